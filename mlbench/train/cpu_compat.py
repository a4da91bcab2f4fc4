"""Lets megatron-core's own code paths run on CPU under gloo. Never active when CUDA is present.

megatron-core 0.16 assumes CUDA in a few places:
`torch.cuda.current_device()` used as a device, hard-coded `device="cuda"` in the pipeline schedules,
optimizers and gradient clipping, the CUDA RNG tracker, and `tensor.type() == 'torch.cuda.FloatTensor'`
checks. Rather than fork megatron-core, this layer redirects those few CUDA requests to the CPU:

- a TorchFunctionMode rewrites CUDA `device=` arguments to CPU, passes `Tensor.cuda()` / `.to('cuda')` /
  pinned memory through, and reports `Tensor.type()` with the `torch.cuda.` prefix megatron-core compares
  against; activation recompute's backward runs under it too;
- `torch.cuda.current_device/synchronize/empty_cache` and the RNG-state functions map to CPU equivalents.

Three changes only save time: megatron-core's fused kernels stay uncompiled (its `disable_jit_fuser`, applied
before the import), since they only run with the GPU fusions on and compiling them costs every process
seconds; a synchronous all-reduce over a group of one process returns at once; and torch's optimizers run
without importing dynamo, which they ask for only to keep out of a compiled graph.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode

_CPU = torch.device("cpu")
_active = False


def _is_cuda(device: Any) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.startswith("cuda")
    # A bare integer is a CUDA ordinal in factory calls (torch.empty(..., device=0)).
    return isinstance(device, int) and not isinstance(device, bool)


_REWRITTEN = frozenset({"cuda", "pin_memory", "to", "type"})  # the functions rewritten whatever their arguments


class _CudaToCpu(TorchFunctionMode):
    # Every torch call of a training step passes through here (about 1,500 a tiny step): the common case, no
    # keyword to rewrite and no function of _REWRITTEN, returns after two tests.
    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        kwargs = kwargs or {}
        cuda, pinned = _is_cuda(kwargs.get("device")), kwargs.get("pin_memory")
        if cuda or pinned:
            kwargs = dict(kwargs)
            if cuda:
                kwargs["device"] = _CPU
            if pinned:  # page-locked memory is for copies to a GPU (RoPE's CP split asks for it)
                kwargs["pin_memory"] = False
        name = getattr(func, "__name__", "")
        if name not in _REWRITTEN:
            return func(*args, **kwargs)
        if name in ("cuda", "pin_memory"):  # Tensor.cuda(): the tensor already lives where compute happens
            return args[0]
        if name == "to":
            args = tuple(_CPU if _is_cuda(a) else a for a in args)
        if name == "type" and len(args) == 1 and not kwargs:
            # megatron-core checks grads with `param.grad.type() == 'torch.cuda.FloatTensor'`.
            return func(*args).replace("torch.", "torch.cuda.", 1)
        return func(*args, **kwargs)


def import_megatron_without_jit_fuser() -> None:
    """megatron.core.jit picks `torch.compile` as its fuser, and the package's import decorates its fused
    kernels with it, which imports dynamo and inductor (about 2.5 s of every process's start). With no
    GPU those kernels never run (mlbench.train.model.config turns the fusions off), so they stay plain functions,
    as megatron's own `disable_jit_fuser` leaves them."""
    if "megatron.core" in sys.modules or torch.cuda.is_available():  # imported already, or the GPU fuses them
        return
    real = torch.compile

    def no_compile(model: Any = None, **kwargs: Any) -> Any:
        return model if model is not None else (lambda fn: fn)

    torch.compile = no_compile  # type: ignore[assignment]
    try:
        from megatron.core import jit

        jit.disable_jit_fuser()  # for modules imported later
    finally:
        torch.compile = real  # type: ignore[assignment]


def _skip_all_reduce_over_one_process() -> None:
    """An all-reduce over a group of one is the identity, yet gloo hands it to its worker thread (0.05 to
    1.5 ms here, more on a busy machine): vocabulary-parallel cross-entropy alone makes three per
    micro-batch at TP 1. perf/cpu_collectives.py measures the tiny gpt3 run 1.03-1.15x faster without them."""
    real = dist.all_reduce

    @functools.wraps(real)
    def all_reduce(tensor: torch.Tensor, op: Any = dist.ReduceOp.SUM, group: Any = None,
                   async_op: bool = False) -> Any:
        if not async_op and dist.get_world_size(group) == 1:
            return None
        return real(tensor, op=op, group=group, async_op=async_op)

    dist.all_reduce = all_reduce


def _patch_cuda_namespace() -> None:
    import_megatron_without_jit_fuser()
    from megatron.core.tensor_parallel import random as mrandom

    torch.cuda.current_device = lambda: _CPU  # type: ignore[assignment]
    torch.cuda.synchronize = lambda *a, **k: None  # type: ignore[assignment]
    torch.cuda.empty_cache = lambda: None  # type: ignore[assignment]
    torch.cuda.get_rng_state = lambda *a, **k: torch.get_rng_state()  # type: ignore[assignment]
    torch.cuda.set_rng_state = lambda state, *a, **k: torch.set_rng_state(state)  # type: ignore[assignment]
    # The CPU generator directly: torch.manual_seed itself calls torch.cuda.manual_seed_all (left alone).
    torch.cuda.manual_seed = lambda seed: torch.default_generator.manual_seed(seed)  # type: ignore[assignment]
    mrandom._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()
    mrandom._set_cuda_rng_state = lambda state, *a, **k: torch.set_rng_state(state)


def _recompute_under_rewrite() -> None:
    """Activation recompute re-runs the forward inside autograd's backward, where the process-wide
    TorchFunctionMode is not active (modes are per thread, and the engine does not carry them into backward):
    megatron's causal mask would ask for a `cuda` tensor there. Its two checkpoint functions' backward passes
    run under the rewrite."""
    from megatron.core.tensor_parallel import random as mrandom

    for fn in (mrandom.CheckpointFunction, mrandom.CheckpointWithoutOutputFunction):
        real = fn.backward

        def backward(ctx: Any, *args: Any, _real: Any = real) -> Any:
            with _CudaToCpu():
                return _real(ctx, *args)

        fn.backward = staticmethod(backward)


# ---- mixture of experts: three more CUDA assumptions in megatron-core 0.16's MoE layer -------------------------


class _NoStream:
    """A CUDA stream or event stand-in: on CPU every operation is already ordered, so waiting is a no-op."""

    def wait_stream(self, other: Any) -> None:
        pass

    def record_event(self, *a: Any) -> _NoStream:
        return self

    def synchronize(self) -> None:
        pass


_DEFAULT_STREAM = _NoStream()


def _moe_on_cpu() -> None:
    """1. The all-to-all dispatcher creates a CUDA stream for its device-to-host copies and waits on it:
    stand-ins. 2. Its split sizes reach all_to_all_single as numpy arrays only when they were CUDA tensors
    (`maybe_move_tensor_to_cpu` converts only those); on CPU they stay tensors, which the binding refuses:
    converted here as well. (The router's missing `te_general_gemm` is not the CPU's: mlbench.models.moe.)"""
    import contextlib

    from megatron.core.transformer.moe import moe_utils, token_dispatcher

    torch.cuda.Stream = lambda *a, **k: _NoStream()  # type: ignore[assignment,misc]
    torch.cuda.current_stream = lambda *a, **k: _DEFAULT_STREAM  # type: ignore[assignment]
    torch.cuda.stream = lambda stream=None: contextlib.nullcontext()  # type: ignore[assignment]

    def maybe_move_tensor_to_cpu(tensor: Any, as_numpy: bool = False, record_stream: bool = False) -> Any:
        if torch.is_tensor(tensor):
            tensor = tensor.cpu()
            return tensor.numpy() if as_numpy else tensor
        return tensor

    moe_utils.maybe_move_tensor_to_cpu = maybe_move_tensor_to_cpu
    token_dispatcher.maybe_move_tensor_to_cpu = maybe_move_tensor_to_cpu


def _experts_drawn_as_one_process() -> None:
    """On CPU megatron draws every weight from the one CPU generator, which each rank seeds alike (data-parallel
    copies must match): each expert-parallel rank drew its local experts from the same state, so at --ep 2
    experts 2 and 3 started as copies of 0 and 1 (at --ep 4 all four as copies of 0). Each rank now draws every
    expert of the layer in order, as one process does, and keeps its own: the experts start from one process's
    weights, and what is drawn after them (the next layers) stays the same on every rank. (A GPU draws them from
    megatron's expert-parallel RNG tracker, seeded per expert-parallel rank.)"""
    from megatron.core.transformer.moe.experts import SequentialMLP

    real = SequentialMLP.__init__

    @functools.wraps(real)
    def __init__(self: Any, num_local_experts: int, config: Any, submodules: Any, pg_collection: Any = None) -> None:
        ep = pg_collection.ep.size() if pg_collection is not None and pg_collection.ep is not None else 1
        if ep == 1 or not config.use_cpu_initialization:
            real(self, num_local_experts, config, submodules, pg_collection)
            return
        real(self, num_local_experts * ep, config, submodules, pg_collection)
        first = pg_collection.ep.rank() * num_local_experts
        self.local_experts = torch.nn.ModuleList(list(self.local_experts)[first:first + num_local_experts])
        self.num_local_experts = num_local_experts

    SequentialMLP.__init__ = __init__


def _optimizers_without_dynamo() -> None:
    """torch's optimizers import dynamo (0.5 s of CPU a process) for what only matters to a torch.compile graph,
    and nothing here runs compiled:
    - add_param_group, state_dict, load_state_dict and zero_grad are wrapped by `torch._disable_dynamo`, which
      imports it at their first call to build the disabled function: each wrapper is handed its own function
      instead (in the attribute it caches that in);
    - Adam's and the other optimizers' `step` is wrapped by `_use_grad_for_differentiable`, which imports it at
      every call for a graph break around the step, a no-op outside a graph: the step runs in the same grad mode
      without it.
    Only wrappers found as torch 2.13 makes them are touched; any other stays as it is (and imports dynamo)."""
    from torch.optim import optimizer as torch_optimizer

    disabled = torch._disable_dynamo(lambda: None).__code__
    use_grad = torch_optimizer._use_grad_for_differentiable(lambda self: None).__code__
    classes, seen = [torch_optimizer.Optimizer], set()
    while classes:
        cls = classes.pop()
        if cls in seen:
            continue
        seen.add(cls)
        classes += cls.__subclasses__()
        for name, wrapper in list(vars(cls).items()):
            fn, code = getattr(wrapper, "__wrapped__", None), getattr(wrapper, "__code__", None)
            if fn is None:
                continue
            if code is disabled:
                setattr(fn, "__dynamo_disable", fn)
            elif code is use_grad:
                setattr(cls, name, _in_differentiable_grad_mode(fn))


def _in_differentiable_grad_mode(step: Any) -> Any:
    @functools.wraps(step)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        previous = torch.is_grad_enabled()
        torch.set_grad_enabled(self.defaults["differentiable"])
        try:
            return step(self, *args, **kwargs)
        finally:
            torch.set_grad_enabled(previous)

    return wrapper


def enable() -> bool:
    """Activate the layer for the rest of the process if there is no CUDA. Returns whether it is active."""
    global _active
    if torch.cuda.is_available():
        return False
    if not _active:
        _patch_cuda_namespace()
        _recompute_under_rewrite()
        _moe_on_cpu()
        _experts_drawn_as_one_process()
        _skip_all_reduce_over_one_process()
        _optimizers_without_dynamo()
        _CudaToCpu().__enter__()  # process-wide: every rank's training runs inside it
        _active = True
    return True


def active() -> bool:
    return _active

