"""A one-process megatron-core world on CPU, for tools that build a model outside a run (the dry-run
checkpoint check, checkpoint conversion)."""

from __future__ import annotations

import os

import torch.distributed as dist

from mlbench.launch.ports import free_port
from mlbench.train import cpu_compat


def init() -> None:
    cpu_compat.enable()  # first: it imports megatron-core without compiling its fused kernels
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port("127.0.0.1")))
    dist.init_process_group("gloo", rank=0, world_size=1)
    ps.initialize_model_parallel(1, 1)
    model_parallel_cuda_manual_seed(0)  # attention's dropout forks this RNG state even when dropout is 0
