"""`mlbench run --dry-run` logs every hyperparameter a real run would, and the official closed rules accept them.

Each case runs the real CLI (`python -m mlbench.cli`, entry point `mlbench.cli:main`) at a realistic scale
(nodes x 8 devices, the benchmark's reference layout for that device count) and checks the `dry-run.txt` it
writes with the official `mlperf_logging.compliance_checker` and the benchmark's own closed ruleset.

A dry-run log stops at run_start: it has no block/eval events, eval_accuracy or run_stop, so the checker's
overall verdict is always FAILED on those. The test instead parses the checker's messages and asserts that
every one of them concerns only those post-run_start events, i.e. that no message names a hyperparameter key
(a failed CHECK, a missing or duplicated key, a failed executed rule). A negative control shows the parse does
catch a hyperparameter the rules reject.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from mlbench import mlperf_log, registry

# Events a dry run cannot have: what the checker may (and must) miss in a log that stops at run_start.
AFTER_RUN_START = {"run_stop", "eval_accuracy", "eval_start", "eval_stop", "block_start", "block_stop",
                   "epoch_start", "epoch_stop"}
SEPARATOR = "-" * 30

# (benchmark, global batch, nodes): 8 devices a node, sized to a reference layout of the benchmark file.
CASES = [
    ("llama31_405b", 576, 64),  # 512 devices: tp 8 pp 8 vp 8 cp 2, dp 4 (NVIDIA v5.0 eos-dfw_n64)
    ("llama31_405b", 1152, 64),
    ("llama31_405b", 2304, 256),  # 2048 devices: dp 16
    ("llama31_405b", 3456, 256),
    ("llama31_405b", 4608, 1024),  # 8192 devices: dp 64
    ("gpt3", 1536, 32),  # 256 devices: tp 4 pp 8 vp 6, mbs 2 (NVIDIA v4.1 eos_n32)
    ("gpt3", 2048, 32),
    ("bert", 8192, 16),  # 128 devices, 64 a device: the reference TPU-v3-128 command, its batch 8192
]


def dry_run(benchmark: str, gbs: int, nodes: int, results: Path) -> Path:
    cmd = [sys.executable, "-m", "mlbench.cli", "run", benchmark, "--dry-run", "--nodes", str(nodes),
           "--nproc-per-node", "8", "--launcher", "torchrun", "--rdzv-endpoint", "localhost:29500",
           "--global-batch-size", str(gbs), "--results", str(results), "--system", "dryrun", "--seed", "7"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    log = results / "dryrun" / benchmark / "dry-run.txt"
    assert log.is_file(), proc.stdout
    return log


def checker_messages(log: Path, ruleset: str, cwd: Path) -> list[str]:
    """The official checker's messages (warnings and errors) on `log`, one string each."""
    cmd = [sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage", "training", "--ruleset", ruleset,
           str(log.resolve())]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)  # cwd: it writes its own log file
    out = proc.stdout + proc.stderr
    body = [ln for ln in out.splitlines() if not ln.startswith(("INFO", "** Logging output", "ERROR - FAILED"))]
    text = "\n".join(body).replace("WARNING - ", "", 1)
    return [m.strip() for m in text.split(SEPARATOR) if m.strip()]


def hyperparameter_problems(messages: list[str]) -> list[str]:
    """Messages about anything but the events a dry run cannot have."""
    bad = []
    for m in messages:
        names = set(re.findall(r"'([a-z0-9_]+)'", m.splitlines()[0]))
        if m.startswith("Required") and names and names <= AFTER_RUN_START:
            continue
        bad.append(m)
    return bad


@pytest.mark.parametrize(("benchmark", "gbs", "nodes"), CASES, ids=[f"{b}-gbs{g}" for b, g, _ in CASES])
def test_dry_run_hyperparameters_pass_closed_rules(benchmark: str, gbs: int, nodes: int, tmp_path: Path) -> None:
    bench = registry.load(benchmark)
    log = dry_run(benchmark, gbs, nodes, tmp_path / "results")
    events = mlperf_log.read(log)
    keys = [e["key"] for e in events]
    assert keys[-1] == "run_start" and "run_stop" not in keys
    logged = {e["key"]: e["value"] for e in events}
    assert logged["global_batch_size"] == gbs
    assert logged["submission_benchmark"] == bench.mlperf.benchmark
    # every hyperparameter a real run logs, with the values it would use at this batch
    layout = {"global_batch_size": gbs, "num_microbatches": logged["gradient_accumulation_steps"],
              "tp": logged["tensor_parallelism"], "pp": logged["pipeline_parallelism"],
              "cp": logged["context_parallelism"], "micro_batch_size": logged["micro_batch_size"]}
    for key, value in mlperf_log.hyperparameters(bench, layout, seed=7):
        assert logged[key] == value, key
    messages = checker_messages(log, bench.mlperf.ruleset, tmp_path)
    assert messages, "the checker must at least miss run_stop in a dry-run log"
    assert hyperparameter_problems(messages) == []


def test_parser_catches_a_rejected_hyperparameter(tmp_path: Path) -> None:
    """Negative control: a learning rate the llama31_405b closed rules reject is reported."""
    log = dry_run("llama31_405b", 1152, 64, tmp_path / "results")
    text = log.read_text()
    good = '"key": "opt_base_learning_rate", "value": 8e-05'
    assert good in text
    log.write_text(text.replace(good, '"key": "opt_base_learning_rate", "value": 9e-05'))
    problems = hyperparameter_problems(checker_messages(log, "6.0.0", tmp_path))
    assert any("opt_base_learning_rate" in p for p in problems), problems
