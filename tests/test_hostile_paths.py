"""Hostile paths for the analysis commands: a JSON input that is a pipe or a device, a path the system refuses (a
name too long), a report named as a result file, a folder path for a report, a signal while `check` works. Each is
one line (`error: ...`, exit 2, nothing written) or a reason in the output; never a hang, a traceback or a
half-written results folder."""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from test_analysis_garbled import RULESET, _sets, mlbench
from test_analysis_hostile_inputs import _tree
from test_analysis_logs import tiny_log

from mlbench.analysis.logs import find_sets
from mlbench.logfile import MAX_JSON_BYTES, load_json


class Blocked(Exception):  # (not TimeoutError: an OSError, which the code under test may take for its own)
    pass


@contextlib.contextmanager
def _no_hang(seconds: int = 30):
    """Fails the test where the body blocks (reading a pipe blocked forever: was)."""
    def stop(signum, frame):
        raise Blocked(f"blocked for {seconds} s")

    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


# --- JSON inputs that are no regular file ------------------------------------------------------------------------

def test_a_run_record_that_is_a_pipe_is_a_reason_not_a_hang(tmp_path, capsys, monkeypatch):
    """A FIFO as result_0.json blocked check, score and compare forever (was)."""
    a, b = _sets(tmp_path, tiny_log())
    (a / "result_0.json").unlink()
    os.mkfifo(a / "result_0.json")
    with _no_hang():
        with pytest.raises(OSError, match="a named pipe, not a regular file"):
            load_json(a / "result_0.json")
        code, out = mlbench(capsys, monkeypatch, "compare", str(a), str(b), "--no-score")
        assert code == 0 and "Traceback" not in out, out
        code, out = mlbench(capsys, monkeypatch, "check", str(a / "result_0.txt"), "--ruleset", RULESET)
    assert code in (0, 1) and "result_0.json cannot be read (a named pipe, not a regular file)" in out, out


def test_a_systems_json_or_scaling_json_that_is_a_pipe_is_a_reason(tmp_path):
    from mlbench.analysis.score import _scaling_json

    d = _tree(tmp_path, "{}", {"devices": 4})
    (d.parent.parent.parent / "systems" / "sys.json").unlink()
    os.mkfifo(d.parent.parent.parent / "systems" / "sys.json")
    os.mkfifo(d / "scaling.json")  # was: taken for no scaling.json, the score unscaled
    with _no_hang():
        rs = find_sets(d)[0]
        n, source = rs.devices()
        notes: list[str] = []
        assert _scaling_json(rs, notes) == (None, False)
    assert n == 4 and "systems/sys.json cannot be read (a named pipe, not a regular file)" in source, source
    assert notes == [f"{d / 'scaling.json'}: cannot be read (a named pipe, not a regular file): no score"]


def test_a_json_input_larger_than_the_bound_is_refused_unread(tmp_path):
    big = tmp_path / "result_0.json"
    with open(big, "wb") as f:
        f.truncate(MAX_JSON_BYTES + 1)  # sparse: nothing written
    with pytest.raises(OSError, match=f"{MAX_JSON_BYTES + 1:,} bytes, over the 64 MiB a JSON input file may hold"):
        load_json(big)
    ok = tmp_path / "ok.json"
    ok.write_bytes(b'\xef\xbb\xbf{"devices": 8}')  # a BOM, as some editors write
    assert load_json(ok) == {"devices": 8}


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))


def test_a_run_record_linked_to_dev_zero_is_a_reason_not_all_memory(tmp_path):
    """/dev/zero as result_0.json: read until the memory ran out (was). Run with 3 GiB of address space at most, so
    that the old reading fails (MemoryError) instead of taking the machine's memory."""
    a, b = _sets(tmp_path, tiny_log())
    (a / "result_0.json").unlink()
    (a / "result_0.json").symlink_to("/dev/zero")
    for args in (("compare", a, b, "--no-score"), ("check", a / "result_0.txt", "--ruleset", RULESET)):
        proc = subprocess.run([sys.executable, "-m", "mlbench.cli", *map(str, args)], capture_output=True, text=True,
                              timeout=120, preexec_fn=_limit_memory)
        assert "Traceback" not in proc.stderr and proc.returncode in (0, 1), proc.stderr[-2000:]
    assert "result_0.json cannot be read (a character device, not a regular file)" in proc.stdout, proc.stdout


# --- paths the system refuses ---------------------------------------------------------------------------------------

LONG = "x" * 300  # past any file system's longest name (255 bytes)


