"""Runs one launch command to its end, the same way for every launcher, and owns the run's ending.

The command (torchrun here, or srun inside a SLURM job) runs in its own process group. The supervisor
follows rank 0's progress events for the live display, and ends the run when:
- the command exits (torchrun stops every rank when one dies and exits non-zero);
- no step progress arrives for `hang_timeout` seconds (a hang);
- it receives SIGTERM/SIGINT (a user, or SLURM preemption).
Whatever the cause, a log with `run_start` but no `run_stop` gets `run_stop` with status `aborted` and the
reason, written after every rank is gone, so one writer at a time still holds.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mlbench.mlperf_log import finalize_aborted

GRACE_S = 10.0  # between SIGTERM and SIGKILL of the process group


@dataclass
class Outcome:
    status: str  # success | aborted
    exit_code: int
    reason: str = ""
    events: list[dict] = field(default_factory=list)


class EventTail:
    """Reads new JSON lines from the events file as rank 0 appends them."""

    def __init__(self, path: Path):
        self.path, self._pos, self._buf = path, 0, ""
        self.events: list[dict] = []

    def poll(self) -> list[dict]:
        if not self.path.exists():
            return []
        with open(self.path) as f:
            f.seek(self._pos)
            chunk = f.read()
            self._pos = f.tell()
        self._buf += chunk
        *lines, self._buf = self._buf.split("\n")
        new = []
        for line in lines:
            try:
                new.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        self.events += new
        return new


def _kill_group(proc: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)


def supervise(
    argv: list[str],
    *,
    env: dict[str, str],
    log_path: Path,
    events_path: Path,
    output: Path,
    hang_timeout: float = 300.0,
    on_events: Callable[[list[dict]], None] | None = None,
    poll_s: float = 0.2,
) -> Outcome:
    """Run `argv` and return how the run ended; the MLPerf log is complete afterwards."""
    tail = EventTail(events_path)
    received: list[str] = []

    def on_signal(signum, frame):
        received.append(signal.Signals(signum).name)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    output.parent.mkdir(parents=True, exist_ok=True)
    with open(output, "ab") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    reason = ""
    last_progress = time.monotonic()
    try:
        while proc.poll() is None:
            time.sleep(poll_s)
            new = tail.poll()
            if new:
                last_progress = time.monotonic()
                if on_events:
                    on_events(new)
            if received and not reason:
                reason = f"received {received[0]}"
            elif time.monotonic() - last_progress > hang_timeout and not reason:
                reason = f"hang: no progress for {hang_timeout:.0f} s"
            if reason:
                _kill_group(proc, signal.SIGTERM)
                try:
                    proc.wait(GRACE_S)
                except subprocess.TimeoutExpired:
                    _kill_group(proc, signal.SIGKILL)
                    proc.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if proc.poll() is None:
            _kill_group(proc, signal.SIGKILL)
            proc.wait()
    new = tail.poll()
    if new and on_events:
        on_events(new)
    code = proc.returncode
    stopped = [e for e in tail.events if e.get("event") == "stopped"]
    if not reason and code != 0:
        reason = stopped[-1].get("reason", "") if stopped else ""
        reason = reason or f"launcher exited with code {code} (a rank failed; see the rank logs)"
    finalize_aborted(log_path, reason or "run ended without run_stop")
    status = stopped[-1]["status"] if stopped and not received else "aborted"
    if status == "success" and code != 0:
        status = "aborted"
        reason = reason or f"launcher exited with code {code} after the target was reached"
    if status != "success" and not reason:
        reason = stopped[-1].get("reason", "") if stopped else "run ended without run_stop"
    return Outcome(status=status, exit_code=code, reason=reason, events=tail.events)
