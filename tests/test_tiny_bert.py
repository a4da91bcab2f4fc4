"""Tiny bert (masked LM on the Markov source, LAMB, BERT's schedule) reaches its target at TP 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import assert_tiny_converges

pytestmark = pytest.mark.slow


# At TP 2 only: it takes every path a one-process run takes (and the padded vocabulary split over ranks), and
# test_bert_data trains the full-size definition's model shape at DP 2.
@pytest.mark.parametrize("flags", [["--nproc-per-node", "2", "--tp", "2"]], ids=["tp2"])
def test_tiny_bert_converges(flags: list[str], tmp_path: Path) -> None:
    assert_tiny_converges("bert", flags, tmp_path)
