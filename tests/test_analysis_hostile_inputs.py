"""Hostile input files for the analysis (score, compare, scaling, check): values a parser or a float cannot hold
(5000 digits, 10^400, nesting 100,000 deep) and values that parse but cannot be true (a negative samples count or
step time, a run of no length, a device count of [8]). Each is a one-line reason naming the file, never a
traceback, a warning on stderr, or a figure silently computed from a replacement."""

from __future__ import annotations

import json
import math
import re
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from test_analysis_garbled import RULESET, _garble, _sets, _strict, mlbench
from test_analysis_logs import _line, tiny_log

from mlbench import logfile
from mlbench.analysis import step_times
from mlbench.analysis.logs import find_sets, read_log
from mlbench.logfile import load_json, time_to_train_s

DEEP = "[" * 100_000 + "]" * 100_000  # parses with no limit on depth, but not with Python's recursion limit


# --- device counts ----------------------------------------------------------------------------------------------

def _tree(root: Path, system: dict | str, record: dict | None = None) -> Path:
    """ORG/systems/sys.json (SYSTEM, as it is when a string) and ORG/results/sys/llama31_8b/result_0.txt, with a
    run record RECORD beside it when given."""
    (root / "ORG" / "systems").mkdir(parents=True)
    (root / "ORG" / "systems" / "sys.json").write_text(system if isinstance(system, str) else json.dumps(system))
    d = root / "ORG" / "results" / "sys" / "llama31_8b"
    d.mkdir(parents=True)
    (d / "result_0.txt").write_text(tiny_log())
    if record is not None:
        (d / "result_0.json").write_text(json.dumps(record))
    return d


TINY_QUALITY = {"metric": "log_perplexity", "target": 1.04, "direction": "min"}  # as a tiny run's record states


def _tiny_runs(root: Path, log: str, quality: object = TINY_QUALITY) -> Path:
    """ROOT/ci/llama31_8b holding three runs of LOG, each with a tiny run's record stating QUALITY."""
    folder = root / "ci" / "llama31_8b"
    folder.mkdir(parents=True)
    for i in range(3):
        (folder / f"result_{i}.txt").write_text(log)
        (folder / f"result_{i}.json").write_text(json.dumps({"variant": "tiny", "quality": quality}))
    return folder


# (systems json as written, what the reason says) - each was read as a count or crashed
BAD_SYSTEMS = [
    ('{"number_of_nodes": "%s", "accelerators_per_node": "8"}' % ("1" * 5000),  # ValueError: 4300 digits
     'number_of_nodes "1111111111'),
    ('{"number_of_nodes": %s, "accelerators_per_node": 8}' % ("1" + "0" * 400), "number_of_nodes 1000000000"),
    ('{"number_of_nodes": "1", "accelerators_per_node": [8]}', "accelerators_per_node [8] is not a whole count"),
    ('{"number_of_nodes": "1", "accelerators_per_node": "8.5"}', 'accelerators_per_node "8.5" is not a whole'),
    ('{"number_of_nodes": "1", "accelerators_per_node": "\u00b2"}', 'accelerators_per_node "\\u00b2"'),  # isdigit
    ('{"number_of_nodes": 0, "accelerators_per_node": 8}', "number_of_nodes 0 is not a whole count"),
    (DEEP, "systems/sys.json is not JSON (JSON nested too deeply to parse)"),  # RecursionError
]


@pytest.mark.parametrize("system,reason", BAD_SYSTEMS, ids=["5000 digits", "10^400", "[8]", '"8.5"', "superscript",
                                                             "0", "deep"])
def test_a_bad_systems_json_count_is_passed_over_and_said(tmp_path, system, reason):
    """[8] or "8.5" per node gave 1 device a node, labelled as from the systems json: per-device figures 8x off."""
    d = _tree(tmp_path, system, {"devices": 4})
    rs = find_sets(d)[0]
    n, source = rs.devices()
    assert n == 4 and source.startswith("run record (") and reason in source, source
    assert "systems/sys.json" in source and len(source.splitlines()) == 1 and len(source) < 200
    (d / "result_0.json").unlink()
    n, source = find_sets(d)[0].devices()
    assert n is None and source.startswith("unknown (") and reason in source


