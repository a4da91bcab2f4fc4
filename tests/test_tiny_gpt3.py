"""The whole path on CPU: tiny gpt3 trains with megatron-core to its target, logs, and passes the checker."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from conftest import assert_cpu_rank_bytes, assert_no_markup, mlbench, mllog, result_dir, sample_private_memory

from mlbench import registry
from mlbench.cli import cli as cli_group
from mlbench.preflight import CPU_RANK_BYTES

pytestmark = pytest.mark.slow
TARGET = registry.load("gpt3", tiny=True).quality.target


@pytest.fixture(scope="module")  # under pytest-xdist, `make test` keeps a file's tests in one worker
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One results folder for the convergence runs, so they form a set to score at the end. The CPU is measured
    first (once a machine, cached), so that each record holds the planner's prediction for its run."""
    from mlbench.planner import cpu

    cpu.measured()
    return tmp_path_factory.mktemp("results")


def _index(stdout: str) -> int:
    return int(re.findall(r"result_(\d+)\.txt", stdout)[-1])


def _assert_converged(root: Path, index: int = 0) -> dict:
    folder = result_dir(root, "gpt3")
    log = mllog(folder / f"result_{index}.txt")
    stops = [e for e in log if e["key"] == "run_stop"]
    assert len(stops) == 1 and stops[0]["metadata"]["status"] == "success"
    evals = [e for e in log if e["key"] == "eval_accuracy"]
    assert evals and evals[-1]["value"] <= TARGET
    assert all(e["metadata"]["epoch_num"] % 64 == 0 for e in evals)  # gpt3 counts tokens: samples x seq
    record = json.loads((folder / f"result_{index}.json").read_text())
    assert record["status"] == "success" and record["compliance"]["ok"]
    assert record["time_to_train_min"] > 0 and record["steps"] and record["evals"]
    assert {"torch", "megatron-core", "mlperf-logging"} <= set(record["environment"]["packages"])
    device = record["environment"]["device"]  # as rank 0 found it, not the launching host
    assert device["type"] == "cpu" and device["per_node"] == record["layout"]["nproc_per_node"]
    assert device["precision"] == "fp32" and device["attention"] == "local"  # no GPU path on CPU
    prediction = record["prediction"]  # the planner's, for this layout on the CPU (measured once, cached)
    assert prediction["device"] == "cpu" and prediction["step_time_s"] > 0
    checked = CliRunner().invoke(cli_group, ["check", str(folder / f"result_{index}.txt")])  # in this process
    assert checked.exit_code == 0 and "PASS" in checked.output, checked.output
    return record


def test_one_process_reaches_target_twice(root: Path) -> None:
    """Two runs of one command (`--runs 2`), one after the other, each with its own seed and result."""
    proc = mlbench("run", "gpt3", "--tiny", "--results", str(root), "--seed", "11", "--runs", "2", "--system", "ci")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("target reached") == 2 and "time-to-train" in proc.stdout
    assert_no_markup(proc.stdout)  # ("[green]target reached[/green]" was printed so)
    assert "training on cpu" in proc.stdout and "(fp32, local attention)" in proc.stdout
    first, second = sorted(int(i) for i in re.findall(r"result_(\d+)\.txt", proc.stdout))
    for index, seed in ((first, 11), (second, 12)):
        record = _assert_converged(root, index)
        assert record["layout"]["world_size"] == 1 and record["seed"] == seed


