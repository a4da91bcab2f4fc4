"""Compliance: which rules a result file is judged by, and the official checker's verdict on it.

The checker runs as `python -m mlperf_logging.compliance_checker`, one process per file, in a scratch folder
(the one way mlbench calls it: see mlbench/mlperf_tools.py for why not in-process). Several files are checked
in parallel processes.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.text import Text

from mlbench import mlperf_tools, owners, registry, schema, verdicts
from mlbench.errors import UserError, printable
from mlbench.launch import lifeline
from mlbench.logfile import (
    TOKEN_B,
    BadField,
    LogReader,
    given_path_problem,
    holds_token,
    load_record,
    text,
    why_not_a_file,
)

SMOKE_RULES = Path(str(resources.files("mlbench") / "rules" / "smoke.yaml"))
_SEPARATOR = "-" * 30  # between the checker's messages, some of which span lines


class NotChecked(UserError):
    """The checker gave no verdict (killed, or it died without one) where one is needed before going on: said on one
    line, exit code 1 (a failure of the machine, not of the input)."""

    exit_code = 1


@dataclass
class Verdict:
    path: Path
    # True: compliant; False: not; None: not checked, the checker did not finish (killed by a signal, or it died
    # without its verdict): never a non-compliant verdict (messages[0] says why)
    ok: bool | None
    rules: str  # "smoke rules" or "training <ruleset> rules"
    messages: list[str] = field(default_factory=list)  # one per checker message (some span lines)

    @property
    def checked(self) -> bool:
        return self.ok is not None


def require_ruleset(ruleset: str) -> str:
    """A training ruleset the installed checker knows, or UserError listing them."""
    known = mlperf_tools.rulesets()
    if ruleset not in known:
        raise UserError(f"unknown ruleset {ruleset!r}; the installed mlperf-logging knows {', '.join(known)}")
    return ruleset


# The checker reads about 5 MB a second (a 250 MB log: 50-61 s, perf/log_reading.py); the limit is several times
# that for a log of any size. What outruns it is long lines: the checker strips each line with
# re.sub(".*:::MLLOG ", ...), whose time grows with the square of the line's length. Measured on this project's
# 2-core machine: one 60 KB line 2.35 s, ten of them 19.4 s, one 120 KB line 7.6 s, 2 MB over 5 minutes (about
# 6e-10 s a byte squared); no MLPerf record is longer than a few KiB.
CHECK_TIME_BASE_S, CHECK_TIME_PER_MB_S = 60.0, 1.0
LONG_LINE_BYTES = 16 * 1024  # from here on a line costs the checker a noticeable time (16 KiB: about 0.15 s)
CHECKER_S_PER_BYTE2 = 6e-10  # the checker's time for a line of n bytes: n * n * this (measured, above)
FASTEST_MACHINE = 4.0  # how much faster than the measuring machine a checker may run: the skip is decided on that


def time_limit_s(path: Path) -> float:
    """How long the checker may take on PATH before mlbench stops it (its verdict then: not compliant)."""
    try:
        size = os.path.getsize(path)
    except OSError:
        size = 0
    return CHECK_TIME_BASE_S + CHECK_TIME_PER_MB_S * size / 1e6


@dataclass(frozen=True)
class LineLengths:
    longest: tuple[int, int]  # (line number from 1, length in bytes)
    long_lines: int  # lines of LONG_LINE_BYTES or more
    square_sum: float  # the sum of every line's length squared: what the checker's time grows with

    def checker_s(self) -> float:
        """The checker's time on these lines at the measured rate (its reading of the rest is not counted)."""
        return self.square_sum * CHECKER_S_PER_BYTE2

    def reason(self) -> str:
        line, length = self.longest
        more = self.long_lines - 1 if length >= LONG_LINE_BYTES else 0
        others = f" and {more:,} more line{'s' if more > 1 else ''} of {LONG_LINE_BYTES // 1024} KiB or more" \
            if more > 0 else ""
        return (f"line {line} is {length:,} bytes long{others}, and the checker's time grows with the square of a "
                f"line's length (60 KB: about 2.4 s; here about {self.checker_s():,.0f} s); an MLPerf record is at "
                f"most a few KiB")