def test_a_good_systems_json_still_counts(tmp_path):
    d = _tree(tmp_path, {"number_of_nodes": "2", "accelerators_per_node": 8.0}, {"devices": 4})
    assert find_sets(d)[0].devices() == (16, "systems json")
    # --devices overrides it, and says so where the systems json says another count (the help said it was only a
    # fallback: a published 256-device set scored as 8 devices without a word)
    assert find_sets(d)[0].devices(3) == (3, "given (the systems json says 16: --devices overrides it)")
    assert find_sets(d)[0].devices(16) == (16, "given")


def test_score_and_compare_say_why_a_count_was_passed_over(tmp_path, capsys, monkeypatch):
    d = _tree(tmp_path / "a", '{"number_of_nodes": "1", "accelerators_per_node": [8]}', {"devices": 4})
    other = _tree(tmp_path / "b", {"number_of_nodes": "1", "accelerators_per_node": "8"}, {"devices": 8})
    why = "systems/sys.json accelerators_per_node [8] is not a whole count"
    code, out = mlbench(capsys, monkeypatch, "score", str(d), "--ruleset", RULESET, "--json")
    assert code == 0, out
    s = _strict(out)[0]
    assert s["devices"] == 4 and why in s["devices_from"]
    assert any(n.startswith("device count 4, from the run record: ") and why in n for n in s["notes"]), s["notes"]
    code, out = mlbench(capsys, monkeypatch, "compare", str(d), str(other), "--no-score")
    flat = " ".join(out.split())
    assert code == 0 and "4 (run record" in flat and why in flat, out


@pytest.mark.parametrize("devices", ["1" + "0" * 5000, 10**400, 1e300, "8.5", [8], True],
                         ids=["5001 digits", "10^400", "1e300", '"8.5"', "[8]", "true"])
def test_a_bad_run_record_count_is_unknown_and_said(tmp_path, capsys, monkeypatch, devices):
    a, b = _sets(tmp_path, tiny_log())
    # mfu and the prediction are read from the record too: 10^400 overflowed math.isfinite
    (a / "result_0.json").write_text(json.dumps({"devices": devices, "mfu": 10**400,
                                                 "prediction": {"step_time_s": 10**400, "device": "h100"}}))
    n, source = find_sets(a)[0].devices()
    assert n is None and source.startswith("unknown (result_0.json devices ") and "not a whole count" in source
    code, out = mlbench(capsys, monkeypatch, "compare", str(a), str(b), "--no-score")
    assert code == 0 and "device count unknown (result_0.json devices" in " ".join(out.split()), out
    code, out = mlbench(capsys, monkeypatch, "scaling", str(a), str(b))
    assert code == 2 and len(out.strip().splitlines()) == 1 and "device count unknown" in out, out


# --- run records and systems jsons nested too deeply ---------------------------------------------------------------

def test_json_nested_too_deeply_is_bad_json(tmp_path):
    f = tmp_path / "x.json"
    f.write_text(DEEP)
    with pytest.raises(ValueError, match="nested too deeply"):
        load_json(f)


def test_a_deep_run_record_is_no_crash_in_any_command(tmp_path, capsys, monkeypatch):
    a, b = _sets(tmp_path, tiny_log())
    (a / "result_0.json").write_text(DEEP)
    code, out = mlbench(capsys, monkeypatch, "score", str(a), "--ruleset", RULESET, "--json")
    assert code == 0 and _strict(out)[0]["devices"] is None, out
    for args in (("compare", str(a), str(b), "--no-score"), ("compare", str(a / "result_0.txt"), str(b))):
        code, out = mlbench(capsys, monkeypatch, *args)
        assert code == 0 and "Traceback" not in out, out
    code, out = mlbench(capsys, monkeypatch, "scaling", str(a), str(b), "--devices", "8", "--devices", "16")
    assert code == 0, out
    code, out = mlbench(capsys, monkeypatch, "check", str(a / "result_0.txt"), "--ruleset", RULESET)
    assert code in (0, 1) and "result_0.json cannot be read (JSON nested too deeply to parse)" in out, out


