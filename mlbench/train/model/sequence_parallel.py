"""Sequence parallelism with megatron-core's local (torch) norms, where Transformer Engine is absent (CPU).

Under sequence parallelism the residual stream between a layer's tensor-parallel regions is split over the
tensor-parallel ranks along the sequence: each rank normalises its own positions with the same, replicated norm
weights, so each holds part of their gradient, and megatron's `finalize_model_grads` sums those parts over the
tensor-parallel group for every parameter marked `sequence_parallel = True` (Transformer Engine's norms mark
theirs). megatron's `WrappedTorchNorm` refuses sequence parallelism outright; this module builds the same torch
norms without that refusal and marks every norm that sees the split stream. Left unmarked, each rank steps its
norm weights with its own part of the gradient: the copies drift apart (losses off by 8e-5 relative at step 20
and 8e-3 at step 60 on the tiny gpt3).
"""

from __future__ import annotations

import copy

import torch
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.torch_norm import WrappedTorchNorm
from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, _get_block_submodules
from megatron.core.transformer.transformer_config import TransformerConfig

# Norms inside attention (per-head q/k norms) see heads split over tensor-parallel ranks, not the sequence.
_PER_HEAD = ("q_layernorm", "k_layernorm")


class TorchNorm:
    """megatron's WrappedTorchNorm (torch LayerNorm or RMSNorm by config.normalization) without its refusal of
    sequence parallelism; `mark_norms` marks the weights after the model is built."""

    def __new__(cls, config: TransformerConfig, hidden_size: int, eps: float = 1e-5, **_: object) -> torch.nn.Module:
        if config.normalization == "RMSNorm":
            return torch.nn.RMSNorm(hidden_size, eps=eps)
        if config.normalization != "LayerNorm":
            raise ValueError(f"normalization {config.normalization!r}: LayerNorm or RMSNorm")
        return torch.nn.LayerNorm(hidden_size, eps=eps)


def _swap(spec: object) -> object:
    return TorchNorm if spec is WrappedTorchNorm else spec


def block_spec(spec: ModuleSpec, config: TransformerConfig, vp_stage: int | None) -> TransformerBlockSubmodules:
    """The block spec megatron would derive from the layer spec `spec`, with every WrappedTorchNorm (the two
    per layer, per-head q/k norms, the block's final one) as TorchNorm."""
    block = _get_block_submodules(config, spec, vp_stage)
    layers = []
    for s in block.layer_specs:
        s = copy.deepcopy(s)
        for name in ("input_layernorm", "pre_mlp_layernorm"):
            setattr(s.submodules, name, _swap(getattr(s.submodules, name)))
        attention = getattr(s.submodules.self_attention, "submodules", None)
        for name in ("q_layernorm", "k_layernorm"):  # per-head norms (qk_layernorm): same class, never marked
            if attention is not None and hasattr(attention, name):
                setattr(attention, name, _swap(getattr(attention, name)))
        layers.append(s)
    return TransformerBlockSubmodules(layer_specs=layers, layer_norm=_swap(block.layer_norm))


def mark_norms(model: torch.nn.Module) -> int:
    """Marks the parameters of every norm on the sequence-split stream `sequence_parallel = True`, so megatron
    sums their gradients over the tensor-parallel group; returns how many were marked."""
    marked = 0
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.LayerNorm | torch.nn.RMSNorm) and not name.endswith(_PER_HEAD):
            for p in module.parameters(recurse=False):
                p.sequence_parallel = True
                marked += 1
    return marked
