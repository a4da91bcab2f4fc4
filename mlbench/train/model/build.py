"""Builds the megatron-core model chunk a benchmark file describes: the family's model class and layer spec
(mlbench.models), with mlbench's norm changes (post-LN, LayerNorm1P) where the definition asks for them."""

from __future__ import annotations

import copy

import torch
from megatron.core import parallel_state
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_config import TransformerConfig

from mlbench.models import family
from mlbench.models.transformer import padded_vocab
from mlbench.spec import ModelSpec
from mlbench.train.model import layernorm1p, sequence_parallel
from mlbench.train.model.config import attention_backend
from mlbench.train.model.context_parallel import ContextParallelAttention
from mlbench.train.model.post_norm import post_norm_model, post_norm_spec


def layer_spec(m: ModelSpec, config: TransformerConfig, backend: str | None = None) -> ModuleSpec:
    backend = backend or attention_backend()
    spec = family(m.family).layer_spec(m, backend)
    if config.context_parallel_size > 1 and backend != "te":  # megatron's local attention refuses CP
        spec = copy.deepcopy(spec)
        spec.submodules.self_attention.submodules.core_attention = ContextParallelAttention
    if m.zero_centered_gamma and backend != "te":
        spec = layernorm1p.layer_spec(spec)
    return post_norm_spec(spec, config, te=backend == "te") if m.norm_position == "post" else spec


def build(m: ModelSpec, config: TransformerConfig, vp_stage: int | None = None,
          backend: str | None = None) -> torch.nn.Module:
    """One model chunk for this rank's pipeline stage (and virtual stage)."""
    spec = layer_spec(m, config, backend)
    common = dict(
        vocab_size=padded_vocab(m, config.tensor_model_parallel_size),
        max_sequence_length=m.seq_length,
        pre_process=parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage),
        post_process=parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage),
        share_embeddings_and_output_weights=not m.untie_embeddings,
        position_embedding_type=m.position_embedding,
        vp_stage=vp_stage,
    )
    # Local specs under sequence parallelism: megatron's torch norms refuse it, ours take it (sequence_parallel.py).
    local_sp = config.sequence_parallel and (backend or attention_backend()) != "te"
    block = sequence_parallel.block_spec(spec, config, vp_stage) if local_sp else spec
    model = family(m.family).build_model(m, config, block, common)
    if m.norm_position == "post":
        post_norm_model(model, config, spec)
    if m.zero_centered_gamma and not config.layernorm_zero_centered_gamma:
        layernorm1p.final_norm(model, config)
    if local_sp:
        sequence_parallel.mark_norms(model)
    return model