# --- log values that parse but cannot be true -----------------------------------------------------------------------

@pytest.mark.parametrize("new,shown", [('"samples_count": -172000', "-172000"),
                                       ('"samples_count": 1.5e300', "1.5e+300"), ('"epoch_num": -1', "-1")],
                         ids=["negative", "1.5e300", "epoch -1"])
def test_a_samples_count_below_0_or_absurd_invalidates_the_run(tmp_path, new, shown):
    text, line = _garble(tiny_log(), "eval_accuracy", '"samples_count": 40', new)
    f = tmp_path / "result_0.txt"
    f.write_text(text)
    log = read_log(f)
    name = new.split('"')[1]
    assert f"{f}:{line}: eval_accuracy {name} is {shown}, expected a count at least 0 and below 2^53: the run " \
           "cannot count" in log.problems, log.problems
    assert log.status == "invalid" and log.samples_to_converge is None and log.ttt_min is None


@pytest.mark.parametrize("old,new,shown", [
    ('"train_step_time": 0.5', '"train_step_time": -0.05', "train_step_time is -0.05"),
    ('"train_step_time": 0.5', '"train_step_time": 0', "train_step_time is 0"),
    ('"train_step_time": 0.5', '"train_step_time": 1e308', "train_step_time is 1e+308"),
    ('"tokens_per_s": 2048.0', '"tokens_per_s": -2048.0', "tokens_per_s is -2048.0"),
    # summed to inf, shown as the mean TFLOP/s with numpy's overflow warning
    ('"tflops_per_device": 100.0', '"tflops_per_device": 1e308', "tflops_per_device is 1e+308"),
    # a step of 5e-324 s: tokens/s of inf; 1e-300, of 300 digits
    ('"train_step_time": 0.5', '"train_step_time": 5e-324', "train_step_time is 5e-324"),
    # passed over as "other statistics NVIDIA logs under this key", without a word
    ('"value": {"train_step_time": 0.5, "tokens_per_s": 2048.0, "tflops_per_device": 100.0}', '"value": [1, 2]',
     "is [1, 2]"),
], ids=["negative", "zero", "1e308", "negative tokens", "1e308 tflops", "5e-324", "value a list"])
def test_an_implausible_step_is_a_problem_left_out_of_the_statistics(tmp_path, old, new, shown):
    text, line = _garble(tiny_log(), "tracked_stats", old, new)
    f = tmp_path / "result_0.txt"
    f.write_text(text)
    log = read_log(f)
    assert any(p.startswith(f"{f}:{line}: tracked_stats {shown}, expected") for p in log.problems), log.problems
    assert log.status == "success"  # a step record does not decide the run
    assert len(log.step_times.seconds) == 4 and log.step_times.stats()["median"] == pytest.approx(0.5)


@pytest.mark.parametrize("step", ["7", "1.5", "1e300"])
def test_records_left_out_for_a_step_that_does_not_rise_are_counted_in_the_note(tmp_path, step):
    """metadata.step the same on every line: all records but the first were left out (taken for NVIDIA's block
    summaries) without a word, and the median was the first step's."""
    text = re.sub(r'"step": \d+', f'"step": {step}', tiny_log(steps=6))
    f = tmp_path / "result_0.txt"
    f.write_text(text)
    st = read_log(f).step_times
    assert len(st.seconds) == 1 and "5 of 6 records in the timed region left out, their metadata step not above the " \
        "steps before it" in st.note, st.note
    assert "left out" not in read_log(_write(tmp_path / "ok.txt", tiny_log(steps=6))).step_times.note


def _write(path, text):
    path.write_text(text)
    return path


