"""Memory measured on rank 0, for the run record's `memory` = {estimated, measured}: the bytes of megatron-core's
real tensors (parameters, gradient buffers, optimizer state) and the bytes one micro-batch saves for backward.

Taken after run_stop, where it cannot change the run: the training losses are those of a run that measures
nothing. Every rank of rank 0's pipeline stage runs the measured forward (tensor-, context- and data-parallel
collectives need their peers); other stages skip it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _model_tensors(model_chunks: list) -> tuple[dict[int, int], dict[int, int]]:
    """{storage: bytes} of the parameters and of the gradient buffers: megatron's contiguous buffers as
    allocated (padding included: the distributed optimizer pads each bucket to lcm(dp, 128) elements), the
    parameters themselves where they live outside a buffer (no distributed optimizer)."""
    params: dict[int, int] = {}
    grads: dict[int, int] = {}
    for chunk in model_chunks:
        for buf in chunk.buffers + chunk.expert_parallel_buffers:
            if buf.param_data is not None:
                params[_storage_key(buf.param_data)] = buf.param_data.numel() * buf.param_data.element_size()
            grads[_storage_key(buf.grad_data)] = buf.grad_data.numel() * buf.grad_data.element_size()
        for p in chunk.parameters():
            key = _storage_key(p)
            if key not in params:
                params[key] = p.untyped_storage().nbytes()
    return params, grads


def _inner_optimizers(optimizer: Any) -> list[torch.optim.Optimizer]:
    members = getattr(optimizer, "chained_optimizers", [optimizer])
    return [m.optimizer for m in members if getattr(m, "optimizer", None) is not None]


def measure_static(model_chunks: list, optimizer: Any) -> dict[str, int]:
    """params_bytes, grads_bytes and optimizer_bytes of this rank: optimizer state is every tensor the torch
    optimizers hold (Adam's moments, fp32 master weights or their shards) that is not model memory already
    counted; 0-dimensional step counters are left out."""
    params, grads = _model_tensors(model_chunks)
    model = params | grads
    state: dict[int, int] = {}
    for inner in _inner_optimizers(optimizer):
        tensors = [p for g in inner.param_groups for p in g["params"]]
        tensors += [t for s in inner.state.values() for t in s.values() if torch.is_tensor(t) and t.dim() > 0]
        for t in tensors:
            key = _storage_key(t)
            if key not in model:
                state[key] = t.untyped_storage().nbytes()
    return {"params_bytes": sum(params.values()), "grads_bytes": sum(grads.values()),
            "optimizer_bytes": sum(state.values())}


def saved_activation_bytes(fn: Callable[[], Any], exclude: list[torch.Tensor]) -> int:
    """Bytes that autograd saves for backward while `fn` runs: each storage once, the tensors of `exclude`
    (the parameters) left out. The saved tensors stay alive (and so their addresses unique) until fn's output
    and the kept references are dropped on return."""
    skip = {_storage_key(t) for t in exclude}
    seen: dict[int, int] = {}
    kept: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = _storage_key(t)
        if key not in skip and key not in seen:
            seen[key] = t.untyped_storage().nbytes()
            kept.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


def measure(parts: Any, batch: dict[str, torch.Tensor] | None) -> dict[str, int]:
    """This rank's static bytes, and the activations one micro-batch (`batch`, as the forward step gets it)
    saves through the first model chunk, under the estimate's name for the same quantity (its activations_bytes
    is that times the micro-batches the schedule keeps in flight, a count, not a measurement); None for batch on
    ranks outside rank 0's pipeline stage."""
    out = measure_static(parts.model, parts.optimizer)
    if batch is not None:
        chunk = parts.model[0]
        chunk.train()
        with torch.enable_grad():
            out["activations_per_micro_batch_bytes"] = saved_activation_bytes(
                lambda: parts.objective.forward(chunk, batch, False)[0], list(chunk.parameters()))
    return out


def allocator_peak() -> dict[str, int]:
    """On a GPU, the CUDA caching allocator's high-water marks over the whole run: every tensor at once at the
    worst moment (allocated; what the plan's total estimates, less the CUDA context, which the allocator does not
    see) and what the allocator held from the driver for it (reserved: allocated plus fragmentation)."""
    return {"peak_allocated_bytes": int(torch.cuda.max_memory_allocated()),
            "peak_reserved_bytes": int(torch.cuda.max_memory_reserved())}


def record(plan: Any, parts: Any, stepper: Any, on_cpu: bool) -> dict:
    """The run record's memory for rank 0: `measured` (above) and `estimated`, the planner's per-GPU plan for this
    layout's first pipeline stage, rank 0's (mlbench.planner.memory.estimate, in the precision and with the
    kernels the run trained with: fp32 on CPU)."""
    from mlbench.planner.memory import estimate
    from mlbench.train.model import attention_backend

    # After run_stop the run's result is settled: a measurement that fails is recorded as such, never turned
    # into a failed run.
    peak = {} if on_cpu else allocator_peak()  # before the measured forward below adds its own
    try:
        measured = measure(parts, stepper.first_micro_batch()) | peak
    except Exception as e:
        measured = {"error": f"{type(e).__name__}: {e}"[:300]} | peak
    try:
        estimated = estimate(plan.benchmark, _layout(plan.layout, on_cpu), stage=0, on_cpu=on_cpu,
                             attention=attention_backend()).as_dict()
    except Exception as e:
        estimated = {"error": f"{type(e).__name__}: {e}"[:300]}
    return {"estimated": estimated, "measured": measured}


def _layout(d: dict, on_cpu: bool) -> Any:
    import dataclasses

    from mlbench.layout import Layout

    return dataclasses.replace(Layout.from_dict(d), precision="fp32" if on_cpu else d["precision"])
