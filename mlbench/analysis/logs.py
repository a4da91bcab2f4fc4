"""MLPerf result logs as the analysis reads them, ours and published, and the folders that hold them.

A log is read in one streaming pass (`mlbench.logfile`), keeping only what the analysis uses. Nothing here
raises on a bad log: a broken line, a missing run_stop or a garbled field (NaN, a list where a number belongs)
becomes a line in `RunLog.problems` naming the file, line and key, so one bad file never hides the rest of a
set; a run whose timing, status or batch is garbled is `invalid` and never counts as a success.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from mlbench import mlperf_tools
from mlbench.analysis import MAX_DEVICES
from mlbench.analysis import step_times as st
from mlbench.errors import UserError, printable
from mlbench.logfile import (
    MAX_TEXT,
    BadField,
    Event,
    LogReader,
    Take,
    given_path_problem,
    is_number,
    load_json,
    load_record,
    metadata,
    number,
    shown,
    text,
    time_to_train_s,
    tree_glob,
    why_not_a_file,
    why_unreadable,
)

RESULT_GLOB = "result_*.txt"
NOT_A_LOG = "no :::MLLOG lines: not an MLPerf result log"
NO_RECORDS = "no readable records: every :::MLLOG line is broken"

# Benchmarks whose eval/block counters count tokens (samples x sequence length) rather than samples.
TOKEN_COUNTED = {"gpt3"}
# Keys that describe the submission or are per-run noise, not hyperparameters to compare.
_NOT_HPARAMS = {
    "cache_clear", "init_start", "init_stop", "run_start", "submission_org", "submission_platform",
    "submission_division", "submission_status", "submission_benchmark", "submission_poc_name",
    "submission_poc_email", "seed", "tracked_stats", "weights_initialization",
}
# Keys before run_start kept for `compare` (real logs have 30 to 80): 300,000 made compare take minutes.
MAX_HYPERPARAMS = 1000


def _kept(value: object) -> object:
    """A hyperparameter's value as compare shows it: a number, a boolean, None or a short string as it is; anything
    else as its JSON text, cut to MAX_TEXT characters (a 5 MB string, or a list nested a thousand deep, whose repr
    ended compare in a RecursionError, is kept as a line)."""
    if value is None or type(value) in (bool, float) or type(value) is int and -(10**18) < value < 10**18 \
            or type(value) is str and len(value) <= MAX_TEXT:
        return value
    return shown(value, MAX_TEXT)


_TEXT_KEYS = ("submission_benchmark", "submission_org", "submission_platform", "submission_division")
_BLOCK_KEYS = ("block_start", "epoch_start", "block_stop", "epoch_stop")
# What is read after run_start (before it, every line: the hyperparameters).
_SCORE_KEYS = frozenset({*_TEXT_KEYS, "global_batch_size", "max_sequence_length", "run_start", "run_stop",
                         "eval_accuracy", "seed"})
MAX_SEEDS = 16  # seed records kept of a log (MLPerf's logs state one; more is warned of by the package checker)
_STEP_KEYS = frozenset({*_SCORE_KEYS, "tracked_stats", *_BLOCK_KEYS})
# A samples (or epoch) counter is at least 0 and below 2^53, where a float still counts by ones: a negative one
# made a negative "samples to converge", 1e300 an absurd one. A batch or sequence length is below it too (the
# product of two of 1e300 overflowed a float)
_MAX_SAMPLES = 2.0**53


@dataclass
class RunLog:
    path: Path
    problems: list[str] = field(default_factory=list)
    invalid: bool = False  # a field the score rests on is garbled: the run never counts
    no_time: bool = False  # invalid only in that run_stop is not after run_start (the summarizer scores it anyway)
    texts: dict[str, str] = field(default_factory=dict)  # first submission_* values
    gbs: int | None = None
    seq_len: int | None = None
    run_start_ms: float | None = None
    run_stop_ms: float | None = None
    logged_status: str | None = None
    stop_line: int = 0  # the run_stop line read (its number in the file)
    hyperparams: dict[str, object] = field(default_factory=dict)  # first value of each key before run_start
    eval_points: list[tuple[float, float, float]] = field(default_factory=list)  # (count, value, time_ms)
    tracked: st.Tracked = field(default_factory=st.Tracked)
    blocks: list[st.Block] = field(default_factory=list)
    # (file, lineno, seed) of its seed records, as MLPerf's package checker keys them: two runs of a set may not
    # state one seed from one line
    seeds: list[tuple[object, object, int]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def benchmark(self) -> str | None:
        return self.texts.get("submission_benchmark")

    @property
    def org(self) -> str | None:
        return self.texts.get("submission_org")

    @property
    def platform(self) -> str | None:
        return self.texts.get("submission_platform")

    @property
    def division(self) -> str | None:
        return self.texts.get("submission_division")

    @property
    def status(self) -> str:
        if self.invalid:
            return "invalid"
        if self.run_start_ms is None:
            return "no run_start"
        if self.run_stop_ms is None:
            return "no run_stop"
        return self.logged_status or "no status"

    @property
    def ttt_min(self) -> float | None:
        """Time to train as the summarizer computes it (the last run_start before the first run_stop), in minutes."""
        s = None if self.invalid else time_to_train_s(self.run_start_ms, self.run_stop_ms)
        return s / 60 if s is not None else None

    @property
    def counts_tokens(self) -> bool:
        return self.benchmark in TOKEN_COUNTED

    @property
    def samples_per_count(self) -> float:
        """An eval/block counter in samples (gpt3 counts tokens: samples x 2048)."""
        return 1 / (self.seq_len or 2048) if self.counts_tokens else 1.0

    @cached_property
    def evals(self) -> list[tuple[float, float, float]]:
        """(samples, eval_accuracy, minutes since run_start) for every eval_accuracy."""
        start = self.run_start_ms
        return [(c * self.samples_per_count, v, (t - start) / 60000 if start is not None else math.nan)
                for c, v, t in self.eval_points]

    @property
    def samples_to_converge(self) -> int | float | None:
        """Samples at the last eval before a successful run_stop (the RCP checker's convergence point): a count,
        so an int (a float only where the counter is not whole: epochs)."""
        if self.status != "success":
            return None
        before = [c for c, _, t in self.eval_points if t <= self.run_stop_ms]
        if not before:
            return None
        samples = before[-1] * self.samples_per_count
        return int(samples) if samples.is_integer() else samples

    @property
    def steps_to_converge(self) -> float | None:
        s, g = self.samples_to_converge, self.gbs
        return s / g if s is not None and g else None

    @cached_property
    def step_times(self) -> st.StepTimes:
        return (st.from_tracked(self.tracked, self.run_start_ms, self.run_stop_ms, self.gbs, self.seq_len)
                or st.from_blocks(self.blocks, [c for c, _, _ in self.eval_points], self.gbs,
                                  self.samples_per_count)
                or st.none())


# --- reading ---------------------------------------------------------------------------------------

class _Pass:
    """One streaming pass over a log, filling a RunLog; a garbled field is a problem, the first per key shown."""

    def __init__(self, log: RunLog, steps: bool):
        self.log, self.steps = log, steps
        self.bad: dict[str, int] = {}
        self.open_block: tuple[float, float | None, float | None] | None = None  # time, size, first count
        self.started = False  # past the first run_start line (whether or not its time is usable)
        self.seen = {"run_start": 0, "run_stop": 0}  # lines of each, usable or not
        self.hyperparams_left = 0  # keys before run_start past MAX_HYPERPARAMS

    def fault(self, e: BadField, key: str, invalidates: bool) -> None:
        self.bad[key] = self.bad.get(key, 0) + 1
        if self.bad[key] == 1:
            self.log.problems.append(str(e) + ("" if not invalidates else ": the run cannot count"))
        self.log.invalid |= invalidates

    def event(self, e: Event) -> None:
        log, path, k = self.log, self.log.path, e.key
        self.started |= k == "run_start"
        if k in self.seen:
            self.seen[k] += 1
        if k == "tracked_stats" and self.steps and self.started:
            self.checked(self.tracked, e)
            return
        if not self.started and k not in _NOT_HPARAMS and k not in log.hyperparams \
                and not e.event_type.startswith("INTERVAL"):
            if len(log.hyperparams) < MAX_HYPERPARAMS:
                log.hyperparams[k] = _kept(e.value)
            else:
                self.hyperparams_left += 1
        if k in _TEXT_KEYS:
            if k not in log.texts:
                self.checked(lambda e: log.texts.__setitem__(k, text(path, e, "value", e.value)), e)
        elif k == "global_batch_size":
            if log.gbs is None:
                self.checked(lambda e: setattr(log, "gbs", _whole(path, e)), e)
        elif k == "max_sequence_length":
            if log.seq_len is None:
                self.checked(lambda e: setattr(log, "seq_len", _whole(path, e, MAX_SEQUENCE)), e)
        elif k in ("run_start", "run_stop"):
            # As the official summarizer reads them (_query_run_start_stop): each line replaces the one before
            # until both are there, so the last run_start before the first run_stop
            if log.run_start_ms is None or log.run_stop_ms is None:
                self.checked(self.stop if k == "run_stop" else
                             lambda e: setattr(log, "run_start_ms", _clock(path, e)), e)
        elif k == "eval_accuracy":
            self.checked(self.eval, e)
        elif k == "seed":
            self.seed(e)
        elif k == "tracked_stats" and self.steps:
            self.checked(self.tracked, e)
        elif k in _BLOCK_KEYS and self.steps:
            self.checked(self.block, e)

    def checked(self, read, e: Event) -> None:
        """Run READ on the event; a garbled field becomes a problem (the run invalid where the score rests on it)."""
        try:
            read(e)
        except BadField as err:
            self.fault(err, e.key, invalidates=e.key not in ("tracked_stats", *_BLOCK_KEYS))

    def take_step(self, record: dict, line: int) -> bool:
        """A well-formed per-step record as parsed (most lines of a big log; `LogReader.take`), stored without an
        Event or the checks' overhead: what `tracked` would store. False for anything else, which `tracked` then
        reads field by field, naming a bad field."""
        fields = _step_fields(record)
        if not fields:
            return fields is not None  # (): no step time, which `tracked` passes over too
        for x in fields:  # finite: an int or a float (not bool: a number to Python only)
            if type(x) is float:
                if x - x != 0.0 and x is not _NAN:  # _NAN: step, tokens_per_s or tflops_per_device not logged
                    return False
            elif type(x) is not int or not -_BIG < x < _BIG:
                return False
        if not st.MIN_STEP_S <= fields[1] <= st.MAX_STEP_S or fields[3] < 0 or not 0 <= fields[4] <= st.MAX_TFLOPS \
                and fields[4] is not _NAN:  # as st.plausible
            return False
        self.log.tracked.add(*fields)
        return True

    def stop(self, e: Event) -> None:
        log, path = self.log, self.log.path
        t = _clock(path, e)
        md = metadata(path, e)
        log.logged_status = text(path, e, "status", md["status"]) if "status" in md else None
        log.stop_line = e.line
        log.run_stop_ms = t

    def seed(self, e: Event) -> None:
        """A seed record the package checker would key (an integer value; where it is not, the checker reports the
        log, which mlbench's compliance verdict does not rest on): kept, never a fault."""
        md = e.metadata if isinstance(e.metadata, dict) else {}
        if type(e.value) is int and len(self.log.seeds) < MAX_SEEDS:
            where = tuple(v if isinstance(v, str | int) and not isinstance(v, bool) else None
                          for v in (md.get("file"), md.get("lineno")))
            self.log.seeds.append((*where, e.value))

    def eval(self, e: Event) -> None:
        path, md = self.log.path, metadata(self.log.path, e)
        name = "samples_count" if "samples_count" in md else "epoch_num"
        if name not in md:
            return
        count = _samples(path, e, name, md[name])
        value = number(path, e, "value", e.value)
        points = self.log.eval_points
        if points and count < points[-1][0]:  # garbled: samples to converge would be read off a count gone back
            raise BadField(path, e, name, count, f"a count not below the evaluation's before it ({points[-1][0]:g})")
        points.append((count, value, number(path, e, "time_ms", e.time_ms)))

    def tracked(self, e: Event) -> None:
        path = self.log.path
        if not isinstance(e.value, dict):  # (NVIDIA logs other statistics under this key: objects too)
            raise BadField(path, e, "value", e.value, "an object of per-step statistics")
        name = next((n for n in st.STEP_TIME_KEYS if n in e.value), None)
        if name is None:
            return
        secs = number(path, e, name, e.value[name], positive=True)
        if not st.MIN_STEP_S <= secs <= st.MAX_STEP_S:
            raise BadField(path, e, name, secs, f"a step time in seconds, from {st.MIN_STEP_S:g} to "
                                                f"{st.MAX_STEP_S:g}")
        md = metadata(path, e)
        step = number(path, e, "step", md["step"]) if "step" in md else math.nan
        extra = [_at_least_0(path, e, n, e.value[n]) if n in e.value else math.nan
                 for n in ("tokens_per_s", "tflops_per_device")]
        if extra[1] > st.MAX_TFLOPS:
            raise BadField(path, e, "tflops_per_device", extra[1], f"TFLOP/s a device, at most {st.MAX_TFLOPS:g}")
        self.log.tracked.add(step, secs, number(path, e, "time_ms", e.time_ms), *extra)

    def block(self, e: Event) -> None:
        path, md = self.log.path, metadata(self.log.path, e)
        t = number(path, e, "time_ms", e.time_ms)
        if e.key.endswith("_start"):
            self.open_block = None
            size, first = md.get("epoch_count"), md.get("first_epoch_num", md.get("samples_count"))
            name = "first_epoch_num" if "first_epoch_num" in md else "samples_count"
            self.open_block = (t, _samples(path, e, "epoch_count", size) if size is not None else None,
                               _samples(path, e, name, first) if first is not None else None)
            return
        if self.open_block is None:
            return
        start, size, first = self.open_block
        self.open_block = None
        self.log.blocks.append(st.Block(start, t, size, first))

    def finish(self) -> None:
        log = self.log
        for key, n in self.seen.items():
            if n > 1:  # the official checker warns (the same value) or fails the log
                log.problems.append(f"{n} {key} lines: time to train is from the last run_start before the first "
                                    "run_stop, as the official summarizer reads them")
        if self.hyperparams_left:
            log.problems.append(f"{self.hyperparams_left:,} more keys before run_start than the {MAX_HYPERPARAMS:,} "
                                "compared: left out of the comparison")
        for key, n in self.bad.items():
            if n > 1:
                log.problems.append(f"{log.path}: {n - 1} more line(s) with a bad {key} field")


_NAN = math.nan
_BIG = 2.0**1023  # an int beyond this cannot become a float


def _step_fields(record: dict) -> tuple | None:
    """A per-step record's row as `tracked` reads it: step, seconds, time_ms, tokens_per_s, tflops (NaN: not
    logged); () where it holds no step time (`tracked` passes it over), None where its value or its metadata is
    no object."""
    v = record.get("value")
    if type(v) is not dict:
        return None  # `tracked` names it
    if (name := next((n for n in st.STEP_TIME_KEYS if n in v), None)) is None:
        return ()
    if type(md := _metadata(record)) is not dict:
        return None
    return (md.get("step", _NAN), v[name], record.get("time_ms"), v.get("tokens_per_s", _NAN),
            v.get("tflops_per_device", _NAN))


def _metadata(record: dict) -> object:
    md = record.get("metadata")
    return {} if md is None else md  # (as an Event holds it)


# Milliseconds since the epoch before the year 5138: no clock logs more (mlperf_logging's is time.time() x 1000,
# 1.7e12 in 2024); 1e300 made a success with a time to train of 300 digits.
MAX_EPOCH_MS = 1e14


def _clock(path: Path, e: Event) -> float:
    """A run_start or run_stop time: milliseconds since the epoch, so never negative (a negative one made a
    time to train of a century) nor past MAX_EPOCH_MS. A string is read as the official tools read it, with
    float() ("1759966206549" is a time to them: the run was scored there and made invalid here)."""
    value = e.time_ms
    if type(value) is str and len(value) <= 64:
        with contextlib.suppress(ValueError):
            value = float(value)
    t = number(path, e, "time_ms", value)
    if not 0 <= t < MAX_EPOCH_MS:
        raise BadField(path, e, "time_ms", t, f"milliseconds since the epoch, from 0 to {MAX_EPOCH_MS:.0e}")
    return t


def _at_least_0(path: Path, e: Event, name: str, value: object) -> float:
    v = number(path, e, name, value)
    if v < 0:
        raise BadField(path, e, name, v, "a finite number at least 0")
    return v


def _samples(path: Path, e: Event, name: str, value: object) -> float:
    """A samples (tokens, epochs) counter: at least 0 and below 2^53."""
    v = number(path, e, name, value)
    if not 0 <= v < _MAX_SAMPLES:
        raise BadField(path, e, name, v, "a count at least 0 and below 2^53")
    return v


def _whole(path: Path, e: Event, most: int | None = None) -> int:
    """The event's value, a positive integer below 2^53, or at most MOST."""
    v = number(path, e, "value", e.value, positive=True, integer=True)
    if v >= _MAX_SAMPLES or most is not None and v > most:
        raise BadField(path, e, "value", v, "a positive integer below 2^53" if most is None else
                       f"a positive integer at most {most:,}")
    return int(v)


# Tokens a sequence: the longest context trained is some millions; 10^15 made samples to converge 1e-10 and a
# throughput of 18 digits (a bound on what a sample may hold, as the batch's 2^53)
MAX_SEQUENCE = 2**24


def read_log(path: Path, steps: bool = True) -> RunLog:
    """Read one result file in one streaming pass; never raises for a bad log (problems are collected instead).

    steps=False leaves out the per-step records (tracked_stats, blocks): what scoring needs, and faster."""
    log = RunLog(Path(path))
    reader = LogReader(log.path)
    scan = _Pass(log, steps)
    take = Take("tracked_stats", scan.take_step, _step_fields, log.tracked.add_rows,  # (the reader's: no cycle)
                st.plausible)
    events = 0
    try:
        for e in reader:
            events += 1
            scan.event(e)
            if scan.started and reader.keys is None:  # hyperparameters done
                reader.keys = _STEP_KEYS if steps else _SCORE_KEYS
                reader.take = take if steps else None
    except OSError as e:
        return RunLog(log.path, [f"cannot read: {e.strerror or e}"])
    scan.finish()
    log.problems[:0] = reader.problems()
    if not events:
        log.problems.append(NOT_A_LOG if not reader.n_broken else NO_RECORDS)
        return log
    if log.run_start_ms is None:  # where a line was there, its bad time_ms is the problem already listed
        if not scan.seen["run_start"]:
            log.problems.append("no run_start: the run never started its timed region")
    elif log.run_stop_ms is None:
        if not scan.seen["run_stop"]:
            log.problems.append("no run_stop: the run did not finish (crashed or the log is truncated)")
    elif log.run_stop_ms <= log.run_start_ms:  # (time_to_train_s: no time to train)
        log.no_time = not log.invalid
        log.invalid = True
        when = (f"{(log.run_start_ms - log.run_stop_ms) / 1000:g} s before" if log.run_stop_ms < log.run_start_ms
                else "at the same time as")
        log.problems.append(f"run_stop is {when} run_start: no time to train, the run cannot count")
    elif log.logged_status not in ("success", "aborted"):
        said = "no status" if log.logged_status is None else f"status {log.logged_status!r}"
        log.problems.append(f"{log.path}:{log.stop_line}: run_stop has {said} (metadata.status), expected "
                            f"'success' or 'aborted'")
    if log.benchmark is None:
        log.problems.append("no submission_benchmark")
    return log


@dataclass
class ResultSet:
    """One benchmark folder: result_*.txt of one system and benchmark (or a single file)."""

    folder: Path
    files: list[Path]
    system: str
    org_root: Path | None  # the organisation folder when the set sits in a submission tree
    steps: bool = True  # read per-step records (compare, scaling); scoring does not need them
    left_out: list[str] = field(default_factory=list)  # files of the folder not read (or read without their run
    # record), and why
    not_files: int = 0  # result_*.txt there that are no file to read (a dangling link, a pipe): the summarizer stops

    @cached_property
    def runs(self) -> list[RunLog]:
        runs = [read_log(f, self.steps) for f in self.files]
        for log in runs:
            _check_own_target(log)
        return runs

    @cached_property
    def benchmark(self) -> str | None:
        """The set's benchmark: the folder's name when runs log it, else the most common one logged."""
        logged = [r.benchmark for r in self.runs if r.benchmark]
        return self.folder.name if self.folder.name in logged else (
            max(sorted(set(logged)), key=logged.count) if logged else None)

    @cached_property
    def benchmark_runs(self) -> list[RunLog]:
        """The runs of the set's benchmark (or naming none): what score, compare and scaling take."""
        return [r for r in self.runs if r.benchmark in (self.benchmark, None)]

    def mixed_note(self, taking: str = "") -> str | None:
        """What a folder of mixed benchmarks leaves out of its set, as a note; None if nothing."""
        others = sorted({f"{r.name} ({r.benchmark})" for r in self.runs if r.benchmark not in (self.benchmark, None)})
        if not others:
            return None
        how = f"{', '.join(others)} counted as failed runs of it" if taking == "scoring " else \
            f"left out {', '.join(others)}"  # (scored: as the summarizer drops them; compared: not its runs)
        return f"mixed benchmarks in one folder: {taking}{self.benchmark}; {how}"

    @property
    def left_out_notes(self) -> list[str]:
        """Every file of the folder left out of the set, and why (not read, or another benchmark's)."""
        return self.left_out + [m for m in [self.mixed_note()] if m]

    @property
    def label(self) -> str:
        parts = [p for p in (self.org_root.name if self.org_root else None, self.system,
                             self.folder.name) if p]
        return "/".join(parts)

    @property
    def system_desc(self) -> dict | None:
        """systems/<system>.json of the submission tree, where there is a readable one."""
        return self._system[0]

    def summarizer_skips(self) -> str | None:
        """Why the official summarizer makes no row for this set, where its systems json (in a submission tree) is
        missing or unusable to it; None where it is not in a tree or nothing is wrong with it."""
        if self.org_root is None:
            return None
        name = f"systems/{self.system}.json"
        desc, why = self._system
        if desc is None:
            return why or f"{name} is missing"
        problem = mlperf_tools.system_desc_problem(desc)
        return f"{name}: {problem}" if problem else None

    @cached_property
    def _system(self) -> tuple[dict | None, str]:
        """(systems/<system>.json, or None; why a file that is there cannot be used, or "")."""
        if self.org_root is None:
            return None, ""
        p = self.org_root / "systems" / f"{self.system}.json"
        if not p.exists():
            return None, ""
        try:
            d = load_json(p)
        except OSError as e:
            return None, f"systems/{p.name} cannot be read ({e.strerror or e})"
        except ValueError as e:
            return None, f"systems/{p.name} is not JSON ({str(e).splitlines()[0][:80]})"
        return (d, "") if isinstance(d, dict) else (None, f"systems/{p.name} is not a JSON object")

    @property
    def smoke(self) -> bool:
        """A set of our tiny (smoke) runs, per their run records: judged by the smoke rules, with no RCPs."""
        return bool(self.files) and all(run_record(f).get("variant") == "tiny" for f in self.files)

    def devices(self, given: int | None = None) -> tuple[int | None, str]:
        """Device count and where it came from: given, systems/<system>.json, or our run record ("unknown" where
        none says). A field that is there but garbled is passed over, never read as another count: the source then
        says why, e.g. "run record (systems/X.json accelerators_per_node [8] is not a whole count ...)". GIVEN
        (--devices) overrides them: where one says another count, the source says it ("given (the systems json
        says 256: --devices overrides it)")."""
        if given:
            found, source = self.devices()
            if found is None:  # (what none said, or said apart: records of different counts)
                why = passed_over(source)[1]
                return given, f"given ({why})" if why else "given"
            if found == given:
                return given, "given"
            return given, f"given (the {passed_over(source)[0]} says {found}: --devices overrides it)"
        why = [self._system[1]] if self._system[1] else []
        d = self.system_desc
        if d is not None and "number_of_nodes" in d:
            name = f"systems/{self.system}.json"
            nodes = _count(d, "number_of_nodes", name, why)
            per_node = _count(d, "accelerators_per_node", name, why) if "accelerators_per_node" in d else 1
            if nodes and per_node and nodes * per_node > MAX_DEVICES:  # each a count, their product none
                why.append(f"{name} number_of_nodes {nodes:,} x accelerators_per_node {per_node:,} = "
                           f"{nodes * per_node:,} devices, more than {MAX_DEVICES:,}")
            elif nodes and per_node:
                return nodes * per_node, _source("systems json", why)
        counts: dict[int, list[str]] = {}
        for f in self.files:
            record = run_record(f)
            if "devices" in record and (n := _count(record, "devices", f.with_suffix(".json").name, why)):
                counts.setdefault(n, []).append(f.with_suffix(".json").name)
        if len(counts) == 1:
            return next(iter(counts)), _source("run record", why)
        if counts:  # (the first was taken: runs on 2 devices scored and compared as on 1)
            why.append("the run records say different device counts (" + "; ".join(
                f"{n}: {', '.join(names)}" for n, names in sorted(counts.items())) + "): a set is one configuration")
        return None, _source("unknown", why)


def _check_own_target(log: RunLog) -> None:
    """A run whose log says success but whose last evaluation misses the target its run record states is garbled:
    the run cannot count. The closed rules make the checker see to a full run's target; the smoke rules do not, and
    tiny runs whose every evaluation was edited away from the target were scored."""
    # the last evaluation before run_stop, as samples to converge: one logged after it does not undo the run
    before = [v for _, v, t in log.eval_points if log.run_stop_ms is None or t <= log.run_stop_ms]
    if log.status != "success":
        return
    q = run_record(log.path).get("quality")
    target, direction = (q.get("target"), q.get("direction")) if isinstance(q, dict) else (None, None)
    if not is_number(target) or direction not in ("min", "max"):
        return
    if not before:  # (every evaluation timed after run_stop: a success that no evaluation shows was scored)
        log.problems.append(f"{log.path}: run_stop says success, but no evaluation precedes it to show the target "
                            f"its run record states was reached: the run cannot count")
        log.invalid, log.no_time = True, False
        return
    last = before[-1]
    if last <= target if direction == "min" else last >= target:
        return
    log.problems.append(f"{log.path}: run_stop says success, but the last evaluation, {last:g}, misses the target "
                        f"its run record states ({'<=' if direction == 'min' else '>='} {target:g}): the run cannot "
                        f"count")
    log.invalid, log.no_time = True, False


def _source(where: str, why: list[str]) -> str:
    return f"{where} ({'; '.join(why)})" if why else where


def passed_over(source: str) -> tuple[str, str]:
    """A source from `ResultSet.devices` split: where the count came from, and why a count that is there was passed
    over ("" where none was)."""
    where, _, why = source.partition(" (")
    return where, why.removesuffix(")")


def _count(d: dict, key: str, name: str, why: list[str]) -> int | None:
    """D[KEY] as a device count, a whole number from 1 to MAX_DEVICES (a number, or a string of digits as systems
    jsons write); None, with the reason naming file NAME and the key added to WHY, for anything else."""
    v = d[key]
    if isinstance(v, str) and re.fullmatch(r"\s*[0-9]{1,7}\s*", v):  # (int() of 5000 digits raises)
        v = int(v)
    if type(v) is float and v.is_integer():
        v = int(v)
    if type(v) is int and 1 <= v <= MAX_DEVICES:
        return v
    why.append(f"{name} {key} {shown(v, 40)} is not a whole count from 1 to {MAX_DEVICES:,}")
    return None


def record_number(result_file: Path, key: str) -> float | None:
    """A finite number from our run record (None where absent or garbled)."""
    v = run_record(result_file).get(key)
    return float(v) if is_number(v) else None


def run_record(result_file: Path) -> dict:
    """Our sidecar result_<i>.json (optional; published logs have none)."""
    try:
        d = load_record(Path(result_file).with_suffix(".json"))
    except (OSError, ValueError):
        return {}
    return d if isinstance(d, dict) else {}


def _no_record(record: Path) -> str:
    """Why a log has no run record beside it: none there (a stray or copied log)."""
    return (f"no run record ({record.name}) beside it, as every run mlbench publishes in this folder has (a stray or "
            f"copied log)")


def _unusable(record: Path) -> str | None:
    """What is wrong with the run record RECORD, which is there (None: nothing): not a file that can be read (a pipe,
    a device, a folder: not read, so never a hang), or garbled (not JSON, cut short, not an object, a variant that is
    no name, a quality with no target to check). Read as absent, it would make its run one of unknown kind, judged
    by the closed rules."""
    try:
        d = load_record(record)
    except OSError as e:
        return f"its run record {record.name} cannot be read ({e.strerror or e})"
    except ValueError as e:
        return f"its run record {record.name} is not JSON ({shown(str(e).splitlines()[0], 80)[1:-1]})"
    if not isinstance(d, dict):
        return f"its run record {record.name} is not a run record (a JSON object) but {shown(d, 40)}"
    if "variant" in d and not isinstance(d["variant"], str):
        return f"its run record {record.name} has variant {shown(d['variant'], 40)}, not a name"
    q = d.get("quality")
    if "quality" in d and not (isinstance(q, dict) and is_number(q.get("target"))
                               and q.get("direction") in ("min", "max")):
        # (a target "1.04" or NaN skipped the check of the target a tiny run states: it counted on its log's word)
        return (f"its run record {record.name} has quality {shown(q, 60)}, not a target (a number) and a direction "
                f"(min or max)")
    return None


class GivenOnce:
    """What a command's PATHs name (a set's folder, a run's file, a published row), each once: the same one given
    twice, or inside another PATH given too, would count twice (scaling) or be compared with itself (compare).
    Keys say what is the same: a set and one run of it are two keys, so compare takes a run beside its set (one
    run against the set's median), while scaling, whose keys are sets, refuses a run file inside a set given."""

    def __init__(self, takes: str):
        self.takes = takes  # e.g. "scaling takes each configuration"
        self.seen: dict[object, object] = {}  # what, by key: the PATH that named it

    def add(self, key: object, name: object, path: object) -> None:
        if key in self.seen:
            first = self.seen[key]
            both = "" if Path(first).resolve() == Path(path).resolve() else f" (in {first} and in {path})"
            raise UserError(printable(f"{name} is given twice{both}; {self.takes} once"))
        self.seen[key] = path


def told_apart(named: list[tuple[str, Path | None]]) -> list[str]:
    """The labels of NAMED (label, path), each that two share followed by its path: the same organisation, system
    and benchmark from two results trees are named apart in every table, note and plot."""
    count: dict[str, int] = {}
    for label, _ in named:
        count[label] = count.get(label, 0) + 1
    return [f"{label} [{shown_path(path)}]" if count[label] > 1 and path is not None else label
            for label, path in named]


def shown_path(path: Path) -> str:
    """PATH as given relative to the working folder where it is in it, else as it is."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except (OSError, ValueError):
        return str(path)


def holds_no_log(sets: list[ResultSet]) -> str | None:
    """Why not one file of SETS is an MLPerf result log, in a few words (None where one is): no :::MLLOG line, or
    none that can be read (score judged a file of broken lines a run with no run_start, exit 0). score, compare and
    scaling refuse such input."""
    last = [r.problems[-1:] for rs in sets for r in rs.runs]
    if not all(p in ([NOT_A_LOG], [NO_RECORDS]) for p in last):
        return None
    return "no :::MLLOG lines" if all(p == [NOT_A_LOG] for p in last) else "no :::MLLOG line that can be read"


def find_sets(path: Path, steps: bool = True) -> list[ResultSet]:
    """Every benchmark folder under PATH: a folder of result_*.txt, a submission tree, or one file.
    steps: whether its runs are read with their per-step records."""
    path = Path(path)
    if (why := given_path_problem(path)) is not None:
        raise UserError(printable(why))
    if not path.is_dir():
        return [_make_set(path.parent, [path], steps)]
    folders: dict[Path, list[Path]] = {}
    others: dict[Path, list[str]] = {}  # result_*.txt that are no file to read (a pipe, a folder, a dead link)
    unlisted: list[tuple[Path, str]] = []
    found, hidden = result_logs(path, unlisted)
    for f in found:
        if (why := why_not_a_file(f)) is None:
            _check_readable(f)
            folders.setdefault(f.parent, []).append(f)
        else:
            others.setdefault(f.parent, []).append(f"{f.name}: left out: {why}")
    if not folders and unlisted:  # (it said 'no result_*.txt files here' of a folder of them it could not list)
        where, why = unlisted[0]
        raise UserError(printable(f"{where}: cannot be listed ({why}); a folder of result logs must be readable by "
                                  f"the user running mlbench"))
    if not folders:
        first = next((f"; {printable(d / notes[0])}" for d, notes in sorted(others.items())), "")
        # a folder of one killed run, PATH itself or a benchmark folder under it (`score results/`): said, not
        # published
        dead = "".join(f"; {n}" for n in [*hidden, *unpublished_notes(path)])
        raise UserError(f"{printable(path)}: no result_*.txt files here (expected a benchmark folder of result_*.txt "
                        f"or a submission tree ORG/results/<system>/<benchmark>/){first}{dead}")
    # a benchmark folder under PATH that holds only runs not published yet (their mlbench killed): no set of its
    # own to say it in, so said with the first set's notes, naming the folder (it was not said at all)
    stray = [n for d in _holding_staging(path) if d not in folders for n in _unpublished(d, named=True)]
    stray += _unlisted_notes(unlisted) + hidden
    first = min(folders)
    return [_make_set(d, _natural(fs), steps, others.get(d, []), name_notes(fs) + (stray if d == first else []))
            for d, fs in sorted(folders.items())]


def result_logs(path: Path, unlisted: list[tuple[Path, str]]) -> tuple[list[Path], list[str]]:
    """The result_*.txt under the folder PATH that analysis reads (`score`, `compare`, `scaling` and `check` alike),
    and a note for each hidden folder under PATH whose result_*.txt it passes over: a hidden folder holds no
    published result (a run's staging folder, a set put aside as .old): R/.old/gpt3 was scored as a set of R.
    PATH itself, hidden or not, is read: given, it is meant."""
    kept: list[Path] = []
    hidden: dict[Path, int] = {}
    for f in tree_glob(path, RESULT_GLOB, unlisted):
        parts = f.relative_to(path).parts[:-1]
        first = next((n for n, part in enumerate(parts) if part.startswith(".")), None)
        if first is None:
            kept.append(f)
        else:
            top = path.joinpath(*parts[:first + 1])
            hidden[top] = hidden.get(top, 0) + 1
    notes = [printable(f"{d}: {n} result_*.txt in a hidden folder, not read (a hidden folder holds no published "
                       f"result: a run's staging folder, or runs put aside); pass that folder itself to read them")
             for d, n in sorted(hidden.items())]
    return kept, notes


def name_notes(files: list[Path]) -> list[str]:
    """A note for each result log of one folder named otherwise than mlbench names a result (result_007.txt, not
    result_7.txt): read all the same, as the official summarizer reads every result_*.txt, and said, with the other
    file of its index where there is one (mlbench.results.index_of: a run claims no index such a name holds)."""
    from mlbench import results

    by_index: dict[int, list[str]] = {}
    for f in files:
        if (i := results.index_of(f.name)) is not None:
            by_index.setdefault(i, []).append(f.name)
    notes = []
    for f in files:
        if results.canonical(f.name):
            continue
        i = results.index_of(f.name)
        same = [n for n in by_index.get(i, []) if n != f.name] if i is not None else []
        also = f"; {', '.join(same)} holds index {i} too: two logs of one index" if same else ""
        notes.append(printable(f"{f.name}: not a result name mlbench writes (result_<i>.txt, <i> a number without "
                               f"leading zeros): read as another run, as the official summarizer reads every "
                               f"result_*.txt{also}"))
    return notes


def _unlisted_notes(unlisted: list[tuple[Path, str]]) -> list[str]:
    """A note for each folder under PATH this user could not list, beside the sets that were read (it was passed
    over without a word); not for a run's staging folder, which another user's run in progress keeps to itself."""
    from mlbench import results

    return [printable(f"{d}: cannot be listed ({why}): any result logs in it are not read") for d, why in unlisted
            if not d.name.startswith(results.STAGING)]


def _check_readable(f: Path) -> None:
    """A run of a set that this user cannot read is refused, as `check` refuses it: it was scored as a failed run
    ('no run_start', 'the compliance checker crashed: PermissionError: [Errno 13] ...'), exit 0."""
    if (why := why_unreadable(f)) is not None:
        raise UserError(printable(f"{f}: cannot be read ({why}); every run of a set is read: make it readable by the "
                                  f"user running mlbench, or move it out of the folder"))


def _natural(files: list[Path]) -> list[Path]:
    def key(p: Path) -> tuple:
        m = re.search(r"(\d+)", p.stem)
        return (int(m.group(1)) if m else -1, p.name)
    return sorted(files, key=key)


def unpublished_notes(path: Path) -> list[str]:
    """What `_unpublished` says of the folder PATH and of each folder under it (naming it) that holds staging
    folders: runs not published yet (for `score`, `compare`, `scaling` and `check` alike)."""
    return [n for d in _holding_staging(path) for n in _unpublished(d, named=d != path)]


def _holding_staging(path: Path) -> list[Path]:
    """PATH and every folder under it that holds a staging folder (a run's: mlbench.results) or a run record
    (result_<i>.json: one without its log is said)."""
    from mlbench import results

    return sorted({path, *(s.parent for s in tree_glob(path, f"{results.STAGING}*") if s.is_dir()),
                   *(r.parent for r in tree_glob(path, "result_*.json") if results.published_here(r, path))})


def _unpublished(folder: Path, named: bool = False) -> list[str]:
    """Runs whose mlbench process died before publishing them (kill -9, a lost session) are not in the folder's
    results until the next `mlbench run` there publishes them (mlbench.dead_runs): said, not done here (analysis
    reads a folder, never writes it). NAMED: each line names the folder (one under the path given)."""
    from mlbench import results  # who owns a staging folder: no training code

    said = []
    where = f"{printable(folder)}: " if named else ""
    # (a run whose mlbench lived but could not publish it, its folder read-only say, is left as a dead run's)
    for staged, how in (([s for s, _ in results.dead_runs(folder)], "died or could not publish them are not "
                                                                    "published yet"),
                        (results.half_published(folder), "died while they were published (a record placed, its log "
                                                         "not)")):
        if staged:
            names = ", ".join(printable(s.name) for s in staged[:3]) + (", ..." if len(staged) > 3 else "")
            said.append(f"{where}{len(staged)} run(s) whose mlbench process {how} ({names}): "
                        f"not read until the next `mlbench run` in this folder publishes them")
    # a record whose log is gone (removed by hand, say) was passed over without a word: the set looked whole
    if alone := results.records_without_log(folder):
        names = ", ".join(printable(r.name) for r in alone[:3]) + (", ..." if len(alone) > 3 else "")
        said.append(f"{where}{len(alone)} run record(s) without their log ({names}): left out, as there is no "
                    f"result_<i>.txt of them to read")
    return said


def _make_set(folder: Path, files: list[Path], steps: bool = True, others: list[str] = (),
              notes: list[str] = ()) -> ResultSet:
    """The set of FILES in FOLDER; OTHERS: its result_*.txt that are no file to read, said in its notes, as NOTES
    are."""
    folder = folder.resolve()
    # mlbench publishes a run's record before its log: in a folder of its runs, a log without a record beside it
    # (or with one that cannot be read) was not published by it (left by hand, or a copy), and would be scored as a
    # run of unknown kind. A folder with no record to read is a published one: its logs are all read, and a record
    # that is there but cannot be read is said so.
    there = {f: os.path.lexists(f.with_suffix(".json")) for f in files}
    wrong = {f: _unusable(f.with_suffix(".json")) if there[f] else None for f in files}
    recorded = [f for f in files if there[f] and wrong[f] is None]
    if recorded:
        left_out = [f"{f.name}: left out: {_no_record(f.with_suffix('.json'))}" if not there[f] else
                    f"{f.name}: left out: {wrong[f]}, so it cannot be told what run it is"
                    for f in files if not there[f] or wrong[f]]
    else:
        left_out = [f"{f.name}: read as a log without a run record: {wrong[f]}" for f in files if wrong[f]]
    files = recorded or files
    left_out += [*others, *notes, *_unpublished(folder)]
    system = folder.parent.name
    org_root = None
    # ORG/results/<system>/<benchmark>/result_*.txt
    if folder.parent.parent.name == "results" and (folder.parent.parent.parent / "systems").is_dir():
        org_root = folder.parent.parent.parent
    # (each named as it is in the folder: a link's target named two rows alike, result_3.txt -> result_1.txt)
    return ResultSet(folder=folder, files=[folder / f.name for f in files], system=system, org_root=org_root,
                     steps=steps, left_out=left_out, not_files=len(others))


