"""Logs that parse but hold garbage, and bad command lines, through the real `mlbench` entry point.

Every garbled field analysis reads gets one line naming the file, line and key; no command ends in a traceback;
`--json` is strict JSON; a run whose time or status is garbled (or whose run_stop precedes run_start) never
counts as a success. Unknown rulesets and unwritable report paths are refused with exit 2 before any work.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import pytest
from test_analysis_logs import tiny_log

from mlbench import cli

RULESET = "5.1.0"  # the first with rules for llama31_8b


def mlbench(capsys, monkeypatch, *args: str) -> tuple[int, str]:
    """Run `mlbench ARGS` as the console script does (exit code, stdout + stderr); a traceback fails the test, and
    so does a refusal (exit 2) that wrote to stdout: its error goes to stderr alone."""
    monkeypatch.setattr(sys, "argv", ["mlbench", *args])
    saved = sys.stdout  # put back after: an error points it at stderr, and a later call's stdout went there
    try:
        cli.main()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 0
    finally:
        sys.stdout = saved
    out = capsys.readouterr()
    assert code != 2 or out.out == "", (out.out, out.err)
    return code, out.out + out.err


def _garble(text: str, key: str, old: str, new: str) -> tuple[str, int]:
    """Replace OLD by NEW in the first line of KEY; (new text, that line's number)."""
    lines = text.splitlines(keepends=True)
    n = next(i for i, ln in enumerate(lines) if f'"key": "{key}"' in ln)
    assert old in lines[n], (key, old, lines[n])
    lines[n] = lines[n].replace(old, new, 1)
    return "".join(lines), n + 1


# (name, key, old, new, the words the reason must hold)
GARBLES = [
    ("gbs NaN", "global_batch_size", '"value": 8', '"value": NaN', "global_batch_size is NaN"),
    ("gbs a list", "global_batch_size", '"value": 8', '"value": [8, 16]', "global_batch_size is [8, 16]"),
    ("status a list", "run_stop", '"status": "success"', '"status": ["success"]',
     'run_stop status is ["success"]'),
    ("metadata a list", "run_stop", '"metadata": {"status": "success"}', '"metadata": ["success"]',
     'run_stop metadata is ["success"]'),
    ("epoch_num lots", "eval_accuracy", '"samples_count": 40', '"epoch_num": "lots"',
     'eval_accuracy epoch_num is "lots"'),
    ("eval Infinity", "eval_accuracy", '"value": 3.5', '"value": Infinity', "eval_accuracy is Infinity"),
    ("run_start time NaN", "run_start", '"time_ms": 1700000001000', '"time_ms": NaN', "run_start time_ms is NaN"),
    # a string float() reads ("1700000001000") is a time, as the official tools read it; one it does not is not
    ("run_start time a string", "run_start", '"time_ms": 1700000001000', '"time_ms": "soon"',
     'run_start time_ms is "soon", expected a finite number'),
    # a time to train of 54 years, counted as a success (was)
    ("run_start time negative", "run_start", '"time_ms": 1700000001000', '"time_ms": -1', "run_start time_ms is -1, "
     "expected milliseconds since the epoch, from 0 to 1e+14"),
    ("run_stop time negative", "run_stop", '"time_ms": 1700000003510', '"time_ms": -1', "run_stop time_ms is -1"),
    # a success with a time to train of 300 digits (was)
    ("run_stop time 1e300", "run_stop", '"time_ms": 1700000003510', '"time_ms": 1e300',
     "run_stop time_ms is 1e+300, expected milliseconds since the epoch"),
    ("benchmark a list", "submission_benchmark", '"value": "llama31_8b"', '"value": ["llama31_8b"]',
     'submission_benchmark is ["llama31_8b"]'),
    ("step time Infinity", "tracked_stats", '"train_step_time": 0.5', '"train_step_time": Infinity',
     "tracked_stats train_step_time is Infinity"),
]


def _sets(root: Path, text: str, runs: int = 1) -> tuple[Path, Path]:
    """Two sets of RUNS runs of llama31_8b (8 and 16 devices); the first run of the first holds TEXT. (One run
    a set by default: every run costs a compliance checker process.)"""
    out = []
    for name, devices in (("sysA", 8), ("sysB", 16)):
        d = root / name / "llama31_8b"
        d.mkdir(parents=True)
        for i in range(runs):
            (d / f"result_{i}.txt").write_text(text if (name, i) == ("sysA", 0) else tiny_log())
            (d / f"result_{i}.json").write_text(json.dumps({"devices": devices}))
        out.append(d)
    return out[0], out[1]


def _strict(doc: str) -> object:
    def refuse(c: str) -> None:
        raise AssertionError(f"{c} in --json output")
    return json.loads(doc, parse_constant=refuse)


@pytest.mark.parametrize("name,key,old,new,reason", GARBLES, ids=[g[0] for g in GARBLES])
def test_garbled_field_is_named_in_every_command(tmp_path, capsys, monkeypatch, name, key, old, new, reason):
    text, line = _garble(tiny_log(), key, old, new)
    a, b = _sets(tmp_path, text)
    bad = a / "result_0.txt"
    where = f"{bad}:{line}: {reason}"
    invalidates = key != "tracked_stats"

    code, out = mlbench(capsys, monkeypatch, "score", str(a), "--ruleset", RULESET)
    assert code == 0, out
    assert "no run_start" not in out and "no run_stop" not in out, out  # the line is there; its field is bad
    # Scoring reads no per-step records (tracked_stats): their garbage is not its business.
    assert (where in " ".join(out.split())) is invalidates, out
    code, out = mlbench(capsys, monkeypatch, "score", str(a), "--ruleset", RULESET, "--json")
    assert code == 0, out
    run0 = _strict(out)[0]["runs"][0]
    if invalidates:
        assert any(where in p for p in run0["problems"]), run0
        assert run0["status"] == "invalid" and not run0["counted"], run0

    code, out = mlbench(capsys, monkeypatch, "compare", str(a), str(b), "--no-score")
    assert code == 0 and where in " ".join(out.split()), out
    code, out = mlbench(capsys, monkeypatch, "scaling", str(a), str(b))
    assert code == 0 and where in " ".join(out.split()), out

    code, out = mlbench(capsys, monkeypatch, "check", str(bad))
    if key == "submission_benchmark":  # which rules judge it cannot be told: bad input
        assert code == 2 and len(out.strip().splitlines()) == 1 and f"{bad}:{line}" in out, out
    else:
        assert code in (0, 1), out


def test_negative_time_to_train_is_not_a_success(tmp_path, capsys, monkeypatch):
    text = tiny_log()
    text, _ = _garble(text, "run_stop", '"time_ms": 1700000003510', '"time_ms": 1700000000000')
    a, _b = _sets(tmp_path, text)
    code, out = mlbench(capsys, monkeypatch, "score", str(a), "--ruleset", RULESET, "--json")
    run0 = _strict(out)[0]["runs"][0]
    assert run0["status"] == "invalid" and run0["time_to_train_min"] is None and not run0["counted"], run0
    assert any("run_stop is 1 s before run_start" in p for p in run0["problems"])
    from mlbench.logfile import log_time_to_train, time_to_train_s

    assert time_to_train_s(2000.0, 1000.0) is None and log_time_to_train(a / "result_0.txt") is None


def test_markup_in_a_log_or_a_path_is_printed_as_it_is(tmp_path, capsys, monkeypatch):
    """Text from a log or a path printed through rich: `[/red]` was read as a closing tag (MarkupError tracebacks in
    score, compare, scaling and check), `[bold]` restyled the output, and an escape sequence reached the terminal."""
    text, _ = _garble(tiny_log(), "submission_org", '"value": "', '"value": "[/bold]\\u001b[2J[link=http://x]')
    text, _ = _garble(text, "global_batch_size", '"value": 8', '"value": "[/x]"')
    a, b = _sets(tmp_path / "[/red]", text)
    for args in (("score", str(a), "--ruleset", RULESET), ("compare", str(a), str(b), "--no-score"),
                 ("scaling", str(a), str(b)), ("check", str(a / "result_0.txt"))):
        code, out = mlbench(capsys, monkeypatch, *args)
        assert code in (0, 1) and "Traceback" not in out, (args, out)
        assert "\x1b" not in out, args
    code, out = mlbench(capsys, monkeypatch, "score", str(a), "--ruleset", RULESET)
    assert "[/red]" in out and 'global_batch_size is "[/x]"' in " ".join(out.split()), out


def test_a_second_run_start_is_noted_and_the_last_before_run_stop_counts(tmp_path, capsys, monkeypatch):
    """As the official summarizer (_query_run_start_stop: each line replaces the one before until run_stop): time to
    train from the last run_start before run_stop (the checker warns of the second). The first counted here once,
    and the note said the summarizer did the same (tests/test_current_suite.py holds it against the summarizer)."""
    lines = tiny_log().splitlines(keepends=True)
    n = next(i for i, ln in enumerate(lines) if '"key": "run_start"' in ln)
    lines.insert(n + 1, lines[n].replace('"time_ms": 1700000001000', '"time_ms": 1700000002000'))
    a, _b = _sets(tmp_path, "".join(lines))
    code, out = mlbench(capsys, monkeypatch, "score", str(a), "--ruleset", RULESET, "--json")
    run0 = _strict(out)[0]["runs"][0]
    assert run0["time_to_train_min"] == pytest.approx(1.51 / 60), run0
    assert ("2 run_start lines: time to train is from the last run_start before the first run_stop, as the official "
            "summarizer reads them") in run0["problems"]


def test_json_output_maps_non_finite_numbers_to_null():
    from mlbench.analysis.commands import strict_json

    doc = json.loads(strict_json({"a": math.nan, "b": [math.inf, 1.5], "c": {"d": -math.inf}}))
    assert doc == {"a": None, "b": [None, 1.5], "c": {"d": None}}


def test_scaling_json_with_garbage_is_a_note_not_a_crash(tmp_path, capsys, monkeypatch):
    a, _b = _sets(tmp_path, tiny_log())
    (a / "scaling.json").write_text('{"scaling_factor": Infinity}')
    code, out = mlbench(capsys, monkeypatch, "score", str(a), "--ruleset", RULESET, "--json")
    assert code == 0, out
    s = _strict(out)[0]
    assert s["score_min"] is None and any("scaling_factor is Infinity, expected" in n for n in s["notes"])
    assert not any("no scaling.json" in n for n in s["notes"]), s["notes"]  # (it is there, unusable)


def test_unknown_ruleset_is_bad_input_for_check_and_score(tmp_path, capsys, monkeypatch):
    a, _b = _sets(tmp_path, tiny_log())
    for cmd in ("check", "score"):
        code, out = mlbench(capsys, monkeypatch, cmd, str(a), "--ruleset", "9.9.9")
        assert code == 2, (cmd, out)
        assert len(out.strip().splitlines()) == 1 and "unknown ruleset '9.9.9'" in out and "5.0.0" in out, (cmd, out)


def test_report_paths_are_refused_before_any_work(tmp_path, capsys, monkeypatch):
    a, b = _sets(tmp_path, tiny_log())
    missing = tmp_path / "no" / "such"
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)  # (a device would do, but a test that fails must not replace /dev/full, as mlbench did)
    renamed = tmp_path / "kept.log"
    renamed.write_text(tiny_log())
    (tmp_path / "r_files").write_text("mine")
    cases = [("--html", missing / "r.html", "does not exist"), ("--md", missing / "r.md", "does not exist"),
             ("--md", Path("/proc/mlbench-report.md"), "cannot write in /proc"),
             ("--html", a / "result_0.txt" / "r.html", "does not exist"), ("--md", tmp_path, "is a folder"),
             ("--html", fifo, "is not a regular file"),
             ("--html", a / "result_0.txt", "is an MLPerf result log"), ("--md", renamed, "is an MLPerf result log"),
             ("--md", tmp_path / "r.md", "r_files, which is not a folder")]
    for cmd in ("compare", "scaling"):
        for option, path, why in cases:
            # A PATH that does not exist either: the report path is judged first, before any log is read.
            code, out = mlbench(capsys, monkeypatch, cmd, str(a), str(b), str(tmp_path / "nope"), option, str(path))
            assert code == 2, (cmd, option, out)
            assert len(out.strip().splitlines()) == 1 and str(path) in out and why in out, (cmd, option, out)
        # both reports to one file: the Markdown replaced the HTML, and "wrote" was printed twice (was)
        code, out = mlbench(capsys, monkeypatch, cmd, str(a), str(b), str(tmp_path / "nope"), "--html",
                            str(tmp_path / "both.out"), "--md", str(tmp_path / "." / "both.out"))
        assert code == 2 and "--html and --md are both" in out and "give each its own name" in out, out
    assert not (tmp_path / "no").exists() and not (tmp_path / "both.out").exists()
    assert fifo.is_fifo() and renamed.read_text() == (a / "result_0.txt").read_text() == tiny_log()
    assert (tmp_path / "r_files").read_text() == "mine" and not (tmp_path / "r.md").exists()


