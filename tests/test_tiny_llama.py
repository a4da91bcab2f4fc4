"""Tiny llama31_405b (GQA, SwiGLU, RMSNorm, RoPE, AdamW) reaches its target at 1 process, TP 2 and PP 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import assert_tiny_converges

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("flags", [[], ["--nproc-per-node", "2", "--tp", "2"], ["--nproc-per-node", "2", "--pp", "2"]],
                         ids=["1proc", "tp2", "pp2"])
def test_tiny_llama_converges(flags: list[str], tmp_path: Path) -> None:
    assert_tiny_converges("llama31_405b", flags, tmp_path)
