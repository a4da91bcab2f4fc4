"""The one interface every token source serves (`TokenSource`), and the synthetic Markov source of tiny runs."""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod

import numpy as np

from mlbench.models import family
from mlbench.spec import Benchmark
from mlbench.train.data.markov import MarkovSource

ALL = slice(None)
PAD = -1  # a position with nothing to predict: past a partial eval sequence, or past a window of exactly seq_length


class TokenSource(ABC):
    """Token sequences of `seq_length + 1` tokens (inputs and their next-token labels), int64.

    `rng` is the caller's generator: for a training step seeded [run seed, step], for the eval set
    [data seed, 2**31 - 1]. A source that samples (Markov) draws from it; the caller keeps using it
    afterwards (masked-LM masking), so its state after the call is part of a run's behaviour.
    A row may hold PAD (`data.add_extra_token_to_sequence: false`, `eval.keep_partial_sequence`); its label
    is never scored.
    """

    def __init__(self, seq_length: int, global_batch: int):
        self.seq_length = seq_length
        self.global_batch = global_batch

    @property
    def row_width(self) -> int:
        """The width of the rows this source gives."""
        return self.seq_length + 1

    @abstractmethod
    def train_batch(self, step: int, rng: np.random.Generator, rows: slice = ALL) -> np.ndarray:
        """Rows `rows` (a data-parallel rank's share; default all) of the global batch of step `step` (0-based),
        a batch the same on every rank: [global_batch, seq_length + 1][rows]. Only those rows are read."""

    @abstractmethod
    def eval_set(self, n: int, rng: np.random.Generator, rows: slice = ALL) -> np.ndarray:
        """Rows `rows` of the fixed held-out eval set's first `n` sequences: [n, seq_length + 1][rows]."""


class MarkovTokens(TokenSource):
    def __init__(self, markov: MarkovSource, seq_length: int, global_batch: int):
        super().__init__(seq_length, global_batch)
        self.markov = markov

    # Sampled whole, then sliced: every rank draws the same stream from the same generator.
    def train_batch(self, step: int, rng: np.random.Generator, rows: slice = ALL) -> np.ndarray:
        return self.markov.sample(self.global_batch, self.seq_length + 1, rng)[rows]

    def eval_set(self, n: int, rng: np.random.Generator, rows: slice = ALL) -> np.ndarray:
        return self.markov.sample(n, self.seq_length + 1, rng)[rows]


def markov_source(bench: Benchmark) -> MarkovSource:
    """The synthetic source a tiny run trains on, over the vocabulary its family leaves to tokens (masked LM
    keeps one id for [MASK])."""
    d, m = bench.data, bench.model
    return MarkovSource(family(m.family).markov_vocab(m), d.branching, d.concentration, d.seed)


@functools.lru_cache(maxsize=16)
def best_value(markov: MarkovSource, metric: str, seq_length: int, mask_prob: float = 0.0) -> float:
    """The best expected eval value of METRIC any model has on the source, over sequences of SEQ_LENGTH: its
    entropy rate for log perplexity (exact), an upper bound of masked-token accuracy with each position masked
    with probability MASK_PROB (MarkovSource.masked_lm_accuracy_bound, computed: within 2e-4 of the true value
    at BERT tiny's 0.3). Cached: at the largest vocabulary (4,096) the chain's stationary law takes seconds."""
    if metric == "log_perplexity":
        return markov.entropy_rate
    return markov.masked_lm_accuracy_bound(seq_length, mask_prob)
