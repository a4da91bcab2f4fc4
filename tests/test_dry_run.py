"""`mlbench run --dry-run` logs every hyperparameter a real run would, and the official closed rules accept them.

Each case runs the real CLI (`python -m mlbench`, as the `mlbench` script starts it) at a realistic scale
(nodes x 8 devices, the benchmark's reference layout for that device count) and checks the `dry-run.txt` it
writes with the official `mlperf_logging.compliance_checker` and the benchmark's own closed ruleset.

A dry-run log stops at run_start: it has no block/eval events, eval_accuracy or run_stop, so the checker's
overall verdict is always FAILED on those. `mlbench.compliance.before_run_start` (which the dry run itself
reports) parses the checker's messages and keeps those that concern anything else (a failed CHECK, a missing or
duplicated key, a failed executed rule). Negative controls show it catches a hyperparameter the rules reject.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mlbench import compliance, mlperf_log, registry

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


@pytest.fixture
def dry_run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture):
    """`mlbench run BENCHMARK --dry-run` at GBS on NODES x 8 under torchrun, in this process (a subprocess each
    cost an interpreter and its imports: about 1 s of the suite's CPU a case): (its log, its output in one line)."""
    from conftest import mlbench_in_process

    def run(benchmark: str, gbs: int, nodes: int, results: Path, code: int = 0) -> tuple[Path, str]:
        got, out, err = mlbench_in_process(
            monkeypatch, capsys, "run", benchmark, "--dry-run", "--nodes", str(nodes), "--nproc-per-node", "8",
            "--launcher", "torchrun", "--rdzv-endpoint", "localhost:29500", "--global-batch-size", str(gbs),
            "--results", str(results), "--system", "dryrun", "--seed", "7")
        assert got == code, out + err
        log = results / "dryrun" / benchmark / "dry-run.txt"
        assert log.is_file(), out
        return log, " ".join(out.split())
    return run


@pytest.mark.parametrize(("benchmark", "gbs", "nodes"), CASES, ids=[f"{b}-gbs{g}" for b, g, _ in CASES])
def test_dry_run_hyperparameters_pass_closed_rules(benchmark: str, gbs: int, nodes: int, tmp_path: Path,
                                                    dry_run) -> None:
    bench = registry.load(benchmark)
    log, out = dry_run(benchmark, gbs, nodes, tmp_path / "results")
    assert f"closed {benchmark} rules ({bench.mlperf.ruleset}) accept every hyperparameter line" in out
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
    assert compliance.before_run_start(log, bench.mlperf.ruleset) == []
    assert "RCP: " + compliance.rcp_coverage(benchmark, bench.mlperf.ruleset, gbs) in out


# What the official RCP checker (its default, pruned RCPs) will compare a set of runs with, per batch.
RCP_CASES = [
    ("llama31_405b", 1152, "RCP at global batch 1152 (the checker's RCPs: [1152, 2304, 4608])"),
    ("llama31_405b", 3456, "interpolated between global batch 2304 and 4608"),
    ("llama31_405b", 576, "below the smallest RCP, at global batch 1152"),
    ("llama31_405b", 9216, "no RCP at or above global batch 9216 (largest 4608)"),
    ("gpt3", 1536, "below the smallest RCP, at global batch 2048 (its RCP at 1536 is pruned by the checker)"),
    ("bert", 8192, "interpolated between global batch 6912 and 12288 (its RCP at 8192 is pruned by the checker)"),
]


@pytest.mark.parametrize(("benchmark", "gbs", "expected"), RCP_CASES, ids=[f"{b}-{g}" for b, g, _ in RCP_CASES])
def test_rcp_coverage_says_what_the_rcp_checker_will_use(benchmark: str, gbs: int, expected: str) -> None:
    assert expected in compliance.rcp_coverage(benchmark, registry.load(benchmark).mlperf.ruleset, gbs)


def test_full_size_runs_are_checked_against_the_closed_rules_before_launch() -> None:
    """The preflight of `mlbench run` (full sizes, not --dry-run): the log up to run_start, through the official
    checker. At 1160 no learning rate passes llama's exact rule; at 1152 everything does. (The CLI's refusal
    itself is exercised in test_indexed_data, where a real full-size run can start.)"""
    from mlbench import layout as layout_lib
    from mlbench.dry_run import closed_rule_problems

    bench = registry.load("llama31_405b")
    odd = closed_rule_problems(bench, layout_lib.resolve(bench, 145, 8, None, None, None, None, None, 1160), "x")
    assert [compliance.summary(p) for p in odd] == [
        "opt_base_learning_rate (needs v['value'] * 1152 == s['global_batch_size'] * 8e-5)"]
    assert closed_rule_problems(bench, layout_lib.resolve(bench, 64, 8, None, None, None, None, None, 1152), "x") == []


def test_a_rejected_hyperparameter_is_reported_and_fails_the_dry_run(tmp_path: Path, dry_run) -> None:
    """Negative controls: a learning rate the llama31_405b closed rules reject is reported, whether the batch
    makes it (1160: no float passes the checker's exact comparison) or the log was altered."""
    log, out = dry_run("llama31_405b", 1160, 145, tmp_path / "odd", code=1)
    assert "closed llama31_405b rules (6.0.0) reject this log" in out and "opt_base_learning_rate" in out
    log, _ = dry_run("llama31_405b", 1152, 64, tmp_path / "results")
    assert compliance.before_run_start(log, "6.0.0") == []
    text = log.read_text()
    good = '"key": "opt_base_learning_rate", "value": 8e-05'
    assert good in text
    log.write_text(text.replace(good, '"key": "opt_base_learning_rate", "value": 9e-05'))
    problems = compliance.before_run_start(log, "6.0.0")
    assert any("opt_base_learning_rate" in p for p in problems), problems


def test_a_dry_run_says_what_a_real_run_of_the_command_would_be_refused_for(tmp_path: Path, cli) -> None:
    """A dry run plans a run from anywhere, so it does not need the launcher, data, checkpoint or device the real
    run does; it exited 0 without a word where the same command without --dry-run is refused. It says each now."""

    proc = cli("run", "gpt3", "--dry-run", "--nodes", "64", "--nproc-per-node", "8", "--results",
                   str(tmp_path / "a"))
    notes = [ln for ln in proc.stdout.splitlines() if ln.startswith("note: a real run of this command would be")]
    assert proc.returncode == 0 and len(notes) == 3, proc.stdout + proc.stderr
    assert "--launcher local runs on this machine only; for --nodes 64 use --launcher torchrun" in notes[0]
    assert "no data path is given: pass --data-path PREFIX" in notes[1]
    assert "gpt3 starts from a checkpoint: pass --init-checkpoint DIR" in notes[2] and "--dry-run" not in notes[2]
    real = cli("run", "gpt3", "--nodes", "64", "--nproc-per-node", "8", "--results", str(tmp_path / "b"))
    assert real.returncode == 2 and real.stderr.strip() == "error:" + notes[0].split(":", 2)[2], real.stderr
    assert real.stdout == "", real.stdout  # the dry run's note is its output; the real run's refusal an error
    # a tiny local run trains on this machine: its device's refusal (no Transformer Engine here) said too
    proc = cli("run", "bert", "--tiny", "--nproc-per-node", "2", "--cp", "2", "--dry-run", "--results",
                   str(tmp_path / "c"))
    assert proc.returncode == 0 and "note: a real run of this command would be refused: --cp > 1 without " \
        "Transformer Engine" in proc.stdout, proc.stdout
    # one node of a torchrun run is this machine: its device's refusal said too (it was left out for any dry run
    # of several nodes)
    proc = cli("run", "gpt3", "--tiny", "--nodes", "2", "--launcher", "torchrun", "--rdzv-endpoint",
                   "localhost:29999", "--precision", "fp8", "--dry-run", "--results", str(tmp_path / "e"))
    assert proc.returncode == 0 and "note: a real run of this command would be refused: --precision fp8 needs a " \
        "GPU" in proc.stdout, proc.stdout
    # a rendezvous host that does not resolve here (a cluster's name, planned from a laptop): exit 2 before
    rdzv = ["run", "gpt3", "--tiny", "--nodes", "2", "--launcher", "torchrun", "--rdzv-endpoint",
            "no-such-host.invalid:29500"]
    proc = cli(*rdzv, "--dry-run", "--results", str(tmp_path / "f"))
    assert proc.returncode == 0 and "note: a real run of this command would be refused: --rdzv-endpoint " \
        "'no-such-host.invalid:29500': the host 'no-such-host.invalid' does not resolve" in proc.stdout, proc.stdout
    real = cli(*rdzv, "--results", str(tmp_path / "g"))
    assert real.returncode == 2 and "does not resolve" in real.stderr and not (tmp_path / "g").exists(), real.stderr
    # and a command a real run takes says nothing
    proc = cli("run", "gpt3", "--tiny", "--dry-run", "--results", str(tmp_path / "d"))
    assert proc.returncode == 0 and "a real run of this command" not in proc.stdout, proc.stdout


@pytest.mark.parametrize(("name", "old", "new", "said"), [
    ("gpt3", "    target: 1.04", "    target: 0.5",
     "gpt3.yaml (tiny): quality.target 0.5 is at or below 0.8881, the Markov source's entropy rate (vocabulary 128, "
     "data.branching 4, data.concentration 0.5, data.seed 1234): the lowest expected eval log perplexity any model "
     "has, so every run would train its whole budget and abort; give a target above it"),
    # between the real floor (0.8135, 30 % of the positions masked) and the bound with every neighbour seen (0.9205),
    # which was the one checked: accepted, and no run could reach it
    ("bert", "    target: 0.616", "    target: 0.85",
     "bert.yaml (tiny): quality.target 0.85 is at or above 0.8135, a bound of any model's expected masked-token "
     "accuracy on the Markov source (vocabulary 31,"),
], ids=["perplexity-below-the-entropy-rate", "accuracy-above-the-bound"])
@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "run"])
def test_a_tiny_target_the_source_does_not_allow_is_refused_before_launch(benchmarks_copy: Path, tmp_path: Path, cli,
                                                                         name: str, old: str, new: str, said: str,
                                                                         dry: bool) -> None:
    """It was accepted: every run trained its whole budget, then aborted as 'quality target not reached'."""
    f = benchmarks_copy / f"{name}.yaml"
    assert old in f.read_text()
    f.write_text(f.read_text().replace(old, new, 1))
    results = tmp_path / "results"
    proc = cli("run", name, "--tiny", *(["--dry-run"] if dry else []), "--results", results,
               env={"MLBENCH_BENCHMARKS": str(benchmarks_copy)})
    assert proc.returncode == 2 and said in " ".join(proc.stderr.split()), proc.stdout + proc.stderr
    assert not results.exists()