def _line_ends(b: np.ndarray) -> np.ndarray:
    """Where lines end in the bytes B, as the tools' universal newlines end them: each \\n, and each \\r not followed
    by one (a \\r\\n cut by the end of B counts twice: a line number one off, no length changed)."""
    lf = b == 0x0A
    cr = b == 0x0D
    if cr.any():
        cr[:-1] &= ~lf[1:]
        lf |= cr
    return np.flatnonzero(lf)


def line_lengths(path: Path) -> LineLengths:
    """PATH's longest line, its long lines and the sum of its lines' squared lengths, read in blocks (a line may
    be gigabytes long). Of lines of LONG_LINE_BYTES or more, only those holding the token count: the checker skips
    a line without it at the cost of a search (200 lines of 60 KB of progress output were judged 'could not finish
    in 432 s' while the checker passed the file in 0.1 s). A shorter line counts whatever it holds (its square is
    small either way)."""
    best, number, carry, long_lines, square_sum = (0, 0), 1, 0, 0, 0.0
    carry_token, tail = False, b""  # whether the line carried over holds the token; its last bytes
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            ends = _line_ends(np.frombuffer(block, np.uint8))
            if ends.size:
                lengths = np.diff(ends, prepend=-1).astype(np.float64) - 1  # without the newline
                lengths[0] += carry
                for i in np.flatnonzero(lengths >= LONG_LINE_BYTES).tolist():
                    if i == 0:  # the line carried over from the blocks before
                        holds = carry_token or TOKEN_B in tail + block[:int(ends[0])]
                    else:
                        holds = block.find(TOKEN_B, int(ends[i - 1]) + 1, int(ends[i])) >= 0
                    if not holds:
                        lengths[i] = 0
                i = int(np.argmax(lengths))
                if lengths[i] > best[1]:
                    best = (number + i, int(lengths[i]))
                long_lines += int(np.count_nonzero(lengths >= LONG_LINE_BYTES))
                square_sum += float(np.dot(lengths, lengths))
                number, carry = number + ends.size, len(block) - 1 - int(ends[-1])
                rest = block[int(ends[-1]) + 1:]
                carry_token, tail = TOKEN_B in rest, rest[-len(TOKEN_B):]
            else:
                carry += len(block)
                carry_token, tail = carry_token or TOKEN_B in tail + block, (tail + block)[-len(TOKEN_B):]
    if carry and (carry < LONG_LINE_BYTES or carry_token):  # the last line, without its newline
        best = (number, carry) if carry > best[1] else best
        long_lines += carry >= LONG_LINE_BYTES
        square_sum += float(carry) * carry
    return LineLengths(best, long_lines, square_sum)


def check(path: Path, ruleset: str, smoke: bool, quiet: bool = False, time_limit: float | None = None,
          checkers: Checkers | None = None) -> Verdict:
    """The official checker's verdict on one file: the closed rules of RULESET, or our smoke rules (kept: a file
    judged before is not checked again, mlbench.verdicts).
    quiet: leave out its warnings (as the result summarizer does). time_limit: seconds before it is stopped and
    the file judged not compliant (default: time_limit_s). A file whose long lines would keep the checker past
    the limit even on a machine FASTEST_MACHINE times faster than the one measured is judged so without it."""
    limit = time_limit_s(path) if time_limit is None else time_limit
    rules = "smoke rules" if smoke else f"training {ruleset} rules"
    rules_id, rules_file = f"{ruleset} {smoke}", SMOKE_RULES if smoke else None
    digest = verdicts.key(Path(path), rules_id, rules_file, quiet)
    if digest and (kept := verdicts.load(digest, Path(path))):  # judged before: the same bytes, the same rules
        return Verdict(path=Path(path), ok=kept[0], rules=rules, messages=kept[1])
    lines = _line_lengths(Path(path))
    if (why := too_long_for_the_tools(lines, limit)) is not None:
        return Verdict(path=Path(path), ok=False, rules=rules, messages=[
            f"the compliance checker was not run, as it could not finish within the {limit:.0f} s limit: {why}"])
    _remove_dead_scratch()
    for attempt in (1, 2):
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix=f"{SCRATCH}{owners.tag()}-") as scratch:
            cmd = mlperf_tools.checker_command(path, ruleset, SMOKE_RULES if smoke else None,
                                               Path(scratch) / "checker.log", quiet)
            # In a session of its own: Ctrl-C at the terminal goes to mlbench alone, which holds it until the run is
            # published (the checker, interrupted, judged a good run non-compliant); it still dies with mlbench.
            try:
                proc = (checkers or Checkers()).run(cmd, scratch, limit)
            except subprocess.TimeoutExpired:  # run has killed it
                why = f": {lines.reason()}" if lines is not None and lines.checker_s() > limit / 2 else ""
                stopped = f"the compliance checker did not finish within {limit:.0f} s and was stopped{why}"
                return Verdict(path=Path(path), ok=False, rules=rules, messages=[stopped])
        unfinished = _unfinished(proc, scratch)
        if not unfinished:
            verdict = _verdict(Path(path), rules, proc)
            # kept only for the bytes the checker read: a log still being written (a live run's) has moved on
            if digest and verdicts.key(Path(path), rules_id, rules_file, quiet) == digest:
                verdicts.save(digest, Path(path), bool(verdict.ok), verdict.messages)
            return verdict
        if attempt == 1 and time.monotonic() - started < RETRY_WITHIN_S:
            continue  # cheap to ask again: a checker killed from outside (the OOM killer, kill -9) may finish now
    again = "" if attempt == 1 else " (twice)"
    return Verdict(path=Path(path), ok=None, rules=rules, messages=[
        f"{unfinished}{again}: {Path(path).name} is not checked (no verdict, not a non-compliant one)"])


