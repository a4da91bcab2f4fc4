"""megatron-core's TransformerConfig for a model under a layout, and the device-dependent choices it carries
(fusions, activation, attention backend, precision)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from megatron.core.transformer.transformer_config import TransformerConfig

from mlbench.models import family
from mlbench.spec import ModelSpec


def have_transformer_engine() -> bool:
    try:
        import transformer_engine  # noqa: F401
    except ImportError:
        return False
    return True


def fused_swiglu(m: ModelSpec, on_gpu: bool) -> bool:
    """Whether megatron's fused SwiGLU runs (mlp.py: bias_swiglu_impl), as Megatron-LM runs dense models on a GPU.
    It keeps only fc1's output for backward; the unfused glu also keeps silu(x_glu) and x_linear, two ffn-wide
    tensors a layer more (on an H100, 1.04B llama-shaped model, micro-batch 2 x 2048: 7.86 GB of activations
    measured against the plan's 5.54, the two tensors 2.15 GB of the gap; perf/saved_activations.py; with the
    fused kernel, 5.575 GB measured against 5.536 planned, docs/gpu.md). The
    experts of a mixture keep the unfused glu, which the memory plan's expert terms count."""
    return on_gpu and m.activation == "swiglu" and not m.num_experts


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


def transformer_config(m: ModelSpec, *, tp: int, pp: int, vp: int, cp: int, bf16: bool, features: dict | None = None,
                       account_for_embedding_in_pipeline_split: bool = False,
                       account_for_loss_in_pipeline_split: bool = False, ep: int = 1,
                       fp8: bool = False) -> TransformerConfig:
    """The TransformerConfig of `m` under a layout; the two pipeline-split flags come from the layout (Megatron's
    asymmetric split: the embedding / the loss count as a layer of the first / last pipeline stage), and
    `features` (FeaturesSpec fields) its sequence parallelism and activation recompute. `fp8`: the matmuls in
    FP8 through Transformer Engine (a GPU that has both; refused before launch elsewhere)."""
    on_gpu = torch.cuda.is_available()
    f = features or {}
    recompute = f.get("recompute", "none")
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
        # The loss is summed and megatron divides the gradients by the scored tokens of the whole step, over every
        # micro-batch and the data-parallel x context-parallel group (finalize_model_grads): each token weighs the
        # same on every layout. A mean per micro-batch gave micro-batches of fewer scored tokens (masked LM) more
        # weight per token, so bert's training changed with the micro-batch size; under CP a rank scores part of
        # every sequence.
        calculate_per_token_loss=True,
        account_for_embedding_in_pipeline_split=account_for_embedding_in_pipeline_split,
        account_for_loss_in_pipeline_split=account_for_loss_in_pipeline_split,
        sequence_parallel=f.get("sequence_parallel", False),
        recompute_granularity=None if recompute == "none" else recompute,
        recompute_method=f.get("recompute_method", "uniform") if recompute == "full" else None,
        recompute_num_layers=f.get("recompute_layers", 1) if recompute == "full" else None,
        bf16=bf16,
        # FP8 as NVIDIA's submissions run it ([nv] gpt3 config_fp8.sh FP8_HYBRID=True): E4M3 forward, E5M2
        # gradients, Transformer Engine's delayed scaling at megatron-core's amax defaults; the parameters kept
        # in FP8 where they are also gathered in FP8 (fp8_param_gather, as DistributedDataParallelConfig).
        fp8="hybrid" if fp8 else None,
        fp8_param=fp8 and f.get("fp8_param_gather", False),
        params_dtype=torch.bfloat16 if bf16 else torch.float32,
        pipeline_dtype=torch.bfloat16 if bf16 else torch.float32,
        use_cpu_initialization=not on_gpu,
        # Fusions are CUDA kernels; on CPU the unfused paths are the ones that exist.
        bias_activation_fusion=fused_bias_gelu(m, on_gpu) or fused_swiglu(m, on_gpu),
        masked_softmax_fusion=on_gpu,
        bias_dropout_fusion=on_gpu,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        persist_layer_norm=False,
        # gloo pairs point-to-point messages between two ranks in posting order; batched p2p posts a rank's
        # sends to the previous and next stage in an order the peer does not receive in, which at pp 2 (where
        # both are the same peer) swaps the interleaved schedule's activations and gradients.
        batch_p2p_comm=on_gpu,
        init_method_std=m.init_method_std,
        qk_layernorm=m.qk_layernorm,
        window_size=(m.window_size, 0) if m.window_size else None,
        window_attn_skip_freq=m.window_attn_skip_freq or None,
        expert_model_parallel_size=ep,
        **family(m.family).config(m),
    )


def attention_backend() -> str:
    """te: Transformer Engine's specs; sdpa: local specs with PyTorch's fused attention (a GPU without TE);
    local: megatron-core's local specs as they are (CPU)."""
    if have_transformer_engine():
        return "te"
    return "sdpa" if torch.cuda.is_available() else "local"
