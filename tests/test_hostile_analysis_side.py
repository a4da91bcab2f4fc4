"""Hostile conditions on the analysis side, each once in-process (the real `mlbench` entry point, `cli.main`, or the
function it calls; no training, no CPU measurement):

- a compliance checker killed from outside (the OOM killer, kill -9) is no verdict: asked once more, else "not
  checked" with the signal, never a non-compliant file;
- text from a log or a folder (a benchmark "gpt3\\nerror: forged line", an ESC sequence) is printed escaped, on the
  terminal and in the Markdown and HTML reports;
- `compare --ruleset` refuses a ruleset the checker does not know, as `score` and `check` do;
- a benchmark file is read only up to a size (a 3 GB one was a MemoryError in `mlbench list`);
- a cached CPU measurement that no CPU measures (a cost of 0, 1e308) is measured again, with a note;
- with --json, stdout carries the document alone (an error goes to stderr); output that cannot be written (a full
  disk) is said on stderr, exit 1.
"""

from __future__ import annotations

import errno
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import mlbench_in_process

from mlbench import compliance, mlperf_tools, registry
from mlbench.analysis import score
from mlbench.errors import UserError

SET = (Path(__file__).parent / "data" / "mlperf-results" / "training_results_v5.1" / "AMD" / "results"
       / "MI355X_EPYC_9575F_pytorch" / "llama31_8b")
LOG = SET / "result_0.txt"


@pytest.fixture
def mlbench(monkeypatch, capsys):
    """`mlbench ARGS` through its entry point in this process: (exit code, stdout, stderr)."""
    return lambda *args: mlbench_in_process(monkeypatch, capsys, *args)


# --- a compliance checker killed from outside -----------------------------------------------------------------

_KILLED_FIRST = """
import os, signal, sys
tries, argv = sys.argv[1], sys.argv[2:]
with open(tries, "a") as f:
    f.write("x")
if not argv or len(open(tries).read()) == 1:
    os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer or kill -9 does
os.execvp(argv[0], argv)
"""


def _checker_killed(monkeypatch, tries: Path, always: bool) -> None:
    """The checker killed by SIGKILL at each try (ALWAYS) or at the first only; TRIES counts the tries. No verdict
    kept from before (mlbench.verdicts): the checker runs."""
    monkeypatch.setenv("MLBENCH_CACHE", str(tries.parent / "cache"))
    real = mlperf_tools.checker_command

    def command(*args, **kwargs) -> list[str]:
        return [sys.executable, "-c", _KILLED_FIRST, str(tries), *([] if always else real(*args, **kwargs))]

    monkeypatch.setattr(mlperf_tools, "checker_command", command)


def test_a_checker_killed_from_outside_is_no_verdict_and_is_asked_once_more(monkeypatch, tmp_path) -> None:
    """It was `ok: False, messages: []`: a silent non-compliant verdict on a log a later check passed."""
    _checker_killed(monkeypatch, tmp_path / "tries", always=True)
    v = compliance.check(LOG, "6.0.0", smoke=False)
    assert v.ok is None and not v.checked
    assert (tmp_path / "tries").read_text() == "xx"  # asked twice
    assert v.messages == ["the compliance checker was killed by SIGKILL (out of memory?) before its verdict (twice): "
                          "result_0.txt is not checked (no verdict, not a non-compliant one)"]


def test_a_checker_killed_once_gives_its_verdict_on_the_second_try(monkeypatch, tmp_path) -> None:
    _checker_killed(monkeypatch, tmp_path / "tries", always=False)
    v = compliance.check(LOG, "6.0.0", smoke=False)
    assert (tmp_path / "tries").read_text() == "xx"
    assert v.ok is True and v.messages == []


def test_mlbench_check_says_not_checked_with_the_signal_never_fail(monkeypatch, tmp_path, mlbench) -> None:
    """`mlbench check` on a published folder with its checkers killed printed `FAIL .../result_1.txt`, no reason."""
    _checker_killed(monkeypatch, tmp_path / "tries", always=True)
    code, out, _ = mlbench("check", LOG)
    assert code == 3  # neither a pass (0) nor a failure (1): no verdict
    assert out.startswith(f"NOT CHECKED {LOG} (training 5.1.0 rules)\n"), out
    assert "killed by SIGKILL (out of memory?)" in out and "FAIL" not in out


def test_a_set_with_a_file_not_checked_has_no_score_and_says_why(monkeypatch, tmp_path) -> None:
    """Unknown is not non-compliant: the set is not scored (it was '... runs failed or did not converge'), its
    files are `compliant: null` in --json, and no verdict is remembered for them (scored again, they are checked)."""
    shutil.copytree(SET, tmp_path / "llama31_8b")
    _checker_killed(monkeypatch, tmp_path / "tries", always=True)
    s = score.score_path(tmp_path / "llama31_8b", "6.0.0", jobs=2)[0]
    assert [r.compliant for r in s.runs] == [None] * len(s.runs) and not any(r.counted for r in s.runs)
    assert s.olympic_min is None and s.score_min is None and s.official_score_min is None
    assert any("result_0.txt: the compliance checker was killed by SIGKILL" in n and "compliance is unknown" in n
               for n in s.notes), s.notes
    assert not any("failed or did not converge" in n for n in s.notes), s.notes
    assert json.loads(json.dumps(s.to_json()))["runs"][0]["compliant"] is None
    assert not list((tmp_path / "cache").rglob("*.json"))  # nothing kept: the next score checks them again


def test_the_closed_rules_check_before_a_run_is_no_rejection_when_the_checker_is_killed(monkeypatch, tmp_path) -> None:
    """A dry run, `plan` and the check before a full-size run listed the kill as a rule the log broke."""
    _checker_killed(monkeypatch, tmp_path / "tries", always=True)
    with pytest.raises(compliance.NotChecked, match="killed by SIGKILL .*; try again$") as e:
        compliance.before_run_start(LOG, "6.0.0")
    assert e.value.exit_code == 1


# --- text from a log or a folder, printed -----------------------------------------------------------------------

FORGED = "gpt3\nerror: forged line"
ANSI = "\x1b]0;pwned\x07gpt3"


def _forged_set(folder: Path, benchmark: str, status: str) -> Path:
    """FOLDER/result_0.txt: the published log with BENCHMARK as its submission_benchmark and STATUS as run_stop's."""
    text = LOG.read_text()
    text = text.replace('"value": "llama31_8b"', f'"value": {json.dumps(benchmark)}', 1)
    text = text.replace('"status": "success"', f'"status": {json.dumps(status)}', 1)
    folder.mkdir(parents=True)
    (folder / "result_0.txt").write_text(text)
    return folder


def _no_control_characters(text: str) -> None:
    bad = [c for c in text if not c.isprintable() and c != "\n"]
    assert not bad, bad
    assert "\nerror: forged" not in text