# A checker that did not finish is asked once more where its try took less than this: a second costs as much again.
RETRY_WITHIN_S = 30.0


def _unfinished(proc: subprocess.CompletedProcess, scratch: str) -> str:
    """Why the checker process gave no verdict ("" where it did): it ends with SUCCESS (exit 0), FAILED (exit 1)
    or a traceback of its own (a crash on its rules: a verdict too, not compliant), unless it was killed by a signal
    (the OOM killer's SIGKILL, kill -9), died without writing any of those, ran out of memory in Python, or failed
    on its SCRATCH folder (removed under it, by a temp-folder cleaner: a fault of this machine, kept as no verdict)."""
    if proc.returncode < 0:
        try:
            name = signal.Signals(-proc.returncode).name
        except ValueError:
            name = f"signal {-proc.returncode}"
        oom = " (out of memory?)" if -proc.returncode == signal.SIGKILL else ""
        return f"the compliance checker was killed by {name}{oom} before its verdict"
    if proc.returncode == 0:
        return ""
    _, crash, trace = proc.stderr.partition("Traceback (most recent call last)")
    if crash and _last_line(trace).startswith("MemoryError"):
        return "the compliance checker ran out of memory (MemoryError) before its verdict"
    if crash and scratch in _last_line(trace):
        return f"the compliance checker could not use its scratch folder ({_last_line(trace)[:200]})"
    if crash or any(ln.startswith("ERROR - FAILED") for ln in proc.stderr.splitlines()):
        return ""
    return f"the compliance checker exited with code {proc.returncode} without a verdict"


def _verdict(path: Path, rules: str, proc: subprocess.CompletedProcess) -> Verdict:
    """The verdict of a checker that finished. Its messages name the log as `printable` writes it: a folder named
    "x<newline>FAIL ..." split a message in two, the second half a line of its own."""
    err = proc.stderr
    for form in sorted({str(path), str(Path(path).resolve())}, key=len, reverse=True):
        err = err.replace(form, printable(form))
    log, crash, trace = err.partition("Traceback (most recent call last)")
    messages = _messages(log)
    if crash:  # e.g. a ruleset without rules for this benchmark: the checker dies reading its own files
        messages.append(CRASHED + _last_line(trace)[:300])
    return Verdict(path=path, ok=proc.returncode == 0, messages=messages, rules=rules)


CRASHED = "the compliance checker crashed: "  # a verdict's message, before its traceback's last line


SCRATCH = "mlbench-check-"  # a checker's scratch folder in the temp folder: SCRATCH<owner tag>-XXXXXXXX


# A scratch folder younger than this is in use whatever its owner looks like: a check takes seconds, and a live one
# removed under its checker was judged not compliant (a test that played every owner dead removed other checks')
SCRATCH_IN_USE_S = 600.0


