"""MLPerf BERT's data as the reference writes it: TFRecord files of `tf.train.Example`s, read without TensorFlow.

The reference's `create_pretraining_data.py` writes pre-masked samples, one Example each, with the int64
features input_ids, input_mask, segment_ids (max_seq_length each), masked_lm_positions, masked_lm_ids
(max_predictions_per_seq each), next_sentence_labels (1) and the float feature masked_lm_weights. A TFRecord
file frames each serialized Example as: length (uint64 LE), masked CRC32-C of the length, the bytes, masked
CRC32-C of the bytes. Both CRCs are verified, as TensorFlow's record reader does, so a corrupt, truncated or
foreign file is an error naming the record, not garbage in the batch (google-crc32c: hardware CRC, ~9 GB/s).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from pathlib import Path

import google_crc32c
import numpy as np


class RecordError(ValueError):
    pass


def masked_crc(data: bytes) -> int:
    """TensorFlow's masked CRC32-C (tensorflow/core/lib/hash/crc32c.h Mask): rotated right 15, plus a constant."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def records(path: str | Path) -> Iterator[bytes]:
    """The serialized records of one TFRecord file, in order."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        index = offset = 0
        while offset < size and (header := f.read(12)):  # what was there at open: a file appended to mid-pass
            where = f"{path}: record {index} (byte {offset})"
            length = _length(header, where, size - offset - 12)
            data = f.read(length + 4)
            if len(data) < length + 4:
                raise RecordError(f"{where}: a record of {length} bytes is cut short (truncated file)")
            (data_crc,) = struct.unpack("<I", data[length:])
            if masked_crc(data[:length]) != data_crc:
                raise RecordError(f"{where}: the {length} bytes fail their CRC32-C (corrupt file)")
            yield data[:length]
            index, offset = index + 1, offset + 16 + length


def count_records(path: str | Path, limit: int) -> int:
    """How many records the file holds, up to LIMIT, by their length fields alone (each checked against its CRC
    and the file's size; no record is read): a file's count at the cost of a seek a record."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        index = offset = 0
        while index < limit and offset < size:
            f.seek(offset)
            length = _length(f.read(12), f"{path}: record {index} (byte {offset})", size - offset - 12)
            index, offset = index + 1, offset + 16 + length
    return index


def _length(header: bytes, where: str, left: int) -> int:
    """A record's length from its 12-byte HEADER, checked against the length's CRC and the LEFT bytes after it."""
    if len(header) < 12:
        raise RecordError(f"{where}: truncated record header (not a TFRecord file?)")
    length, length_crc = struct.unpack("<QI", header)
    if masked_crc(header[:8]) != length_crc:
        raise RecordError(f"{where}: the length field fails its CRC32-C (not a TFRecord file, or corrupt)")
    # Held against what the file has left before reading: a length field of 2**40 (its CRC sound) was a
    # MemoryError naming nothing
    if length + 4 > left:
        raise RecordError(f"{where}: a record of {length} bytes is cut short: the file has {max(left - 4, 0)} left "
                          f"(truncated file)")
    return length


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        b = buf[i]
        result |= (b & 0x7F) << shift
        i += 1
        if b < 0x80:
            return result, i
        shift += 7


def _packed_varints(buf: bytes) -> np.ndarray:
    """A packed repeated int64 field, decoded with numpy: each value ends at the first byte below 0x80."""
    b = np.frombuffer(buf, dtype=np.uint8)
    if not len(b):
        return np.zeros(0, dtype=np.int64)
    ends = np.flatnonzero(b < 0x80)
    starts = np.concatenate(([0], ends[:-1] + 1))
    place = np.arange(len(b)) - np.repeat(starts, ends - starts + 1)
    return np.add.reduceat((b & 0x7F).astype(np.int64) << (7 * place), starts)


def _fields(buf: bytes) -> Iterator[tuple[int, int, bytes | int]]:
    """(field number, wire type, value) of one protobuf message: length-delimited values as bytes."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        field, wire = key >> 3, key & 7
        if wire == 2:
            n, i = _varint(buf, i)
            yield field, wire, buf[i:i + n]
            i += n
        elif wire == 0:
            v, i = _varint(buf, i)
            yield field, wire, v
        elif wire == 5:
            yield field, wire, buf[i:i + 4]
            i += 4
        elif wire == 1:
            yield field, wire, buf[i:i + 8]
            i += 8
        else:
            raise RecordError(f"unsupported protobuf wire type {wire}")


def _signed(v: int) -> int:
    """A varint as int64: negative values travel as their 64-bit two's complement (10 bytes)."""
    return v - (1 << 64) if v >= 1 << 63 else v


def parse_example(buf: bytes) -> dict[str, np.ndarray]:
    """A tf.train.Example's int64, float and bytes features (Example.features = 1; Features.feature = 1, a map of
    name = 1 to Feature = 2; Feature: bytes_list = 1, float_list = 2, int64_list = 3; each list's value = 1)."""
    out: dict[str, np.ndarray] = {}
    for _, _, features in _fields(buf):
        for _, _, entry in _fields(features):
            name, feature = "", b""
            for f, _, v in _fields(entry):
                if f == 1:
                    name = v.decode()
                elif f == 2:
                    feature = v
            for kind, _, lst in _fields(feature):
                values = [(w, v) for _, w, v in _fields(lst)]
                if kind == 3:  # int64: packed (wire 2) or one varint per value (wire 0)
                    out[name] = np.concatenate([_packed_varints(v) if w == 2 else np.array([_signed(v)], np.int64)
                                                for w, v in values]) if values else np.zeros(0, np.int64)
                elif kind == 2:  # float: packed little-endian float32
                    out[name] = np.frombuffer(b"".join(v for _, v in values), dtype="<f4").astype(np.float32)
                elif kind == 1:  # bytes: kept (dtype object) so a reader can say a feature has the wrong type
                    out[name] = np.array([v for _, v in values], dtype=object)
    return out