def test_text_from_a_log_is_printed_escaped_by_score_compare_and_scaling(tmp_path, mlbench) -> None:
    """A log's benchmark "gpt3\\nerror: forged line" printed a forged line in score, compare and scaling; an ESC
    sequence in it, in a status or in a folder's name reached the terminal raw."""
    a = _forged_set(tmp_path / "sys\x1b[31m" / "a", FORGED, "\x1b[2Jsuccess\nfake")
    b = _forged_set(tmp_path / "sys2" / "b\x07", FORGED, "success")
    code, out, err = mlbench("score", a)
    _no_control_characters(out + err)
    assert code == 0 and "gpt3\\nerror: forged line" in out and "\\x1b[2Jsuccess\\nfake" in out
    assert "sys\\x1b[31m/a" in out
    code, out, err = mlbench("compare", "--no-score", a, b)
    _no_control_characters(out + err)
    assert code == 0 and "gpt3\\nerror: forged line" in out and "sys2/b\\x07" in out
    code, out, err = mlbench("scaling", a, b, "--devices", "8", "--devices", "16")
    _no_control_characters(out + err)
    assert code == 0 and "(gpt3\\nerror: forged line)" in out and "sys\\x1b[31m/a" in out
    c = _forged_set(tmp_path / "sys3" / "c", ANSI, "success")
    code, out, err = mlbench("scaling", a, c, "--devices", "8", "--devices", "16")  # two benchmarks: refused
    _no_control_characters(out + err)
    assert code == 2 and "\\x1b]0;pwned\\x07gpt3" in err and out == "", (out, err)


def test_text_from_a_log_is_escaped_in_the_markdown_and_html_reports(tmp_path, mlbench) -> None:
    a = _forged_set(tmp_path / "s" / "a", ANSI, "success")
    b = _forged_set(tmp_path / "s" / "b", FORGED, "success")
    (tmp_path / "out").mkdir()
    md, html = tmp_path / "out" / "r.md", tmp_path / "out" / "r.html"
    code, out, err = mlbench("compare", "--no-score", a, b, "--md", md, "--html", html)
    assert code == 0, out + err
    for report, escaped in ((md, "\\\\x1b\\]0;pwned\\\\x07gpt3"), (html, "\\x1b]0;pwned\\x07gpt3")):
        text = report.read_text()
        _no_control_characters(text)
        assert escaped in text and "gpt3\\nerror: forged line".replace("\\", "\\\\" if report == md else "\\") \
            in text, text  # Markdown: printable's backslash itself escaped (rendered, the text is printable's)


def test_mlbench_check_prints_a_file_name_escaped(tmp_path, mlbench) -> None:
    folder = tmp_path / "x\x1b[2J"
    folder.mkdir()
    shutil.copy(LOG, folder / "result_\x1b]0;t\x07.txt")
    code, out, err = mlbench("check", folder, "--ruleset", "6.0.0")
    _no_control_characters(out + err)
    assert code == 0 and "x\\x1b[2J/result_\\x1b]0;t\\x07.txt" in out


def test_a_folder_name_cannot_forge_a_line_of_checks_verdict_even_from_the_cache(tmp_path, monkeypatch,
                                                                                   mlbench) -> None:
    """A folder "x<newline>FAIL fake": the PASS line was escaped, but the checker's message naming the file was
    split at the newline and its second half printed as a line of its own, "FAIL fake ..."; kept in the verdict
    cache, it was printed under another folder holding the same bytes."""
    monkeypatch.setenv("MLBENCH_CACHE", str(tmp_path / "cache"))
    forged, plain = tmp_path / "x\nFAIL fake (closed rules)", tmp_path / "plain"
    for folder in (forged, plain):
        folder.mkdir()
        shutil.copy(LOG, folder / "result_0.txt")
    for folder in (forged, forged, plain):  # judged, then from the cache twice
        code, out, err = mlbench("check", folder, "--ruleset", "6.0.0")
        assert code == 0 and out.splitlines() == [f"PASS {folder}/result_0.txt (training 6.0.0 rules)".replace(
            "\n", "\\n")], out


@pytest.mark.parametrize("tiny", [False, True], ids=["full", "tiny"])
@pytest.mark.parametrize("command", ["check", "score", "compare"])
def test_a_ruleset_asked_for_without_rules_for_the_benchmark_is_refused_as_an_unknown_one(mlbench, command, tiny,
                                                                                         tmp_path) -> None:
    """--ruleset 1.0.0 (known, without llama31_8b): `check` said FAIL ('the compliance checker crashed:
    FileNotFoundError', exit 1), `score` and `compare` judged every run non-compliant, exit 0; --ruleset 9.9.9
    is refused by all three (exit 2). Tiny runs (judged by the smoke rules) were let through: with 0.6.0 a valid
    tiny gpt3 run FAILed, with 1.0.0 it passed with a note."""
    folder, log, other = SET, LOG, SET
    if tiny:
        from test_analysis_logs import tiny_log
        for name in ("tiny", "other"):
            (tmp_path / name).mkdir()
            (tmp_path / name / "result_0.txt").write_text(tiny_log())
            (tmp_path / name / "result_0.json").write_text(json.dumps({"variant": "tiny", "status": "success"}))
        folder, other = tmp_path / "tiny", tmp_path / "other"
        log = folder / "result_0.txt"
    code, out, err = mlbench(command, folder, *([other] if command == "compare" else []), "--ruleset", "1.0.0")
    where = f"{log}: " if command == "check" else ""
    assert code == 2 and f"error: {where}--ruleset 1.0.0 has no rules for llama31_8b" in out + err, out + err
    assert "rulesets holding it: 5.1.0, 6.0.0, 6.1.0" in out + err and "Traceback" not in out + err


def test_a_file_that_is_no_mlperf_log_is_refused_not_scored(tmp_path, mlbench) -> None:
    """`score` of a file of text: exit 0 with a table headed '(None, ruleset 6.1.0, ? devices)' and 'RCP Skipped
    (no RCP check for division None)'; `check` said 'benchmark None is not one of ...'. In a tree of sets it is a
    run of its set, said so in the notes."""
    folder = tmp_path / "set"
    folder.mkdir()
    (folder / "result_0.txt").write_text("hello\n")
    code, out, err = mlbench("score", folder / "result_0.txt")
    assert code == 2 and (out, err) == ("", f"error: {folder / 'result_0.txt'} is not an MLPerf result log (no "
                                            f":::MLLOG lines)\n"), (out, err)
    (folder / "result_1.txt").write_text("")
    code, out, err = mlbench("score", folder)
    assert code == 2 and f"none of the 2 result_*.txt in {folder} is an MLPerf result log" in err, err
    # `check` said 'cannot tell the ruleset ...; pass --ruleset', and with it gave FAIL (16 'Required' lines), exit 1
    for ruleset in ([], ["--ruleset", "4.1.0"]):
        code, out, err = mlbench("check", folder / "result_0.txt", *ruleset)
        assert code == 2 and out == "" and err == f"error: {folder / 'result_0.txt'} is not an MLPerf result log " \
                                                  "(no :::MLLOG lines)\n", (out, err)
        code, out, err = mlbench("check", folder, *ruleset)
        assert code == 2 and f"none of the 2 result_*.txt in {folder} is an MLPerf result log" in err, err
    (folder / "result_1.txt").write_text(":::MLLOG {}\n")  # a log without a benchmark: still a log
    code, out, err = mlbench("check", folder / "result_1.txt")
    assert code == 2 and "the log names no benchmark (no submission_benchmark record); pass --ruleset" in err, err
    (folder / "result_1.txt").write_text("")
    shutil.copytree(SET, tmp_path / "llama31_8b")
    code, out, err = mlbench("score", tmp_path, "--json")
    doc = json.loads(out)
    assert code == 0 and len(doc) == 2 and "None" not in out, out
    assert doc[1]["rcp"]["message"] == "no RCP check (the logs state no submission_division)", doc[1]
    assert doc[1]["rcp_status"] is None  # (the summarizer checks RCP in the closed division alone)