@functools.cache  # once a process
def _remove_dead_scratch() -> None:
    """The scratch folders of checks whose mlbench was killed (kill -9: no clean-up ran) are removed, once their
    owner is gone (owners.gone: this host and PID namespace, no live process of that pid and start time) and they
    are older than SCRATCH_IN_USE_S."""
    for p in Path(tempfile.gettempdir()).glob(f"{SCRATCH}*"):
        with contextlib.suppress(OSError):
            if owners.gone(p.name[len(SCRATCH):].rpartition("-")[0]) and not p.is_symlink() and \
                    time.time() - p.stat().st_mtime > SCRATCH_IN_USE_S:
                shutil.rmtree(p, ignore_errors=True)


def _last_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[-1]


class _Stopping(Exception):
    """A checker not started: the check_all it was for has stopped."""


class Checkers:
    """The checkers one `check_all` runs, so that, stopped (Ctrl-C, SIGTERM: a KeyboardInterrupt in the main
    thread), it stops them at once: each worker then removes its scratch folder and ends, where it would have
    waited out its checker (up to the time limit: minutes for a big log). Stopped for good: a worker the main
    thread has lost track of (interrupted as it started the worker's thread, under load) starts no checker later,
    where a stop flag shared by every call was cleared on the way out and that worker then waited 120 s on one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: set[subprocess.Popen] = set()
        self._stopped = False

    def run(self, cmd: list[str], scratch: str, limit: float) -> subprocess.CompletedProcess:
        """subprocess.run of the checker in SCRATCH, for at most LIMIT seconds (TimeoutExpired, the checker
        killed)."""
        with self._lock:
            if self._stopped:
                raise _Stopping
            # started from a worker thread: the parent-death signal is armed by a shim, not preexec_fn
            proc = subprocess.Popen(lifeline.dying_with_parent(cmd), cwd=scratch, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, errors="replace", start_new_session=True)
            self._running.add(proc)
        try:
            with proc:
                try:
                    out, err = proc.communicate(timeout=limit)
                except BaseException:  # the time limit, or this thread stopped: the checker goes too
                    proc.kill()
                    raise
        finally:
            with self._lock:
                self._running.discard(proc)
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err)

    def stop(self) -> None:
        """Kill the checkers running and start no other."""
        with self._lock:
            self._stopped = True
            for proc in self._running:
                proc.kill()


def too_long_for_the_tools(lines: LineLengths | None, limit: float) -> str | None:
    """Why the official tools could not read a file of these LINES within LIMIT seconds, even on a machine
    FASTEST_MACHINE times faster than the one measured (the checker and the RCP checker strip every line alike);
    None where they can."""
    return lines.reason() if lines is not None and lines.checker_s() / FASTEST_MACHINE > limit else None


def tools_cannot_read(path: Path) -> str | None:
    """`too_long_for_the_tools` for PATH at the checker's limit for it."""
    return too_long_for_the_tools(_line_lengths(Path(path)), time_limit_s(Path(path)))


def _line_lengths(path: Path) -> LineLengths | None:
    try:
        return line_lengths(path)
    except OSError:  # unreadable: the checker says so in its own words
        return None


# The checker holds a whole log in memory: 1,807 MiB for a 250 MB log (perf/log_reading.py), about 7.6 bytes a byte.
CHECKER_BYTES_PER_LOG_BYTE = 8


def check_all(items: list[tuple[Path, str, bool]], quiet: bool = False, jobs: int | None = None) -> list[Verdict]:
    """Verdicts for (path, ruleset, smoke) items, in order, checked in up to JOBS processes at once (default: the
    CPU count, at most 8, and no more than half the free memory holds checkers of the largest log)."""
    jobs = max(1, default_jobs([p for p, _, _ in items]) if jobs is None else jobs)
    checkers = Checkers()
    with ThreadPoolExecutor(max_workers=jobs) as ex:
        try:
            return list(ex.map(lambda it: check(*it, quiet=quiet, checkers=checkers), items))
        except BaseException:  # stopped (Ctrl-C, SIGTERM): no checker left running, none started, then out
            ex.shutdown(wait=False, cancel_futures=True)
            checkers.stop()
            raise


def default_jobs(paths: list[Path]) -> int:
    """Checkers to run at once: the CPU count (at most 8), and no more than half the free memory holds."""
    largest = max((os.path.getsize(p) for p in paths if os.path.isfile(p)), default=0)
    fit = _free_memory() // 2 // max(1, CHECKER_BYTES_PER_LOG_BYTE * largest)
    return max(1, min(len(paths), os.cpu_count() or 1, 8, fit))


def _free_memory() -> int:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not POSIX: assume room for one checker at a time
        return 0


