"""Parameter counts and model FLOPs of a benchmark's model, computed analytically from its `ModelSpec` by its
family (mlbench.models): the one definition the CLI, the training loop's MFU and the planner share.

`param_count` counts exactly what megatron-core 0.16 builds for the spec (checked against the built modules in
tests/test_benchmarks_full.py). `flops_per_sample` is the model-FLOPs count used for MFU, in the Megatron-LM
convention (mlbench.models.transformer.decoder_forward_flops).
"""

from __future__ import annotations

from mlbench.models import family
from mlbench.models.transformer import padded_vocab
from mlbench.spec import ModelSpec


def param_count(m: ModelSpec, tp: int = 1) -> int:
    """Parameters of the full (unsharded) model megatron-core builds for `m` at tensor parallelism `tp`."""
    return family(m.family).param_count(m, tp)


def active_param_count(m: ModelSpec, tp: int = 1) -> int:
    """Parameters a token passes through: the total, less the experts it is not routed to (mixture of experts)."""
    f = family(m.family)
    return f.active_param_count(m, tp) if f.active_param_count else f.param_count(m, tp)


def flops_per_sample(m: ModelSpec, tp: int = 1) -> float:
    """Model FLOPs to train on one sample (a sequence of seq_length tokens): forward + backward = 3 x forward."""
    return family(m.family).flops_per_sample(m, tp)


__all__ = ["active_param_count", "flops_per_sample", "padded_vocab", "param_count"]