# TP 2 without sequence parallel converges in test_tiny_llama (and bert at TP 2 equals one process in
# test_bert_reference); tiny gpt3 at TP 2 with it, in test_features.
def test_two_pipeline_stages_reach_target(root: Path, tmp_path: Path) -> None:
    """Two ranks forked from mlbench's agent. Each samples its private memory (conftest.sample_private_memory:
    five times a second, 4 ms of CPU a read, about 0.1 s a rank in this run); what it holds beyond its pipeline
    stage's memory plan is what preflight charges such a rank, CPU_RANK_BYTES (measured here: 71 to 83 MiB)."""
    proc = mlbench("run", "gpt3", "--tiny", "--nproc-per-node", "2", "--pp", "2", "--results", str(root),
                   "--seed", "6", "--system", "ci", env=sample_private_memory(tmp_path / "memory"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    i = _index(proc.stdout)
    record = _assert_converged(root, i)
    assert record["layout"]["world_size"] == 2 and record["layout"]["pp"] == 2
    ranks = list((result_dir(root, "gpt3") / "logs" / f"result_{i}").rglob("*.log"))
    assert len([p for p in ranks if p.name == "stderr.log"]) == 2  # per-rank logs gathered with the result
    assert sorted(assert_cpu_rank_bytes(tmp_path / "memory", record, CPU_RANK_BYTES)) == [0, 1]


def test_the_set_scores(root: Path, cli) -> None:
    """The last step of the path: the three runs above (two of one process, one of two) are a set that
    `mlbench score` scores."""
    proc = cli("score", str(result_dir(root, "gpt3")), "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (doc,) = json.loads(proc.stdout)
    assert doc["benchmark"] == "gpt3" and len(doc["runs"]) == 3
    assert all(r["compliant"] and r["status"] == "success" for r in doc["runs"])
    ttts = sorted(r["time_to_train_min"] for r in doc["runs"])
    assert doc["olympic_min"] == pytest.approx(ttts[1])  # 3 runs: the median
    assert doc["rcp_factor"] == 1.0 and doc["score_min"] == pytest.approx(ttts[1])


def test_compare_shows_predicted_against_measured_step_time(root: Path, tmp_path: Path, cli) -> None:
    """`mlbench compare` of two of the runs above: the planner's step time from each record beside the median
    measured one, and their ratio (terminal and Markdown)."""
    folder = result_dir(root, "gpt3")
    records = sorted(folder.glob("result_*.json"))[:2]
    md = tmp_path / "compare.md"
    proc = cli("compare", *(str(r.with_suffix(".txt")) for r in records), "--md", str(md))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    predicted = [json.loads(r.read_text())["prediction"]["step_time_s"] for r in records]
    text = md.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| step time predicted (s)"))
    assert [float(c.split()[0]) for c in row.split("|")[2:4]] == pytest.approx(predicted, abs=1e-4)
    assert "(cpu)" in row and "| predicted / measured" in text
    assert "step time predicted" in proc.stdout and "predicted / measured" in proc.stdout


def test_unreachable_target_is_aborted(tmp_path: Path, benchmarks_copy: Path) -> None:
    """A target the budget does not reach: the budget runs out, the run is aborted. (One below the source's entropy
    floor is refused before launch: tests/test_dry_run.py.)"""
    spec = yaml.safe_load((benchmarks_copy / "gpt3.yaml").read_text())
    spec["tiny"]["quality"]["target"] = 0.9  # above the floor (0.888 nats), and far below 12 steps (1.04 takes ~120)
    spec["tiny"]["train"]["max_steps"] = 12
    spec["tiny"]["eval"]["interval_samples"] = 96
    (benchmarks_copy / "gpt3.yaml").write_text(yaml.safe_dump(spec))
    root = tmp_path / "results"
    proc = mlbench("run", "gpt3", "--tiny", "--results", str(root), "--seed", "1",
                   env={"MLBENCH_BENCHMARKS": str(benchmarks_copy)})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "target NOT reached" in proc.stdout
    folder = result_dir(root, "gpt3")
    stops = [e for e in mllog(folder / "result_0.txt") if e["key"] == "run_stop"]
    assert len(stops) == 1 and stops[0]["metadata"]["status"] == "aborted"
    record = json.loads((folder / "result_0.json").read_text())
    assert record["status"] == "aborted" and "budget" in record["reason"]
    assert len(record["steps"]) == 12


def test_a_diverged_run_stops_at_its_first_non_finite_loss(tmp_path: Path) -> None:
    """A learning rate of 1e18 makes the loss NaN at step 2: the run trained on to its budget of 300 steps of NaN
    (or, from a converted checkpoint holding NaN, 600); every rank now stops there, together, logged aborted."""
    root = tmp_path / "results"
    proc = mlbench("run", "gpt3", "--tiny", "--results", str(root), "--seed", "1", "--lr", "1e18",
                   "--warmup-steps", "0")
    assert proc.returncode == 1, proc.stdout + proc.stderr

    def refuse(constant: str):
        raise AssertionError(f"not strict JSON: {constant}")

    # strict JSON: the NaN loss is null, its key kept (the record held bare NaN, which jq and JSON.parse refuse)
    record = json.loads((result_dir(root, "gpt3") / "result_0.json").read_text(), parse_constant=refuse)
    assert record["status"] == "aborted" and len(record["steps"]) == 2, record["reason"]
    assert record["reason"].startswith("the training loss is nan at step 2: a run whose loss is not a finite number")
    last = record["steps"][-1]
    assert last["step"] == 2 and last["loss"] is None and set(last) == set(record["steps"][0])
    stops = [e for e in mllog(result_dir(root, "gpt3") / "result_0.txt") if e["key"] == "run_stop"]
    assert len(stops) == 1 and stops[0]["metadata"]["reason"] == record["reason"]
