"""The decoder family (GPT-3, Llama): megatron-core's GPTModel, causal LM on the Markov or indexed source."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mlbench.models import Family, transformer

if TYPE_CHECKING:
    from mlbench.spec import Benchmark, ModelSpec


def layer_spec(m: ModelSpec, backend: str) -> Any:
    if backend == "te":
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec

        return get_gpt_layer_with_transformer_engine_spec()
    import copy

    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    spec = copy.deepcopy(get_gpt_layer_local_spec(normalization=m.normalization))  # edits stay ours
    if backend == "sdpa":  # a GPU without Transformer Engine: PyTorch's fused attention in megatron's place
        from mlbench.train.model.attention import SDPAttention

        spec.submodules.self_attention.submodules.core_attention = SDPAttention
    return spec


def build_model(m: ModelSpec, config: Any, spec: Any, common: dict) -> Any:
    from megatron.core.models.gpt.gpt_model import GPTModel

    return GPTModel(config=config, transformer_layer_spec=spec, **common, rotary_base=int(m.rotary_base),
                    rope_scaling=m.rope_scaling, rope_scaling_factor=m.rope_scaling_factor)


def objective(b: Benchmark) -> Any:
    from mlbench.train.objectives import CausalLM

    return CausalLM(output_vocab=b.model.vocab_size if b.model.mask_padded_vocab else None)


FAMILY = Family(
    name="gpt",
    data_sources=("markov", "indexed"),
    markov_vocab=lambda m: m.vocab_size,
    param_count=transformer.decoder_params,
    flops_per_sample=lambda m, tp=1: 3.0 * transformer.decoder_forward_flops(m, tp),
    describe=transformer.describe,
    build_model=build_model,
    layer_spec=layer_spec,
    objective=objective,
    metric="log_perplexity",
    sdpa_attention=True,
)