def test_a_report_of_many_sets_stays_readable_and_names_are_not_maths(tmp_path, mlbench) -> None:
    """A folder named 'x$^{$' was parsed as maths by matplotlib: a traceback. 50 sets: the legend was drawn over the
    convergence plot, the step-time plot was 9510 px wide (squeezed to the page, unreadable), and the colours
    repeated every 10. Now: rows of the step-time plot top to bottom, the legend under the plots, a colour each."""
    import struct

    from test_analysis_logs import tiny_log

    sets = [tmp_path / "s" / f"set{i:02d}" for i in range(24)] + [tmp_path / "s" / "x$^{$"]
    for folder in sets:
        folder.mkdir(parents=True)
        (folder / "result_0.txt").write_text(tiny_log())
    code, out, err = mlbench("compare", "--no-score", *sets, "--md", tmp_path / "r.md")
    assert code == 0 and "Traceback" not in out + err, out + err
    # nor as maths by a Markdown renderer (GitHub's $...$): each $ escaped
    text = (tmp_path / "r.md").read_text()
    assert "x\\$^{\\$" in text and "x$^{$" not in text, text[:2000]
    size = {p.stem: struct.unpack(">II", p.read_bytes()[16:24]) for p in (tmp_path / "r_files").glob("*.png")}
    assert size["step_times"][0] < 1200 and size["step_times"][1] > 25 * 20, size  # a row of 20 px or more a set
    assert size["convergence"][1] > 600, size  # the legend's rows under the plots
    from mlbench.analysis.report import line_looks
    assert all(len(set(line_looks(n))) == n for n in (15, 25, 120, 121, 3000))


@pytest.mark.parametrize(("nodes", "said"), [
    ("9999999", "systems/MI355X_EPYC_9575F_pytorch.json number_of_nodes 9,999,999 x accelerators_per_node 8 = "
                "79,999,992 devices, more than 10,000,000"),
    ("sixty-four", 'systems/MI355X_EPYC_9575F_pytorch.json number_of_nodes "sixty-four" is not a whole count')])
def test_scaling_says_why_a_systems_json_gives_no_device_count(tmp_path, mlbench, nodes, said) -> None:
    """Each field a count, their product 79,999,992 devices was taken (an efficiency of 0.000); a garbled count was
    'no systems/<system>.json, no run record with devices', with the file there."""
    org = shutil.copytree(SET.parents[2], tmp_path / "AMD")
    system = org / "systems" / "MI355X_EPYC_9575F_pytorch.json"
    system.write_text(json.dumps(json.loads(system.read_text()) | {"number_of_nodes": nodes}))
    other = shutil.copytree(SET, tmp_path / "b" / "llama31_8b")
    code, out, err = mlbench("scaling", org / "results" / SET.parent.name / SET.name, other)
    assert code == 2 and f"device count unknown ({said}" in out + err, out + err


@pytest.mark.parametrize("option", ["--md", "--html"])
def test_a_report_replaces_only_an_earlier_report(tmp_path, mlbench, option) -> None:
    """A log whose lines a launcher prefixed with the rank ('0: :::MLLOG ...'), one behind 64 KiB of shell output,
    and a set's scaling.json were replaced by a report, exit 0. An earlier report is replaced, as before."""
    log = LOG.read_text()
    other = shutil.copytree(SET, tmp_path / "b" / "llama31_8b")
    victims = {"ranked.log": "".join(f"0: {ln}" for ln in log.splitlines(keepends=True)),
               "preamble.log": "+ echo noise\n" * 6000 + log, "scaling.json": '{"scaling_factor": 1.0625}'}
    for name, text in victims.items():
        (tmp_path / name).write_text(text)
        code, out, err = mlbench("compare", "--no-score", SET, other, option, tmp_path / name)
        assert code == 2 and out == "" and err == f"error: {option} {tmp_path / name}: is there, and is no " \
                                                  "report mlbench wrote; a report replaces only an earlier report, " \
                                                  "give another name\n", (out, err)
        assert (tmp_path / name).read_text() == text
    report = tmp_path / ("r.md" if option == "--md" else "r.html")
    for _ in range(2):
        code, out, err = mlbench("compare", "--no-score", SET, other, option, report)
        assert code == 0 and out.endswith(f"wrote {report}\n"), out + err


@pytest.mark.parametrize("option", ["--md", "--html"])
def test_a_report_path_with_a_control_character_is_refused(tmp_path, mlbench, option) -> None:
    """--html 'a<newline>b.html' was written, and 'wrote ...' printed on two lines."""
    code, out, err = mlbench("compare", "--no-score", SET, SET.parent, option, tmp_path / "a\nb.x")
    assert code == 2 and out == "" and err == f"error: {option} '{tmp_path}/a\\nb.x': holds \\n, a character " \
                                              "that is not printable; name the report without one\n", (out, err)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("command", ["check", "score"])
def test_a_result_file_that_is_no_regular_file_is_named_with_what_it_is(tmp_path, mlbench, command) -> None:
    """A FIFO, a folder or a link to /dev/zero named result_1.txt: `score` dropped it without a word (and the
    score changed); given alone, 'no result_*.txt files here'; a loop of links 'no such file' (`check`: click's
    'does not exist'). `score` leaves it out with a note naming it; `check`, a verdict on every file, refuses."""
    folder = tmp_path / "set"
    folder.mkdir()
    shutil.copy(LOG, folder / "result_0.txt")
    os.mkfifo(folder / "result_1.txt")
    (folder / "result_2.txt").mkdir()
    (folder / "result_3.txt").symlink_to("/dev/zero")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    said = {"result_1.txt": "a named pipe, not a regular file", "result_2.txt": "a folder, not a regular file",
            "result_3.txt": "a character device, not a regular file"}
    for name, what in said.items():
        if name == "result_2.txt":  # (a folder given is searched, as any)
            continue
        code, out, err = mlbench(command, folder / name, "--ruleset", "6.0.0")
        assert code == 2 and out == "" and err == f"error: {folder / name}: {what} (a result log is a regular " \
                                                  f"file; or give a folder of them)\n", (out, err)
    code, out, err = mlbench(command, tmp_path / "loop", "--ruleset", "6.0.0")
    assert code == 2 and f"{tmp_path / 'loop'}: a loop of links" in out + err, out + err
    code, out, err = mlbench(command, folder, "--ruleset", "6.0.0", *(["--json"] if command == "score" else []))
    if command == "check":
        assert code == 2 and out == "" and err == f"error: {folder / 'result_1.txt'}: a named pipe, not a regular " \
                                                  f"file (a result log is a regular file)\n", (out, err)
    else:
        notes = json.loads(out)[0]["notes"]
        assert code == 0 and [f"{n}: left out: {w}" for n, w in said.items()] == notes[:3], notes


def test_printable_is_the_escaping_of_a_status_and_leaves_printable_text_alone() -> None:
    from mlbench.errors import printable

    assert printable("gpt3") == "gpt3" and printable("ünïcode ok") == "ünïcode ok"
    assert printable("\x1b[2J\nx\u202e") == repr("\x1b[2J\nx\u202e")[1:-1] == "\\x1b[2J\\nx\\u202e"
    # a name's bytes that are not UTF-8 (the only ones Python leaves undecoded, in UTF-8 mode): written \xNN, as
    # --json writes them (they went out raw, the output no longer UTF-8)
    assert printable("caf\udce9\n") == "caf\\xe9\\n"
    assert printable(printable(FORGED)) == printable(FORGED)  # idempotent


