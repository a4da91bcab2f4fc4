"""The mixture-of-experts decoder family (gpt_oss_20b): megatron-core's GPTModel whose every layer's MLP is an
`MoELayer`, as the MLPerf reference (AMD Primus on Megatron-LM) builds it.

Routing is the reference's: a linear router (no bias) scores the experts, each token goes to the top-k logits'
experts with a softmax over those k (`moe_router_pre_softmax` false: weights sum to 1), no load-balancing loss,
no z-loss, no expert bias, no capacity factor (dropless); the all-to-all token dispatcher. Experts are SwiGLU
MLPs of `moe_ffn_hidden_size` without biases, no shared expert. Attention may slide (window on alternate
layers) and carry a q/k norm: `ModelSpec.window_size`, `window_attn_skip_freq`, `qk_layernorm`, which
`config` hands to megatron-core's TransformerConfig.

Counts: `params` is what megatron-core builds (all experts); `active_params` what one token's forward uses: the
router, top-k experts, attention, norms and the output layer, without the input embedding (a lookup, not a
matmul: OpenAI's convention for gpt-oss's "3.6B active"). Model FLOPs count the active experts only.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any

from mlbench.models import Family, gpt, transformer

if TYPE_CHECKING:
    from mlbench.spec import ModelSpec


def config(m: ModelSpec) -> dict:
    """TransformerConfig fields of the MoE layer, as the reference configures it."""
    return dict(
        num_moe_experts=m.num_experts,
        moe_router_topk=m.moe_router_topk,
        moe_ffn_hidden_size=m.moe_ffn_hidden_size or m.ffn_hidden_size,
        moe_router_pre_softmax=False,  # top-k of the logits, then softmax over the k
        moe_router_score_function="softmax",
        moe_router_load_balancing_type="none",
        moe_aux_loss_coeff=0.0,
        moe_token_dispatcher_type="alltoall",
        # Transformer Engine's grouped GEMM where it is installed (the "te" layer spec builds TEGroupedMLP);
        # without it megatron's SequentialMLP, one GEMM pair per expert
        moe_grouped_gemm=importlib.util.find_spec("transformer_engine") is not None,
        moe_router_dtype="fp32",  # the reference's AMD config
    )


def layer_spec(m: ModelSpec, backend: str) -> Any:
    if backend == "te":
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec

        return get_gpt_layer_with_transformer_engine_spec(num_experts=m.num_experts, moe_grouped_gemm=True,
                                                          qk_layernorm=m.qk_layernorm)
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.moe import moe_utils

    # megatron-core 0.16.1's router tests `te_general_gemm` before its torch GEMM, and moe_utils defines the name
    # only where Transformer Engine imports: a NameError on every router call, on a GPU as on the CPU.
    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
    # "sdpa" keeps megatron's own core attention: mlbench's SDPA module has no sliding-window mask.
    return get_gpt_layer_local_spec(num_experts=m.num_experts, moe_grouped_gemm=False,
                                    qk_layernorm=m.qk_layernorm, normalization=m.normalization)


def _expert_params(m: ModelSpec) -> int:
    """One expert: fc1 (x2 when gated) and fc2, no biases."""
    ffn = m.moe_ffn_hidden_size or m.ffn_hidden_size
    gated = 2 if m.activation == "swiglu" else 1
    return m.hidden_size * gated * ffn + ffn * m.hidden_size


def _layer_params(m: ModelSpec, experts: int) -> int:
    """A layer with `experts` experts counted: attention, q/k norms, the two norms, router."""
    s = transformer.shapes(m)
    attention = s.h * (s.q + 2 * s.kv) + s.q * s.h
    kv_channels = m.kv_channels or m.hidden_size // m.num_attention_heads
    qk_norms = 2 * kv_channels * (2 if m.normalization == "LayerNorm" else 1) if m.qk_layernorm else 0
    router = m.hidden_size * m.num_experts
    return attention + qk_norms + 2 * transformer.norm_params(m) + router + experts * _expert_params(m)


def params(m: ModelSpec, tp: int = 1) -> int:
    vocab = transformer.padded_vocab(m, tp)
    embeddings = (2 if m.untie_embeddings else 1) * vocab * m.hidden_size
    return m.num_layers * _layer_params(m, m.num_experts) + embeddings + transformer.norm_params(m)


def active_params(m: ModelSpec, tp: int = 1) -> int:
    output = transformer.padded_vocab(m, tp) * m.hidden_size
    return m.num_layers * _layer_params(m, m.moe_router_topk) + output + transformer.norm_params(m)


def forward_flops(m: ModelSpec, tp: int = 1) -> float:
    """Forward model FLOPs per sample, in the dense decoder's convention (transformer.decoder_forward_flops):
    2 x matmul weights x tokens for attention, the router and the top-k experts a token goes through, the full
    s x s attention products on every layer (the sliding window is not subtracted, as Megatron-LM's count does
    not), and the logit layer."""
    s = transformer.shapes(m)
    seq = m.seq_length
    matmul = s.h * (s.q + 2 * s.kv) + s.q * s.h + m.hidden_size * m.num_experts + m.moe_router_topk * _expert_params(m)
    per_layer = 2 * matmul * seq + 4 * seq * seq * s.q
    return m.num_layers * per_layer + 2 * seq * s.h * transformer.padded_vocab(m, tp)


def describe(m: ModelSpec) -> str:
    k = m.window_attn_skip_freq
    where = " on alternate layers" if k == 2 else f", full attention every {k} layers" if k else " on every layer"
    window = f", sliding window {m.window_size}{where}" if m.window_size else ""
    qk = ", q/k norm" if m.qk_layernorm else ""
    return (f"{transformer.describe(m)}; {m.num_experts} experts of ffn {m.moe_ffn_hidden_size or m.ffn_hidden_size}, "
            f"top-{m.moe_router_topk}{window}{qk}")


def check(m: ModelSpec) -> str | None:
    """A mixture-of-experts model has experts, each of some width, and routes each token to 1 to all of them (a
    width of -1 was counted as a model of 1.4B parameters by show, and an IndexError in plan)."""
    for key in ("num_experts", "moe_router_topk", "moe_ffn_hidden_size"):
        if getattr(m, key) < 1:
            return f"model.{key} is {getattr(m, key)}; a mixture-of-experts model (family moe) needs it at least 1"
    if m.moe_router_topk > m.num_experts:
        return (f"model.moe_router_topk is {m.moe_router_topk}, more than its {m.num_experts} experts "
                f"(model.num_experts)")
    return None


FAMILY = Family(
    name="moe",
    data_sources=("markov", "indexed"),
    markov_vocab=lambda m: m.vocab_size,
    param_count=params,
    flops_per_sample=lambda m, tp=1: 3.0 * forward_flops(m, tp),
    describe=describe,
    build_model=gpt.build_model,
    layer_spec=layer_spec,
    objective=gpt.objective,
    metric="log_perplexity",
    active_param_count=active_params,
    config=config,
    check=check,
)
