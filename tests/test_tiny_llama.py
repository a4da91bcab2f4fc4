"""Tiny llama31_405b (GQA, SwiGLU, RMSNorm, RoPE, AdamW) reaches its target at 1 process and TP 2 (GQA's groups
split over ranks). Pipeline parallelism is the layers' placement, not the layers': tiny gpt3 proves it at PP 2
(test_tiny_gpt3) and interleaved (test_interleaved_pipeline), and llama at CP 2 and TP 2 with sequence parallel
agrees with its DP 2 run (docs/features.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import assert_tiny_converges

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("flags", [[], ["--nproc-per-node", "2", "--tp", "2"]], ids=["1proc", "tp2"])
def test_tiny_llama_converges(flags: list[str], tmp_path: Path) -> None:
    assert_tiny_converges("llama31_405b", flags, tmp_path)