# --- an unknown ruleset -------------------------------------------------------------------------------------

def test_compare_refuses_an_unknown_ruleset_as_score_and_check_do(tmp_path, mlbench) -> None:
    """It exited 0, every file judged non-compliant ('3 runs failed or did not converge ... no score')."""
    shutil.copytree(SET, tmp_path / "s2")
    for command in (("compare", SET, tmp_path / "s2"), ("compare", "--no-score", SET, tmp_path / "s2"),
                    ("score", SET), ("check", SET)):
        code, out, err = mlbench(*command, "--ruleset", "bogus")
        assert code == 2 and err.startswith("error: unknown ruleset 'bogus'; the installed mlperf-logging knows ")
        assert len(err.splitlines()) == 1 and out == "", (out, err)


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
    code, out, err = mlbench("list")  # gpt3 listed, zz named on stderr
    assert code == 2 and err == (f"error: {tmp_path / 'zz.yaml'}: cannot read the benchmark file ({size:,} bytes, "
                                 "over the 1 MiB a benchmark file may hold; the built-in ones are under 20 KB)\n")
    assert " gpt3 " in out, out
    assert registry.load("gpt3").name == "gpt3"


def test_every_built_in_benchmark_file_is_far_below_the_limit() -> None:
    for f in (registry.ROOT / "benchmarks").glob("*.yaml"):
        assert f.stat().st_size < registry.MAX_BENCHMARK_BYTES / 20, f


# --- a cached CPU measurement no CPU measures ---------------------------------------------------------------------

def _measurement() -> dict:
    from mlbench.planner import cpu

    return {"key": cpu._key(), "gemm_flops": 6.1e10, "bytes_per_s": 3.7e9, "step_1_micro_s": 0.024,
            "step_2_micro_s": 0.041, "step_fb_s": 0.0145, "optimizer_s_per_tensor": 0.0, "megatron_layer_s": 0.025,
            "megatron_head_s": 0.0, "megatron_probe_layer_flops": 176160768.0, "megatron_probe_head_flops": 25165824.0,
            "megatron_shapes": "tiny gpt3", "collective_latency_s": 0.0017, "measured_at": "2026-11-27T02:24:13Z"}


@pytest.mark.parametrize("bad", [{"megatron_layer_s": 0, "megatron_head_s": 0}, {"step_fb_s": 1e308},
                                 {"gemm_flops": 1e308}, {"collective_latency_s": 1e308}, {"step_fb_s": 0},
                                 {"megatron_head_s": -1e-3}, {"bytes_per_s": math.nan}])
def test_a_cached_cpu_measurement_no_cpu_measures_is_measured_again(monkeypatch, tmp_path, mlbench, bad) -> None:
    """A cache with megatron_layer_s and megatron_head_s 0 was a ZeroDivisionError traceback in `plan --device cpu
    --tiny`; 1e308 gave infinite or NaN step times, exit 0. (`measure` here returns canned figures: no 17 s.)"""
    from mlbench.planner import cpu

    fresh = _measurement()
    cache = tmp_path / "cpu-device.json"
    cache.write_text(json.dumps(fresh | bad))
    monkeypatch.setattr(cpu, "CACHE", cache)
    monkeypatch.setattr(cpu, "measure", lambda: dict(fresh))
    assert cpu.cached() is None
    code, out, err = mlbench("plan", "gpt3", "--device", "cpu", "--tiny", "--json")
    assert code == 0, out + err
    step = json.loads(out)["layouts"][0]["step_time_s"]
    assert isinstance(step, float) and 0 < step < 10
    name = next(iter(bad))
    assert f"note: the cached CPU measurement {cache} has {name}" in err and "measuring this CPU again" in err
    assert json.loads(cache.read_text()) == fresh and cpu.cached() == fresh  # replaced


def test_a_cached_cpu_measurement_with_costs_the_probe_clamps_at_0_is_used(monkeypatch, tmp_path) -> None:
    """0 is a measurement for a difference of two timings the probe clamps (the optimizer's, the head's)."""
    from mlbench.planner import cpu

    m = _measurement()
    assert m["optimizer_s_per_tensor"] == 0 == m["megatron_head_s"]
    monkeypatch.setattr(cpu, "CACHE", tmp_path / "cpu-device.json")
    cpu.CACHE.write_text(json.dumps(m))
    assert cpu.cached() == m


# --- where output and errors go ---------------------------------------------------------------------------------

class _Full:
    """A stdout on a full disk: every write fails as /dev/full's does."""

    encoding = "utf-8"

    def write(self, text: str) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def test_an_error_of_a_json_command_goes_to_stderr(mlbench) -> None:
    """`score --json X | jq` got 'error: ...' on stdout; without --json too (`score X > report.md` hid it in the
    file)."""
    for command in (("score", "--json", "/no/such/folder"), ("plan", "nope", "--device", "h100", "--json")):
        code, out, err = mlbench(*command)
        assert code == 2 and out == "" and err.startswith("error: ") and len(err.splitlines()) == 1, (out, err)
    code, out, err = mlbench("score", "/no/such/folder")
    assert code == 2 and out == "" and err == "error: /no/such/folder: no such file or folder\n", (out, err)


@pytest.mark.parametrize("command", [("score", "--json", LOG), ("score", LOG),
                                     ("plan", "llama31_8b", "--device", "h100", "--tp", "1", "--pp", "1", "--json"),
                                     ("plan", "llama31_8b", "--device", "h100", "--tp", "1", "--pp", "1")])
def test_output_that_cannot_be_written_is_said_on_stderr_exit_1(monkeypatch, capsys, command) -> None:
    """`score > /dev/full` exited 1 with no message (with --json) or 0, its output lost (without)."""
    from mlbench import cli

    monkeypatch.setattr(sys, "stdout", _Full())
    monkeypatch.setattr(sys, "argv", ["mlbench", *map(str, command)])
    with pytest.raises(SystemExit) as e:
        cli.main()
    assert e.value.code == 1
    assert capsys.readouterr().err == "error: could not write to standard output: No space left on device\n"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_score_json_to_dev_full_says_so_on_stderr() -> None:
    """The real thing: stdout opened on /dev/full, the interpreter's own last flush included."""
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "mlbench.cli", "score", "--json", str(LOG)], stdout=full,
                              stderr=subprocess.PIPE, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr == "error: could not write to standard output: No space left on device\n", proc.stderr


def test_a_runs_summary_says_not_checked_where_the_checker_gave_no_verdict() -> None:
    """The run's last line said `compliance (FAILED)` for a checker killed from outside."""
    from rich.console import Console

    from mlbench import registry
    from mlbench.runner import RunResult, _summary

    console = Console(record=True, width=400)
    for compliant, said in ((None, "compliance (not checked)"), (False, "compliance (FAILED)"), (True, "(ok)")):
        _summary(console, registry.load("gpt3", tiny=True), RunResult(Path("r/result_0.txt"), "success", 1.0, 1.0,
                                                                      compliant, ""))
        assert said in console.export_text(), console.export_text()