def _messages(log: str) -> list[str]:
    """The checker's messages from its log stream, without its INFO lines and the final FAILED."""
    body = []
    for ln in log.splitlines():
        if ln.startswith(("INFO", "ERROR - FAILED")):
            continue
        body.append(ln.removeprefix("WARNING - ").removeprefix("ERROR - "))
    return [m.strip() for m in "\n".join(body).split(_SEPARATOR) if m.strip()]


# Events a log that stops at run_start (a dry run's) cannot have: what the checker must miss in it.
AFTER_RUN_START = {"run_stop", "train_samples", "eval_accuracy", "eval_start", "eval_stop", "block_start", "block_stop",
                   "epoch_start", "epoch_stop"}


def before_run_start(path: Path, ruleset: str) -> list[str]:
    """What the official closed rules of `ruleset` reject in a log that stops at run_start, leaving out the
    events such a log cannot have: every hyperparameter line is checked, exact float comparisons included."""
    v = check(path, ruleset, smoke=False)
    if not v.checked:  # no verdict: neither a rejection nor a pass
        raise NotChecked(f"the closed rules' check of the log a run writes up to run_start could not be done: "
                         f"{v.messages[0]}; try again")
    problems = []
    for m in v.messages:
        names = set(re.findall(r"'([a-z0-9_]+)'", m.splitlines()[0]))
        if not (m.startswith("Required") and names and names <= AFTER_RUN_START):
            problems.append(m)
    if not v.ok and not v.messages:  # the checker itself failed: not a verdict
        problems.append("the compliance checker failed without a message")
    return problems


def rcp_coverage(benchmark: str, ruleset: str, global_batch_size: int) -> str:
    """How the official RCP checker will judge a set of runs at this batch: against the RCP at this batch, one
    interpolated between two, the smallest (only a slower set passes), or none."""
    try:
        rcp = mlperf_tools.Rcp(benchmark, ruleset)
    except ValueError as e:  # a ruleset without RCPs for this benchmark
        return str(e)
    # The checker's default pass drops RCPs that converge in more samples than a larger batch's ("pruned").
    used = rcp.batch_sizes()
    bs = global_batch_size
    if rcp.at(bs) is not None:
        return f"RCP at global batch {bs} (the checker's RCPs: {used})"
    pruned = f" (its RCP at {bs} is pruned by the checker)" if bs in rcp.batch_sizes(pruned=False) else ""
    lo, hi = rcp.below(bs), rcp.above(bs)
    if lo is not None and hi is not None:
        return f"scored against an RCP interpolated between global batch {lo['BS']} and {hi['BS']}{pruned}"
    if lo is not None:
        return (f"no RCP at or above global batch {bs} (largest {lo['BS']}){pruned}: the official RCP "
                f"check fails this set ('Missing RCP') until an RCP at this batch is submitted")
    return (f"below the smallest RCP, at global batch {hi['BS']}{pruned}: the official RCP check passes this set only "
            f"if it converges in no fewer samples than that RCP")


def summary(problem: str) -> str:
    """A checker message in one phrase: the key and the failed test, without the log line and context dumps."""
    lines = problem.splitlines()
    test = next((ln.strip().removeprefix("failed test:").strip() for ln in lines
                 if ln.strip().startswith("failed test:")), "")
    key = re.match(r"CHECK for '([^']+)' failed", lines[0])
    if key and test:
        return f"{key.group(1)} (needs {test})"
    return lines[0].rstrip(":")


# --- `mlbench check` ------------------------------------------------------------------------------------------

def _run_record(result_file: Path) -> tuple[dict, str]:
    """Our run record beside a result file ({} where there is none: a published log has none), and why it cannot
    be read where there is one but it cannot ("" otherwise)."""
    rec = Path(result_file).with_suffix(".json")
    if not rec.exists():
        return {}, ""
    try:
        data = load_record(rec)
    except (OSError, ValueError) as e:
        return {}, f"{rec.name} cannot be read ({getattr(e, 'strerror', None) or str(e).splitlines()[0]})"
    return (data, "") if isinstance(data, dict) else ({}, f"{rec.name} is not a run record (a JSON object)")


@dataclass
class Target:
    """One file to check and the rules it is judged by."""

    path: Path
    ruleset: str
    smoke: bool
    dry_run: bool  # the log ends at run_start
    note: str = ""  # why the rules chosen may not be the ones meant