def test_a_garbled_published_table_is_one_line(tmp_path):
    from mlbench.analysis import published
    from mlbench.errors import UserError

    good = published.TABLE.read_text().splitlines()
    bad = tmp_path / "t.csv"
    header = good[0].split(",")
    row = dict(zip(header, ["x"] * len(header), strict=True))
    row.update(id="r1", devices="lots", time_to_train_min="1.5", step_time_s="")
    bad.write_text(",".join(header) + "\n" + ",".join(row[h] for h in header) + "\n")
    with pytest.raises(UserError, match=r"t.csv:2: devices: 'lots' is not a positive whole number"):
        published.load(bad)
    row.update(devices="8", time_to_train_min="nan")
    bad.write_text(",".join(header) + "\n" + ",".join(row[h] for h in header) + "\n")
    with pytest.raises(UserError, match=r"t.csv:2: time_to_train_min: 'nan' is not a positive number"):
        published.load(bad)
    # a byte that is not UTF-8, a field past csv's limit: tracebacks; a FIFO hung, /dev/zero filled the memory
    text = published.TABLE.read_bytes()
    last = len(text.splitlines()) + 1
    for content, said in ((text + b"\xff,x\n", rf"t.csv:{last}: not UTF-8 text \(byte 0xff\)"),
                          (text + b"a," + b"x" * 200_000 + b"\n", r"t.csv: not a CSV table the reader takes \(field "
                                                                  r"larger than field limit")):
        bad.write_bytes(content)
        with pytest.raises(UserError, match=said):
            published.load(bad)
    for make, what in ((lambda p: os.mkfifo(p), "a named pipe"), (lambda p: p.symlink_to("/dev/zero"),
                                                                   "a character device")):
        bad.unlink()
        make(bad)
        with pytest.raises(UserError, match=f"t.csv: cannot read the published results table \\({what}, not a "
                                            f"regular file\\)$"):
            published.load(bad)


