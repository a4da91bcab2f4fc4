"""Writes TFRecord files of tf.train.Example, as TensorFlow's TFRecordWriter would (masked CRC32-C of the length
and of the bytes), for tests of MLPerf BERT's data path without TensorFlow."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from mlbench.train.data.tfrecord import masked_crc


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | 0x80 if n else b)
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:  # length-delimited
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _int64(x: int) -> bytes:  # a negative int64 travels as its 64-bit two's complement, as protobuf writes it
    return _varint(int(x) & (1 << 64) - 1)


def example(features: dict[str, np.ndarray], packed: bool = True) -> bytes:
    """An Example of int64 lists (integer arrays), float lists (float arrays) and bytes lists (bytes arrays)."""
    entries = b""
    for name, v in features.items():
        if v.dtype.kind == "f":
            feature = _field(2, _field(1, v.astype("<f4").tobytes()))
        elif v.dtype.kind == "S":
            feature = _field(1, b"".join(_field(1, bytes(x)) for x in v))
        elif packed:
            feature = _field(3, _field(1, b"".join(_int64(x) for x in v)))
        else:  # one varint per value (wire type 0), which protobuf parsers must also accept
            feature = _field(3, b"".join(_varint(1 << 3) + _int64(x) for x in v))
        entries += _field(1, _field(1, name.encode()) + _field(2, feature))
    return _field(1, entries)


def write(path: Path, examples: list[bytes]) -> None:
    with open(path, "wb") as f:
        for e in examples:
            length = struct.pack("<Q", len(e))
            f.write(length + struct.pack("<I", masked_crc(length)) + e + struct.pack("<I", masked_crc(e)))
