"""LayerNorm1P: a LayerNorm whose weight stores gamma - 1, for the megatron-core specs that have no such norm.

The Megatron GPT-3 reference builds every LayerNorm as MixedFusedLayerNorm1P (weight initialised to 0, applied
as weight + 1), and its checkpoint stores gamma - 1. megatron-core calls this `layernorm_zero_centered_gamma`:
Transformer Engine's norms and megatron's apex-fused one honour it; the torch LayerNorm its local specs use on a
machine without either refuses it. This is that norm for the local specs (CPU, or a GPU without TE). With
weight decay on every parameter, as the reference has, the parametrisation also changes training: decay pulls
the stored weight to 0, so gamma to 1.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_config import TransformerConfig


class LayerNorm1P(torch.nn.LayerNorm):
    def __init__(self, config: TransformerConfig, hidden_size: int, eps: float = 1e-5, **_: object) -> None:
        super().__init__(hidden_size, eps=eps)
        torch.nn.init.zeros_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.normalized_shape, self.weight + 1, self.bias, self.eps)


def layer_spec(spec: ModuleSpec) -> ModuleSpec:
    """The local layer spec with its two norms as LayerNorm1P."""
    spec = copy.deepcopy(spec)
    spec.submodules.input_layernorm = LayerNorm1P
    spec.submodules.pre_mlp_layernorm = LayerNorm1P
    return spec


def final_norm(model: torch.nn.Module, config: TransformerConfig) -> None:
    """The block's final LayerNorm (built by megatron from its own choice of class) as LayerNorm1P."""
    decoder = getattr(model, "decoder", None)
    if getattr(decoder, "final_layernorm", None) is not None:
        decoder.final_layernorm = LayerNorm1P(config, config.hidden_size, eps=config.layernorm_epsilon)