def test_garbled_block_events_are_named_at_their_own_line(tmp_path):
    """Logs without per-step statistics (Google's) time steps by blocks: a bad block field skips that block."""
    from test_analysis_logs import _line

    from mlbench.analysis.logs import read_log

    t0 = 1_700_000_000_000

    def log(start_md: dict, eval_count: object = 128) -> str:
        return "".join([_line("submission_benchmark", t0, "gpt3"), _line("global_batch_size", t0, 8),
                        _line("max_sequence_length", t0, 16), _line("run_start", t0 + 1000),
                        _line("block_start", t0 + 1000, None, **start_md), _line("block_stop", t0 + 5000, None),
                        _line("eval_accuracy", t0 + 5000, 3.0, epoch_num=eval_count),
                        _line("run_stop", t0 + 5010, None, status="success")])

    f = tmp_path / "result_0.txt"
    f.write_text(log({"first_epoch_num": 0, "epoch_count": 128}))
    assert read_log(f).step_times.stats()["median"] == pytest.approx(4.0)  # 128 tokens / 16 / 8 = 1 step in 4 s
    f.write_text(log({"first_epoch_num": "lots", "epoch_count": 128}))
    good = read_log(f)
    assert good.problems == [f'{f}:5: block_start first_epoch_num is "lots", expected a finite number']
    assert good.status == "success" and good.step_times.source == "none"
    f.write_text(log({"first_epoch_num": 0, "epoch_count": 1e300}))  # finite, absurd: no block of 1e298 steps
    assert read_log(f).step_times.source == "none"