def test_a_run_that_stopped_short_gives_no_time_to_train() -> None:
    """The end line of a run aborted by CUDA's out-of-memory error 5 s after run_start (an H200, docs/gpu.md) said
    'time-to-train 5.0 s': MLPerf scores a converged run's time alone. It says how long the run trained instead."""
    from rich.console import Console

    from mlbench import registry
    from mlbench.runner import RunResult, _summary

    bench = registry.load("gpt3", tiny=True)
    for status, ttt, said in (("aborted", 5.0, "; no time-to-train (stopped 5.0 s after run_start);"),
                              ("aborted", None, "; time-to-train n/a;"),
                              ("success", 7.4, "; time-to-train 7.4 s (0.123 min);")):
        console = Console(record=True, width=400)
        _summary(console, bench, RunResult(Path("r/result_0.txt"), status, ttt, None, True, "OutOfMemoryError: x"))
        text = console.export_text()
        assert said in text and text.count("time-to-train") <= 1, text


@pytest.mark.parametrize("argv", [["score", "--json", "/no/such/folder"], ["show", "--json", "no_such_benchmark"],
                                  ["list", "--json", "--no-such-option"]])
def test_an_error_before_a_json_command_runs_goes_to_stderr(argv: list[str]) -> None:
    """click's own checks (a path that does not exist, an unknown option) and the commands in cli.py printed their
    error on stdout, into the JSON document's stream."""
    proc = subprocess.run([sys.executable, "-m", "mlbench.cli", *argv], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.startswith("error: "), (proc.stdout, proc.stderr)


# --- errors: a folder's name in them, printed escaped -----------------------------------------------------------

HOSTILE_FOLDER = "e\x1b]0;pwned\x07\nerror: forged"


def test_a_folder_name_in_an_error_is_printed_escaped(tmp_path, monkeypatch, mlbench) -> None:
    """`mlbench score <folder>/gpt3` printed `error: e<ESC>]0;pwned<BEL>` and then a forged line `error: forged/gpt3:
    no result_*.txt files here`; click's own 'Got unexpected extra argument (...)' was raw too."""
    (tmp_path / HOSTILE_FOLDER / "gpt3").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    for args in (("score", f"{HOSTILE_FOLDER}/gpt3"), ("compare", f"{HOSTILE_FOLDER}/gpt3", f"{HOSTILE_FOLDER}/gpt3"),
                 ("scaling", f"{HOSTILE_FOLDER}/gpt3", f"{HOSTILE_FOLDER}/gpt3"),
                 ("list", f"{HOSTILE_FOLDER}\u202e")):
        code, out, err = mlbench(*args)
        _no_control_characters(out + err)
        assert code == 2 and len((out + err).splitlines()) == 1, (out, err)
        assert "e\\x1b]0;pwned\\x07\\nerror: forged" in err and out == "", (out, err)
    assert "Got unexpected extra argument (e\\x1b]0;pwned\\x07\\nerror: forged\\u202e)" in err, err
    code, _, err = mlbench("show", "\"ü\"")  # ordinary text as it is: quotes, letters of any script
    assert code == 2 and "'\"ü\"'" in err, err


def test_the_note_on_a_dead_run_prints_its_staging_folder_escaped(tmp_path, monkeypatch) -> None:
    """`run` printed a dead run's staging folder's name raw in its 'could not be published' line."""
    import io
    from types import SimpleNamespace

    from rich.console import Console

    from mlbench import dead_runs, results
    from mlbench.launch import launcher

    staging = tmp_path / "r" / "sys" / "gpt3" / f".staging-{HOSTILE_FOLDER}"
    staging.mkdir(parents=True)

    def publish_one(*_args):
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(results, "dead_runs", lambda folder: [(staging, "owner")])
    monkeypatch.setattr(dead_runs, "_publish_one", publish_one)
    monkeypatch.setattr(results, "set_aside", lambda folder, staging: None)
    stub = SimpleNamespace(prepare=lambda folder: None, start=lambda: None, supervise=lambda: None, collect=lambda: 0)
    monkeypatch.setattr(launcher, "choose", lambda *args: stub)
    console = Console(record=True, width=1 << 20, file=io.StringIO())
    opts = SimpleNamespace(results=tmp_path / "r", system="sys")
    assert launcher.start(SimpleNamespace(name="gpt3"), None, opts, None, console, dry_run=False) == 0
    said = console.export_text()
    _no_control_characters(said)
    assert len(said.splitlines()) == 1 and ".staging-e\\x1b]0;pwned\\x07\\nerror: forged) could not be" in said, said
    # Another command published it meanwhile (two at once on a folder with a dead run): the loser said it 'could
    # not be published ... its files stay in' a folder that was gone, the run published. Nothing to say now.
    staging.rmdir()
    console = Console(record=True, width=1 << 20, file=io.StringIO())
    assert launcher.start(SimpleNamespace(name="gpt3"), None, opts, None, console, dry_run=False) == 0
    assert console.export_text() == ""


def test_a_folder_name_in_a_plot_label_is_escaped(tmp_path, mlbench) -> None:
    """`compare ... --html` with a folder named with an ESC: matplotlib warned 'Glyph 27 (<ESC>) missing from
    font', a raw ESC on stderr."""
    import warnings

    a = _forged_set(tmp_path / "s\x1b[2J" / "a\x1b]0;t\x07", "llama31_8b", "success")
    b = _forged_set(tmp_path / "s" / "b", "llama31_8b", "success")
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        code, out, err = mlbench("compare", "--no-score", a, b, "--html", tmp_path / "r.html")
    assert code == 0, out + err
    _no_control_characters(out + err + "".join(str(w.message) for w in said))
    assert not [w for w in said if "Glyph" in str(w.message)], [str(w.message) for w in said]


# --- output that cannot be written, in every command --------------------------------------------------------------

def _with_stdout_full(monkeypatch, capsys, *command: object) -> tuple[int, str]:
    """`mlbench COMMAND > /dev/full` in this process: (exit code, stderr)."""
    code, _, err = mlbench_in_process(monkeypatch, capsys, *command, stdout=_Full())
    return code, err


@pytest.mark.parametrize("command", [("list",), ("show", "gpt3"), ("show", "gpt3", "--json"),
                                     ("check", LOG, "--ruleset", "6.0.0"),
                                     ("run", "gpt3", "--tiny", "--dry-run", "--results", "{tmp}")])
def test_every_command_says_output_it_could_not_write_on_stderr_exit_1(monkeypatch, capsys, tmp_path,
                                                                      command) -> None:
    """`list`, `show`, `check` (its verdict lost), `run --dry-run` > /dev/full exited 0 with nothing said."""
    code, err = _with_stdout_full(monkeypatch, capsys, *(str(c).format(tmp=tmp_path / "res") for c in command))
    assert code == 1 and err == "error: could not write to standard output: No space left on device\n", err


def test_an_error_stdout_cannot_take_goes_to_stderr(monkeypatch, capsys) -> None:
    """`score /nonexistent > /dev/full` exited 2 with nothing said anywhere."""
    code, err = _with_stdout_full(monkeypatch, capsys, "score", "/no/such/folder")
    assert code == 2 and err == "error: /no/such/folder: no such file or folder\n", err


def test_progress_output_lost_does_not_stop_the_command_and_is_said_once_at_its_end(monkeypatch, capsys) -> None:
    """A run's progress lines on a full disk: the run goes on (nothing raised at each line), and the loss is said
    once on stderr as the command ends, exit 1."""
    from mlbench import cli, terminal

    said = []

    @cli.cli.command("progress-probe")
    def probe() -> None:
        for i in range(3):
            terminal.console().print(f"step {i}")
            said.append(i)

    try:
        code, err = _with_stdout_full(monkeypatch, capsys, "progress-probe")
    finally:
        cli.cli.commands.pop("progress-probe")
    assert said == [0, 1, 2]
    assert code == 1 and err == "error: could not write to standard output: No space left on device\n", err


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
@pytest.mark.parametrize("command", [("list",), ("score", "/no/such/folder")])
def test_list_and_an_error_to_dev_full_say_so_on_stderr(command) -> None:
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "mlbench.cli", *command], stdout=full, stderr=subprocess.PIPE,
                              text=True, timeout=120)
    assert proc.returncode in (1, 2) and proc.stderr.startswith("error: ") and len(proc.stderr.splitlines()) == 1, \
        proc.stderr