@pytest.mark.parametrize("args", [
    ("score", LONG), ("score", LONG, "--json"), ("compare", LONG, "{a}"), ("scaling", LONG, "{a}"), ("show", LONG),
    ("plan", LONG, "--device", "h100"), ("run", "llama31_8b", "--tiny", "--dry-run", "--results", LONG),
    ("run", "llama31_8b", "--tiny", "--dry-run", "--results", f"{{tmp}}/{LONG}/x"),
    ("run", "llama31_8b", "--tiny", "--dry-run", "--save-checkpoint", LONG),
    ("run", "llama31_8b", "--tiny", "--dry-run", "--init-checkpoint", LONG),
    # click's check that SRC exists said "File '...' does not exist." of a name too long, a loop or no permission
    ("convert-checkpoint", "bert", LONG, "dest"), ("convert-checkpoint", "bert", f"{{tmp}}/{LONG}/x", "dest")],
    ids=["score", "score --json", "compare", "scaling", "show", "plan", "run --results", "run --results DIR/LONG/x",
         "run --save-checkpoint", "run --init-checkpoint", "convert-checkpoint SRC", "convert-checkpoint DIR/LONG/x"])
def test_a_name_too_long_is_one_line_naming_it(tmp_path, capsys, monkeypatch, args):
    """OSError 'File name too long' out of the command: a traceback, exit 1 (was)."""
    a, _b = _sets(tmp_path / "sets", tiny_log())
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    code, out = mlbench(capsys, monkeypatch, *(x.format(a=a, tmp=work) for x in args))
    assert code == 2 and len(out.strip().splitlines()) == 1 and out.startswith("error: "), out
    assert LONG in out and "File name too long (a name takes at most 255 bytes; give a shorter one)" in out, out
    assert os.listdir(work) == [], "written: " + ", ".join(os.listdir(work))


def test_a_benchmark_folder_named_too_long_is_one_line(tmp_path, capsys, monkeypatch):
    from mlbench import registry

    monkeypatch.setattr(registry, "BENCHMARKS_DIR", tmp_path / LONG)
    code, out = mlbench(capsys, monkeypatch, "list")
    assert code == 2 and out == f"error: {tmp_path / LONG}: File name too long (a name takes at most 255 bytes; " \
                                 "give a shorter one)\n", out


@pytest.mark.parametrize("errno_,code", [(errno.ELOOP, 2), (errno.ENOTDIR, 2), (errno.EACCES, 2), (errno.EIO, 1)])
def test_any_system_error_naming_a_path_is_one_line(tmp_path, capsys, monkeypatch, errno_, code):
    """Whatever command meets it: a path the system refuses is bad input (exit 2), a failing disk is not (1)."""
    from mlbench.analysis import score

    def refused(path, *args):
        raise OSError(errno_, os.strerror(errno_), str(path))

    monkeypatch.setattr(score, "score_path", refused)
    got, out = mlbench(capsys, monkeypatch, "score", "some/path")
    assert (got, out) == (code, f"error: some/path: {os.strerror(errno_)}\n")


# --- reports named as a run's files -------------------------------------------------------------------------------

@pytest.mark.parametrize("option,name", [("--md", "result_1.txt"), ("--html", "result_2.json"),
                                         ("--html", "result_12.txt"), ("--md", "result_x.json")])
def test_a_report_named_as_a_run_file_is_refused_and_nothing_written(tmp_path, capsys, monkeypatch, option, name):
    """`--md SET/result_1.txt` wrote a log without a record (and result_1_files/), `--html SET/result_2.json` a
    record without a log, exit 0; `mlbench check SET` then refused the whole folder (was)."""
    a, b = _sets(tmp_path, tiny_log())
    before = sorted(os.listdir(a))
    for cmd in ("compare", "scaling"):
        code, out = mlbench(capsys, monkeypatch, cmd, str(a), str(b), option, str(a / name))
        assert code == 2 and out == (f"error: {option} {a / name}: is named as a run's file (result_*.txt, "
                                     "result_*.json), and a results folder holds a run's log and record both or "
                                     "neither; give another name\n"), out
    assert sorted(os.listdir(a)) == before


