"""Rewrites a megatron-core distributed checkpoint under other tensor names, as another framework would have
written it: `convert(SRC, DST, PREFIX, RULES)` (a rule: 'FROM -> TO', applied to megatron-core names; optimizer
tensors follow their parameter). Only tensors are kept: no optimizer metadata and no per-layer extra state, like
the MLPerf GPT-3 reference checkpoint."""

from __future__ import annotations

import os

import torch

from mlbench.train import cpu_compat

cpu_compat.enable()  # before megatron-core's import (its fused kernels stay uncompiled); its writer syncs CUDA
from megatron.core import dist_checkpointing  # noqa: E402
from megatron.core.dist_checkpointing import ShardedTensor  # noqa: E402
from megatron.core.dist_checkpointing.serialization import load_plain_tensors  # noqa: E402

from mlbench.train.checkpoint import renamer, save_strategy  # noqa: E402

OPTIMIZER = "optimizer.state."


def convert(src: str, dst: str, prefix: str, rules: list[str]) -> None:
    """SRC rewritten to DST under the new names, in a process group of one."""
    rename = renamer(rules)

    def new_name(key: str) -> str:
        if key.startswith(OPTIMIZER):  # optimizer.state.exp_avg.<param> -> optimizer.state.exp_avg.<new param>
            kind, param = key[len(OPTIMIZER):].split(".", 1)
            return f"{OPTIMIZER}{kind}.{prefix}{rename(param)}"
        return prefix + rename(key)

    os.makedirs(dst)
    state = {new_name(k): ShardedTensor.from_rank_offsets(new_name(k), t.contiguous(), replica_id=0)
             for k, t in load_plain_tensors(src).items() if isinstance(t, torch.Tensor)}  # not common.pt
    dist_checkpointing.save(state, dst, sharded_strategy=save_strategy())