# --- values that are too deep, too long or too many --------------------------------------------------------------

def _edited_log(folder: Path, edit) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    f = folder / "result_0.txt"
    f.write_text(edit(LOG.read_text()))
    return f


def test_values_nested_a_thousand_deep_are_shown_not_a_recursion_error(tmp_path, mlbench) -> None:
    """A run_stop status or a hyperparameter nested 1000 lists deep: score, compare and scaling ended in a
    RecursionError out of repr() (exit 1, a traceback)."""
    deep = "[" * 1000 + "1" + "]" * 1000
    status = _edited_log(tmp_path / "a", lambda t: t.replace('"status": "success"', f'"status": {deep}'))
    opt = _edited_log(tmp_path / "b", lambda t: t.replace('"key": "opt_name", "value": "adamw"',
                                                          f'"key": "opt_name", "value": {deep}'))
    assert '"key": "opt_name", "value": [[' in opt.read_text()
    for args in (("score", status), ("compare", "--no-score", status, LOG), ("compare", "--no-score", opt, LOG),
                 ("scaling", status, LOG, "--devices", "8", "--devices", "16")):
        code, out, err = mlbench(*args)
        # (the official checkers' own RecursionError on such a line is their verdict, reported as one)
        assert code in (0, 2) and "Traceback" not in out + err and len(out) < 50_000, (args, code, out[-500:], err)
    code, out, _ = mlbench("compare", "--no-score", opt, LOG)
    assert "opt_name" in out and "(list nested too deep to show)" in out, out


def test_long_values_from_logs_and_run_records_are_cut_and_many_keys_bounded(tmp_path, mlbench) -> None:
    """A 5-million-character opt_name printed 15.7 MB; a run record's million-character prediction device 30 MB;
    300,000 keys before run_start made compare take minutes (a row and a dict copy a key), their values its
    memory."""
    long = _edited_log(tmp_path / "long", lambda t: t.replace('"value": "adamw"', '"value": "adamw' + "x" * 5_000_000
                                                              + '"'))
    (tmp_path / "long" / "result_0.json").write_text(json.dumps({"prediction": {"step_time_s": 10,
                                                                                 "device": "D" * 1_000_000}}))
    code, out, err = mlbench("compare", "--no-score", long, LOG)
    assert code == 0 and len(out) < 50_000 and "adamwxxx" in out and "DDDD" in out, (code, len(out), err)
    many = "".join(f':::MLLOG {{"namespace": "", "time_ms": 1, "event_type": "POINT_IN_TIME", "key": "hp{j}", '
                   f'"value": {j}, "metadata": {{}}}}\n' for j in range(1200))
    keys = _edited_log(tmp_path / "many", lambda t: many + t)
    from mlbench.analysis.logs import read_log

    log = read_log(keys, steps=False)
    assert len(log.hyperparams) == 1000, len(log.hyperparams)
    assert any("more keys before run_start than the 1,000 compared" in p for p in log.problems), log.problems


def test_an_evaluation_after_run_stop_does_not_undo_a_converged_run(tmp_path) -> None:
    """A run whose record states its target, with an evaluation logged after run_stop that misses it: the run was
    made invalid ('the last evaluation misses the target'), while its samples to converge are read, as the RCP
    checker reads them, at the last evaluation before run_stop (3.2907 here, which meets 3.3)."""
    from mlbench.analysis.logs import find_sets

    late = (':::MLLOG {"namespace": "", "time_ms": 1759972064686, "event_type": "POINT_IN_TIME", "key": '
            '"eval_accuracy", "value": 3.5, "metadata": {"epoch_num": 180000, "samples_count": 180000}}\n')
    f = _edited_log(tmp_path / "set", lambda t: t + late)
    f.with_suffix(".json").write_text(json.dumps({"quality": {"target": 3.3, "direction": "min"}}))
    (run,) = find_sets(f.parent)[0].runs
    assert run.status == "success" and not run.invalid and run.problems == [], run.problems
    f.write_text(f.read_text().replace('"value": 3.290742874145508', '"value": 3.31'))  # before run_stop: misses
    (run,) = find_sets(f.parent)[0].runs
    assert run.invalid and "the last evaluation, 3.31, misses the target" in run.problems[-1], run.problems


def test_the_rcp_checker_is_not_run_on_a_line_it_could_not_read_in_time(tmp_path, monkeypatch) -> None:
    """The RCP checker strips every line as the compliance checker does (re.sub(".*:::MLLOG ", ...), quadratic in
    the line's length) and runs inside `score`, where no limit stops it: a 3.5 MB line kept score busy for hours
    while `check` refused the same file at once. The RCP check is now refused on the same grounds (here it would
    have run: it is replaced by a stand-in that says so)."""
    f = _edited_log(tmp_path / "set", lambda t: t.replace('"status": "success"',
                                                          '"status": "success", "x": "' + "x" * 1_000_000 + '"'))

    def ran(*args, **kwargs):
        raise AssertionError("the RCP checker ran")

    monkeypatch.setattr(mlperf_tools, "rcp_check_files", ran)
    notes: list[str] = []
    ok, msg, factor, _ = score.rcp_check([f], "llama31_8b", "5.1.0", notes)
    assert not ok and factor == 1.0 and msg.startswith("RCP checker not run, as it could not read result_0.txt in "
                                                       "time: line 128 is 1,000,"), msg


def test_compare_takes_a_mixed_folders_runs_as_score_does(tmp_path, mlbench) -> None:
    """A folder of llama31_8b runs holding one gpt3 log: score left it out, saying so, while compare took the
    first run's benchmark, counted the other's steps and noted 'different benchmarks side by side'."""
    folder = tmp_path / "llama31_8b"
    shutil.copytree(SET, folder)
    other = folder / "result_0.txt"
    other.write_text(other.read_text().replace('"key": "submission_benchmark", "value": "llama31_8b"',
                                               '"key": "submission_benchmark", "value": "gpt3"'))
    from mlbench.analysis.compare import build_comparison

    cmp = build_comparison([str(folder), str(LOG)], with_score=False)
    mixed = cmp.entries[0]
    assert mixed.benchmark == "llama31_8b" and len(mixed.runs) == 9, (mixed.benchmark, len(mixed.runs))
    assert "mixed benchmarks in one folder: llama31_8b; left out result_0.txt (gpt3)" in mixed.problems
    assert not any("different benchmarks side by side" in n for n in cmp.notes), cmp.notes