def test_compare_shows_no_negative_step_time_and_prints_no_warning(tmp_path, capsys, monkeypatch):
    """Every step time -0.05 showed a step time of -0.05 s and negative tokens/s; 1e308 printed numpy's and
    matplotlib's overflow warnings to stderr under --html."""
    a, b = _sets(tmp_path, tiny_log().replace('"train_step_time": 0.5', '"train_step_time": -0.05'))
    c = tmp_path / "c"
    _sets(c, tiny_log().replace('"train_step_time": 0.5', '"train_step_time": 1e308'))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, out = mlbench(capsys, monkeypatch, "compare", str(a), str(b), str(c / "sysA" / "llama31_8b"),
                            "--no-score", "--html", str(tmp_path / "c.html"))
    assert code == 0, out
    assert not [w for w in caught if issubclass(w.category, RuntimeWarning)], [str(w.message) for w in caught]
    flat = " ".join(out.split())
    assert "-0.05" not in out.replace("is -0.05", "") and "train_step_time is -0.05" in flat, out


def test_step_statistics_never_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        stats = step_times.step_stats(np.full(10, 1e308))
    assert stats["median"] == 1e308


def test_a_run_of_no_length_is_not_a_success(tmp_path, capsys, monkeypatch):
    """run_stop at run_start: time to train 0, a success, counted (was)."""
    text, _ = _garble(tiny_log(), "run_stop", '"time_ms": 1700000003510', '"time_ms": 1700000001000')
    a, _b = _sets(tmp_path, text)
    assert time_to_train_s(5.0, 5.0) is None and logfile.log_time_to_train(a / "result_0.txt") is None
    code, out = mlbench(capsys, monkeypatch, "score", str(a), "--ruleset", RULESET, "--json")
    run0 = _strict(out)[0]["runs"][0]
    assert run0["status"] == "invalid" and run0["time_to_train_min"] is None and not run0["counted"], run0
    assert "run_stop is at the same time as run_start: no time to train, the run cannot count" in run0["problems"]


def test_an_implausible_step_in_a_batch_is_read_at_its_own_line(tmp_path, monkeypatch):
    """Per-step lines of one layout are read in batches (`logfile._Layout`) without their lines: a bad step among
    them is left to the one-by-one reading, which names its line, as reading every line one by one does."""
    monkeypatch.setattr(logfile, "_BLOCK", 4096)
    t0 = 1_700_000_000_000
    lines = [_line("submission_benchmark", t0, "llama31_8b"), _line("global_batch_size", t0, 8),
             _line("max_sequence_length", t0, 128), _line("run_start", t0)]
    bad = {300: -0.05, 301: 1e300, 302: 0.0}
    for s in range(1, 600):
        lines.append(_line("tracked_stats", t0 + s * 500, {"train_step_time": bad.get(s, 0.5)}, step=s))
    lines.append(_line("run_stop", t0 + 600 * 500, None, status="success"))
    f = tmp_path / "result_0.txt"
    f.write_text("".join(lines))
    batched = []
    add_rows = step_times.Tracked.add_rows
    monkeypatch.setattr(step_times.Tracked, "add_rows", lambda self, rows: (batched.append(len(rows)),
                                                                            add_rows(self, rows)))
    log = read_log(f)
    assert sum(batched) > 400  # the batches were used
    assert log.problems == [f"{f}:304: tracked_stats train_step_time is -0.05, expected a finite positive number",
                            f"{f}: 2 more line(s) with a bad tracked_stats field"]
    assert len(log.step_times.seconds) == 596 and set(log.step_times.seconds) == {0.5}
    monkeypatch.setattr(logfile, "_BATCHES", False)
    one_by_one = read_log(f)
    assert one_by_one.problems == log.problems
    assert np.stack(one_by_one.tracked.columns()).tobytes() == np.stack(log.tracked.columns()).tobytes()


