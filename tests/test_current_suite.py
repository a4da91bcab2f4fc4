"""The current MLPerf LLM suite (llama31_8b; gpt_oss_20b in test_current_suite_moe.py): definitions against their
sources, the learning-rate table by RCP batch, dry-run logs the official closed rules accept at every RCP batch,
and scores of published submissions equal to the official summarizer's."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import mllog
from test_analysis_score import OFFICIAL, official_summaries

from mlbench import compliance, flops, layout, rcp_schedule, registry
from mlbench.dry_run import closed_rule_problems
from mlbench.errors import UserError
from mlbench.mlperf_log import hyperparameters

RESULTS = Path(__file__).resolve().parent / "data" / "mlperf-results"


def _rcps(benchmark: str) -> dict[int, dict]:
    from mlperf_logging.rcp_checker import rcp_checker

    checker = rcp_checker.RCP_Checker("training", "6.0.0", benchmark, False)
    return {r["BS"]: r["Hyperparams"] for r in checker.rcp_data.values()}


@pytest.mark.parametrize("benchmark", ["llama31_8b"])
def test_the_table_is_the_rcps_hyperparameters(benchmark: str) -> None:
    """Learning rate at every RCP batch as the RCP file says; warm-up = its warm-up samples / batch (rounded
    up: llama31_8b's 16,348 samples at 96 is 170.3 steps)."""
    bench = registry.load(benchmark)
    rcps = _rcps(benchmark)
    assert sorted(bench.optimizer.lr_table) == sorted(rcps) == sorted(bench.optimizer.warmup_table)
    for gbs, hp in rcps.items():
        s = rcp_schedule.at(bench, gbs)
        assert s.lr == hp["opt_base_learning_rate"]
        assert s.warmup_steps == -(-hp["opt_learning_rate_warmup_samples"] // gbs)
        assert s.decay_steps == 1_200_000 - s.warmup_steps  # closed rules, exact
        assert s.min_lr == s.lr / 10  # rules: 0.1 x lr


def test_llama31_8b_values_match_the_published_log() -> None:
    """The hyperparameter lines at batch 32 equal what AMD's v5.1 submission at 32 logged (its lr and warm-up are
    the RCP's), key by key, for every key both write."""
    bench = registry.load("llama31_8b")
    ly = layout.resolve(bench, 1, 8, global_batch_size=32)
    ours = dict(hyperparameters(bench, ly.as_dict(), seed=1))
    published = RESULTS / "training_results_v5.1/AMD/results/MI355X_EPYC_9575F_pytorch/llama31_8b/result_0.txt"
    theirs = {e["key"]: e["value"] for e in map(json.loads, (ln.split(":::MLLOG ", 1)[1] for ln in
                                                             published.read_text().splitlines() if ":::MLLOG " in ln))}
    for key in ("global_batch_size", "max_sequence_length", "opt_name", "opt_base_learning_rate",
                "opt_end_learning_rate", "opt_learning_rate_warmup_steps", "opt_learning_rate_decay_steps",
                "opt_learning_rate_decay_schedule", "opt_adamw_beta_1", "opt_adamw_beta_2", "opt_adamw_epsilon",
                "opt_adamw_weight_decay", "opt_gradient_clip_norm", "eval_samples", "max_steps",
                "init_checkpoint_step"):
        assert ours[key] == theirs[key], key


def test_llama31_8b_parameters_are_meta_s_count() -> None:
    """Meta's Llama-3.1-8B checkpoint: 8,030,261,248 parameters (32 layers of 218,112,000, two 128,256 x 4096
    embeddings, the final norm)."""
    m = registry.load("llama31_8b").model
    assert flops.param_count(m) == 32 * 218_112_000 + 2 * 128_256 * 4096 + 4096 == 8_030_261_248


@pytest.mark.parametrize("benchmark, gbs", [("llama31_8b", 16), ("llama31_8b", 32), ("llama31_8b", 64),
                                            ("llama31_8b", 96), ("llama31_8b", 128)])
def test_dry_run_at_every_rcp_batch_passes_the_closed_rules(benchmark: str, gbs: int) -> None:
    """On one 8-GPU node (the reference layout, gradient accumulation where the batch needs it), the log up to
    run_start passes the official 6.0.0 closed rules, and the RCP checker will use the RCP at that batch."""
    bench = registry.load(benchmark)
    ly = layout.resolve(bench, 1, 8, global_batch_size=gbs)
    assert closed_rule_problems(bench, ly, "ci") == []
    assert compliance.rcp_coverage(bench.mlperf.benchmark, bench.mlperf.ruleset, gbs).startswith(
        f"RCP at global batch {gbs}")


def test_a_batch_off_the_table_is_refused_unless_the_schedule_is_given() -> None:
    bench = registry.load("llama31_8b")
    with pytest.raises(UserError, match=r"interpolated between global batch 32 and 64.*--lr and --warmup-steps"):
        rcp_schedule.for_run(bench, 48)
    with pytest.raises(UserError, match=r"no RCP at or above global batch 256"):
        rcp_schedule.for_run(bench, 256)
    with pytest.raises(UserError, match="both"):
        rcp_schedule.for_run(bench, 48, lr=6e-4)
    given = rcp_schedule.for_run(bench, 48, lr=6e-4, warmup_steps=100)
    assert rcp_schedule.at(given, 48) == rcp_schedule.Schedule(6e-4, 6e-4 / 10, 100, 1_199_900)
    # At an RCP batch one flag is enough: the other comes from the table.
    assert rcp_schedule.at(rcp_schedule.for_run(bench, 64, lr=1e-3), 64).warmup_steps == 96


def _garbled_copy(tmp_path: Path) -> Path:
    """AMD's submission with two run_start lines in result_1 (a copy of it ten minutes earlier) and, in result_0,
    another rank's record cut off by the run_start line on the same line: both pass the official checker. mlbench
    read them otherwise than the official tools (the first run_start; the line as broken JSON, so no run_start),
    and left a run with a note out of the official summarizer's figure: 0.85 minutes off it."""
    import shutil

    org = tmp_path / "training_results_v5.1" / "AMD"
    shutil.copytree(RESULTS / "training_results_v5.1" / "AMD", org)
    folder = org / "results" / "MI355X_EPYC_9575F_pytorch" / "llama31_8b"
    start = re.compile(r'^(:::MLLOG \{"namespace": "", "time_ms": )(\d+)(.*"key": "run_start".*)$', re.M)
    f0, f1 = folder / "result_0.txt", folder / "result_1.txt"
    f0.write_text(start.sub(r'\1\2, "event_type": "POINT_IN_TIME", "key": "trac\1\2\3', f0.read_text(), count=1))
    f1.write_text(start.sub(lambda m: f"{m[1]}{int(m[2]) - 600_000}{m[3]}\n{m[0]}", f1.read_text(), count=1))
    # result_2: its run_stop line ends in a no-break space (0xA0), which the official tools strip (Latin-1, strip())
    # and mlbench read as broken JSON ('no run_stop'); result_3: 200 lines of 60 KB without the token (a progress
    # bar), which the checker skips and mlbench counted as its cost ('could not finish within the limit')
    f2, f3 = folder / "result_2.txt", folder / "result_3.txt"
    f2.write_bytes(re.sub(rb'("key": "run_stop".*)\n', lambda m: m[1] + b"\xa0\n", f2.read_bytes(), count=1))
    lines = f3.read_text().split("\n")
    f3.write_text("\n".join(lines[:5] + ["x" * 60_000] * 200 + lines[5:]))
    # result_5: its run_start time a string, which the official tools read with float(); it was an invalid run here
    f5 = folder / "result_5.txt"
    f5.write_text(start.sub(lambda m: f'{m[1]}"{m[2]}"{m[3]}', f5.read_text(), count=1))
    return org


def test_published_scores_equal_the_official_summarizer(tmp_path: Path) -> None:
    """Published v5.1 llama31_8b submissions (tests/data, Apache-2.0): AMD MI355X at batch 32 and the University
    of Florida's 32 DGX B200 nodes at 128, scored by `mlbench score` and by the official result summarizer; and a
    garbled copy of AMD's that the official tools accept (`_garbled_copy`)."""
    orgs = sorted({p.parent.parent for p in RESULTS.glob("training_results_v*/*/results/*")})
    garbled = _garbled_copy(tmp_path)
    proc = subprocess.run([sys.executable, "-c", OFFICIAL, *map(str, orgs), str(garbled)], capture_output=True,
                          text=True, timeout=300, check=True)
    official = json.loads(proc.stdout)
    from mlbench.analysis.score import score_path

    ours = {s.folder: s for s in score_path(RESULTS, jobs=1) + score_path(garbled, jobs=1)}
    assert set(ours) == set(official) and len(ours) == 3
    for folder, s in ours.items():
        assert s.benchmark == "llama31_8b"
        assert s.score_min == pytest.approx(official[folder], abs=1e-4), folder
        assert s.official_score_min == pytest.approx(official[folder], abs=1e-4), folder
        assert s.rcp.status == "Pass" and all(r.compliant for r in s.runs), folder
    # check judges a published log by the round its path names, as score does (it took llama31_8b's definition's
    # 6.0.0, and passed a file score judged against 5.1.0)
    assert {t.ruleset for t in compliance.targets(garbled, None, "auto")} == {"5.1.0"}
    (g,) = score_path(garbled, jobs=1)
    r0, r1, r2, r3, _, r5 = g.runs[:6]
    for r in (r0, r2, r3, r5):
        assert r.problems == [] and r.status == "success" and r.compliant, (r.file, r.problems, r.compliance)
    assert r1.problems == ["2 run_start lines: time to train is from the last run_start before the first run_stop, "
                           "as the official summarizer reads them"], r1.problems
    # Records parted by a lone CR, which the official tools read as lines (universal newlines): read so here too
    # (mlbench read them as one broken line, the run without run_stop, and gave no official figure)
    f4 = garbled / "results" / "MI355X_EPYC_9575F_pytorch" / "llama31_8b" / "result_4.txt"
    before = g.runs[4]
    f4.write_bytes(re.sub(rb'\n(:::MLLOG [^\n]*"key": "run_stop")', rb"\r\1", f4.read_bytes(), count=1))
    (g,) = score_path(garbled, jobs=1)
    assert g.runs[4].problems == [] and g.runs[4].ttt_min == before.ttt_min and g.runs[4].compliant, g.runs[4]
    assert g.official_score_min == pytest.approx(official[g.folder], abs=1e-4)  # (the same file, read alike)


def test_show_lists_the_current_suite(cli) -> None:
    proc = cli("list")
    assert proc.returncode == 0 and "llama31_8b" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.parametrize("name", ["llama31_8b", "gpt_oss_20b"])
def test_tiny_targets_are_the_floor_plus_the_stated_margin(name: str) -> None:
    from mlbench.train.data.source import markov_source

    b = registry.load(name, tiny=True)
    floor = markov_source(b).entropy_rate
    assert f"{floor:.3f} nats per token" in b.quality.note and "floor + 0.15" in b.quality.note
    assert b.quality.target == pytest.approx(floor + 0.15, abs=0.01)


def test_the_table_survives_the_run_plan(tmp_path) -> None:
    """Ranks read the benchmark from the plan's JSON, whose mapping keys are strings: the table's batches come
    back as integers and resolve the same schedule."""
    from mlbench.run_plan import RunPlan

    bench = registry.load("llama31_8b")
    ly = layout.resolve(bench, 1, 8, global_batch_size=64)
    RunPlan(benchmark=bench, layout=ly.as_dict(), seed=1, run_dir=str(tmp_path), system="ci").save(tmp_path / "p.json")
    back = RunPlan.load(tmp_path / "p.json").benchmark
    assert back.optimizer.lr_table == bench.optimizer.lr_table
    assert rcp_schedule.at(back, 64) == rcp_schedule.at(bench, 64)


def test_a_batch_off_the_table_is_refused_before_launch(tmp_path, cli) -> None:
    proc = cli("run", "llama31_8b", "--dry-run", "--nproc-per-node", "8", "--gbs", "48", "--results",
                   str(tmp_path / "results"))
    said = proc.stderr.strip()
    assert proc.returncode == 2 and len(said.splitlines()) == 1 and proc.stdout == "", (proc.stdout, said)
    assert "interpolated between global batch 32 and 64" in said and "--lr and --warmup-steps" in said
    assert not any(tmp_path.iterdir())


def test_the_user_s_schedule_off_the_table_is_logged(tmp_path, cli) -> None:
    proc = cli("run", "llama31_8b", "--dry-run", "--nproc-per-node", "8", "--gbs", "48", "--lr", "6e-4",
                   "--warmup-steps", "100", "--results", str(tmp_path), "--system", "ci")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    logged = {e["key"]: e["value"] for e in mllog(tmp_path / "ci" / "llama31_8b" / "dry-run.txt")}
    assert (logged["opt_base_learning_rate"], logged["opt_learning_rate_warmup_steps"]) == (6e-4, 100)
    assert logged["opt_learning_rate_decay_steps"] == 1_199_900




def test_a_set_whose_systems_json_the_summarizer_cannot_use_has_no_official_figure(tmp_path: Path) -> None:
    """The systems json missing, lacking a field, or with a count no int() takes: the official summarizer makes no
    row for the set (or stops), and `score` printed its figure beside the score all the same."""
    import shutil

    from mlbench.analysis.score import score_path

    amd = RESULTS / "training_results_v5.1" / "AMD"
    edits = {"missing": lambda d: d.unlink(), "no-division": lambda d: d.write_text(
        json.dumps({k: v for k, v in json.loads(d.read_text()).items() if k != "division"})),
        "nodes-abc": lambda d: d.write_text(json.dumps({**json.loads(d.read_text()), "number_of_nodes": "abc"}))}
    orgs = {}
    for name, edit in edits.items():
        org = tmp_path / name / "training_results_v5.1" / "AMD"
        shutil.copytree(amd, org)
        edit(next((org / "systems").glob("*.json")))
        orgs[name] = org
    official = official_summaries(*orgs.values())
    # no row; no row, then stopped (the summarizer's FieldError, then its NameError); stopped
    assert [official[str(o)] for o in orgs.values()] == [[], "NameError", "ValueError"], official
    for name, org in orgs.items():
        (s,) = score_path(org, jobs=1)
        assert s.score_min is not None and s.official_score_min is None, name
        said = " ".join(s.notes)
        assert "the official summarizer makes no row for this set (or stops): systems/MI355X_EPYC_9575F_pytorch.json" \
            in said, said
        assert {"missing": "is missing", "no-division": "no division field",
                "nodes-abc": "number_of_nodes 'abc' is no whole number"}[name] in said, said


def test_a_file_naming_no_benchmark_is_said_to_be_left_out_of_the_rcp_check(tmp_path: Path) -> None:
    """result_0.txt in UTF-16 (no :::MLLOG line read): mlbench's RCP check passed without it and said nothing,
    while the official RCP checker stops on it (KeyError: None): the note says so."""
    import shutil

    from mlbench.analysis.score import score_path

    org = tmp_path / "training_results_v5.1" / "AMD"
    shutil.copytree(RESULTS / "training_results_v5.1" / "AMD", org)
    log = next(org.glob("results/*/llama31_8b/result_0.txt"))
    log.write_bytes(log.read_text().encode("utf-16"))
    proc = subprocess.run([sys.executable, "-m", "mlperf_logging.rcp_checker", "--rcp_version", "5.1.0",
                           str(log.parent)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode != 0 and "KeyError: None" in proc.stderr, proc.stderr[-500:]
    (s,) = score_path(org, jobs=1)
    assert s.rcp.status == "Pass", s.rcp
    assert any(n.startswith("result_0.txt: no submission_benchmark read, so left out of the RCP check here; the "
                            "official RCP checker, reading every result_*.txt of the folder in its order (") and
               "), stops on such a file (KeyError: None)" in n for n in s.notes), s.notes


def test_a_run_stop_before_its_run_start_is_scored_by_the_summarizer_and_its_figure_given(tmp_path: Path) -> None:
    """result_0's run_stop 10,000 s earlier: invalid here (no time to train), while the official summarizer takes its
    negative time as the fastest run and drops it, printing 99.6803; mlbench printed its figure as unknown ('-')."""
    import shutil

    from mlbench.analysis.score import score_path

    org = tmp_path / "training_results_v5.1" / "AMD"
    shutil.copytree(RESULTS / "training_results_v5.1" / "AMD", org)
    log = next(org.glob("results/*/llama31_8b/result_0.txt"))
    log.write_text(re.sub(r'("time_ms": )(\d+)(, "event_type": "INTERVAL_END", "key": "run_stop")',
                          lambda m: f"{m[1]}{int(m[2]) - 10_000_000}{m[3]}", log.read_text(), count=1))
    proc = subprocess.run([sys.executable, "-c", OFFICIAL, str(org)], capture_output=True, text=True, timeout=300,
                          check=True)
    official = json.loads(proc.stdout)[str(log.parent.resolve())]
    (s,) = score_path(org, jobs=1)
    assert s.official_score_min == pytest.approx(official, abs=1e-4), (s.official_score_min, official)
    assert s.score_min is not None and s.score_min != pytest.approx(s.official_score_min, abs=1e-3)
    assert any(n.startswith("result_0.txt: the official summarizer scores its time as any run's, -") for n in s.notes)


def test_a_log_counted_twice_and_a_factor_below_1_are_said(tmp_path: Path) -> None:
    """A byte copy of result_0.txt as result_10.txt, and result_11.txt a link to result_3.txt: scored as two more
    runs (as the official summarizer scores them) without a word; a scaling.json of 0.5 halved the score, said only
    as a difference from the RCP check's factor."""
    import shutil

    from mlbench.analysis.score import score_path

    folder = tmp_path / "llama31_8b"
    shutil.copytree(next(RESULTS.glob("training_results_v5.1/AMD/results/*/llama31_8b")), folder)
    shutil.copy(folder / "result_0.txt", folder / "result_10.txt")
    (folder / "result_11.txt").symlink_to("result_3.txt")
    (folder / "scaling.json").write_text('{"scaling_factor": 0.5}')
    (s,) = score_path(folder, "5.1.0", jobs=1)
    assert len(s.runs) == 12 and s.score_min == pytest.approx(s.official_score_min), s
    assert "result_10.txt is the same log as result_0.txt (byte for byte): counted as another run, as the official " \
           "summarizer counts it; a set's runs are distinct runs" in s.notes, s.notes
    assert any(n.startswith("result_11.txt is the same log as result_3.txt") for n in s.notes), s.notes
    assert "scaling.json's factor 0.5 is below 1, which no RCP check writes: it makes the score faster than the " \
           "runs; applied, as the official summarizer applies it" in s.notes, s.notes
