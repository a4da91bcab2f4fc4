"""Starting from, and saving, megatron-core distributed checkpoints (the `torch_dist` format).

A distributed checkpoint stores every tensor once, by its global name and shape, so it loads into any parallel
layout: a checkpoint saved at TP 1 loads at TP 2 or PP 2. What is checked before anything is read: the folder
is a distributed checkpoint in a format this megatron-core reads, and every tensor the model needs is there with
the model's global shape (names may carry one common prefix, as NeMo's `model.`). The optimizer's state is
loaded when the checkpoint holds all of it (megatron's names, `optimizer.state.exp_avg.<tensor>`, the names of
the MLPerf GPT-3 checkpoint), else the run starts with fresh moments and says so.

Saving writes to a staging folder next to the destination and renames it into place once every rank is done:
a checkpoint is complete or absent, and an existing one is never replaced.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import torch.distributed as dist

MLBENCH_KEY = "mlbench"  # common (non-tensor) entry: what saved the checkpoint, from which benchmark and step


class CheckpointError(Exception):
    """A checkpoint that cannot start this run; the message names what is wrong and what would be right."""


def model_state(model: list) -> dict:
    """The model chunks' sharded state dict, nested as megatron-LM nests it (`model` or `model0`, `model1`...),
    with megatron-core's names: taken below the DDP wrapper, which would prefix every name with `module.`."""
    if len(model) == 1:
        return {"model": model[0].module.sharded_state_dict()}
    return {f"model{i}": chunk.module.sharded_state_dict() for i, chunk in enumerate(model)}


def _sharded_items(state: dict, kind: type | None = None):
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedBase

    for v in nested_values(state):
        if isinstance(v, kind or ShardedBase):
            yield v


def _tensors(state: dict):
    """Tensors and tensor factories (a fused SwiGLU weight); ShardedObjects (layers' `_extra_state`, stored per
    shard) are left to megatron's own load checks."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory

    return _sharded_items(state, (ShardedTensor, ShardedTensorFactory))


def _global_shape(item) -> tuple | None:
    return tuple(item.global_shape) if hasattr(item, "global_shape") else None


def _rekey(state: dict, fn: Callable[[str], str]) -> None:
    for item in _sharded_items(state):
        item.key = fn(item.key)


def check_readable(path: str | Path) -> None:
    """Fails early, on the launching side, for a path that cannot be a checkpoint to start from."""
    p = Path(path)
    if not p.is_dir():
        raise CheckpointError(f"--init-checkpoint {path}: no such folder (a megatron-core distributed checkpoint "
                              f"folder, with metadata.json)")
    meta = p / "metadata.json"
    if not meta.is_file():
        hint = (" (this looks like a legacy per-rank Megatron checkpoint: convert it to the torch_dist format with "
                "Megatron-LM's checkpoint converter)" if any(p.glob("mp_rank_*")) or any(p.glob("iter_*")) else "")
        raise CheckpointError(f"--init-checkpoint {path}: not a megatron-core distributed checkpoint "
                              f"(no metadata.json){hint}")
    import json

    try:
        backend = json.loads(meta.read_text()).get("sharded_backend")
    except (json.JSONDecodeError, AttributeError) as e:
        raise CheckpointError(f"--init-checkpoint {path}: metadata.json is not valid JSON ({e})") from e
    if backend != "torch_dist":
        raise CheckpointError(
            f"--init-checkpoint {path}: sharded backend {backend!r}; this megatron-core reads 'torch_dist' only. "
            f"The MLPerf GPT-3 reference checkpoint is zarr: convert it to torch_dist with Megatron-LM "
            f"(--ckpt-convert-format torch_dist) first")


def _find_prefix(needed: dict[str, tuple | None], stored: dict) -> str:
    """The one prefix under which the checkpoint holds the model's tensors ('' or, for NeMo, 'model.')."""
    if all(k in stored for k in needed):
        return ""
    anchor = next(iter(needed))
    for key in stored:
        if key.endswith(anchor) and key != anchor:
            prefix = key[: -len(anchor)]
            if all(prefix + k in stored for k in needed):
                return prefix
    return ""


def _same_but_padding(item, want: tuple, got: tuple, vocab_size: int) -> bool:
    """Embedding and output rows padded for another TP size (megatron marks those tensors allow_shape_mismatch
    and pads or trims on load); both must still hold every real token."""
    return (getattr(item, "allow_shape_mismatch", False) and want[1:] == got[1:]
            and min(want[0], got[0]) >= vocab_size)