def test_compare_refuses_files_that_are_no_mlperf_logs_as_score_does(tmp_path, mlbench) -> None:
    """Two text files: an empty comparison, exit 0, while score refused them (exit 2)."""
    for i, word in enumerate(("hello", "world")):
        (tmp_path / f"result_{i}.txt").write_text(word + "\n")
    code, out, err = mlbench("compare", tmp_path / "result_0.txt", tmp_path / "result_1.txt")
    assert code == 2 and "result_0.txt is not an MLPerf result log (no :::MLLOG lines)" in out + err, (code, out, err)
    code, out, err = mlbench("compare", tmp_path, LOG)
    assert code == 2 and "holds no MLPerf result log" in out + err, (code, out, err)
    # every line broken JSON: score judged it a run with no run_start (exit 0), compare compared it
    for i in range(2):
        (tmp_path / f"result_{i}.txt").write_text(':::MLLOG {garbage\n:::MLLOG {"key": \n')
    code, out, err = mlbench("score", tmp_path)
    assert code == 2 and "none of the 2 result_*.txt in" in err and "(no :::MLLOG line that can be read)" in err, err
    code, out, err = mlbench("compare", tmp_path / "result_0.txt", tmp_path / "result_1.txt")
    said = "result_0.txt is not an MLPerf result log (no :::MLLOG line that can be read)"
    assert code == 2 and said in out + err, (code, out, err)


def test_a_markdown_reports_images_replace_only_an_earlier_reports(tmp_path, mlbench) -> None:
    """A user's rep_files/convergence.png (no report there) was replaced by a report's image, exit 0; --html given
    as rep_files/convergence.png beside --md rep.md was 'written' and then replaced by the image, the HTML lost."""
    other = shutil.copytree(SET, tmp_path / "b" / "llama31_8b")
    (tmp_path / "rep_files").mkdir()
    mine = tmp_path / "rep_files" / "convergence.png"
    mine.write_text("notes\n")
    code, out, err = mlbench("compare", "--no-score", SET, other, "--md", tmp_path / "rep.md")
    assert code == 2 and "convergence.png: is there, and is no image of a report mlbench wrote" in out + err, out + err
    assert mine.read_text() == "notes\n" and not (tmp_path / "rep.md").exists()
    (tmp_path / "r_files").mkdir()
    code, out, err = mlbench("compare", "--no-score", SET, other, "--md", tmp_path / "r.md", "--html",
                             tmp_path / "r_files" / "convergence.png")
    assert code == 2 and "is where --md" in out + err and "puts its images" in out + err, out + err
    mine.unlink()
    for _ in range(2):  # its own images, from the run before, are replaced
        code, out, err = mlbench("compare", "--no-score", SET, other, "--md", tmp_path / "rep.md")
        assert code == 0 and mine.read_bytes().startswith(b"\x89PNG"), out + err
    # the same --html in a second command: it was written among the images the next --md replaces
    code, out, err = mlbench("compare", "--no-score", SET, other, "--html", tmp_path / "rep_files" / "x.html")
    assert code == 2 and f"is in {tmp_path / 'rep_files'}, the images folder of the Markdown report " \
        f"{tmp_path / 'rep.md'}" in out + err, out + err
    assert not (tmp_path / "rep_files" / "x.html").exists()
    (tmp_path / "link").symlink_to(tmp_path / "rep_files")  # nor through a link to it, nor a Markdown report there
    (tmp_path / "rep_files" / "sub").mkdir()  # nor in a folder below it
    for option, name in (("--html", tmp_path / "link" / "x.html"), ("--md", tmp_path / "rep_files" / "y.md"),
                         ("--html", tmp_path / "rep_files" / "sub" / "z.html")):
        code, out, err = mlbench("compare", "--no-score", SET, other, option, name)
        assert code == 2 and "the images folder of the Markdown report" in out + err, out + err
    assert sorted(p.name for p in (tmp_path / "rep_files").iterdir()) == ["convergence.png", "step_times.png",
                                                                          "sub"]


def test_a_set_whose_runs_log_different_divisions_says_so(tmp_path, monkeypatch) -> None:
    """One run of a closed set logging division 'open': the RCP check was skipped or not by which file came first,
    and nothing said the set mixed divisions. (The compliance checker is not what this is about: every file is
    taken as compliant.)"""
    folder = shutil.copytree(SET, tmp_path / "llama31_8b")
    (folder / "result_3.txt").write_text((folder / "result_3.txt").read_text().replace(
        '"key": "submission_division", "value": "closed"', '"key": "submission_division", "value": "open"'))
    from mlbench.analysis.logs import find_sets

    monkeypatch.setattr(score, "_compliance_all", lambda files, *args, **kwargs: [(True, [])] * len(files))
    rs = find_sets(folder, steps=False)[0]
    assert sorted({r.division for r in rs.runs}) == ["closed", "open"]
    s = score.score_set(rs, jobs=1)
    notes = [n for n in s.notes if "submission_division" in n]
    assert notes and "(closed: result_0.txt" in notes[0] and "open: result_3.txt)" in notes[0], s.notes


UF = (Path(__file__).parent / "data" / "mlperf-results" / "training_results_v5.1" / "University-of-Florida" / "results"
      / "hpg.dgxb200x8.n32" / "llama31_8b")


def test_scaling_takes_a_sets_runs_as_score_does_and_its_base_is_a_configuration_with_a_figure(tmp_path,
                                                                                               mlbench) -> None:
    """scaling counted another benchmark's run in a folder (score and compare leave it out), refused a folder whose
    other-benchmark runs were the first, took a set of empty files as a configuration, and a base whose runs all
    failed blanked every efficiency."""
    from mlbench.analysis.scaling import build_scaling

    mixed = shutil.copytree(SET, tmp_path / "mixed" / "llama31_8b")
    for f in ("result_0.txt", "result_1.txt"):
        (mixed / f).write_text((mixed / f).read_text().replace(
            '"key": "submission_benchmark", "value": "llama31_8b"', '"key": "submission_benchmark", "value": "bert"'))
    sc = build_scaling([mixed, UF], devices=[8, 256])
    assert sc.benchmark == "llama31_8b" and sc.points[0].ttt_runs == 8, (sc.benchmark, sc.points[0])
    assert any("left out result_0.txt (bert), result_1.txt (bert)" in n for n in sc.notes), sc.notes
    failed = shutil.copytree(SET, tmp_path / "failed" / "llama31_8b")
    for f in failed.glob("result_*.txt"):
        f.write_text(f.read_text().replace('"status": "success"', '"status": "aborted"'))
    sc = build_scaling([failed, SET, UF], devices=[4, 8, 256])
    effs = dict((q.devices, e) for q, e in sc.strong_ttt)
    assert effs[4] is None and effs[8] == 1.0 and effs[256] is not None, effs
    assert any("no successful run, so the time-to-train base is" in n for n in sc.notes), sc.notes
    # the text table names that base and its speed-ups from it (its title named the failed set, every speed-up "-")
    from mlbench.analysis.scaling import tables

    title, _, rows = next(t for t in tables(sc) if t[0].startswith("strong scaling, time to train"))
    base = next(q for q in sc.points if q.devices == 8)
    assert title.endswith(f"(base: {base.label})") and rows[1][2:4] == ["1.000", "1.000"], (title, rows)
    empty = tmp_path / "empty" / "llama31_8b"
    empty.mkdir(parents=True)
    (empty / "result_0.txt").write_text("")
    code, out, err = mlbench("scaling", empty, SET, "--devices", "8", "--devices", "16")
    assert code == 2 and "holds no MLPerf result log" in out + err, (code, out, err)


