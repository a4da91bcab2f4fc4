"""MLPerf BERT's pre-masked samples (`data.source: tfrecord`): the reference's TFRecord shards for training,
its eval_10k file for evaluation.

A sample travels as one int64 row of fixed width (ROW_FIELDS, in order), so it fits the sources' one
interface (the whole global batch as rows, sliced by data-parallel rank) and the masked-LM objective splits it
back (`split_rows`). Each feature is checked as it is read (its width and list type per record, its values per
batch): a bad sample aborts the run naming the file, record, feature, value and what is allowed.
Training order: each pass over the data visits the shard files in an order shuffled by the run seed and each
file's samples in order; step i trains on the pass's samples [i * gbs, (i + 1) * gbs).
The reference (run_pretraining.py input_fn) also shuffles files, then interleaves several and shuffles within
100 samples; that finer mixing is not reproduced. Eval: the eval files' first `eval.samples` samples, in order.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import numpy as np

from mlbench.errors import UserError
from mlbench.train.data.source import ALL, TokenSource
from mlbench.train.data.tfrecord import RecordError, count_records, parse_example, records

INT, FLOAT = "i", "f"  # numpy dtype kinds of an Example's int64 and float lists (parse_example)
_LISTS = {INT: "an int64 list", FLOAT: "a float list", "O": "a bytes list"}


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
        pattern = any(c in part for c in "*?[")
        if Path(part).is_dir():
            here = [str(p) for p in Path(part).iterdir() if p.is_file()]
        else:
            here = glob.glob(part) if pattern else [part] if Path(part).is_file() else []
        # There, but no file (a FIFO, which the run would block on for ever; a folder a pattern matches): say what
        there = next((m for m in here if not Path(m).is_file()), None) or \
            (part if not here and not pattern and os.path.lexists(part) else None)
        if there is not None:
            from mlbench.logfile import why_not_a_file

            raise UserError(f"{flag} {there}: {why_not_a_file(there)} (MLPerf BERT's TFRecord shards are regular "
                            f"files)")
        if not here:
            raise UserError(f"{flag} {part}: no such file, folder or matching files (MLPerf BERT's TFRecord "
                            f"shards, e.g. 'DIR/part-*-of-00500')")
        found += here
    if not found:
        raise UserError(f"{flag} {spec!r}: names no files")
    return sorted(set(found))


def check_files(train: list[str], eval_: list[str], eval_samples: int,
                named: tuple[str, str] = ("--data-path", "--eval-data-path")) -> None:
    """Before launch, cheaply: each training shard's first record (its length and both CRCs: a file that is no
    TFRecord at all, and training files that hold no sample, were found only mid-run), and the eval files' records,
    counted by their length fields (an eval set short of EVAL_SAMPLES was found at the first eval). NAMED: what gave
    the training and the eval files (a flag, or the benchmark file's key), for the errors."""
    held = 0
    for path in train:
        held += _guarded(named[0], path, lambda p: next((1 for _ in records(p)), 0))  # its first record
    if not held:
        raise UserError(f"{named[0]}: the training files hold no samples: {', '.join(train[:3])}"
                        f"{', ...' if len(train) > 3 else ''}")
    held = 0
    for path in eval_:
        held += _guarded(named[1], path, partial(count_records, limit=eval_samples - held))
        if held >= eval_samples:
            return
    raise UserError(f"{named[1]} {' '.join(eval_[:3])}{' ...' if len(eval_) > 3 else ''}: {held} records; "
                    f"the run evaluates on {eval_samples} (eval.samples): give the whole eval set (MLPerf's eval_10k)")


def _guarded(flag: str, path: str, read: Callable[[str], int]) -> int:
    """READ(PATH), a file that is no TFRecord file or cannot be read said as the user's: FLAG, the file, and why."""
    try:
        return read(path)
    except RecordError as e:
        raise UserError(f"{flag} {e}") from None
    except OSError as e:
        raise UserError(f"{flag} {path}: cannot read it ({e.strerror or e})") from None


class BertRecords(TokenSource):
    def __init__(self, train: list[str], eval_: list[str], seq: int, predictions: int, global_batch: int,
                 seed: int, vocab_size: int) -> None:
        super().__init__(seq, global_batch)
        self.train_files, self.eval_files = train, eval_
        self.predictions, self.seed, self.vocab_size = predictions, seed, vocab_size
        self._stream: Iterator[np.ndarray] | None = None
        self._next_step = 0

    def _example(self, rec: bytes, path: str, index: int) -> dict[str, np.ndarray]:
        """One record's features, each as wide as the model needs and of the type MLPerf's records store it."""
        try:
            example = parse_example(rec)
        except (ValueError, IndexError, TypeError, AttributeError, OverflowError) as e:  # CRC-sound, not protobuf
            raise RecordError(f"{path}: record {index}: not a tf.train.Example ({e})") from None
        for name, width in row_fields(self.seq_length, self.predictions):
            v = example.get(name)
            if v is None or len(v) != width:
                got = "missing" if v is None else f"{len(v)} values"
                raise RecordError(f"{path}: record {index}: feature {name} is {got}; this model needs {width} "
                                  f"(max_seq_length {self.seq_length}, max_predictions_per_seq {self.predictions})")
            want = FLOAT if name == "masked_lm_weights" else INT
            if v.dtype.kind != want:
                raise RecordError(f"{path}: record {index}: feature {name} is {_LISTS[v.dtype.kind]}; MLPerf's "
                                  f"records store it as {_LISTS[want]}")
        return example

    def _limits(self) -> dict[str, tuple[int, str]]:
        """The bound each int64 feature's values stay below (all are >= 0), and what it is, for the reason."""
        vocab = "the model's vocab_size; prepared with another vocabulary?"
        return {"input_ids": (self.vocab_size, vocab), "segment_ids": (2, "segment A or B"),
                "input_mask": (2, "0 padding, 1 token"), "masked_lm_positions": (self.seq_length, "max_seq_length"),
                "masked_lm_ids": (self.vocab_size, vocab), "next_sentence_labels": (2, "the 2-way next-sentence head")}

    def _check_values(self, features: dict[str, np.ndarray], items: list[tuple[bytes, str, int]]) -> None:
        """Every value in its range, a batch at once: out of range, an id or position fails an embedding or
        gather mid-step (or, on a GPU, a device assert); a weight other than 0/1 would be cast away unseen."""
        limits = self._limits()
        for name, v in features.items():
            if name == "masked_lm_weights":
                bad = (v != 0) & (v != 1)  # NaN too
                allowed = "1.0 (a masked token) or 0.0 (padding), as MLPerf's records hold"
            else:
                limit, why = limits[name]
                bad = (v < 0) | (v >= limit)
                allowed = f"[0, {limit}) ({why})"
            if bad.any():
                r, c = np.argwhere(bad)[0]
                _, path, index = items[r]
                found = v[r, c].item()
                found = f"{found:.7g}" if isinstance(found, float) else found  # float32's digits, not float64's
                raise RecordError(f"{path}: record {index}: {name}[{c}] is {found}; allowed: {allowed}")

    @property
    def row_width(self) -> int:
        return sum(width for _, width in row_fields(self.seq_length, self.predictions))

    @staticmethod
    def _records(paths: list[str]) -> Iterator[tuple[bytes, str, int]]:
        """(record, file, its number in the file): what a bad sample's reason names."""
        for path in paths:
            for index, rec in enumerate(records(path)):
                yield rec, path, index

    def _passes(self) -> Iterator[tuple[bytes, str, int]]:
        for epoch in range(1 << 30):
            order = np.random.default_rng([self.seed, epoch]).permutation(len(self.train_files))
            empty = True
            for item in self._records([self.train_files[i] for i in order]):
                empty = False
                yield item
            if empty:
                raise RecordError(f"the training files hold no samples: {self.train_files[:3]}")

    def _parse(self, batch: list[tuple[bytes, str, int]], rows: slice) -> np.ndarray:
        # Framing every record of the batch is cheap; parsing is not, so only this rank's rows are parsed.
        items = batch[rows]
        if not items:
            return np.zeros((0, self.row_width), dtype=np.int64)
        examples = [self._example(*item) for item in items]
        fields = row_fields(self.seq_length, self.predictions)
        features = {name: np.stack([e[name] for e in examples]) for name, _ in fields}
        self._check_values(features, items)
        return np.concatenate([features[name].astype(np.int64) for name, _ in fields], axis=1)  # weights: 0/1

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
