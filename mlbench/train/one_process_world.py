"""A one-process megatron-core world on CPU, for tools that build a model outside a run (the dry-run
checkpoint check, checkpoint conversion)."""

from __future__ import annotations

import torch.distributed as dist

from mlbench.train import cpu_compat


def init() -> None:
    cpu_compat.enable()  # first: it imports megatron-core without compiling its fused kernels
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # no port to race for
    ps.initialize_model_parallel(1, 1)
    model_parallel_cuda_manual_seed(0)  # attention's dropout forks this RNG state even when dropout is 0
