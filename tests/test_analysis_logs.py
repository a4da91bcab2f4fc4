"""Robust reading: every broken input gives a clear message, never a traceback."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlbench.analysis.commands import compare as compare_cmd
from mlbench.analysis.commands import scaling as scaling_cmd
from mlbench.analysis.commands import score as score_cmd
from mlbench.analysis.logs import find_sets, read_log
from mlbench.errors import UserError


def _line(key: str, t: int, value: object = None, **md: object) -> str:
    return ":::MLLOG " + json.dumps({"namespace": "", "time_ms": t, "event_type": "POINT_IN_TIME",
                                     "key": key, "value": value, "metadata": md}) + "\n"


def tiny_log(steps: int = 5, step_s: float = 0.5, status: str = "success", stop: bool = True,
             gbs: int = 8, seq: int = 128, step_key: str = "train_step_time") -> str:
    t0 = 1_700_000_000_000
    out = [_line("submission_benchmark", t0, "llama31_8b"), _line("submission_org", t0, "mlbench"),
           _line("submission_division", t0, "open"), _line("global_batch_size", t0, gbs),
           _line("max_sequence_length", t0, seq), _line("tensor_parallelism", t0, 2),
           _line("run_start", t0 + 1000)]
    t = t0 + 1000
    for s in range(1, steps + 1):
        t += int(step_s * 1000)
        out.append(_line("tracked_stats", t, {step_key: step_s, "tokens_per_s": gbs * seq / step_s,
                                              "tflops_per_device": 100.0}, step=s))
    out.append(_line("eval_accuracy", t, 3.5, samples_count=steps * gbs))
    if stop:
        out.append(_line("run_stop", t + 10, None, status=status))
    return "".join(out)


def test_well_formed_log(tmp_path):
    f = tmp_path / "result_0.txt"
    f.write_text(tiny_log())
    log = read_log(f)
    assert log.problems == []
    assert log.status == "success" and log.benchmark == "llama31_8b"
    assert log.ttt_min == pytest.approx((2500 + 10) / 60000)
    st = log.step_times
    assert st.source == "tracked_stats" and len(st.seconds) == 5
    assert st.stats()["median"] == pytest.approx(0.5)
    assert log.samples_to_converge == 40 and log.steps_to_converge == 5
    assert log.hyperparams["tensor_parallelism"] == 2


def test_broken_json_lines_are_skipped_and_reported(tmp_path):
    f = tmp_path / "result_0.txt"
    text = tiny_log().splitlines(keepends=True)
    text.insert(3, ':::MLLOG {"key": "oops", \n')
    f.write_text("".join(text))
    log = read_log(f)
    assert any("broken JSON" in p and "line 4" in p for p in log.problems)
    assert log.status == "success"  # the rest is still read


@pytest.mark.parametrize("line", [
    b':::MLLOG \x00\x00{"key": "x"}',  # NUL bytes: json.loads of bytes would guess UTF-16 (and we recursed)
    b':::MLLOG {"key": "x", "value": "\xff\xfe"',  # bad UTF-8, broken JSON
    b':::MLLOG {"key": "x", "value": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",  # too deep for either parser
], ids=["nul", "bad utf-8", "deep"])
def test_lines_the_parsers_choke_on_are_broken_lines(tmp_path, line):
    f = tmp_path / "result_0.txt"
    text = tiny_log().encode().splitlines(keepends=True)
    text.insert(3, line + b"\n")
    f.write_bytes(b"".join(text))
    log = read_log(f)
    assert log.problems == ["1 line(s) with broken JSON skipped (line 4)"]
    assert log.status == "success" and log.ttt_min is not None


def test_truncated_and_missing_run_stop(tmp_path):
    f = tmp_path / "result_0.txt"
    f.write_text(tiny_log(stop=False) + ':::MLLOG {"namespace": "", "time_ms": 17')
    log = read_log(f)
    assert any("truncated" in p for p in log.problems)
    assert any("no run_stop" in p for p in log.problems)
    assert log.ttt_min is None and log.status == "no run_stop"


def test_not_an_mlperf_log(tmp_path):
    f = tmp_path / "result_0.txt"
    f.write_text("hello\nworld\n")
    assert any("no :::MLLOG lines" in p for p in read_log(f).problems)


def test_empty_and_missing_paths_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="no result_"):
        find_sets(tmp_path)
    with pytest.raises(UserError, match="no such file"):
        find_sets(tmp_path / "nope")
    res = CliRunner().invoke(score_cmd, [str(tmp_path)])
    assert isinstance(res.exception, UserError)


def test_step_time_variants(tmp_path):
    # NVIDIA gpt3 key, and a step counter in samples logged every 4 steps with the time covering all 4.
    f = tmp_path / "result_0.txt"
    f.write_text(tiny_log(step_key="train_step_timing in s"))
    assert read_log(f).step_times.stats()["median"] == pytest.approx(0.5)
    t0 = 1_700_000_000_000
    lines = [_line("submission_benchmark", t0, "llama31_405b"), _line("global_batch_size", t0, 16),
             _line("max_sequence_length", t0, 8192), _line("run_start", t0)]
    for i in range(1, 6):
        lines.append(_line("tracked_stats", t0 + i * 4000, {"train_step_time": 4.0}, step=float(i * 4 * 16)))
    lines.append(_line("run_stop", t0 + 30000, None, status="success"))
    g = tmp_path / "result_1.txt"
    g.write_text("".join(lines))
    st = read_log(g).step_times
    assert "samples" in st.note and "divided" in st.note
    assert st.stats()["median"] == pytest.approx(1.0)


def _our_set(root: Path, system: str, devices: int, step_s: float, gbs: int, n: int = 3) -> Path:
    d = root / system / "llama31_8b"
    d.mkdir(parents=True)
    for i in range(n):
        (d / f"result_{i}.txt").write_text(tiny_log(step_s=step_s, gbs=gbs))
        (d / f"result_{i}.json").write_text(json.dumps({"devices": devices, "mfu": 0.4}))
    return d


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_compare_and_scaling_on_our_own_runs(tmp_path):
    a = _our_set(tmp_path, "sysA", 8, 1.0, 16)
    b = _our_set(tmp_path, "sysB", 16, 0.55, 16)
    html, md = tmp_path / "cmp.html", tmp_path / "rep" / "cmp.md"
    md.parent.mkdir()
    res = CliRunner().invoke(compare_cmd, [str(a), str(b), "--no-score", "--html", str(html), "--md", str(md)])
    assert res.exit_code == 0, res.output
    assert "step time median" in res.output and "40.0%" in res.output  # MFU from the run record
    page = html.read_text()
    assert page.count("data:image/png;base64,") == 2
    assert (tmp_path / "rep" / "cmp_files" / "convergence.png").exists()
    mode = 0o666 & ~_umask()  # as any file the user writes, not a temporary file's 0600
    for f in (html, md, tmp_path / "rep" / "cmp_files" / "convergence.png"):
        assert f.stat().st_mode & 0o777 == mode, f
    res = CliRunner().invoke(scaling_cmd, [str(a), str(b)])
    assert res.exit_code == 0, res.output
    # per-step strong scaling at global batch 16: 1.0 x 8 / (0.55 x 16)
    assert f"{1.0 * 8 / (0.55 * 16):.3f}" in res.output


def test_compare_reads_each_run_record_once(tmp_path, monkeypatch):
    """compare parsed a run's record once for each thing it read of it (its variant, devices, quality target, MFU,
    prediction, features): several times, 0.2 s each for an 18 MiB record. Each is read once; a record changed
    after the command is read anew by the next."""
    from mlbench import logfile

    a = _our_set(tmp_path, "sysA", 8, 1.0, 16, n=2)
    b = _our_set(tmp_path, "sysB", 16, 0.55, 16, n=1)
    (b / "result_0.json").write_text(json.dumps({"devices": 16, "mfu": 0.4, "steps": [{"step": 1}] * 1000,
                                                 "prediction": {"step_time_s": 0.5, "device": "h100"}}))
    reads: list[str] = []
    load = logfile._load_record
    monkeypatch.setattr(logfile, "_load_record", lambda path: reads.append(Path(path).name) or load(path))
    res = CliRunner().invoke(compare_cmd, [str(a), str(b), "--no-score", "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["entries"][1]["mfu"] == 0.4, res.output
    assert sorted(reads) == ["result_0.json", "result_0.json", "result_1.json"], reads
    (b / "result_0.json").write_text(json.dumps({"devices": 16, "mfu": 0.25}))
    res = CliRunner().invoke(compare_cmd, [str(a), str(b), "--no-score", "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["entries"][1]["mfu"] == 0.25, res.output
    assert logfile._read_once is None  # nothing kept past the command


def test_scaling_rejects_mixed_benchmarks_and_unknown_devices(tmp_path):
    a = _our_set(tmp_path, "sysA", 8, 1.0, 16)
    d = tmp_path / "sysC" / "llama31_8b"
    d.mkdir(parents=True)
    (d / "result_0.txt").write_text(tiny_log())
    res = CliRunner().invoke(scaling_cmd, [str(a), str(d)])
    assert isinstance(res.exception, UserError) and "device count unknown" in str(res.exception)
    res = CliRunner().invoke(scaling_cmd, [str(a), str(d), "--devices", "8", "--devices", "16"])
    assert res.exit_code == 0, res.output


def test_analysis_never_imports_the_training_code():
    import subprocess
    import sys

    code = ("import sys, mlbench.analysis.commands, mlbench.analysis.compare, mlbench.analysis.scaling, "
            "mlbench.analysis.score, mlbench.compliance, mlbench.logfile; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'megatron') "
            "or m.startswith('mlbench.train')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


def test_a_stray_log_in_a_folder_of_our_runs_is_left_out_with_a_note(tmp_path):
    """mlbench publishes the record before the log, so in a folder of its runs a log without a record is not one
    of them: with one beside tiny runs, score judged the whole set by the closed rules (a set is tiny only if every
    file's record says so) and the real runs non-compliant. A published folder (no records at all) is read whole."""
    d = _our_set(tmp_path, "sysA", 8, 1.0, 16)
    for i in range(3):
        (d / f"result_{i}.json").write_text(json.dumps({"devices": 8, "variant": "tiny"}))
    (d / "result_3.txt").write_text(tiny_log())  # a copy, no record
    note = ("result_3.txt: left out: no run record (result_3.json) beside it, as every run mlbench publishes in "
            "this folder has (a stray or copied log)")
    rs = find_sets(d)[0]
    assert [f.name for f in rs.files] == ["result_0.txt", "result_1.txt", "result_2.txt"] and rs.smoke
    assert rs.left_out == [note]
    res = CliRunner().invoke(score_cmd, [str(d), "--json"])
    assert res.exit_code == 0, res.output
    scored = json.loads(res.output)[0]
    assert [r["file"] for r in scored["runs"]] == ["result_0.txt", "result_1.txt", "result_2.txt"]
    assert note in scored["notes"]
    res = CliRunner().invoke(scaling_cmd, [str(d), str(_our_set(tmp_path, "sysB", 16, 0.55, 16))])
    assert res.exit_code == 0 and "left out: no run record" in res.output.replace("\n", " "), res.output
    # a record that is there but cannot be read (a pipe: never opened) is said so, not called missing
    os.mkfifo(d / "result_3.json")
    assert find_sets(d)[0].left_out == [
        "result_3.txt: left out: its run record result_3.json cannot be read (a named pipe, not a regular file), so "
        "it cannot be told what run it is"]
    for i in range(3):
        (d / f"result_{i}.json").unlink()
    assert len(find_sets(d)[0].files) == 4  # no records: a published folder, every log read


@pytest.mark.parametrize(("text", "wrong"), [
    ('{"devices": 8, "variant": "ti', "is not JSON (Unterminated string starting at: line 1 column 27 (char 26))"),
    ("", "is not JSON (Expecting value: line 1 column 1 (char 0))"),
    (b'{"variant": "\xc3("}', "is not JSON ('utf-8' codec can't decode byte 0xc3 in position 13: invalid "
                             "continuation byte)"),
    ('[{"devices": 8, "variant": "tiny"}]', 'is not a run record (a JSON object) but [{"devices": 8, "variant": '
                                            '"tiny"}]'),
    ('{"devices": 8, "variant": 5}', "has variant 5, not a name"),
], ids=["cut short", "empty", "bad unicode", "a list", "variant a number"])
def test_a_garbled_run_record_is_said_so_not_read_as_absent(tmp_path, text, wrong):
    """A run record that is a regular file but garbled was read as no record at all, silently: beside tiny runs,
    its log was scored as a run of unknown kind (judged by the closed rules, the set no longer tiny). It is left out
    as an unreadable one is, saying what is wrong; where no record of the folder can be read, the logs are read as
    published ones, each garbled record named."""
    d = _our_set(tmp_path, "sysA", 8, 1.0, 16, n=4)
    for i in range(4):
        (d / f"result_{i}.json").write_text(json.dumps({"devices": 8, "variant": "tiny"}))
    bad = d / "result_3.json"
    bad.write_bytes(text if isinstance(text, bytes) else text.encode())
    note = f"result_3.txt: left out: its run record result_3.json {wrong}, so it cannot be told what run it is"
    rs = find_sets(d)[0]
    assert [f.name for f in rs.files] == ["result_0.txt", "result_1.txt", "result_2.txt"] and rs.smoke
    assert rs.left_out == [note]
    res = CliRunner().invoke(score_cmd, [str(d), "--json"])
    assert res.exit_code == 0 and note in json.loads(res.output)[0]["notes"], res.output
    for i in range(3):
        (d / f"result_{i}.json").unlink()
    rs = find_sets(d)[0]
    assert len(rs.files) == 4 and rs.left_out == [
        f"result_3.txt: read as a log without a run record: its run record result_3.json {wrong}"]


def test_a_run_or_a_folder_this_user_cannot_read_is_refused_naming_it(tmp_path: Path) -> None:
    """A result_1.txt this user cannot read, in a set: `score` scored it as a failed run ('no run_start', 'the
    compliance checker crashed: PermissionError: [Errno 13] ...'), a score from the others, exit 0; compare and
    scaling took the median of the rest. A benchmark folder it cannot list was 'no result_*.txt files here' for
    score, compare, scaling and check. Each is now refused, naming the file or folder, as check refuses the file."""
    from conftest import unprivileged

    folder = tmp_path / "sys" / "llama31_8b"
    folder.mkdir(parents=True)
    for i in range(3):
        (folder / f"result_{i}.txt").write_text(tiny_log())
    (folder / "result_1.txt").chmod(0)
    sets = "from mlbench.analysis.logs import find_sets; find_sets({!r})"
    checked = "from mlbench.compliance import targets; targets(__import__('pathlib').Path({!r}), None, 'auto')"
    for code in (sets, checked):
        assert unprivileged(code.format(str(tmp_path))).startswith(
            f"mlbench.errors.UserError: {folder}/result_1.txt: cannot ")  # (check's words: 'cannot read (...)')
    assert unprivileged(sets.format(str(folder / "result_1.txt"))) == (
        f"mlbench.errors.UserError: {folder}/result_1.txt: cannot be read (Permission denied); a result log must be "
        f"readable by the user running mlbench")
    (folder / "result_1.txt").chmod(0o644)
    folder.chmod(0o311)  # searched, not listed
    for code in (sets, checked):
        assert unprivileged(code.format(str(tmp_path))) == (
            f"mlbench.errors.UserError: {folder}: cannot be listed (Permission denied); a folder of result logs must "
            f"be readable by the user running mlbench")
    folder.chmod(0o755)
    assert unprivileged(sets.format(str(tmp_path))) == ""
    # beside sets that are read, a folder that cannot be listed was passed over without a word: said in a note;
    # a run's staging folder (another user's run in progress keeps it to itself) is not
    for hidden in (tmp_path / "other" / "gpt3", folder / ".staging-1-2-h@3-x"):
        hidden.mkdir(parents=True)
        hidden.chmod(0)
    notes = "from mlbench.analysis.logs import find_sets; raise SystemExit(repr(find_sets({!r})[0].left_out))"
    assert unprivileged(notes.format(str(tmp_path))) == repr(
        [f"{tmp_path}/other/gpt3: cannot be listed (Permission denied): any result logs in it are not read"])


def test_a_run_record_without_its_log_is_said_left_out_by_score_and_check(tmp_path):
    from mlbench.compliance import _unpublished_notes

    d = _our_set(tmp_path, "sysA", 8, 1.0, 16, n=2)
    (d / "result_0.txt").unlink()  # its log removed by hand: the set of one run looked whole
    (d / "result_5.json").mkdir()  # not even a record: still a name of a run with no log
    notes = find_sets(tmp_path)[0].left_out_notes
    said = [n for n in notes if "without their log" in n]
    assert said == ["2 run record(s) without their log (result_0.json, result_5.json): left out, as there is no "
                    "result_<i>.txt of them to read"], notes
    assert any("without their log (result_0.json" in n for n in _unpublished_notes(tmp_path))  # check says it too
    aside = d / "logs" / "unpublished-staging-x"  # a run's own records, not the folder's: not said
    for kept in (aside, d / ".staging-x", d / ".slurm"):
        kept.mkdir(parents=True)
        (kept / "result_7.json").write_text("{}")
    assert [n for n in find_sets(tmp_path)[0].left_out_notes if "without their log" in n] == said
    (d / "result_1.txt").unlink()  # none left to read: the refusal names them
    with pytest.raises(UserError, match=r"no result_\*\.txt files here.*3 run record\(s\) without their log"):
        find_sets(tmp_path)


@pytest.mark.parametrize("hidden", [".old/llama31_8b", "llama31_8b/.staging-1-2-h@3-x", ".trash"])
def test_result_logs_in_a_hidden_folder_are_passed_over_with_a_note_by_score_and_check(tmp_path, hidden):
    """R/.old/llama31_8b/result_0.txt (runs put aside) or a staging folder's copy was scored, compared and checked
    as a set of R; a hidden folder holds no published result: passed over, said. Given itself, it is read."""
    from mlbench.compliance import _unpublished_notes, targets

    root = tmp_path / "R"
    _our_set(root, "sysA", 8, 1.0, 16)
    aside = root / "sysA" / hidden
    aside.mkdir(parents=True)
    (aside / "result_0.txt").write_text(tiny_log(step_s=3.0))
    sets = find_sets(root)
    assert [s.folder for s in sets] == [(root / "sysA" / "llama31_8b").resolve()]
    top = root / "sysA" / hidden.split("/")[0] if hidden.startswith(".") else aside
    note = f"{top}: 1 result_*.txt in a hidden folder, not read"
    assert any(n.startswith(note) for n in sets[0].left_out_notes), sets[0].left_out_notes
    assert all(".old" not in str(t.path) and ".staging" not in str(t.path) and ".trash" not in str(t.path)
               for t in targets(root, None, "auto"))
    assert any(n.startswith(note) for n in _unpublished_notes(root))  # check says it too
    assert [f.name for s in find_sets(aside) for f in s.files] == ["result_0.txt"]  # given, it is read
    for f in (root / "sysA" / "llama31_8b").glob("result_*"):
        f.unlink()
    with pytest.raises(UserError, match="no result_.*hidden folder, not read"):  # nothing else there: said why
        find_sets(root)


def test_a_result_name_with_leading_zeros_holds_its_index_for_run_score_and_check(tmp_path):
    """result_007.txt beside result_7.txt: the next run claimed index 7 beside result_007 (two logs of one index),
    and score and check read both without a word. The rule (mlbench.results.index_of): a result_<digits> name holds
    its number; a run claims no index one holds; analysis reads every result_*.txt (as the official summarizer does)
    and says a name mlbench does not write, and the other log of its index."""
    from mlbench import results
    from mlbench.compliance import _unpublished_notes

    d = _our_set(tmp_path, "sysA", 8, 1.0, 16, n=1)
    (d / "result_007.txt").write_text(tiny_log(step_s=2.0))
    (d / "result_007.json").write_text(json.dumps({"devices": 8}))
    staging = results.stage(d)
    (staging / "mlperf.log").write_text(tiny_log())
    for i in range(1, 7):
        (d / "logs" / f"result_{i}").mkdir(parents=True)  # indices 1 to 6 held: the next free one is 8, not 7
    assert results.publish(d, staging, {"status": "success"}).name == "result_8.txt"
    (d / "result_7.txt").write_text(tiny_log(step_s=2.5))
    (d / "result_7.json").write_text(json.dumps({"devices": 8}))
    said = ("result_007.txt: not a result name mlbench writes (result_<i>.txt, <i> a number without leading zeros): "
            "read as another run, as the official summarizer reads every result_*.txt; result_7.txt holds index 7 "
            "too: two logs of one index")
    s = find_sets(tmp_path)[0]
    assert [f.name for f in s.files] == ["result_0.txt", "result_007.txt", "result_7.txt", "result_8.txt"]
    assert said in s.left_out_notes, s.left_out_notes
    assert f"{d}: {said}" in _unpublished_notes(tmp_path)  # check says it too
    assert results.index_of("result_007.json") == 7 and not results.canonical("result_007.txt")
    assert results.canonical("result_0.txt") and results.index_of("result_x.txt") is None
