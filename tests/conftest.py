"""Shared helpers: run the real `mlbench` command as a user would, and read what it wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

MLBENCH = [sys.executable, "-m", "mlbench.cli"]


def mlbench(*args: str, env: dict | None = None, timeout: float = 300, cwd: Path | None = None):
    """Run `mlbench ARGS` in a subprocess; returns the CompletedProcess (stdout and stderr as text)."""
    full_env = dict(os.environ, COLUMNS="200", **(env or {}))
    return subprocess.run([*MLBENCH, *args], capture_output=True, text=True, timeout=timeout, env=full_env,
                          cwd=cwd)


def mllog(path: Path) -> list[dict]:
    out = []
    for line in Path(path).read_text().splitlines():
        if line.startswith(":::MLLOG "):
            out.append(json.loads(line[len(":::MLLOG "):]))
    return out


def result_dir(root: Path, benchmark: str) -> Path:
    systems = [p for p in root.iterdir() if p.is_dir()]
    assert len(systems) == 1, systems
    return systems[0] / benchmark


@pytest.fixture
def benchmarks_copy(tmp_path: Path) -> Path:
    """A private copy of benchmarks/ that a test may edit (pointed at by MLBENCH_BENCHMARKS)."""
    src = Path(__file__).resolve().parents[1] / "benchmarks"
    dst = tmp_path / "benchmarks"
    dst.mkdir()
    for f in src.glob("*.yaml"):
        (dst / f.name).write_text(f.read_text())
    return dst