def test_an_absurd_batch_is_a_problem_not_an_overflow(tmp_path, capsys, monkeypatch):
    """Global batch and sequence length of 1e300: their product, an int, overflowed a float (OverflowError)."""
    text, line = _garble(tiny_log(), "global_batch_size", '"value": 8', '"value": 1e300')
    text, _ = _garble(text, "max_sequence_length", '"value": 128', '"value": 1e300')
    a, b = _sets(tmp_path, text)
    code, out = mlbench(capsys, monkeypatch, "compare", str(a), str(b), "--no-score")
    flat = " ".join(out.split())
    assert code == 0 and f"{a / 'result_0.txt'}:{line}: global_batch_size is 1e+300, expected a positive integer " \
           "below 2^53" in flat, out
    code, out = mlbench(capsys, monkeypatch, "scaling", str(a), str(b))
    assert code == 0, out


def test_compare_says_what_a_prediction_does_not_model(tmp_path, capsys, monkeypatch):
    """A GPU run without Transformer Engine: its record's prediction carries a note (planner/prediction.py), and
    compare prints it beside the predicted step time, once however many runs repeat it; a note that is not text is
    passed over."""
    a, b = _sets(tmp_path, tiny_log())
    note = "predicted for a Transformer Engine stack"
    (a / "result_0.json").write_text(json.dumps({"devices": 8, "prediction": {"step_time_s": 0.3, "device": "h100",
                                                                               "note": note}}))
    (b / "result_0.json").write_text(json.dumps({"devices": 16, "prediction": {"step_time_s": 0.3, "note": [1]}}))
    code, out = mlbench(capsys, monkeypatch, "compare", str(a), str(b), "--no-score")
    flat = " ".join(out.split())
    assert code == 0 and flat.count(note) == 1 and "[1]" not in flat, out


@pytest.mark.parametrize("ends", ["\r", "\r\n", "\n\r"], ids=["CR", "CRLF", "LFCR"])
@pytest.mark.parametrize("long", [False, True], ids=["short", "longer-than-a-block"])
def test_lines_end_as_the_official_tools_end_them(tmp_path, monkeypatch, ends, long):
    """Every \\n a \\r: 'no readable records; the last line (1) is cut off', while the official checker (Python's
    universal newlines) read the lines and passed the log. A lone \\r ends a line, as \\n and \\r\\n do, in a
    block and in a line longer than one (read apart); \\n\\r is two line ends, an empty line between."""
    from mlbench import logfile

    if long:
        monkeypatch.setattr(logfile, "_BLOCK", 64)  # each record longer than a block
    f = tmp_path / "result_0.txt"
    f.write_text(tiny_log().replace("\n", ends), newline="")
    log = read_log(f)
    f.write_text(tiny_log())
    plain = read_log(f)
    assert log.problems == [] and log.ttt_min == plain.ttt_min and log.status == "success", log.problems
    assert list(log.step_times.seconds) == list(plain.step_times.seconds)
    lines = [e.line for e in logfile.LogReader(tmp_path / "result_0.txt")]
    f.write_text(tiny_log().replace("\n", ends), newline="")
    assert [e.line for e in logfile.LogReader(f)] == ([2 * x - 1 for x in lines] if ends == "\n\r" else lines)


@pytest.mark.parametrize("mfu", [-5, 50, 0.4])
def test_an_mfu_from_a_run_record_is_a_fraction_of_the_peak(tmp_path, mfu):
    """A record edited to -5 or 50 showed MFU -500 % and 5,000 %."""
    from mlbench.analysis.compare import build_comparison

    folders = [tmp_path / s / "llama31_8b" for s in ("a", "b")]
    for folder in folders:
        folder.mkdir(parents=True)
        (folder / "result_0.txt").write_text(tiny_log())
        (folder / "result_0.json").write_text(json.dumps({"variant": "full", "mfu": mfu}))
    entry = build_comparison([str(f) for f in folders], with_score=False).entries[0]
    assert entry.mfu() == (mfu if 0 <= mfu <= 1 else None)


