"""Reading a checkpoint's pickles without running them.

A torch_dist checkpoint holds three kinds of pickle: its tensor index `.metadata` (torch reads it with a plain
pickle.load), its non-tensor state `common.pt` (megatron-core's torch.load), and byte records in its `.distcp`
files (layers' `_extra_state`, which torch's load planner reads with torch.load(weights_only=False)). Any pickle can
name a function to call as it is read (os.system): a checkpoint from elsewhere ran code on the machine that loaded
it, in the pre-launch check and in every rank. Within `no_code_run()` the index is read by an unpickler that builds
torch.distributed.checkpoint's metadata classes alone, and every torch.load is weights_only (torch's and
megatron-core's allowlists), whatever TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD or a caller asks.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import importlib
import io
import os
import pickle
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from mlbench.train.checkpoint.folder import CheckpointError, load_error, refused_global

# Where torch (now and in the versions that wrote older checkpoints) defines what a `.metadata` holds: its
# dataclasses and enums are built from the pickle, nothing else of these modules.
_INDEX_MODULES = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.planner",
                  "torch.distributed.checkpoint.filesystem", "torch.distributed._shard.metadata",
                  "torch.distributed._shard.sharded_tensor.metadata")
_TORCH_VALUES = (torch.dtype, torch.layout, torch.memory_format)  # pickled as globals: torch.float32
# torch.load honours the first whatever weights_only its caller passes (torch's planner passes False)
_FORCE, _NO_FORCE = "TORCH_FORCE_WEIGHTS_ONLY_LOAD", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"


class RefusedPickle(pickle.UnpicklingError):
    """A pickle that names a global no checkpoint index holds (the text is torch's weights_only wording, which
    folder.refused_global reads for both)."""

    def __init__(self, name: str):
        super().__init__(f"unsupported GLOBAL {name}: not a class of a checkpoint's index")


def _index_global(module: str, name: str) -> Any:
    if "." in name:  # a dotted name reaches whatever the module imported (os.system through it)
        return None
    if module in _INDEX_MODULES:
        try:
            obj = getattr(importlib.import_module(module), name, None)
        except ImportError:
            return None
        plain = isinstance(obj, type) and (dataclasses.is_dataclass(obj) or issubclass(obj, enum.Enum))
        return obj if plain and obj.__module__ == module else None
    if module == "torch":
        obj = getattr(torch, name, None)
        return obj if obj is torch.Size or isinstance(obj, _TORCH_VALUES) else None
    if (module, name) == ("torch.serialization", "_get_layout"):  # a layout from its name
        return torch.serialization._get_layout
    return collections.OrderedDict if (module, name) == ("collections", "OrderedDict") else None


class _IndexUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        obj = _index_global(module, name)
        if obj is None:
            raise RefusedPickle(f"{module}.{name}")
        return obj


def read_index(f: io.BufferedIOBase) -> Any:
    """A `.metadata` file's Metadata, built from torch.distributed.checkpoint's classes alone."""
    return _IndexUnpickler(f).load()


def _read_metadata(self, *args: Any, **kwargs: Any) -> Any:
    """FileSystemReader.read_metadata (torch 2.6+), its pickle.load replaced by read_index."""
    from torch.distributed.checkpoint.metadata import StorageMeta

    with self.fs.create_stream(self._get_metadata_path(kwargs.get("rank")), "rb") as f:
        metadata = read_index(f)
    if getattr(metadata, "storage_meta", None) is None:
        metadata.storage_meta = StorageMeta()
    metadata.storage_meta.load_id = self.load_id
    return metadata


@contextmanager
def no_code_run() -> Iterator[None]:
    """Within it, torch's checkpoint reader (and megatron-core's, its subclass) reads `.metadata` with read_index,
    and every torch.load (common.pt, the .distcp byte records, megatron's object files) is weights_only."""
    from torch.distributed.checkpoint.filesystem import FileSystemReader

    env = {k: os.environ.get(k) for k in (_FORCE, _NO_FORCE)}
    original = FileSystemReader.__dict__["read_metadata"]
    os.environ.pop(_NO_FORCE, None)
    os.environ[_FORCE] = "1"
    FileSystemReader.read_metadata = _read_metadata  # type: ignore[method-assign]
    try:
        yield
    finally:
        FileSystemReader.read_metadata = original  # type: ignore[method-assign]
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def check_byte_records(path: Path, metadata: Any) -> None:
    """Each byte record of the .distcp files loads as plain data (torch.load(weights_only=True)): a record that
    would import a function is refused before anything loads it."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    for index, info in metadata.storage_data.items():
        if not isinstance(metadata.state_dict_metadata.get(index.fqn), BytesStorageMetadata):
            continue
        if getattr(info, "transform_descriptors", None):
            continue  # stored compressed: read through torch's transforms, weights_only there too
        try:
            with open(path / info.relative_path, "rb") as f:
                f.seek(info.offset)
                record = f.read(info.length)
        except OSError as e:
            raise CheckpointError(f"--init-checkpoint {path}: {info.relative_path}: {e.strerror or e}") from None
        try:
            torch.load(io.BytesIO(record), map_location="cpu", weights_only=True)
        except Exception as e:
            if (name := refused_global(e)) is None:
                raise CheckpointError(f"--init-checkpoint {path}: {info.relative_path}: the record of {index.fqn} "
                                      f"cannot be read ({load_error(e)}); a damaged checkpoint") from None
            raise refused(path, f"{info.relative_path} (the record of {index.fqn})", name) from None


def refused(path: str | Path, file: str, name: str) -> CheckpointError:
    """The one-line refusal of a checkpoint file whose pickle would import NAME."""
    return CheckpointError(f"--init-checkpoint {path}: {file} would import {name} as it is read, which no "
                           f"checkpoint holds: refused, nothing of it run (a checkpoint holds tensors and plain "
                           f"data; take it from its source again)")