def test_a_dry_run_says_which_attention_it_planned_and_what_a_gpu_without_te_keeps(tmp_path: Path, cli) -> None:
    """A dry run (no GPU here) planned a GPU with Transformer Engine's kernels, while a real run on a GPU without
    it builds other layer specs (preflight.gpu_attention_here): BERT's then keep megatron's local attention and
    its s x s probabilities, 30 GiB more a GPU, which the dry run did not say. It says which kernels it planned and
    what the other keeps; a CPU plan (a tiny fp32 run) says nothing of it."""
    from mlbench import layout as layout_lib
    from mlbench import registry
    from mlbench.planner.memory import estimate

    proc = cli("run", "bert", "--dry-run", "--results", str(tmp_path / "a"))
    said = [ln for ln in proc.stdout.splitlines() if ln.startswith("attention planned:")]
    bench = registry.load("bert")
    layout = layout_lib.resolve(bench)
    te, other = (estimate(bench, layout, on_cpu=False, attention=a).total_bytes for a in ("te", "sdpa"))
    assert proc.returncode == 0 and said == [
        f"attention planned: Transformer Engine's kernels; a GPU without Transformer Engine runs megatron's local "
        f"attention and keeps {(other - te) / 2**30:.2f} GiB more per GPU ({other / 2**30:.2f} GiB)"], proc.stdout
    proc = cli("run", "gpt3", "--tiny", "--dry-run", "--results", str(tmp_path / "b"))
    assert proc.returncode == 0 and "memory per GPU" in proc.stdout and "attention planned" not in proc.stdout
