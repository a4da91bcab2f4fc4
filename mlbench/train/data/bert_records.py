"""MLPerf BERT's pre-masked samples (`data.source: tfrecord`): the reference's TFRecord shards for training,
its eval_10k file for evaluation.

A sample travels as one int64 row of fixed width (ROW_FIELDS, in order), so it fits the sources' one
interface (the whole global batch as rows, sliced by data-parallel rank) and the masked-LM objective splits it
back (`split_rows`). Training order: each pass over the data visits the shard files in an order shuffled by
the run seed and each file's samples in order; step i trains on the pass's samples [i * gbs, (i + 1) * gbs).
The reference (run_pretraining.py input_fn) also shuffles files, then interleaves several and shuffles within
100 samples; that finer mixing is not reproduced. Eval: the eval files' first `eval.samples` samples, in order.
"""

from __future__ import annotations

import glob
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from mlbench.errors import UserError
from mlbench.train.data.source import ALL, TokenSource
from mlbench.train.data.tfrecord import RecordError, parse_example, records


def row_fields(seq: int, predictions: int) -> list[tuple[str, int]]:
    return [("input_ids", seq), ("segment_ids", seq), ("input_mask", seq), ("masked_lm_positions", predictions),
            ("masked_lm_ids", predictions), ("masked_lm_weights", predictions), ("next_sentence_labels", 1)]


def split_rows(rows: np.ndarray, seq: int, predictions: int) -> dict[str, np.ndarray]:
    out, at = {}, 0
    for name, width in row_fields(seq, predictions):
        out[name] = rows[:, at:at + width]
        at += width
    return out


def files(spec: str, flag: str) -> list[str]:
    """The files a --data-path / --eval-data-path names: space-separated files, folders (every file in them)
    or glob patterns, sorted."""
    found: list[str] = []
    for part in spec.split():
        if Path(part).is_dir():
            here = [str(p) for p in Path(part).iterdir() if p.is_file()]
        else:
            here = glob.glob(part) if any(c in part for c in "*?[") else [part] if Path(part).is_file() else []
        if not here:
            raise UserError(f"{flag} {part}: no such file, folder or matching files (MLPerf BERT's TFRecord "
                            f"shards, e.g. 'DIR/part-*-of-00500')")
        found += here
    if not found:
        raise UserError(f"{flag} {spec!r}: names no files")
    return sorted(set(found))


class BertRecords(TokenSource):
    def __init__(self, train: list[str], eval_: list[str], seq: int, predictions: int, global_batch: int,
                 seed: int, vocab_size: int) -> None:
        super().__init__(seq, global_batch)
        self.train_files, self.eval_files = train, eval_
        self.predictions, self.seed, self.vocab_size = predictions, seed, vocab_size
        self._stream: Iterator[np.ndarray] | None = None
        self._next_step = 0

    def _row(self, example: dict[str, np.ndarray], path: str) -> np.ndarray:
        parts = []
        for name, width in row_fields(self.seq_length, self.predictions):
            v = example.get(name)
            if v is None or len(v) != width:
                got = "missing" if v is None else f"{len(v)} values"
                raise RecordError(f"{path}: feature {name} is {got}; this model needs {width} (max_seq_length "
                                  f"{self.seq_length}, max_predictions_per_seq {self.predictions})")
            parts.append(v.astype(np.int64))
        row = np.concatenate(parts)
        ids = row[:self.seq_length]
        if ids.min() < 0 or ids.max() >= self.vocab_size:
            raise RecordError(f"{path}: token id {int(ids.max())} outside the model's vocabulary ({self.vocab_size}):"
                              f" prepared with another vocabulary?")
        return row

    @property
    def row_width(self) -> int:
        return sum(width for _, width in row_fields(self.seq_length, self.predictions))

    @staticmethod
    def _records(paths: list[str]) -> Iterator[tuple[bytes, str]]:
        for path in paths:
            for rec in records(path):
                yield rec, path

    def _passes(self) -> Iterator[tuple[bytes, str]]:
        for epoch in range(1 << 30):
            order = np.random.default_rng([self.seed, epoch]).permutation(len(self.train_files))
            empty = True
            for item in self._records([self.train_files[i] for i in order]):
                empty = False
                yield item
            if empty:
                raise RecordError(f"the training files hold no samples: {self.train_files[:3]}")

    def _parse(self, batch: list[tuple[bytes, str]], rows: slice) -> np.ndarray:
        # Framing every record of the batch is cheap; parsing is not, so only this rank's rows are parsed.
        parsed = [self._row(parse_example(rec), path) for rec, path in batch[rows]]
        return np.stack(parsed) if parsed else np.zeros((0, self.row_width), dtype=np.int64)

    def train_batch(self, step: int, rng: np.random.Generator, rows: slice = ALL) -> np.ndarray:
        if self._stream is None or step != self._next_step:  # start over and skip to the step (a restart)
            self._stream = self._passes()
            for _ in range(step * self.global_batch):
                next(self._stream)
        self._next_step = step + 1
        return self._parse([next(self._stream) for _ in range(self.global_batch)], rows)

    def eval_set(self, n: int, rng: np.random.Generator, rows: slice = ALL) -> np.ndarray:
        batch = []
        for item in self._records(self.eval_files):
            batch.append(item)
            if len(batch) == n:
                return self._parse(batch, rows)
        raise RecordError(f"the eval files hold {len(batch)} samples; the eval set is {n}: {self.eval_files[:3]}")
