"""Loading zarr distributed checkpoints, the format of the MLPerf GPT-3 reference checkpoint, through
megatron-core's own `dist_checkpointing.load`.

megatron-core 0.16 reads `torch_dist` only: it dropped the zarr strategy its older versions had. The
reference's conversion script (`convert_paxml_to_megatron_distributed.py`) writes one zarr v2 array per tensor:
a folder named by the tensor's key, with `.zarray` metadata and chunk files `i.j.k`, uncompressed, dtype `<f4`
or `bfloat16` (tensorstore's name; megatron's own zarr strategy wrote bf16 as `<V2`), the layers stacked on
the first axis; `metadata.json` says `{"sharded_backend": "zarr"}`. `register()` adds a load strategy for that
backend which reads, for each tensor of a rank, only the chunks its slice covers. Everything else (common.pt,
names, shapes, the optimizer) goes through the same path as a torch_dist checkpoint.

Compressed arrays (megatron's zarr strategy compressed with Blosc) need numcodecs, the zarr project's codecs;
it is imported only for them.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import torch
from megatron.core.dist_checkpointing.core import CheckpointingException
from megatron.core.dist_checkpointing.dict_utils import dict_list_map_inplace
from megatron.core.dist_checkpointing.mapping import ShardedTensor
from megatron.core.dist_checkpointing.strategies.base import (
    LoadShardedStrategy,
    StrategyAction,
    register_default_strategy,
)

# zarr dtype -> (torch dtype, how the bytes are read)
_DTYPES = {"<f4": (torch.float32, "<f4"), "<f2": (torch.float16, "<f2"), "<f8": (torch.float64, "<f8"),
           "bfloat16": (torch.bfloat16, "<u2"), "<V2": (torch.bfloat16, "<u2"), "|V2": (torch.bfloat16, "<u2"),
           "<i8": (torch.int64, "<i8"), "<i4": (torch.int32, "<i4"), "|u1": (torch.uint8, "|u1")}


def array_meta(folder: Path) -> dict:
    try:
        meta = json.loads((folder / ".zarray").read_text())
    except (OSError, ValueError) as e:
        raise CheckpointingException(f"{folder}: cannot read .zarray ({e})") from None
    if meta.get("zarr_format") != 2 or meta.get("dtype") not in _DTYPES or meta.get("filters"):
        raise CheckpointingException(
            f"{folder}: zarr array {meta.get('zarr_format')!r} of dtype {meta.get('dtype')!r} with filters "
            f"{meta.get('filters')!r}; this reader takes zarr v2 arrays of {', '.join(_DTYPES)} without filters")
    # (here, read as the check before launch lists the arrays, not only as the run reads their chunks)
    codec = meta["compressor"].get("id") if isinstance(meta.get("compressor"), dict) else meta.get("compressor")
    if codec is not None and codec not in _COMPRESSORS:
        raise CheckpointingException(f"{folder}: compressor {codec!r}; a zarr checkpoint's arrays are compressed "
                                     f"with one of {', '.join(_COMPRESSORS)}, or not at all")
    return meta


# numcodecs' compressors: its other codecs (pickle, msgpack, JSON) decode chunks into objects, pickle by running them
_COMPRESSORS = ("blosc", "zstd", "lz4", "gzip", "zlib", "bz2", "lzma")


def _decoder(meta: dict, folder: Path):
    if meta.get("compressor") is None:
        return lambda raw: raw
    try:
        import numcodecs
    except ImportError:
        raise CheckpointingException(f"{folder}: compressed with {meta['compressor'].get('id')}; reading it needs "
                                     f"numcodecs (pip install numcodecs)") from None
    return numcodecs.get_codec(meta["compressor"]).decode


def read(folder: Path, index: tuple = ()) -> torch.Tensor:
    """The part `index` (ints and unit-step slices, as ShardedTensor.global_slice gives) of the zarr array in
    `folder`, reading only the chunks it covers. Slices past the array's end are clipped."""
    meta = array_meta(folder)
    shape, chunks = meta["shape"], meta["chunks"]
    dtype, raw_dtype = _DTYPES[meta["dtype"]]
    decode = _decoder(meta, folder)
    sep = meta.get("dimension_separator") or "."
    index = tuple(index) + (slice(None),) * (len(shape) - len(index))
    lo, hi, keep = [], [], []
    for d, ix in enumerate(index):
        if isinstance(ix, int):
            lo.append(ix), hi.append(ix + 1)
        else:
            start, stop, step = ix.indices(shape[d])
            if step != 1:
                raise CheckpointingException(f"{folder}: strided read {ix}")
            lo.append(start), hi.append(max(start, stop))
            keep.append(d)
    out = np.zeros([h - s for s, h in zip(lo, hi, strict=True)], dtype=raw_dtype)
    if meta.get("fill_value") not in (None, 0) and meta["dtype"] in ("<f4", "<f2", "<f8"):
        out[...] = meta["fill_value"]  # chunks never written hold the fill value
    ranges = [range(s // c, -(-h // c)) for s, h, c in zip(lo, hi, chunks, strict=True)]
    for ci in itertools.product(*ranges):
        path = folder / (sep.join(map(str, ci)) if ci else "0")
        if not path.is_file():
            continue
        block = np.frombuffer(decode(path.read_bytes()), dtype=raw_dtype)
        if block.size != int(np.prod(chunks)):
            raise CheckpointingException(f"{path}: {block.size} values, a chunk of {chunks} holds {np.prod(chunks)}")
        block = block.reshape(chunks, order=meta.get("order", "C"))
        src, dst = [], []
        for c, s, h, size in zip(ci, lo, hi, chunks, strict=True):
            a, b = max(s, c * size), min(h, (c + 1) * size)
            src.append(slice(a - c * size, b - c * size))
            dst.append(slice(a - s, b - s))
        out[tuple(dst)] = block[tuple(src)]
    t = torch.from_numpy(out)
    t = t.view(dtype) if raw_dtype == "<u2" else t
    return t.reshape([t.shape[d] for d in keep])


def _fit(x: torch.Tensor, t: ShardedTensor) -> torch.Tensor:
    """Vocabulary padding (allow_shape_mismatch tensors): rows the checkpoint lacks load as zeros, extra rows
    are dropped, as megatron's torch_dist load does."""
    if tuple(x.shape) == tuple(t.local_shape) or not t.allow_shape_mismatch:
        return x
    out = torch.zeros(t.local_shape, dtype=x.dtype)
    common = tuple(slice(0, min(a, b)) for a, b in zip(x.shape, t.local_shape, strict=True))
    out[common] = x[common]
    return out


class ZarrLoadStrategy(LoadShardedStrategy):
    def check_backend_compatibility(self, loaded_backend: str) -> None:
        if loaded_backend != "zarr":
            raise CheckpointingException(f"the zarr strategy cannot read a {loaded_backend!r} checkpoint")

    def check_version_compatibility(self, loaded_version: int) -> None:
        pass  # the reference's metadata.json gives no version (megatron reads it as 1)

    def load(self, sharded_state_dict: dict, checkpoint_dir: str | Path) -> dict:
        def one(t: ShardedTensor) -> torch.Tensor:
            if not isinstance(t, ShardedTensor):
                raise CheckpointingException(f"zarr checkpoints hold tensors only, not {type(t).__name__}")
            x = _fit(read(Path(checkpoint_dir) / t.key, t.global_slice()), t)
            if t.flattened_range is not None:  # a distributed optimizer's slice of the flattened tensor
                x = x.flatten()[t.flattened_range]
            return x.to(t.dtype)

        return dict_list_map_inplace(one, sharded_state_dict)

    def load_tensors_metadata(self, checkpoint_dir: str | Path, metadata: object = None) -> dict:
        out = {}
        for folder in sorted(Path(checkpoint_dir).iterdir()):
            if (folder / ".zarray").is_file():
                meta = array_meta(folder)
                data = torch.empty(meta["shape"], dtype=_DTYPES[meta["dtype"]][0], device="meta")
                out[folder.name] = ShardedTensor.from_rank_offsets(folder.name, data, replica_id=0)
        return out

    def load_sharded_metadata(self, checkpoint_dir: str | Path) -> dict:
        return self.load_tensors_metadata(checkpoint_dir)

    @property
    def can_handle_sharded_objects(self) -> bool:
        return False


def register() -> None:
    """megatron's loaders pick a strategy by the backend metadata.json names; version 1 is what it reads for a
    metadata.json without one."""
    register_default_strategy(StrategyAction.LOAD_SHARDED, "zarr", 1, ZarrLoadStrategy())
