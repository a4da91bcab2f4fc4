"""Builds the megatron-core model a benchmark file describes. The file alone decides the model."""

from __future__ import annotations

import copy
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from megatron.core import parallel_state
from megatron.core.models.bert.bert_layer_specs import bert_layer_local_spec
from megatron.core.models.bert.bert_model import BertModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.models.gpt.gpt_model import GPTModel
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_config import TransformerConfig

from mlbench.spec import ModelSpec
from mlbench.train import layernorm1p
from mlbench.train.post_norm import post_norm_model, post_norm_spec


def have_transformer_engine() -> bool:
    try:
        import transformer_engine  # noqa: F401
    except ImportError:
        return False
    return True


def fused_bias_gelu(m: ModelSpec, on_gpu: bool) -> bool:
    """Whether megatron's fused bias-gelu kernel runs: it is the tanh approximation, so it serves gelu_tanh (with
    biases, on GPU) and never the exact gelu."""
    return on_gpu and m.activation == "gelu_tanh" and m.add_bias_linear


def activation(m: ModelSpec, fused: bool = False) -> Callable:
    """The FFN activation. megatron's MLP recognises its fused kernel by function identity (F.gelu), so
    gelu_tanh is F.gelu where the (tanh) fused kernel runs (`fused`) and the tanh F.gelu where it does not."""
    if m.activation == "swiglu":
        return F.silu
    if m.activation == "gelu_tanh" and not fused:
        return partial(F.gelu, approximate="tanh")
    return F.gelu


def transformer_config(m: ModelSpec, *, tp: int, pp: int, vp: int, cp: int, bf16: bool,
                       account_for_embedding_in_pipeline_split: bool = False,
                       account_for_loss_in_pipeline_split: bool = False) -> TransformerConfig:
    """The TransformerConfig of `m` under a layout; the two pipeline-split flags come from the layout (Megatron's
    asymmetric split: the embedding / the loss count as a layer of the first / last pipeline stage)."""
    on_gpu = torch.cuda.is_available()
    return TransformerConfig(
        num_layers=m.num_layers,
        hidden_size=m.hidden_size,
        num_attention_heads=m.num_attention_heads,
        num_query_groups=m.num_query_groups,
        kv_channels=m.kv_channels,
        ffn_hidden_size=m.ffn_hidden_size,
        normalization=m.normalization,
        layernorm_epsilon=m.norm_epsilon,
        # Transformer Engine's norms apply it; elsewhere the specs carry LayerNorm1P (layernorm1p.py), and
        # megatron's torch LayerNorm would refuse the flag.
        layernorm_zero_centered_gamma=m.zero_centered_gamma and have_transformer_engine(),
        gated_linear_unit=m.activation == "swiglu",
        activation_func=activation(m, fused=fused_bias_gelu(m, on_gpu)),
        add_bias_linear=m.add_bias_linear,
        hidden_dropout=m.dropout,
        attention_dropout=m.dropout,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vp if vp > 1 else None,
        context_parallel_size=cp,
        account_for_embedding_in_pipeline_split=account_for_embedding_in_pipeline_split,
        account_for_loss_in_pipeline_split=account_for_loss_in_pipeline_split,
        sequence_parallel=False,
        bf16=bf16,
        params_dtype=torch.bfloat16 if bf16 else torch.float32,
        pipeline_dtype=torch.bfloat16 if bf16 else torch.float32,
        use_cpu_initialization=not on_gpu,
        # Fusions are CUDA kernels; on CPU the unfused paths are the ones that exist.
        bias_activation_fusion=fused_bias_gelu(m, on_gpu),
        masked_softmax_fusion=on_gpu,
        bias_dropout_fusion=on_gpu,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        persist_layer_norm=False,
        # gloo pairs point-to-point messages between two ranks in posting order; batched p2p posts a rank's
        # sends to the previous and next stage in an order the peer does not receive in, which at pp 2 (where
        # both are the same peer) swaps the interleaved schedule's activations and gradients.
        batch_p2p_comm=on_gpu,
        init_method_std=0.02,
    )


def attention_backend() -> str:
    """te: Transformer Engine's specs; sdpa: local specs with PyTorch's fused attention (a GPU without TE);
    local: megatron-core's local specs as they are (CPU)."""
    if have_transformer_engine():
        return "te"
    return "sdpa" if torch.cuda.is_available() else "local"


def layer_spec(m: ModelSpec, config: TransformerConfig, backend: str | None = None) -> ModuleSpec:
    backend = backend or attention_backend()
    spec = _pre_norm_spec(m, backend)
    if m.zero_centered_gamma and backend != "te":
        spec = layernorm1p.layer_spec(spec)
    return post_norm_spec(spec, config, te=backend == "te") if m.norm_position == "post" else spec


def _pre_norm_spec(m: ModelSpec, backend: str) -> ModuleSpec:
    if backend == "te":
        if m.family == "bert":
            from megatron.core.models.bert.bert_layer_specs import bert_layer_with_transformer_engine_spec

            return bert_layer_with_transformer_engine_spec
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec

        return get_gpt_layer_with_transformer_engine_spec()
    spec = bert_layer_local_spec if m.family == "bert" else get_gpt_layer_local_spec(normalization=m.normalization)
    # megatron's BertModel accepts only its own DotProductAttention or TE's (it compares the class, then asks
    # for TE's version), so BERT keeps the local attention when TE is absent.
    if backend == "sdpa" and m.family != "bert":
        from mlbench.train.attention import SDPAttention

        spec = copy.deepcopy(spec)  # the bert spec is a module-level object shared by every caller
        spec.submodules.self_attention.submodules.core_attention = SDPAttention
    return spec


def padded_vocab(m: ModelSpec, tp: int) -> int:
    """Vocabulary padded as Megatron pads it: to a multiple of make_vocab_size_divisible_by x tp."""
    multiple = m.make_vocab_size_divisible_by * tp
    return -(-m.vocab_size // multiple) * multiple


def build(m: ModelSpec, config: TransformerConfig, vp_stage: int | None = None,
          backend: str | None = None) -> torch.nn.Module:
    """One model chunk for this rank's pipeline stage (and virtual stage)."""
    pre = parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage)
    post = parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage)
    common = dict(
        config=config,
        transformer_layer_spec=layer_spec(m, config, backend),
        vocab_size=padded_vocab(m, config.tensor_model_parallel_size),
        max_sequence_length=m.seq_length,
        pre_process=pre,
        post_process=post,
        share_embeddings_and_output_weights=not m.untie_embeddings,
        position_embedding_type=m.position_embedding,
        vp_stage=vp_stage,
    )
    if m.family == "bert":
        model = BertModel(**common, num_tokentypes=m.num_tokentypes, add_binary_head=m.add_binary_head)
    else:
        model = GPTModel(**common, rotary_base=int(m.rotary_base), rope_scaling=m.rope_scaling,
                         rope_scaling_factor=m.rope_scaling_factor)
    if m.family == "bert" and post:
        model.lm_head.gelu = activation(m)  # megatron's BertLMHead hard-codes the erf GeLU; BERT's head uses hidden_act
    if m.norm_position == "post":
        post_norm_model(model, config, common["transformer_layer_spec"])
    if m.zero_centered_gamma and not config.layernorm_zero_centered_gamma:
        layernorm1p.final_norm(model, config)
    return model