def targets(path: Path, ruleset: str | None, rules: str) -> list[Target]:
    """The files under PATH and their rules: smoke rules for tiny runs (as their run record says), else the closed
    rules of RULESET or of the benchmark the log names. UserError, before any check, for what cannot be decided."""
    if ruleset is not None:
        require_ruleset(ruleset)
    if (why := given_path_problem(path)) is not None:
        raise UserError(printable(why))
    unlisted: list[tuple[Path, str]] = []
    files = [path] if not path.is_dir() else _result_logs(path, unlisted)
    if not files and unlisted:  # (it said 'no result_*.txt files here' of a folder of them it could not list)
        raise UserError(printable(f"{unlisted[0][0]}: cannot be listed ({unlisted[0][1]}); a folder of result logs "
                                  f"must be readable by the user running mlbench"))
    for f in files:  # refused whole, as a file given alone is: `check` is a verdict on every file
        if (why := why_not_a_file(f)) is not None:
            raise UserError(printable(f"{f}: {why} (a result log is a regular file)"))
    if not files:  # a folder of runs not published yet (their mlbench killed): said, as score says it
        raise UserError(printable(f"{path}: no result_*.txt files here (a result file, or a folder of them)"
                                  + "".join(f"; {n}" for n in _unpublished_notes(path))))
    if not any(map(_holds_token, files)):  # (as score, compare and scaling refuse it: not a verdict's to give)
        what = f"{files[0]} is not" if len(files) == 1 else f"none of the {len(files)} result_*.txt in {path} is"
        raise UserError(printable(f"{what} an MLPerf result log (no :::MLLOG lines)"))  # (score's words)
    return [_target(f, ruleset, rules) for f in files]


def _holds_token(f: Path) -> bool:
    try:
        return holds_token(f)
    except OSError as e:
        raise UserError(printable(f"{f}: cannot read ({e.strerror or e})")) from None


def _target(f: Path, ruleset: str | None, rules: str) -> Target:
    benchmark, last = None, None
    try:  # the keys that tell the benchmark and whether the log ends at run_start; other lines are skipped unparsed
        for e in LogReader(f, keys=frozenset({"submission_benchmark", "run_start", *AFTER_RUN_START})):
            if e.key == "submission_benchmark" and benchmark is None:
                benchmark = text(f, e, "value", e.value) if ruleset is None else e.value
            last = e.key
    except BadField as e:
        raise UserError(f"{e}: cannot tell the ruleset; pass --ruleset") from None
    except OSError as e:
        raise UserError(f"{f}: cannot read ({e.strerror or e})") from None
    record, why = _run_record(f) if rules == "auto" else ({}, "")
    smoke = rules == "smoke" or record.get("variant") == "tiny"
    if ruleset is not None and isinstance(benchmark, str) and ruleset not in mlperf_tools.rulesets_with(benchmark):
        # the checker crashed reading its own files (a FAIL, exit 1): bad input, as an unknown ruleset is; for a
        # tiny run too (by the smoke rules, 0.6.0 failed a valid tiny gpt3 run and 1.0.0 passed it)
        raise UserError(printable(f"{f}: --ruleset {ruleset} has no rules for {benchmark} (the benchmark its log "
                                  f"names); rulesets holding it: "
                                  f"{', '.join(mlperf_tools.rulesets_with(benchmark)) or 'none'}"))
    passed_over = None
    if ruleset is None:
        if benchmark is None and not _holds_token(f):
            raise UserError(printable(f"{f}: not an MLPerf result log (no :::MLLOG lines)"))
        if benchmark is None:
            raise UserError(printable(f"{f}: cannot tell the ruleset: the log names no benchmark (no "
                                      f"submission_benchmark record); pass --ruleset"))
        ruleset = default_ruleset(f.resolve(), benchmark)
        if ruleset is None:
            raise UserError(f"{f}: cannot tell the ruleset (benchmark {benchmark!r} is not one of "
                            f"{', '.join(registry.names())}); pass --ruleset")
        passed_over = mlperf_tools.passed_over_round(f.resolve(), benchmark, ruleset)
    note = f"{why}, so it is judged as a full-size run; --rules smoke judges a tiny one" if why else ""
    note = "; ".join(filter(None, (note, passed_over)))
    return Target(f, ruleset, smoke, dry_run=last == "run_start", note=note)