def test_folder_names_with_undecodable_bytes_in_reports_plots_and_json(tmp_path, mlbench) -> None:
    """A set folder named with a byte that is not UTF-8 (llama31_8b<0xFF>): compare --html and --md ended in a
    matplotlib traceback (its font refused the lone surrogate), and score --json wrote "\\udcff", which strict
    parsers refuse. Such a byte is written \\xff in a report, a plot and a JSON document. In this process: its
    arguments are the names as Python decodes a command line (the byte a lone surrogate), and a surrogate written
    out (as a process's stdout would write the raw byte) fails the strict UTF-8 encoding below."""
    import orjson

    a = shutil.copytree(SET, tmp_path / os.fsdecode(b"llama31_8b\xff"))
    b = shutil.copytree(SET, tmp_path / os.fsdecode(b"x\xc3\x28"))

    # The terminal's text is UTF-8 too, each such byte written \xNN (0xFF and 0xC3 went out raw, as ls prints
    # them: text output that was not UTF-8, while --json escaped them)
    for args in (("score", a, "--devices", "8"), ("compare", "--no-score", a, b)):
        code, out, err = mlbench(*args)
        out.encode("utf-8")  # (strict: no lone surrogate left)
        assert code == 0 and "llama31_8b\\xff" in out, out + err
        assert "x\\xc3(" in out or args[0] == "score", out

    for option, name in (("--html", "r.html"), ("--md", "r.md")):
        code, out, err = mlbench("compare", "--no-score", a, b, option, tmp_path / name)
        assert code == 0, (option, out, err)
        text = (tmp_path / name).read_bytes().decode("utf-8")  # UTF-8 throughout (Markdown escapes the backslash)
        assert ("llama31_8b\\xff" if option == "--html" else "llama31\\_8b\\\\xff") in text, option
    code, out, err = mlbench("score", a, "--json", "--devices", "8")
    assert code == 0 and orjson.loads(out)[0]["folder"].endswith("llama31_8b\\xff"), out + err


def test_a_run_stop_without_a_status_is_named_with_its_file_and_line(tmp_path) -> None:
    """It read "run_stop has status 'no status'": no file, no line, and as if the status logged were 'no status'."""
    from mlbench.analysis.logs import read_log

    f = _edited_log(tmp_path / "set", lambda t: t.replace('"status": "success", ', ""))
    log = read_log(f, steps=False)
    assert f"{f}:128: run_stop has no status (metadata.status), expected 'success' or 'aborted'" in log.problems, \
        log.problems
    assert log.status == "no status"


def test_a_round_the_path_names_without_rules_for_the_benchmark_is_said_passed_over(tmp_path, mlbench) -> None:
    """llama31_8b logs under training_results_v4.1 (a round before llama31_8b): check and score judged them by
    another ruleset without a word, while --ruleset 4.1.0 is refused."""
    folder = tmp_path / "training_results_v4.1" / "AMD" / "results" / "x" / "llama31_8b"
    shutil.copytree(SET, folder)
    code, out, err = mlbench("check", folder / "result_0.txt")
    assert code == 0 and "note: the path names round 4.1, which has no rules for llama31_8b: judged by 6.0.0" \
        in out, out
    code, out, err = mlbench("score", folder, "--json")
    [doc] = json.loads(out)
    assert code == 0 and "the path names round 4.1, which has no rules for llama31_8b: judged by 6.0.0" \
        in doc["notes"], doc["notes"]  # (as check: score took the newest, 6.1.0)
    code, out, err = mlbench("score", SET, "--json")  # a round it names with rules: no note
    assert not [n for n in json.loads(out)[0]["notes"] if "round" in n], out


def test_a_set_of_runs_at_different_global_batches_is_said_so(tmp_path, mlbench) -> None:
    """One run of another batch in a set: the RCP check failed with the checker's 'KeyError: None' and no word on
    why; the batches and their files are named now."""
    folder = tmp_path / "llama31_8b"
    shutil.copytree(SET, folder)
    f = folder / "result_9.txt"
    f.write_text(f.read_text().replace('"key": "global_batch_size", "value": 32', '"key": "global_batch_size", '
                                                                                  '"value": 64'))
    code, out, err = mlbench("score", folder, "--json")
    [doc] = json.loads(out)
    assert code == 0 and "the runs log different global_batch_size values (32: result_0.txt, result_1.txt, " \
        "result_2.txt, result_3.txt, result_4.txt, result_5.txt, result_6.txt, result_7.txt, result_8.txt; 64: " \
        "result_9.txt): a set is one batch" in " ".join(doc["notes"]), doc["notes"]


def test_scaling_names_apart_two_sets_of_one_label(tmp_path, mlbench) -> None:
    """The same organisation, system and benchmark from two results trees: every row and the 'base' note of
    scaling carried the same label (compare named them apart by their paths; scaling does now too)."""
    org = SET.parents[2]
    for tree in ("a", "b"):
        shutil.copytree(org, tmp_path / tree / "training_results_v5.1" / "AMD")
    sets = [tmp_path / t / "training_results_v5.1" / "AMD" / "results" / SET.parent.name / "llama31_8b"
            for t in ("a", "b")]
    code, out, err = mlbench("scaling", *sets, "--md", tmp_path / "s.md")
    text = (tmp_path / "s.md").read_text().replace("\\", "")  # (Markdown's escapes)
    assert code == 0, out + err
    for t in sets:
        assert f"| AMD/{SET.parent.name}/llama31_8b [{t}] | 8 (systems json) |" in text, text
    assert f"(base: AMD/{SET.parent.name}/llama31_8b [{sets[0]}])" in text, text


def test_a_systems_json_field_the_summarizer_cannot_read_is_said_in_one_short_line(tmp_path, mlbench) -> None:
    """host_processors_per_node of 100,000 characters: the note that the official summarizer makes no row printed
    it whole, a line of 100,000 characters and more (score, and score --json's notes)."""
    org = tmp_path / "AMD"
    shutil.copytree(SET.parents[2], org)
    system = next((org / "systems").glob("*.json"))
    system.write_text(json.dumps({**json.loads(system.read_text()), "host_processors_per_node": "x" * 100_000}))
    for as_json in ((), ("--json",)):
        code, out, err = mlbench("score", org, *as_json)
        assert code == 0 and "host_processors_per_node 'xxxx" in out and "... is no whole number" in out, out + err
        assert max(map(len, out.splitlines())) < 1000, max(map(len, out.splitlines()))


def test_score_refuses_one_device_count_for_the_sets_of_several_systems(tmp_path, mlbench) -> None:
    """`score <tree> --devices 8` scored every set of the tree, of systems of 512 to 8192 devices, as one of 8
    (per-device figures off by up to 1024x), while scaling refuses --devices for a PATH of several sets."""
    tree = tmp_path / "training_results_v5.1"
    for system in ("sysA", "sysB"):
        shutil.copytree(SET, tree / "AMD" / "results" / system / "llama31_8b")
    code, out, err = mlbench("score", tree, "--devices", "8", "--json")
    assert code == 2 and out == "" and len(err.splitlines()) == 1, out + err
    assert "holds sets of 2 systems (sysA, sysB); score each system's folder with its own --devices" in err
    code, out, err = mlbench("score", tree / "AMD" / "results" / "sysA", "--devices", "8", "--json")
    assert code == 0 and json.loads(out)[0]["devices"] == 8, out + err