@pytest.mark.parametrize("option,name", [("--md", "scaling.json"), ("--html", "systems/sys.json")])
def test_a_report_named_as_a_file_analysis_reads_is_refused(tmp_path, capsys, monkeypatch, option, name):
    """`--md SET/scaling.json` and `--html ORG/systems/<system>.json` were written, exit 0; the next `score` of
    the set said 'scaling.json: not JSON ... no score' and 'device count unknown'."""
    a, b = _sets(tmp_path, tiny_log())
    (a / "systems").mkdir()
    before = sorted(os.listdir(a))
    for cmd in ("compare", "scaling"):
        code, out = mlbench(capsys, monkeypatch, cmd, str(a), str(b), option, str(a / name))
        assert code == 2 and out == (f"error: {option} {a / name}: is named as a file analysis reads (a set's "
                                     "scaling.json, a systems/<system>.json); give another name\n"), out
    assert sorted(os.listdir(a)) == before and not os.listdir(a / "systems")


@pytest.mark.parametrize("value,ending", [("r7.md/", "/"), ("r7.md/.", "/."), ("r7.md//", "/")])
def test_a_report_path_ending_as_a_folder_is_refused(tmp_path, capsys, monkeypatch, value, ending):
    """`--md r7.md/` wrote the file r7.md, exit 0 (was): pathlib drops the slash."""
    a, b = _sets(tmp_path / "sets", tiny_log())
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    for cmd, option in (("compare", "--md"), ("compare", "--html"), ("scaling", "--md"), ("scaling", "--html")):
        code, out = mlbench(capsys, monkeypatch, cmd, str(a), str(b), option, value)
        assert code == 2 and out == (f"error: {option} {value}: ends with '{ending}', a folder's path; give the "
                                     f"report's file name, without the '{ending}'\n"), out
    assert os.listdir(work) == []


# --- check stopped by a signal ------------------------------------------------------------------------------------

# `mlbench check` whose checker takes two minutes (a stand-in for the checker on a big log). Ctrl-C's SIGINT as a
# terminal's foreground process takes it: a suite started in the background by a shell without job control
# (`make test &`) hands its processes SIGINT ignored, and Python then keeps it so (the INT case timed out there).
_SLOW_CHECK = """
import os, signal, sys
# no verdict kept from before (beside the log, not in the temp folder the tests watch): the (slow) checker runs
os.environ["MLBENCH_CACHE"] = os.path.join(os.path.dirname(os.path.abspath(sys.argv[1])), "cache")
signal.signal(signal.SIGINT, signal.default_int_handler)
from mlbench import cli, mlperf_tools
mlperf_tools.checker_command = lambda *args, **kwargs: [sys.executable, "-c", "import time; time.sleep(120)"]
sys.argv = ["mlbench", "check", *sys.argv[1:]]
cli.main()
"""


def test_a_stopped_check_starts_no_checker_afterwards(tmp_path):
    """A check_all stopped by Ctrl-C stops its checkers for good: a worker the main thread lost track of (interrupted
    as it started that worker's thread, seen under load) started its checker after check_all had cleared a stop
    flag shared by every call on its way out, and the process then waited 120 s on it at exit. Each call's
    checkers are its own now, so a later check is not affected."""
    from mlbench import compliance

    stopped = compliance.Checkers()
    stopped.stop()
    with pytest.raises(compliance._Stopping):
        stopped.run([sys.executable, "-c", "import time; time.sleep(120)"], str(tmp_path), 60)
    fresh = compliance.Checkers()  # another check in the same process
    assert fresh.run([sys.executable, "-c", "print('ran')"], str(tmp_path), 60).stdout == "ran\n"


