"""Hostile paths for the analysis commands: a JSON input that is a pipe or a device, a path the system refuses (a
name too long), a report named as a result file, a folder path for a report, a signal while `check` works. Each is
one line (`error: ...`, exit 2, nothing written) or a reason in the output; never a hang, a traceback or a
half-written results folder."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import sys

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