def test_scaling_report_when_no_configuration_has_a_time(tmp_path, capsys, monkeypatch):
    """The base configuration's only run is invalid: no efficiency anywhere, and the plot still draws."""
    text, _ = _garble(tiny_log(), "run_start", '"time_ms": 1700000001000', '"time_ms": NaN')
    a, b = _sets(tmp_path, text)
    code, out = mlbench(capsys, monkeypatch, "scaling", str(a), str(b), "--html", str(tmp_path / "s.html"))
    assert code == 0, out
    assert (tmp_path / "s.html").read_text().count("<img") == 1


def test_a_line_the_checker_would_take_minutes_on_is_judged_not_compliant_without_waiting(tmp_path):
    """The official checker strips every line with re.sub(".*:::MLLOG ", ...), whose time grows with the square
    of the line's length (2 MB: over 5 minutes). mlbench gives it a time limit (60 s + 1 s a MB); a file whose lines
    would keep it past the limit even on a machine 4 times faster is judged not compliant without running it,
    and the reason names the line and why."""
    from mlbench import compliance

    f = tmp_path / "result_0.txt"
    lines = tiny_log().splitlines(keepends=True)
    f.write_text("".join(lines[:3]) + _note_line(1_000_000) + "".join(lines[3:]))
    assert compliance.time_limit_s(f) == pytest.approx(60 + f.stat().st_size / 1e6)
    length = len(_note_line(1_000_000)) - 1
    assert compliance.line_lengths(f).longest == (4, length)
    v = compliance.check(f, RULESET, smoke=False)
    assert not v.ok and v.messages == [
        f"the compliance checker was not run, as it could not finish within the {compliance.time_limit_s(f):.0f} s "
        f"limit: line 4 is {length:,} bytes long, and the checker's time grows with the square of a line's length "
        f"(60 KB: about 2.4 s; here about 600 s); an MLPerf record is at most a few KiB"]
    ok = tmp_path / "ok.txt"
    ok.write_text(tiny_log())
    assert not any("checker" in m for m in compliance.check(ok, RULESET, smoke=False).messages)  # it ran