def test_a_sequence_length_past_any_context_invalidates_the_run(tmp_path):
    """10^15 tokens a sequence: counted, with samples to converge 1.2e-10 and tokens/s of 18 digits."""
    text, line = _garble(tiny_log(), "max_sequence_length", '"value": 128', '"value": 1000000000000000')
    f = tmp_path / "result_0.txt"
    f.write_text(text)
    log = read_log(f)
    assert f"{f}:{line}: max_sequence_length is 1000000000000000, expected a positive integer at most 16,777,216: " \
           "the run cannot count" in log.problems, log.problems
    assert log.status == "invalid"


def test_an_evaluation_whose_count_goes_back_is_left_out_and_said(tmp_path):
    """Counts rewritten to 10^6 - count were taken: samples to converge 13,705 for a run of 120 steps. A count that
    goes back is a garbled evaluation, as any other: the run cannot count."""
    lines = tiny_log(steps=3).splitlines(keepends=True)
    at = next(i for i, ln in enumerate(lines) if '"eval_accuracy"' in ln)
    later = lines[at].replace('"samples_count": 24', '"samples_count": 8').replace('"value": 3.5', '"value": 3.0')
    lines.insert(at + 1, later)
    f = tmp_path / "result_0.txt"
    f.write_text("".join(lines))
    log = read_log(f)
    assert f"{f}:{at + 2}: eval_accuracy samples_count is 8, expected a count not below the evaluation's before it " \
           "(24): the run cannot count" in log.problems, log.problems  # as any garbled evaluation
    assert log.status == "invalid"


def test_a_success_whose_last_evaluation_misses_its_records_target_does_not_count(tmp_path, capsys, monkeypatch):
    """Tiny runs (smoke rules: no target check) whose evaluations were edited to 5 - v, 3.96 against a target of
    1.04, were scored: three runs counted."""
    folder = _tiny_runs(tmp_path, tiny_log())  # last evaluation 3.5
    code, out = mlbench(capsys, monkeypatch, "score", str(folder), "--json")
    runs = _strict(out)[0]["runs"]
    assert code == 0 and [r["status"] for r in runs] == ["invalid"] * 3 and _strict(out)[0]["score_min"] is None
    assert runs[0]["problems"][-1].endswith("run_stop says success, but the last evaluation, 3.5, misses the target "
                                            "its run record states (<= 1.04): the run cannot count"), runs[0]


def test_a_text_field_of_millions_of_characters_is_not_printed_whole(tmp_path, capsys, monkeypatch):
    """A run_stop status of 10 million ESCs was printed whole, escaped: 91 MB of output from `score`."""
    text, line = _garble(tiny_log(), "run_stop", '"status": "success"', '"status": "' + "\\u001b" * 1_000_000 + '"')
    a, _b = _sets(tmp_path, text)
    code, out = mlbench(capsys, monkeypatch, "score", str(a), "--ruleset", RULESET)
    assert code == 0 and len(out) < 20_000, len(out)
    assert "run_stop status is" in out and "expected a string of at most 256 characters (it has 1,000,000)" in out


def test_compare_shows_differing_features_and_small_rates(tmp_path, capsys, monkeypatch):
    """A TP2 run with sequence parallelism and selective recompute beside a plain one: 'hyperparameters and layout
    that differ' showed only what the MLPerf log holds (no key logs the features); a CPU's 0.0163 TFLOP/s read 0.0.
    A feature a record of only one side states (a published run has none) is no difference."""
    a, b = _sets(tmp_path, tiny_log().replace('"tflops_per_device": 100.0', '"tflops_per_device": 0.0163'))
    feats = {"sequence_parallel": False, "recompute": "none", "distributed_optimizer": False}
    for folder, changed in ((a, {"sequence_parallel": True, "recompute": "selective"}), (b, {})):
        record = {"devices": 8, "layout": {"features": {**feats, **changed, "x" * 100: True}}}
        (folder / "result_0.json").write_text(json.dumps(record))
    code, out = mlbench(capsys, monkeypatch, "compare", str(a), str(b), "--no-score")
    flat = " ".join(out.split())
    assert code == 0 and "features.sequence_parallel" in flat and "features.recompute" in flat, out
    assert "features.distributed_optimizer" not in flat and "xxxx" not in flat, out
    assert re.search(r"TFLOP/s per device \(logged\)\s*│\s*0\.0163", out), out