def default_ruleset(path: Path, benchmark: str | None) -> str | None:
    """The ruleset a log at PATH of BENCHMARK is judged by where none is asked for, by check and score alike: the
    round a published tree names (training_results_vX.Y) where it has rules for the benchmark, else the one its
    definition names (our runs log it); None for a benchmark mlbench does not define."""
    if (r := mlperf_tools.ruleset_in_path(path, benchmark)) is not None:
        return r
    return registry.load(benchmark).mlperf.ruleset if benchmark in registry.names() else None


def check_paths(path: Path, ruleset: str | None, rules: str, console: Console) -> bool | None:
    """`mlbench check`: print each file's verdict; whether every file passed (`overall`)."""
    checked, notes = judge_paths(path, ruleset, rules)
    print_checked(console, checked, notes)
    return overall(checked)


def judge_paths(path: Path, ruleset: str | None, rules: str) -> tuple[list[tuple[Target, Verdict]], list[str]]:
    """Each file under PATH with its verdict, and the notes on what was not checked (runs not
    published yet, result logs in hidden folders or named otherwise)."""
    todo = targets(path, ruleset, rules)
    verdicts_ = check_all([(t.path, t.ruleset, t.smoke) for t in todo])
    return list(zip(todo, verdicts_, strict=True)), _unpublished_notes(path)


def overall(checked: list[tuple[Target, Verdict]]) -> bool | None:
    """Whether every file passed (True), some failed (False), or none failed but the checker gave no verdict on some
    (None: killed from outside, twice; each such file says so)."""
    oks = [v.ok for _, v in checked]
    return False if False in oks else None if None in oks else True


def print_checked(console: Console, checked: list[tuple[Target, Verdict]], notes: list[str]) -> None:
    """Each file's verdict. A path and a checker's message (which quotes the log's line) are `printable`."""
    for t, v in checked:
        mark = ("PASS", "green") if v.ok else ("FAIL", "red") if v.checked else ("NOT CHECKED", "yellow")
        console.print(Text.assemble(mark, f" {printable(t.path)} ({v.rules})"), highlight=False)
        if t.note:
            console.print(f"    note: {printable(t.note)}", highlight=False, soft_wrap=True)
        for m in v.messages[:20]:
            console.print("    " + "\n    ".join(printable(ln) for ln in m.splitlines()), highlight=False)
        if t.dry_run and v.checked:
            hp = [m for m in v.messages if "CHECK for" in m]
            console.print(f"    note: a dry-run log (it ends at run_start), so the run's own events are missing; "
                          f"{'no hyperparameter line failed' if not hp else f'{len(hp)} lines failed their rules'}",
                          highlight=False)
    for note in notes:  # not checked: not results yet (the next `mlbench run` publishes them)
        console.print(f"note: {note}", highlight=False, soft_wrap=True)


def checked_json(checked: list[tuple[Target, Verdict]], notes: list[str]) -> dict:
    """`check --json` (docs/output.md): the verdicts as the run record's `compliance` names them (ok, rules,
    messages), each message whole."""
    return schema.versioned({"ok": overall(checked), "files": [
        {"file": str(t.path), "ok": v.ok, "rules": v.rules, "ruleset": t.ruleset, "dry_run": t.dry_run,
         "note": t.note or None, "messages": list(v.messages)} for t, v in checked], "notes": notes})


def _result_logs(path: Path, unlisted: list[tuple[Path, str]]) -> list[Path]:
    """The result_*.txt under the folder PATH that score reads too (none in a hidden folder: analysis.logs)."""
    from mlbench.analysis.logs import result_logs  # (analysis reads logs; imported where a folder is checked)

    return result_logs(path, unlisted)[0]


def _unpublished_notes(path: Path) -> list[str]:
    """The runs under the folder PATH whose mlbench died before it published them, the result logs in hidden folders
    passed over, and those named otherwise than mlbench names a result (analysis.logs says which, as score does)."""
    if not path.is_dir():
        return []
    from mlbench.analysis.logs import name_notes, result_logs, unpublished_notes

    found, hidden = result_logs(path, [])
    by_folder: dict[Path, list[Path]] = {}
    for f in found:
        by_folder.setdefault(f.parent, []).append(f)
    names = [f"{printable(d)}: {n}" if d != path else n for d, fs in sorted(by_folder.items()) for n in name_notes(fs)]
    return [*hidden, *names, *unpublished_notes(path)]