def test_lines_too_long_for_the_time_limit_stop_the_checker_with_the_reason(tmp_path):
    """Three 60 KB lines take the checker about 7 s here (2.35 s each, measured): under a 2 s limit it is
    started (a machine 4 times faster might finish), stopped at the limit, and the reason counts the lines."""
    from mlbench import compliance

    f = tmp_path / "result_0.txt"
    lines = tiny_log().splitlines(keepends=True)
    f.write_text("".join(lines[:3]) + _note_line(60_000) * 3 + "".join(lines[3:]))
    v = compliance.check(f, RULESET, smoke=False, time_limit=2)
    length = len(_note_line(60_000)) - 1
    assert not v.ok and v.messages == [
        f"the compliance checker did not finish within 2 s and was stopped: line 4 is {length:,} bytes long and 2 "
        f"more lines of 16 KiB or more, and the checker's time grows with the square of a line's length (60 KB: "
        f"about 2.4 s; here about 7 s); an MLPerf record is at most a few KiB"]


def test_line_lengths_are_counted_across_blocks_and_without_a_last_newline(tmp_path):
    from mlbench import compliance

    f = tmp_path / "lines"
    # The 2.5 MB line spans blocks, its token across the first block's end (2^20 bytes); a long line without the
    # token costs the checker a search alone and is not counted (a progress bar's 60 KB lines were taken for
    # minutes of checking); the last line has no newline
    token = b":::MLLOG "
    first = (1 << 20) - 10  # the token begins 4 bytes before the block's end (the line starts at byte 6)
    line2 = b"b" * first + token + b"b" * (2_500_000 - first - len(token))
    f.write_bytes(b"a" * 5 + b"\n" + line2 + b"\n\n" + b"d" * 30_000 + b"\n" + b"c" * (20_000 - 9) + token)
    got = compliance.line_lengths(f)
    assert got.longest == (2, 2_500_000) and got.long_lines == 2
    assert got.square_sum == 25 + 2_500_000**2 + 20_000**2
    f.write_bytes(b"")
    assert compliance.line_lengths(f) == compliance.LineLengths((0, 0), 0, 0.0)


def _note_line(size: int) -> str:
    note = {"namespace": "", "time_ms": 1_700_000_000_000, "event_type": "POINT_IN_TIME", "key": "note",
            "value": "x" * size, "metadata": {"file": "a.py", "lineno": 1}}
    return ":::MLLOG " + json.dumps(note) + "\n"


def test_an_eval_value_near_the_float_maximum_is_left_off_the_plot_with_a_note(tmp_path, capsys, monkeypatch):
    """1.7e308 is a finite eval_accuracy, but matplotlib's axis arithmetic overflows on it (a ValueError out of
    its ticker; 1e307: overflow warnings): compare --html leaves the point off the plot and says so."""
    import warnings

    text, _ = _garble(tiny_log(), "eval_accuracy", '"value": 3.5', '"value": 1.7e308')
    a, b = _sets(tmp_path, text)
    html = tmp_path / "report.html"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an overflow warning fails the test
        code, out = mlbench(capsys, monkeypatch, "compare", str(a), str(b), "--no-score", "--html", str(html))
    assert code == 0 and html.is_file(), out
    assert "1 eval point(s) with a value of magnitude 1e+150 or more left off the convergence plot" in \
        html.read_text()


def test_a_few_seeded_fuzz_cases_find_no_fault():
    """perf/fuzz_inputs.py (mutated logs, run records, systems json and benchmark files through every analysis
    command and the registry) for a few seeded cases, without the checker's commands: the fuzzer still runs, and
    what it runs holds. Rerun it with thousands of iterations after a change to what analysis reads."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "perf" / "fuzz_inputs.py"
    spec = importlib.util.spec_from_file_location("fuzz_inputs", path)
    fuzz = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("fuzz_inputs", fuzz)  # its dataclass looks its module up there
    spec.loader.exec_module(fuzz)
    got = fuzz.run(2, seed=10, score_every=10**6, check_every=10**6, registry_every=2, quiet=True)  # ~1 s
    assert got["faults"] == {} and got["commands"] >= 15, got
