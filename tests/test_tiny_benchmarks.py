"""The tiny llama31_405b and bert variants reach their targets through the real CLI, at 1 and 2 processes.

Each run: exit 0, result_0.txt ends with run_stop status success, its last eval_accuracy meets the tiny target,
and `mlbench check` (the official checker with the smoke rules) passes.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mlbench import mlperf_log, registry

ROOT = Path(__file__).resolve().parent.parent

CASES = [
    ("llama31_405b", []),
    ("llama31_405b", ["--nproc-per-node", "2", "--tp", "2"]),
    ("llama31_405b", ["--nproc-per-node", "2", "--pp", "2"]),
    ("bert", []),
    ("bert", ["--nproc-per-node", "2", "--tp", "2"]),
]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mlbench.cli", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize(("benchmark", "flags"), CASES,
                         ids=[f"{b}-{'-'.join(f.lstrip('-') for f in fl) or '1proc'}" for b, fl in CASES])
def test_tiny_converges(benchmark: str, flags: list[str], tmp_path: Path) -> None:
    bench = registry.load(benchmark, tiny=True)
    proc = _cli("run", benchmark, "--tiny", "--results", str(tmp_path), "--system", "ci", "--seed", "3", *flags)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = tmp_path / "ci" / benchmark / "result_0.txt"
    events = mlperf_log.read(result)
    stops = [e for e in events if e["key"] == "run_stop"]
    assert len(stops) == 1 and stops[0]["metadata"]["status"] == "success"
    evals = [e["value"] for e in events if e["key"] == "eval_accuracy"]
    assert evals and bench.converged(evals[-1]), evals
    check = _cli("check", str(result))
    assert check.returncode == 0, check.stdout + check.stderr
