"""Tiny llama (GQA, SwiGLU, RMSNorm, RoPE, AdamW) reaches its target: llama31_405b's tiny variant and llama31_8b's
(the same tiny model under the current suite's rules and RCP table, so its log is checked against training 6.0.0),
each at 1 process. Tensor parallelism (GQA's groups split over ranks) computes what one process does: TP 2 from a
TP 1 checkpoint gives TP 1's losses to 1e-4 (test_checkpoints.py), so a second convergence at TP 2 (two ranks, 13 s
of the suite's CPU) proved nothing more. Pipeline parallelism is the layers' placement, not the layers': tiny gpt3
proves it at PP 2 (test_tiny_gpt3) and interleaved (test_interleaved_pipeline), and llama at CP 2 and TP 2 with
sequence parallel agrees with its DP 2 run (docs/features.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import assert_tiny_converges

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("benchmark, flags", [("llama31_405b", []), ("llama31_8b", [])], ids=["405b", "8b"])
def test_tiny_llama_converges(benchmark: str, flags: list[str], tmp_path: Path) -> None:
    assert_tiny_converges(benchmark, flags, tmp_path)
