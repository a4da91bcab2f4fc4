"""Hostile conditions on the analysis side, each once in-process (the real `mlbench` entry point, `cli.main`, or the
function it calls; no training, no CPU measurement):

- a benchmark file is read only up to a size (a 3 GB one was a MemoryError in `mlbench list`);
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from mlbench import registry
from mlbench.errors import UserError

SET = (Path(__file__).parent / "data" / "mlperf-results" / "training_results_v5.1" / "AMD" / "results"
       / "MI355X_EPYC_9575F_pytorch" / "llama31_8b")
LOG = SET / "result_0.txt"


@pytest.fixture
def mlbench(monkeypatch, capsys):
    """`mlbench ARGS` through its entry point in this process: (exit code, stdout, stderr)."""
    from mlbench import cli

    stdout: list = []  # capsys's, as the test runs (not yet at this fixture's setup)

    def run(*args: object) -> tuple[int, str, str]:
        stdout[:] = stdout or [sys.stdout]
        monkeypatch.setattr(sys, "stdout", stdout[0])  # each time: a failing --json command points it at stderr
        monkeypatch.setattr(sys, "argv", ["mlbench", *map(str, args)])
        try:
            cli.main()
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        out, err = capsys.readouterr()
        assert "Traceback" not in out + err, out + err
        return code, out, err

    return run


# --- a benchmark file's size ------------------------------------------------------------------------------------

@pytest.mark.parametrize("size", [(1 << 20) + 1, 3 << 30])
def test_a_benchmark_file_past_the_size_limit_is_refused_unread(monkeypatch, tmp_path, mlbench, size) -> None:
    """A 3 GB sparse zz.yaml beside the benchmarks was a MemoryError traceback in `mlbench list` (read whole)."""
    shutil.copy(registry.ROOT / "benchmarks" / "gpt3.yaml", tmp_path)
    with open(tmp_path / "zz.yaml", "wb") as f:
        f.truncate(size)  # sparse: no disk used
    monkeypatch.setattr(registry, "BENCHMARKS_DIR", tmp_path)
    with pytest.raises(UserError, match=rf"zz.yaml: cannot read the benchmark file \({size:,} bytes, over the 1 MiB"):
        registry.load("zz")
    code, out, _ = mlbench("list")
    assert code == 2 and out == (f"error: {tmp_path / 'zz.yaml'}: cannot read the benchmark file ({size:,} bytes, "
                                 "over the 1 MiB a benchmark file may hold; the built-in ones are under 20 KB)\n")
    assert registry.load("gpt3").name == "gpt3"


def test_every_built_in_benchmark_file_is_far_below_the_limit() -> None:
    for f in (registry.ROOT / "benchmarks").glob("*.yaml"):
        assert f.stat().st_size < registry.MAX_BENCHMARK_BYTES / 20, f
