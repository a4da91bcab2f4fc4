"""Writes a megatron-core checkpoint in the layout of the MLPerf GPT-3 reference checkpoint (the Megatron one,
`checkpoint_megatron_fp32.tar`), as the reference's `scripts/convert_paxml_to_megatron_distributed.py` and
`json_to_torch.py` write it: `convert(SRC, DST)`.

- one zarr v2 array per tensor, in a folder named by the tensor's legacy Megatron-LM name (README "Checkpoint
  Parameters"; the name table below is the converter's), layers stacked on the first axis;
- uncompressed '<f4' chunks, chunked by the converter's heuristic;
- `metadata.json` {"sharded_backend": "zarr"} and `common.pt` holding the content of `common_fp32.json`: one
  param group (lr, betas, eps, weight decay 0.1, step 4000) and no megatron-core parameter ids.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import torch

from mlbench.train import cpu_compat

cpu_compat.enable()  # before megatron-core's import: its fused kernels stay uncompiled (2-3 s)
from megatron.core.dist_checkpointing.serialization import load_plain_tensors  # noqa: E402

LAYER = "language_model.encoder.layers."
LEGACY = {
    "embedding.word_embeddings.weight": "language_model.embedding.word_embeddings.weight",
    "embedding.position_embeddings.weight": "language_model.embedding.position_embeddings.weight",
    "decoder.final_layernorm.weight": "language_model.encoder.final_layernorm.weight",
    "decoder.final_layernorm.bias": "language_model.encoder.final_layernorm.bias",
    "decoder.layers.self_attention.linear_qkv.layer_norm_weight": LAYER + "input_layernorm.weight",
    "decoder.layers.self_attention.linear_qkv.layer_norm_bias": LAYER + "input_layernorm.bias",
    "decoder.layers.self_attention.linear_qkv.weight": LAYER + "self_attention.query_key_value.weight",
    "decoder.layers.self_attention.linear_qkv.bias": LAYER + "self_attention.query_key_value.bias",
    "decoder.layers.self_attention.linear_proj.weight": LAYER + "self_attention.dense.weight",
    "decoder.layers.self_attention.linear_proj.bias": LAYER + "self_attention.dense.bias",
    "decoder.layers.mlp.linear_fc1.layer_norm_weight": LAYER + "post_attention_layernorm.weight",
    "decoder.layers.mlp.linear_fc1.layer_norm_bias": LAYER + "post_attention_layernorm.bias",
    "decoder.layers.mlp.linear_fc1.weight": LAYER + "mlp.dense_h_to_4h.weight",
    "decoder.layers.mlp.linear_fc1.bias": LAYER + "mlp.dense_h_to_4h.bias",
    "decoder.layers.mlp.linear_fc2.weight": LAYER + "mlp.dense_4h_to_h.weight",
    "decoder.layers.mlp.linear_fc2.bias": LAYER + "mlp.dense_4h_to_h.bias",
}
COMMON_FP32 = {"optimizer": {"param_groups": [{"wd_mult": 1.0, "lr_mult": 1.0, "lr": 5.984178321979609e-05,
                                               "bias_correction": True, "betas": [0.9, 0.95], "eps": 1e-08,
                                               "weight_decay": 0.1, "step": 4000}]}}


def chunks_for(shape: list[int]) -> list[int]:
    """The converter's chunking heuristic (open_array)."""
    chunks = list(shape)

    def reduce(dim: int, by: int) -> None:
        if len(chunks) > dim and chunks[dim] % by == 0:
            chunks[dim] //= by

    if shape[0] > 200:
        reduce(0, 8), reduce(1, 8)
    else:
        chunks[0] = 1
        reduce(1, 8), reduce(2, 8)
    return chunks


def write_array(folder: Path, x: np.ndarray, dtype: str = "<f4") -> None:
    """A zarr v2 array, uncompressed; `dtype` '<f4', or 'bfloat16' (x given as its uint16 bits)."""
    chunks = chunks_for(list(x.shape))
    folder.mkdir(parents=True)
    (folder / ".zarray").write_text(json.dumps({"zarr_format": 2, "shape": list(x.shape), "chunks": chunks,
                                                "dtype": dtype, "compressor": None, "fill_value": None,
                                                "order": "C", "filters": None}))
    for ci in itertools.product(*[range(-(-n // c)) for n, c in zip(x.shape, chunks, strict=True)]):
        block = np.zeros(chunks, dtype=x.dtype)  # edge chunks are stored whole, padded
        part = x[tuple(slice(i * c, (i + 1) * c) for i, c in zip(ci, chunks, strict=True))]
        block[tuple(slice(0, n) for n in part.shape)] = part
        (folder / ".".join(map(str, ci))).write_bytes(block.tobytes(order="C"))


def convert(src: str, dst: str) -> None:
    """SRC (a megatron-core checkpoint) written to DST in the reference's layout, in a process group of one."""
    out = Path(dst)
    out.mkdir()
    for key, t in load_plain_tensors(src).items():
        if not isinstance(t, torch.Tensor):
            continue
        kind, _, param = key.rpartition("optimizer.state.")[2].partition(".") if key.startswith(
            "optimizer.state.") else ("", "", key)
        name = f"optimizer.state.{kind}.{LEGACY[param]}" if kind else LEGACY[param]
        write_array(out / name, t.float().numpy())
    (out / "metadata.json").write_text(json.dumps({"sharded_backend": "zarr"}))
    torch.save(COMMON_FP32, out / "common.pt")