def test_a_checker_dies_with_mlbench_killed_by_sigkill(tmp_path):
    """kill -9 of `mlbench check` (or score) takes its checker with it: a parent-death signal, armed by a shim in the
    checker's process rather than by preexec_fn in the thread that starts it (which may deadlock the child)."""
    log = tmp_path / "result_0.txt"
    log.write_text(tiny_log())
    marker = f"time.sleep(120)  # {tmp_path.name}"  # this test's checker, among the processes
    slow = _SLOW_CHECK.replace("time.sleep(120)", marker)
    proc = subprocess.Popen([sys.executable, "-c", slow, str(log), "--ruleset", RULESET], text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)

    def checkers() -> list[int]:
        found = []
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            with contextlib.suppress(OSError):
                if marker.encode() in cmdline.read_bytes() and b"cli.main" not in cmdline.read_bytes():
                    found.append(int(cmdline.parent.name))
        return found

    try:
        for _ in range(600):
            if checkers() or proc.poll() is not None:
                break
            time.sleep(0.05)
        assert checkers(), proc.poll()
        proc.kill()
        proc.wait(timeout=20)
        for _ in range(100):
            if not checkers():
                break
            time.sleep(0.05)
        assert not checkers(), "the checker outlived mlbench"
    finally:
        proc.kill()
        for pid in checkers():
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=["TERM", "HUP", "INT"])
def test_check_stopped_by_a_signal_removes_its_scratch_folder_at_once(tmp_path, sig):
    """SIGTERM or SIGHUP ended check at once, leaving /tmp/mlbench-check-XXXX behind (was); Ctrl-C removed it, once
    the checker had finished (minutes for a big log). Now each stops the checker and removes the folder at once, and
    exits 128 + the signal."""
    log = tmp_path / "result_0.txt"
    log.write_text(tiny_log())
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", _SLOW_CHECK, str(log), "--ruleset", RULESET], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, "TMPDIR": str(scratch)})
    try:
        for _ in range(600):  # the checker started in its scratch folder
            if os.listdir(scratch) or proc.poll() is not None:
                break
            time.sleep(0.05)
        assert [p.startswith("mlbench-check-") for p in os.listdir(scratch)] == [True], proc.poll()
        time.sleep(0.3)
        proc.send_signal(sig)
        try:
            out, _ = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:  # seen once under a loaded suite: what it had said, and what ran
            proc.kill()
            said = proc.communicate()[0]
            running = [c.read_bytes().replace(b"\0", b" ")[:120] for c in Path("/proc").glob("[0-9]*/cmdline")
                       if b"time.sleep(120)" in c.read_bytes()]
            pytest.fail(f"not stopped by {sig.name} in 20 s; it said {said!r}; running: {running}")
    finally:
        proc.kill()
    assert proc.returncode == 128 + sig and "Traceback" not in out, out
    assert out.strip().endswith("aborted" if sig == signal.SIGINT else f"aborted ({sig.name})"), out
    assert os.listdir(scratch) == []


def test_a_checker_whose_scratch_folder_went_gives_no_verdict_and_none_is_kept(tmp_path, monkeypatch):
    """A scratch folder removed under its checker (a temp-folder cleaner; a test that played every owner dead): the
    checker crashed opening its log there, which was taken as a verdict on the log (not compliant) and kept, so
    every later check of those bytes, in any process, said the log failed. It is no verdict now, and none is kept."""
    from mlbench import compliance, mlperf_tools, verdicts

    monkeypatch.setenv("MLBENCH_CACHE", str(tmp_path / "cache"))
    command = mlperf_tools.checker_command
    monkeypatch.setattr(mlperf_tools, "checker_command",
                        lambda path, ruleset, rules, log, quiet: command(path, ruleset, rules, log.parent / "gone" /
                                                                        log.name, quiet))
    log = tmp_path / "result_0.txt"
    log.write_text(tiny_log())
    verdict = compliance.check(log, RULESET, smoke=False)
    assert verdict.ok is None and "could not use its scratch folder" in verdict.messages[0], verdict.messages
    assert not list(verdicts.folder().glob("*.json"))


def test_the_scratch_folder_of_a_check_whose_mlbench_was_killed_is_removed_by_the_next(tmp_path, monkeypatch):
    """kill -9 of mlbench while its log was checked left /tmp/mlbench-check-XXXX for good (no clean-up runs): the
    next check removes those whose owner is gone; a live owner's, and one not named by an owner, are left."""
    from mlbench import compliance, owners

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # (read TMPDIR again)
    monkeypatch.setenv("MLBENCH_CACHE", str(tmp_path / "cache"))
    dead = subprocess.run([sys.executable, "-c", "from mlbench import owners; print(owners.tag())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    folders = {who: tmp_path / f"{compliance.SCRATCH}{tag}-abcd1234" for who, tag in
               (("dead", dead), ("live", owners.tag()))} | {"untagged": tmp_path / f"{compliance.SCRATCH}x1y2z3"}
    old = time.time() - compliance.SCRATCH_IN_USE_S - 60
    for folder in folders.values():
        folder.mkdir()
        (folder / "checker.log").write_text("x")
        os.utime(folder, (old, old))
    # a dead owner's folder made just now is left: in use whatever its owner looks like (a test that played every
    # owner dead removed other processes' live checks' folders, and they were judged not compliant)
    young = tmp_path / f"{compliance.SCRATCH}{dead}-young123"
    young.mkdir()
    log = tmp_path / "result_0.txt"
    log.write_text(tiny_log())
    compliance._remove_dead_scratch.cache_clear()
    assert compliance.check(log, RULESET, smoke=False).checked
    assert [w for w, f in folders.items() if f.exists()] == ["live", "untagged"] and young.is_dir()
    young.rmdir()
    assert sorted(p.name for p in tmp_path.glob(f"{compliance.SCRATCH}*")) == sorted(
        f.name for w, f in folders.items() if w != "dead")  # its own removed once done