def load(path: str | Path, model: list, optimizer, vocab_size: int) -> dict:
    """Loads the model (and optimizer state when the checkpoint has it) from `path`; returns what was loaded.
    `vocab_size` is the tokenizer's: the embedding rows beyond it are padding and may differ."""
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.serialization import load_common_state_dict, load_sharded_metadata
    from megatron.core.dist_checkpointing.validation import StrictHandling

    check_readable(path)
    stored = load_sharded_metadata(str(path))
    state = model_state(model)
    items = {item.key: item for item in _tensors(state)}
    needed = {k: _global_shape(item) for k, item in items.items()}
    prefix = _find_prefix(needed, stored)
    missing = [k for k in needed if prefix + k not in stored]
    if missing:
        legacy = any(k.startswith("language_model.") for k in stored)
        hint = ("; it uses legacy Megatron-LM names (language_model.*): convert it to megatron-core names first"
                if legacy else "")
        raise CheckpointError(f"--init-checkpoint {path}: {len(missing)} of the model's {len(needed)} tensors are "
                              f"not in the checkpoint, e.g. {', '.join(missing[:3])}{hint}")
    wrong = [(k, s, got) for k, s in needed.items()
             if s is not None and (got := _global_shape(stored[prefix + k])) not in (None, s)
             and not _same_but_padding(items[k], s, got, vocab_size)]
    if wrong:
        k, want, got = wrong[0]
        raise CheckpointError(f"--init-checkpoint {path}: {len(wrong)} tensors differ in shape from this model, e.g. "
                              f"{k}: checkpoint {list(got)}, model {list(want)} (a different architecture)")
    # Padding rows the checkpoint lacks load as zeros; megatron's softmax spans them, so the loss moves a little.
    resized = [k for k, s in needed.items() if s is not None and _global_shape(stored[prefix + k]) not in (None, s)]
    if prefix:
        _rekey(state, lambda k: prefix + k)
    opt_state = optimizer.sharded_state_dict(state, is_loading=True)
    opt_keys = [item.key for item in _tensors(opt_state)]
    with_optimizer = bool(opt_keys) and all(k in stored for k in opt_keys)
    if with_optimizer:
        state["optimizer"] = opt_state
    loaded = dist_checkpointing.load(state, str(path), strict=StrictHandling.RAISE_UNEXPECTED)
    for i, chunk in enumerate(model):
        chunk.module.load_state_dict(loaded["model" if len(model) == 1 else f"model{i}"], strict=True)
    if with_optimizer:
        optimizer.load_state_dict(loaded["optimizer"])
    common = load_common_state_dict(str(path))
    return {"path": str(path), "prefix": prefix, "optimizer_state": with_optimizer, "tensors": len(needed),
            "vocab_padding_resized": resized,
            "saved_by": common.get(MLBENCH_KEY) if isinstance(common, dict) else None}


def save(path: str | Path, model: list, optimizer, info: dict) -> None:
    """Saves model and optimizer state to `path` (which must not exist) through a staging folder."""
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.strategies.fully_parallel import FullyParallelSaveStrategyWrapper
    from megatron.core.dist_checkpointing.strategies.torch import TorchDistSaveShardedStrategy

    dest = Path(path)
    staging = dest.with_name(f".{dest.name}.partial")
    if dist.get_rank() == 0:
        if dest.exists():
            raise CheckpointError(f"--save-checkpoint {dest}: exists; a checkpoint is never overwritten")
        shutil.rmtree(staging, ignore_errors=True)  # left by a save that died
        staging.mkdir(parents=True)
    dist.barrier()
    state = model_state(model)
    state["optimizer"] = optimizer.sharded_state_dict(state)
    state[MLBENCH_KEY] = info
    # Synchronous writes (one thread, no worker processes): the async writer's spawned manager does not start
    # from a rank launched as `python -m`.
    strategy = TorchDistSaveShardedStrategy("torch_dist", 1, thread_count=1)
    strategy = FullyParallelSaveStrategyWrapper(strategy)  # tensors replicated across DP are written once
    dist_checkpointing.save(state, str(staging), sharded_strategy=strategy)
    dist.barrier()
    if dist.get_rank() == 0:
        os.rename(staging, dest)
    dist.barrier()
