"""megatron-core's indexed dataset (PREFIX.bin + PREFIX.idx, what megatron's preprocess_data.py writes and
MLPerf's preprocessed C4 is), served by megatron-core's own GPTDataset and BlendedMegatronDatasetBuilder: their
document shuffle, sample packing, blending and index caches. Imports nothing heavy at the top: the pre-launch
checks read `parse_blend`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mlbench.errors import UserError
from mlbench.spec import Benchmark
from mlbench.train.data.source import ALL, PAD, TokenSource

Blend = tuple[list[str], list[float] | None]


class IndexedTokens(TokenSource):
    """Step i's batch = samples [i * gbs, (i + 1) * gbs) of the train dataset (already shuffled by megatron);
    the eval set = the eval dataset's first samples."""

    def __init__(self, train: Any, eval_: Any, seq_length: int, global_batch: int, vocab_size: int):
        super().__init__(seq_length, global_batch)
        self.train, self.eval = train, eval_
        self.vocab_size = vocab_size

    def _rows(self, dataset: Any, start: int, n: int, what: str) -> np.ndarray:
        if start + n > len(dataset):
            raise ValueError(f"the {what} dataset has {len(dataset)} samples; samples up to {start + n} requested")
        out = np.empty((n, self.seq_length + 1), dtype=np.int64)
        for j in range(n):
            s = dataset[start + j]  # GPTDataset: tokens, and labels = the tokens shifted by one
            out[j, :-1] = s["tokens"].numpy()
            out[j, -1] = int(s["labels"][-1])
            # megatron zeroes its padding in tokens and labels and masks those labels' loss: mark them again
            out[j, 1:][s["loss_mask"].numpy() == 0] = PAD
        # A token id past the embedding would fail deep inside the model; name the likely cause instead.
        if n and (out.min() < PAD or out.max() >= self.vocab_size):  # n is 0 for a share of only padding
            raise ValueError(f"{what} data holds token id {int(out.max())} outside the model's vocabulary "
                             f"({self.vocab_size}): prepared with another tokenizer?")
        return out

    def train_batch(self, step: int, rng: np.random.Generator, rows: slice = ALL) -> np.ndarray:
        start, stop, _ = rows.indices(self.global_batch)
        return self._rows(self.train, step * self.global_batch + start, stop - start, "training")

    def eval_set(self, n: int, rng: np.random.Generator, rows: slice = ALL) -> np.ndarray:
        start, stop, _ = rows.indices(n)
        return self._rows(self.eval, start, stop - start, "eval")


def parse_blend(spec: str) -> Blend:
    """megatron's --data-path syntax: "PREFIX", "P1 P2 ..." (weighted by size) or "W1 P1 W2 P2 ..."."""
    parts = spec.split()
    if not parts:
        raise UserError("empty data path")
    if len(parts) % 2 == 0:
        try:
            weights = [float(w) for w in parts[0::2]]
        except ValueError:
            weights = None
        if weights is not None:
            if not all(0 < w < math.inf for w in weights):  # (NaN fails every comparison)
                raise UserError(f"data blend {spec!r}: weights must be positive finite numbers")
            return parts[1::2], weights
    if any(_is_number(p) for p in parts):
        raise UserError(f"data blend {spec!r}: give a weight before every prefix, or none at all")
    return parts, None


def _is_number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


# ---- the indexed source ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class DefinitionTokenizer:
    """What megatron's GPTDatasetConfig reads of a tokenizer (vocabulary size, EOD id), from the definition:
    the corpus is already tokenized, so nothing is loaded. It has no `pad`, so megatron pads with -1."""

    vocab_size: int
    eod: int

    @property
    def unique_identifiers(self) -> dict:  # megatron hashes the config, tokenizer included, into cache names
        return {"class": type(self).__name__, "vocab_size": self.vocab_size, "eod": self.eod}


def _holdout_split(prefix: str, tokens_needed: int) -> str:
    """megatron's split string for one prefix: the last documents holding `tokens_needed` tokens are the
    validation split, the rest is training (split by whole documents, as megatron splits)."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    dataset = IndexedDataset(prefix)
    lengths = np.array(dataset.sequence_lengths)  # a copy: the memory map closes with `dataset`
    del dataset
    n = len(lengths)
    k = int(np.searchsorted(np.cumsum(lengths[::-1], dtype=np.int64), tokens_needed)) + 1
    if k >= n:
        raise ValueError(f"{prefix}: {n} documents, {int(lengths.sum())} tokens: too few to hold out "
                         f"{tokens_needed} eval tokens and still train; pass --eval-data-path")
    return f"{n - k},{k},0"


def indexed_source(bench: Benchmark, *, seed: int, global_batch: int, steps: int, cache: Path) -> IndexedTokens:
    """megatron-core GPT datasets for a run: training shuffled by the run seed, eval fixed by the data seed."""
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    d, seq = bench.data, bench.model.seq_length
    n_train, n_eval = steps * global_batch, bench.eval.samples
    keep_partial = bench.eval.keep_partial_sequence
    tokenizer = DefinitionTokenizer(bench.model.vocab_size,
                                    # EOD tokens leave the loss where data.eod_mask_loss; no position or
                                    # attention resets. Without an eod_id: one past the vocabulary (no token)
                                    d.eod_id if d.eod_id is not None else bench.model.vocab_size)
    train_blend = parse_blend(d.path)
    eval_blend = parse_blend(d.eval_path) if d.eval_path.strip() else None
    split = None if eval_blend else _holdout_split(train_blend[0][0], n_eval * seq + 1)

    def build(random_seed: int, which: int, size: int) -> Any:
        common = dict(random_seed=random_seed, sequence_length=seq, path_to_cache=str(cache), tokenizer=tokenizer,
                      reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=d.eod_mask_loss,
                      create_attention_mask=False, drop_last_partial_validation_sequence=not keep_partial,
                      add_extra_token_to_sequence=d.add_extra_token_to_sequence)
        if eval_blend is None:  # one prefix, megatron's document split
            config = GPTDatasetConfig(blend=train_blend, split=split, **common)
            # Build only the split asked for (the other one, under another seed, is the other builder's).
            config.split_matrix = [m if i == which else None for i, m in enumerate(config.split_matrix)]
        else:
            per_split: list[Blend | None] = [None, None, None]
            per_split[which] = train_blend if which == 0 else eval_blend
            config = GPTDatasetConfig(blend_per_split=per_split, **common)
        sizes: list[int | None] = [None, None, None]
        sizes[which] = size
        return BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, config).build()[which]

    train = build(seed, 0, n_train)
    # The data seed, not the run's: every run evaluates on the same set. Kept whole, the split is one epoch
    # (size None): a size would make megatron wrap into a second epoch to fill the partial sequence.
    eval_ = build(d.seed, 1, None if keep_partial else n_eval)
    for ds, n, what in ((train, n_train, "training"), (eval_, n_eval, "eval")):
        if ds is None or len(ds) < n:
            raise ValueError(f"the {what} data provides {0 if ds is None else len(ds)} sequences of {seq}; "
                             f"the run needs {n}")
    return IndexedTokens(train, eval_, seq, global_batch, bench.model.vocab_size)