def test_a_set_whose_records_say_different_device_counts_has_none(tmp_path, capsys, monkeypatch):
    """Our runs at 1 and 2 processes in one folder: scored and compared as '1 device' (the first record's), no
    word; --devices 2 noted 'the run record says 1'. A set is one configuration: its count is unknown, said why."""
    a, b = _sets(tmp_path, tiny_log(), runs=3)
    for i, n in enumerate((1, 2, 2)):
        (a / f"result_{i}.json").write_text(json.dumps({"devices": n}))
    said = "the run records say different device counts (1: result_0.json; 2: result_1.json, result_2.json)"
    assert find_sets(a)[0].devices() == (None, f"unknown ({said}: a set is one configuration)")
    assert find_sets(a)[0].devices(2) == (2, f"given ({said}: a set is one configuration)")
    code, out = mlbench(capsys, monkeypatch, "score", str(a), "--ruleset", RULESET, "--json")
    [s] = _strict(out)
    assert code == 0 and s["devices"] is None and any(said in n for n in s["notes"]), s["notes"]


def _block_log(blocks: list[tuple[int, int, dict]], evals: list[tuple[int, int]] = ()) -> str:
    """A llama31_8b log (global batch 8) with no tracked_stats: block events (start, stop, metadata) and evaluations
    (time, samples), so its step times come from the blocks."""
    t0 = 1_700_000_000_000
    lines = [_line("submission_benchmark", t0, "llama31_8b"), _line("global_batch_size", t0, 8),
             _line("max_sequence_length", t0, 128), _line("run_start", t0)]
    for start, stop, md in blocks:
        lines += [_line("block_start", t0 + start, None, **md), _line("block_stop", t0 + stop, None, **md)]
    lines += [_line("eval_accuracy", t0 + t, 2.0, samples_count=n) for t, n in evals]
    return "".join(lines) + _line("run_stop", t0 + 10**7, None, status="success")


def test_blocks_claiming_millions_of_steps_are_weighted_not_expanded(tmp_path, capsys, monkeypatch):
    """A block's mean was repeated once for every step it claims: 30 blocks of 10^6 steps (3 KB of log) made a list
    of 3 * 10^7 entries (400 blocks: 10 GB, the machine out of memory)."""
    text = _block_log([(1 + 3000 * i, 2000 + 3000 * i, {"samples_count": 0, "epoch_count": 8 * 10**6})
                       for i in range(30)])
    a, b = _sets(tmp_path, text)
    st = read_log(a / "result_0.txt").step_times
    assert st.source == "blocks" and len(st.seconds) <= 10**6, len(st.seconds)
    assert st.stats()["median"] == pytest.approx(1999e-9) and "30,000,000 steps claimed, weighted down" in st.note
    code, out = mlbench(capsys, monkeypatch, "compare", str(a), str(b), "--no-score")
    assert code == 0, out


def test_block_sizes_from_the_next_evaluation_take_time_in_step_with_the_log(tmp_path):
    """A block without epoch_count is as long as the samples to the next evaluation, which was looked for among
    every evaluation: 30,000 blocks and evaluations (4 MB) took 30 s."""
    n = 30_000
    blocks = [step_times.Block(10.0 * i, 10.0 * i + 8, None, 8.0 * i) for i in range(n)]
    started = time.monotonic()
    st = step_times.from_blocks(blocks, [8.0 * (i + 1) for i in range(n)][::-1], 8, 1.0)
    assert time.monotonic() - started < 3
    assert st is not None and len(st.seconds) == n and set(st.seconds) == {0.008}


