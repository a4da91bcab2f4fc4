"""The megatron-core model of a run: its config (config.py), the chunk a pipeline stage builds (build.py), and
mlbench's own layers plugged in through megatron's layer specs (attention, post_norm, layernorm1p)."""

from mlbench.models.transformer import padded_vocab
from mlbench.train.model.build import build, layer_spec
from mlbench.train.model.config import (
    activation,
    attention_backend,
    fused_bias_gelu,
    have_transformer_engine,
    transformer_config,
)

__all__ = ["activation", "attention_backend", "build", "fused_bias_gelu", "have_transformer_engine", "layer_spec",
           "padded_vocab", "transformer_config"]
