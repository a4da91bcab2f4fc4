"""Tiny bert (masked LM on the Markov source, LAMB, BERT's schedule) reaches its target."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import assert_tiny_converges

pytestmark = pytest.mark.slow


# At one process: convergence is the model's and the optimizer's, not the layout's. TP 2 (the padded vocabulary
# split over ranks, LAMB's trust ratios over sharded weights, the binary head) computes the one-process losses to
# 1e-5 in test_bert_reference, and test_bert_data trains the full-size definition's model shape at DP 2.
def test_tiny_bert_converges(tmp_path: Path) -> None:
    assert_tiny_converges("bert", [], tmp_path)
