"""Runs one launch command to its end, the same way for every launcher, and owns the run's ending.

The command (the local agent or torchrun here, srun inside a SLURM job, or the one rank itself) runs in its own
process group, dies with the supervisor (lifeline), and leaves no process behind it: ranks it orphaned are
re-parented to the supervisor, which stops and reaps them before the run is judged. The supervisor follows rank
0's progress events for the live display, and ends the run when:
- the command exits (the agent, like torchrun, stops every rank when one dies and exits non-zero);
- no step progress arrives for `hang_timeout` seconds (a hang), or, before the first step (counted from the
  ranks' start: a rendezvous has a deadline of its own) and while a checkpoint is saved after run_stop, for
  `init_timeout` seconds;
- a launcher that meets other nodes first (torchrun's rendezvous) has started no rank by its deadline;
- on a node other than node 0, node 0 is gone (lifeline.NodeWatch) and this node's ranks have not ended by
  themselves within LOST_GRACE_S (while they start, they would wait about 53 s to learn it);
- on node 0, another node's supervisor tells it of a failure of that node's own (Command.told: its ranks, which
  would otherwise wait for the lost peer until their process group's timeout, as they do while it forms);
- it receives SIGTERM, SIGINT, SIGQUIT or SIGHUP (a user: Ctrl-C, Ctrl-\\; SLURM preemption; the terminal
  closing: an SSH session that drops), or another signal that would end it (SIGUSR1, SIGUSR2, SIGALRM:
  `--signal=USR1@60` in a job): the reason names it, or what sent it where the launcher can say (Command.outside:
  a SLURM job's time limit, its node's failure).
Whatever the cause, a log without `run_stop` gets `run_stop` with status `aborted` and the reason (a log rank 0
never began gets the preamble it would have written first, where it is this node's), written
after every rank is gone, so one writer at a time still holds. Rank 0 stopped because another rank failed (its
launcher's SIGTERM, a peer lost) leaves run_stop to the supervisor, which names the rank that failed first (under
torchrun across nodes, perhaps another node's, or why another node's supervisor stopped its run: that node's
supervisor tells node 0's, Command.ended).
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from mlbench import results, seed_claims
from mlbench.errors import stopped_by_signals
from mlbench.launch import lifeline, local_ranks
from mlbench.launch.events import EventTail, Steps
from mlbench.mlperf_log import finalize_aborted
from mlbench.run_plan import RunPlan, stop_reason_path

GRACE_S = 10.0  # between SIGTERM and SIGKILL of the process group
# From node 0's loss to this node's stopping its ranks, if they are still running: a run that ended well on both
# nodes sees node 0's store close as its torchrun exits, and node 1's ranks that lost their peers end by themselves
LOST_GRACE_S = 2.0
# Between SIGTERM and SIGKILL where node 0 stops its run for a failure another node told of: its ranks wait for a
# peer that is gone, and one waiting in init_process_group's store takes no SIGTERM (the wait goes on in C++); it
# would be killed after GRACE_S. Rank 0 leaves run_stop to the supervisor there (no reason given it, Command.told).
TOLD_GRACE_S = 2.0
# What stops a run cleanly (logged aborted with the signal's name, published): every signal whose default is to
# end the process and that a process may catch. Left to its default, one would kill the supervisor alone: its
# ranks die with it (lifeline), but the run is left unlogged in its staging folder (SIGQUIT, Ctrl-\, did: its
# default also dumps core).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2,
                signal.SIGALRM)
# Before a set's supervisor puts its handlers in place (its folder made, its seeds claimed): each raises
# errors.Stopped (errors.stopped_by_signals), so that what the set made is removed on the way out; Ctrl-C raises
# KeyboardInterrupt already.
STOPS_BEFORE_SUPERVISING = tuple(s for s in STOP_SIGNALS if s != signal.SIGINT)


@contextlib.contextmanager
def set_folder(root: str | Path, system: str, benchmark: str) -> Iterator[Path]:
    """Within: the results folder a set runs in (results.result_folder), its claim on its seeds released on every
    way out (seed_claims.released), and a stop signal before its supervisor's handlers raising errors.Stopped
    (STOPS_BEFORE_SUPERVISING), so that what was made for it is removed: SIGTERM's default had killed `mlbench
    run` with its empty results folder left behind, and SIGQUIT's or SIGUSR1's with its claim."""
    with stopped_by_signals(STOPS_BEFORE_SUPERVISING), results.result_folder(root, system, benchmark) as folder, \
            seed_claims.released(folder):
        yield folder


@dataclass
class Outcome:
    status: str  # success | aborted
    exit_code: int
    reason: str = ""
    events: list[dict] = field(default_factory=list)  # rank 0's events but the steps (EventTail)
    steps: Steps = field(default_factory=Steps)  # its steps' record fields
    checkpoint_error: str = ""  # a checkpoint save after run_stop failed (the run's own status stands)
    log_error: str = ""  # the log could not be completed (run_stop not written, e.g. a full disk)
    signal: str = ""  # the stop signal received (SIGINT: Ctrl-C), whatever the run's status: a set ends with it
    error_after_run_stop: str = ""  # a failure after run_stop `success` (not the checkpoint's): the status stands
    # error_after_run_stop is a stop signal that came as the run ended, no failure: said as such, not as one
    stopped_after_run_stop: bool = False


class Rendezvous(Protocol):
    """A launcher's meeting with other nodes before its ranks start (mlbench.launch.torchrun.Rendezvous)."""

    deadline_s: float  # from the launcher's start: past it with no rank started, the run is aborted
    nodes: int  # the nodes that meet

    def formed(self) -> bool:
        """Whether this node's ranks have started (the rendezvous is done)."""

    def not_formed(self) -> str:
        """The reason a run ends whose rendezvous did not form by the deadline."""

    def explain(self, error: str) -> str:
        """Plain words for the launcher's own last error line (torch's raw rendezvous message); "" if not one."""

    def node0(self) -> tuple[str, int] | None:
        """Where node 0 answers for the whole run (its rendezvous store), watched by another node once its ranks
        have started (lifeline.NodeWatch); None on node 0 itself."""


@dataclass
class Command:
    """What one run starts: argv and environment, stdout to a file (stderr with it unless given its own)."""

    argv: list[str]
    env: dict[str, str]
    stdout: Path
    stderr: Path | None = None
    what: str = "launcher"  # what it is, in the reason a run ended: "launcher", "rank 0 (the only rank)"
    logs: str = ""  # where the command is the one rank: its logs under the run's ("direct/attempt_0/0")
    rendezvous: Rendezvous | None = None  # where the launcher meets other nodes first (torchrun's)
    # which rank's failure ended the launcher (an agent's: torchrun's, local_ranks'), how, and where its output is,
    # from the end of the launcher's output; "" where it names none
    rank_failure: Callable[[str], str] | None = None
    # once the launcher has ended and the run is judged, with the end of its output, why this supervisor stopped
    # the run ("" where it did not, or did for another node's end: node 0 lost, another's failure told) and when
    # (time.time(); 0.0 where it did not stop it: a signal the launcher's output tells of is another process's):
    # what the launcher's node owes the others (torchrun's: node 0 stops hearing their failures, another node
    # tells node 0 its own)
    ended: Callable[[str, str, float], None] | None = None
    # while the run goes on, looked at on each poll: another node's failure of its own, told to this node's
    # supervisor (torchrun's node 0), as the reason to stop this run now; "" where none is told
    told: Callable[[], str] | None = None
    # why the run was stopped from outside, where the launcher's allocation can say (a SLURM job's time limit or a
    # node's failure, SLURM's warning before the limit), given the stop signal received ("" where none came and the
    # launcher ended non-zero: its end may reach it first): said in place of "received SIGTERM"; "" where it cannot
    outside: Callable[[str], str] | None = None
    # where the launcher may fail to start the run at all (srun's step not launched: a node briefly not answering, the
    # controller restarting): from its output, why no rank started, in the launcher's own words ("" where a rank
    # started, or it said no such error). Such a launch is no run (nothing trained, nothing logged): it is tried
    # again, LAUNCH_TRIES times at most, RELAUNCH_S apart. A command that has it has no `ended`.
    not_launched: Callable[[str], str] | None = None


def _descendants(pid: int) -> list[int]:
    """Every process below `pid`, from /proc. torchrun starts each rank in a session of its own, so
    signalling torchrun's process group would leave the ranks running once torchrun is gone."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _signal_tree(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _stop_tree(proc: subprocess.Popen, grace_s: float = GRACE_S) -> None:
    """SIGTERM the launcher and every rank; SIGKILL whatever is left after the grace period."""
    tree = [proc.pid, *_descendants(proc.pid)]
    _signal_tree(tree, signal.SIGTERM)
    _signal_tree(tree, signal.SIGCONT)  # a stopped process cannot act on SIGTERM
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(grace_s)
    _signal_tree(tree + _descendants(proc.pid), signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() and _alive(p) for p in tree):
        time.sleep(0.1)


def _stop_orphans(launcher_pid: int, before: set[int]) -> None:
    """Kills and reaps what the launcher left (re-parented to this subreaper), e.g. ranks of a launcher that
    was killed: nothing of the run may go on writing once it is judged. `before`: this process's descendants
    before the launch, not the run's."""
    orphans = [p for p in _descendants(os.getpid()) if p != launcher_pid and p not in before]
    if not orphans:
        return
    _signal_tree(orphans, signal.SIGKILL)
    deadline = time.monotonic() + GRACE_S
    for pid in orphans:
        while time.monotonic() < deadline:
            try:
                if os.waitpid(pid, os.WNOHANG)[0]:
                    break
            except ChildProcessError:  # not our child (a grandchild): gone when its parent reaps it
                if not _alive(pid):
                    break
            time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _start(cmd: Command) -> subprocess.Popen:
    lifeline.become_subreaper()
    for path in (cmd.stdout, cmd.stderr):
        if path:
            path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as files:
        out = files.enter_context(open(cmd.stdout, "ab"))
        err = files.enter_context(open(cmd.stderr, "ab")) if cmd.stderr else subprocess.STDOUT
        return subprocess.Popen(cmd.argv, env=cmd.env, stdout=out, stderr=err, start_new_session=True,
                                preexec_fn=lifeline.die_with_parent)


def _exit_reason(cmd: Command, code: int, output: bool = True, otherwise: str = "") -> str:
    """Why the command ended with CODE, from its own output where `output` (which rank failed, the launcher's own
    failure), else from the code alone; OTHERWISE (node 0 gone, or rank 0's words for a failure not its own) where
    the output names no rank that failed of itself."""
    what, see = cmd.what, f"see the rank logs: {cmd.logs}" if cmd.logs else "see the rank logs"
    if cmd.logs and lifeline.consequent(code):  # the one rank, stopped as for another's failure: none failed
        return local_ranks.stopped_from_outside(0, local_ranks.describe(code), cmd.logs)
    if code < 0:  # killed by a signal (the OOM killer, kill -9)
        return f"{what} {local_ranks.describe(code)} ({see})"
    tail = _tail(cmd.stdout) if output else ""
    last = _last_error(tail)
    if last and cmd.rendezvous and (plain := cmd.rendezvous.explain(last)):
        return plain
    if tail and cmd.rank_failure and (failed := cmd.rank_failure(tail)):  # the agent named the rank that failed
        return failed
    if otherwise:
        return otherwise
    if last:  # the launcher's own failure (a rendezvous that never formed): no rank ran to say anything
        return f"{what} exited with code {code}: {last}"
    return f"{what} exited with code {code} ({see if cmd.logs else 'a rank failed; see the rank logs'})"


_ERROR_LINE = re.compile(r"^(?:[\w.]+\.)?(\w*(?:Error|Exception|Timeout)): (.+)$")


def _tail(output: Path, since: int = 0) -> str:
    """The end of a command's output (64 KiB, from byte SINCE on); "" if it cannot be read."""
    try:
        with open(output, "rb") as f:
            f.seek(max(since, f.seek(0, os.SEEK_END) - 65536))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def _last_error(tail: str) -> str:
    """The last exception line (`Type: message`) in the end of a command's output, shortened; "" if none."""
    found = [m for line in tail.splitlines() if (m := _ERROR_LINE.match(line.strip()))]
    return f"{found[-1][1]}: {found[-1][2]}"[:240] if found else ""


def _tell_ranks(events_path: Path, reason: str) -> None:
    """Why the ranks are stopped, for rank 0's run_stop (it would say only that SIGTERM came); best effort: a full
    disk leaves the reason to the record."""
    with contextlib.suppress(OSError):
        stop_reason_path(events_path).write_text(reason)


def _complete_log(log_path: Path, reason: str, plan: RunPlan | None, owns_log: bool) -> str:
    """Ends a log that has no run_stop with run_stop `aborted` (`finalize_aborted`); returns why the log is
    still not whole ("" when it is), e.g. a full disk."""
    try:
        with results.log_write_errors_silenced():
            finalize_aborted(log_path, reason, plan, begin=owns_log)
    except OSError as e:
        return f"the log could not be completed: {e.strerror or e}"
    problem = results.log_problem(log_path, "run_stop")
    return f"the log could not be completed: {problem}" if problem else ""


@dataclass
class _Seen:
    """What the supervisor has seen of a run so far, and the limits it judges the run by."""

    cmd: Command
    hang_timeout: float
    init_timeout: float
    started: float = field(default_factory=time.monotonic)
    last_progress: float = field(default_factory=time.monotonic)
    formed: bool = False  # the ranks have started (no rendezvous: at once)
    watch: lifeline.NodeWatch | None = None  # node 0, watched from another node
    lost_at: float = 0.0  # when the watch found node 0 gone
    # stopped for another node's end (node 0 lost, a failure another node told of), not one of this node's own:
    # another node tells node 0 no reason of its supervisor's then
    followed: bool = False
    # stopped for a failure another node told of: its ranks are stopped as for another rank's failure (given no
    # reason: rank 0 leaves run_stop to the supervisor, which names the failure, as where its ranks end by themselves)
    told: bool = False
    grace_s: float = GRACE_S  # between SIGTERM and SIGKILL when the supervisor stops the run
    # Until the first training step, the untimed initialisation is judged by MLPerf's own limit (30 min
    # closed); from then on, no progress for hang_timeout seconds is a hang.
    stepping: bool = False
    saving: bool = False
    folder: Path | None = None  # the run's own folder (its log and events): gone, nothing of the run can be kept

    def __post_init__(self) -> None:
        self.formed = self.cmd.rendezvous is None

    def saw(self, new: list[dict], events: int) -> None:
        """NEW: the events just read; EVENTS: how many were read in all."""
        if new:
            self.last_progress = time.monotonic()
            self.stepping = self.stepping or any(e.get("event") == "step" for e in new)
            self.saving = self.saving or any(e.get("event") == "checkpoint_saving" for e in new)
        rendezvous = self.cmd.rendezvous
        if not self.formed and (events or rendezvous.formed()):  # events: rank 0 is running
            # the start-up limit counts from the ranks' start: waiting for nodes is --rdzv-timeout's to judge
            # (up to a week), and a wait over 1800 s stopped node 0 as a hang while nodes could still come
            self.formed, self.last_progress = True, time.monotonic()
            if node0 := rendezvous.node0():
                self.watch = lifeline.NodeWatch(*node0)
        if self.watch and not self.lost_at and self.watch.lost():
            self.lost_at = time.monotonic()

    def stop_reason(self, pid: int) -> str:
        """Why the supervisor must stop the run now (the command's pid), or ""."""
        now = time.monotonic()
        idle = now - self.last_progress
        if self.lost_at and now - self.lost_at > LOST_GRACE_S and _descendants(pid):
            # this node's ranks still run (or start) without node 0: a rank blocked in a store client's
            # connection retries takes no SIGTERM, and nothing of this node's is published, so no long grace
            self.grace_s, self.followed = LOST_GRACE_S, True
            return self.watch.lost()
        if self.folder is not None and _removed(self.folder):  # rm -rf of the results (or the staging folder)
            return (f"the run's folder {self.folder} was removed while the run was in progress (by another program or "
                    f"person): nothing of the run can be kept")
        if self.cmd.told and (told := self.cmd.told()):  # node 0: another node's failure (its ranks may not know)
            self.grace_s, self.followed, self.told = TOLD_GRACE_S, True, True
            return told
        if not self.formed and now - self.started > self.cmd.rendezvous.deadline_s:
            # torch's own timeouts end a rendezvous that fails; this one for a launcher stuck in it (its
            # client connected to another program's port, which answers nothing)
            return self.cmd.rendezvous.not_formed()
        if self.saving and idle > self.init_timeout:
            return f"hang: checkpoint save not done within {self.init_timeout:g} s"
        if self.stepping and not self.saving and idle > self.hang_timeout:
            return f"hang: no progress for {self.hang_timeout:g} s"
        if not self.stepping and idle > self.init_timeout:
            return f"hang: no training step within {self.init_timeout:g} s of start"
        return ""


def _removed(folder: Path) -> bool:
    """FOLDER is no longer there (an error other than its absence, a network filesystem's for a moment, is not)."""
    try:
        os.stat(folder)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return False


LAUNCH_TRIES = 3  # launches of a run that started no rank (Command.not_launched), the first included
RELAUNCH_S = 5.0  # between two of them: a node that did not answer may again


def supervise(
    cmd: Command,
    *,
    log_path: Path,
    events_path: Path,
    hang_timeout: float = 300.0,
    init_timeout: float = 1800.0,
    on_events: Callable[[list[dict]], None] | None = None,
    poll_s: float = 0.2,
    plan: RunPlan | None = None,
    owns_log: bool = False,
    say: Callable[[str], None] = print,
) -> Outcome:
    """Run `argv` and return how the run ended; the MLPerf log is complete afterwards. PLAN: the run's; OWNS_LOG:
    this supervisor's rank 0 writes the log (one node), so a log the rank never began is begun for it. A launch that
    started no rank (Command.not_launched: srun's words) is tried again, said through SAY: a transient srun failure
    ended the run (aborted, published) though nothing had trained."""
    between: list[str] = []  # a stop signal that came between two tries (each try has a handler of its own)
    previous = {s: signal.signal(s, lambda signum, frame: between.append(signal.Signals(signum).name))
                for s in STOP_SIGNALS}
    try:
        for attempt in range(1, LAUNCH_TRIES + 1):
            ended = _supervise_once(cmd, log_path, events_path, hang_timeout, init_timeout, on_events, poll_s, plan,
                                    owns_log, relaunch=attempt < LAUNCH_TRIES)
            if isinstance(ended, Outcome):
                return ended
            say(f"{ended}; no rank had started, so no run: launching it again in {RELAUNCH_S:g} s (try "
                f"{attempt + 1} of {LAUNCH_TRIES})")
            deadline = time.monotonic() + RELAUNCH_S
            while not between and time.monotonic() < deadline:
                time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
            if between:
                reason = f"{_signalled(cmd, between[0])} before the run was launched again (after: {ended})"
                return Outcome(status="aborted", exit_code=128 + signal.Signals[between[0]].value, reason=reason,
                               log_error=_LogEnd(log_path, plan, owns_log).complete(reason), signal=between[0])
        raise AssertionError("the last try is always judged")
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _supervise_once(cmd: Command, log_path: Path, events_path: Path, hang_timeout: float, init_timeout: float,
                    on_events: Callable[[list[dict]], None] | None, poll_s: float, plan: RunPlan | None,
                    owns_log: bool, relaunch: bool) -> Outcome | str:
    """One launch of the run, supervised (supervise); RELAUNCH: a launch that started no rank returns why
    (Command.not_launched's words) instead of its judged Outcome."""
    tail = EventTail(events_path)
    received: list[str] = []

    def on_signal(signum, frame):
        received.append(signal.Signals(signum).name)

    previous = {s: signal.signal(s, on_signal) for s in STOP_SIGNALS}
    before = set(_descendants(os.getpid()))
    since = 0  # where this try's output begins: each try appends to it
    with contextlib.suppress(OSError):
        since = cmd.stdout.stat().st_size
    try:
        proc = _start(cmd)
    except OSError as e:  # a full disk (its output files), a missing program: the run never started
        for s, handler in previous.items():
            signal.signal(s, handler)
        reason = f"the run could not start: {e.strerror or e} ({e.filename or cmd.argv[0]})"
        if cmd.ended:
            cmd.ended("", "", 0.0)
        return Outcome(status="aborted", exit_code=127, reason=reason,
                       log_error=_LogEnd(log_path, plan, owns_log).complete(reason))
    except BaseException:
        for s, handler in previous.items():
            signal.signal(s, handler)
        raise
    reason, stopped_at, by_signal = "", 0.0, False
    seen = _Seen(cmd, hang_timeout, init_timeout, folder=events_path.parent)
    exited = _ExitWait(proc)
    try:
        while proc.poll() is None:
            exited.wait(poll_s)  # returns as soon as the command exits: no polling delay at the end
            seed_claims.renew_due()  # (the set's claim on its seeds: its lease, while its runs go on)
            new = tail.poll()
            if new and on_events:
                on_events(new)
            seen.saw(new, tail.seen)
            if not reason and (reason := _signalled(cmd, received[0]) if received else seen.stop_reason(proc.pid)):
                stopped_at, by_signal = time.time(), bool(received)
                if not seen.told:
                    _tell_ranks(events_path, reason)
                _stop_tree(proc, seen.grace_s)
    finally:
        exited.close()
        for s, handler in previous.items():
            signal.signal(s, handler)
        if proc.poll() is None:
            _stop_tree(proc)
        _stop_orphans(proc.pid, before)
    lost = ""
    if seen.watch:
        # node 0 gone, whether or not the watch has told yet
        lost = seen.watch.check() if proc.returncode != 0 else ""
        seen.watch.close()
    for new in tail.drain():
        if on_events:
            on_events(new)
    judged = reason or (_signalled(cmd, received[0]) if received else "")
    by_signal = by_signal or bool(received) and not reason
    if not judged and proc.returncode != 0 and cmd.outside:  # its allocation ended (SLURM's time limit) first
        judged = cmd.outside("")
    retry = relaunch and cmd.not_launched and not judged and proc.returncode != 0 and not tail.seen
    if retry and (not_launched := cmd.not_launched(_tail(cmd.stdout, since))):
        return not_launched
    try:
        outcome = _judge(cmd, proc.returncode, tail.events, judged, received[0] if received else "",
                         _LogEnd(log_path, plan, owns_log), lost, by_signal)
        outcome.steps = tail.steps
        return outcome
    finally:
        if cmd.ended:
            cmd.ended(_tail(cmd.stdout), "" if seen.followed else reason, stopped_at)


class _ExitWait:
    """Sleeps until a process exits or a time passes, woken once: Popen.wait(timeout) polls waitpid between sleeps
    of up to 50 ms, about 55 wakeups a second of the supervisor (beside the rank, on the rank's cores) where one
    a poll_s does. A pidfd (Linux 5.3) becomes readable as its process exits; without one, Popen.wait."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        try:
            self.fd: int | None = os.pidfd_open(proc.pid)
        except (AttributeError, OSError):  # not Linux, an older kernel, or no pidfd allowed (a seccomp filter)
            self.fd = None

    def wait(self, timeout: float) -> None:
        if self.fd is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout)
            return
        select.select([self.fd], [], [], timeout)  # a handled signal resumes it (PEP 475): woken by poll_s at most

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _signalled(cmd: Command, name: str) -> str:
    """Why the run stops on the stop signal NAME: its allocation's end where the launcher can say (a SLURM job at
    its time limit, whose node failed: SIGTERM said only "received SIGTERM"), else the signal received."""
    return (cmd.outside(name) if cmd.outside else "") or f"received {name}"


@dataclass
class _LogEnd:
    """What completes the run's log: its path, the run's plan, whether this node's rank 0 writes it."""

    path: Path
    plan: RunPlan | None
    owns: bool

    def complete(self, reason: str) -> str:
        return _complete_log(self.path, reason, self.plan, self.owns)


def _judge(cmd: Command, code: int, events: list[dict], reason: str, stop_signal: str, log: _LogEnd,
           lost: str = "", by_signal: bool = False) -> Outcome:
    """How the run ended, from the command's exit code, rank 0's events and what the supervisor did (REASON,
    STOP_SIGNAL; BY_SIGNAL: REASON is the stop signal's) or saw (LOST: node 0 gone, on another node); the log is
    completed on the way."""
    saving = any(e.get("event") == "checkpoint_saving" for e in events)
    last = next((e for e in reversed(events) if e.get("event") == "stopped"), None)
    # the supervisor stopped the run: the launcher's own words then tell only of its SIGTERM (torchrun's
    # SignalException, the agent's "received SIGTERM"), not why
    stopped = bool(reason)
    # Why it ended, most specific first: what the supervisor did, what rank 0 said of its own failure, the rank
    # the launcher saw fail first (of itself), node 0 gone, what rank 0 said of a failure not its own (a SIGTERM
    # with no reason, a peer lost: the launcher stopping it for another rank's failure), the launcher's exit code.
    consequent = last is not None and last.get("consequent", False)
    if not reason and last is not None and not consequent:
        reason = last.get("reason", "")
    if not reason and code != 0:
        peer = last.get("reason", "") if consequent else ""
        if peer and cmd.rendezvous is not None and cmd.rendezvous.nodes > 1:
            # no rank here failed of itself, no node said: another node's end (a run of one node has none: it said
            # so of a rank that SIGTERM from another process stopped)
            peer = f"a peer on another node was lost, and no node said why (its mlbench or host gone?): {peer}"
        reason = _exit_reason(cmd, code, otherwise=lost or peer)
    log_error = log.complete(reason or "run ended without run_stop")
    checkpoint_error = ""
    if saving and not any(e.get("event") == "checkpoint_saved" for e in events):
        failed = next((e for e in events if e.get("event") == "checkpoint_failed"), None)
        if failed is not None and failed.get("consequent") and code != 0:  # another rank failed first: that one
            checkpoint_error = reason if stopped else _exit_reason(cmd, code, otherwise=failed["reason"])
        else:
            checkpoint_error = failed["reason"] if failed else reason or _exit_reason(cmd, code, output=False)
    # Once run_stop `success` is written, the run's status is the log's, whatever came after it (the checkpoint
    # save, the measured-memory record, a signal in teardown); a failure there is said apart.
    if last is not None and last["status"] == "success":
        if not saving and reason and log.plan is not None and log.plan.save_checkpoint:
            checkpoint_error = reason  # ended before its save began (a signal in the measured-memory record)
        after = "" if checkpoint_error or code == 0 and not stop_signal else reason
        # a stop signal as the run ended (its checkpoint saved, its log closing): no failure, and not said as one
        stopped = bool(after) and by_signal
        return Outcome(status="success", exit_code=code, events=events, checkpoint_error=checkpoint_error,
                       log_error=log_error, signal=stop_signal,
                       error_after_run_stop=f"{after} after run_stop, as the run ended" if stopped else after,
                       stopped_after_run_stop=stopped)
    return Outcome(status="aborted", exit_code=code, reason=reason or "run ended without run_stop",
                   events=events, checkpoint_error=checkpoint_error, log_error=log_error, signal=stop_signal)
