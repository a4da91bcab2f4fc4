"""Rewrites a megatron-core distributed checkpoint under other tensor names, as another framework would have
written it: `python tests/rename_checkpoint.py SRC DST PREFIX RULE...` (RULE: 'FROM -> TO', applied to
megatron-core names; optimizer tensors follow their parameter). Only tensors are kept: no optimizer metadata and
no per-layer extra state, like the MLPerf GPT-3 reference checkpoint."""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

from mlbench.train import cpu_compat

cpu_compat.enable()  # before megatron-core's import (its fused kernels stay uncompiled); its writer syncs CUDA
from megatron.core import dist_checkpointing  # noqa: E402
from megatron.core.dist_checkpointing import ShardedTensor  # noqa: E402
from megatron.core.dist_checkpointing.serialization import load_plain_tensors  # noqa: E402

from mlbench.train.checkpoint import renamer  # noqa: E402

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
    dist_checkpointing.save(state, dst)


def main(src: str, dst: str, prefix: str, rules: list[str]) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29555")
    dist.init_process_group("gloo", rank=0, world_size=1)
    convert(src, dst, prefix, rules)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:])