def test_a_step_counter_rising_absurdly_does_not_divide_step_times_below_any_step(tmp_path, capsys, monkeypatch):
    """metadata step 10^12 times the step: each record was taken to cover 10^9 steps, its time divided by them,
    and compare showed a median step of 0.0000 s (5 * 10^-10) and 2.5 * 10^11 tokens/s a device, without a word."""
    text = re.sub(r'"step": (\d+)', lambda m: f'"step": {int(m.group(1)) * 10**12}', tiny_log(steps=20))
    a, b = _sets(tmp_path, text)
    st = read_log(a / "result_0.txt").step_times
    assert st.stats()["median"] == 0.5 and "more steps than a record's time can hold" in st.note, st.note
    code, out = mlbench(capsys, monkeypatch, "compare", str(a), str(b), "--no-score")
    assert code == 0 and " 256 " in out.split("tokens/s per device")[1].splitlines()[0], out


def test_a_success_with_every_evaluation_after_run_stop_does_not_count(tmp_path, capsys, monkeypatch):
    """The same tiny runs with their evaluations timed after run_stop (or none at all) were counted: the target
    check looked only at evaluations before run_stop, and passed a run that had none."""
    late = re.sub(r'"time_ms": \d+, "event_type": "POINT_IN_TIME", "key": "eval_accuracy", "value": 3.5',
                  '"time_ms": 1700000009000, "event_type": "POINT_IN_TIME", "key": "eval_accuracy", "value": 1.0',
                  tiny_log())
    assert late != tiny_log()
    folder = _tiny_runs(tmp_path, late)
    code, out = mlbench(capsys, monkeypatch, "score", str(folder), "--json")
    runs = _strict(out)[0]["runs"]
    assert code == 0 and [r["status"] for r in runs] == ["invalid"] * 3 and _strict(out)[0]["score_min"] is None
    assert runs[0]["problems"][-1].endswith("run_stop says success, but no evaluation precedes it to show the "
                                            "target its run record states was reached: the run cannot count")


@pytest.mark.parametrize("quality", [{"target": "1.04", "direction": "min"}, {"target": math.nan, "direction": "min"},
                                     {"target": 1.04, "direction": "down"}, "1.04"])
def test_a_run_record_whose_target_cannot_be_checked_is_said_garbled(tmp_path, capsys, monkeypatch, quality):
    """A record's quality.target "1.04" or NaN skipped the check of the target a tiny run states: runs whose every
    evaluation misses it counted on their log's word (success, scored). The record is now garbled, said so."""
    missing = re.sub(r'"key": "eval_accuracy", "value": 3.5', '"key": "eval_accuracy", "value": 9.5', tiny_log())
    assert missing != tiny_log()
    folder = _tiny_runs(tmp_path, missing, quality)
    code, out = mlbench(capsys, monkeypatch, "score", str(folder), "--json")
    doc = _strict(out)[0]
    assert code == 0 and doc["score_min"] is None, out
    assert "not a target (a number) and a direction (min or max)" in " ".join(doc["notes"]), doc["notes"]


def test_a_benchmark_folder_that_is_a_link_is_searched_and_a_loop_of_links_once(tmp_path: Path) -> None:
    """`mlbench run --results res` publishes into res/ci/llama31_8b where that folder is a link (to a bigger disk,
    say), but `score res`, `compare res ...` and `check res` said 'no result_*.txt files here': Path.rglob passes
    over a linked folder. A link back up the tree (a loop) is searched once, not for ever nor twice."""
    from mlbench import compliance

    real = _tiny_runs(tmp_path / "disk", tiny_log())
    (tmp_path / "res" / "ci").mkdir(parents=True)
    (tmp_path / "res" / "ci" / "llama31_8b").symlink_to(real, target_is_directory=True)
    (real / "up").symlink_to(tmp_path / "res", target_is_directory=True)  # a loop: res/ci/llama31_8b/up/ci/...
    [rs] = find_sets(tmp_path / "res")
    assert rs.folder == real and [r.path.name for r in rs.runs] == ["result_0.txt", "result_1.txt", "result_2.txt"]
    files = [t.path for t in compliance.targets(tmp_path / "res", RULESET, "smoke")]
    assert files == [tmp_path / "res" / "ci" / "llama31_8b" / f"result_{i}.txt" for i in range(3)], files
