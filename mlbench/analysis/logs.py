"""Robust reading of MLPerf result logs (`:::MLLOG {json}` lines), ours and published.

Nothing here raises on a bad log: every defect (broken JSON, a truncated last line, no run_stop, ...)
becomes a line in `RunLog.problems`, so one bad file never hides the rest of a set.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

from mlbench.errors import UserError

TOKEN = ":::MLLOG "
RESULT_GLOB = "result_*.txt"

# Benchmarks whose eval/block counters count tokens (samples x sequence length) rather than samples.
TOKEN_COUNTED = {"gpt3"}
# Keys that describe the submission or are per-run noise, not hyperparameters to compare.
_NOT_HPARAMS = {
    "cache_clear", "init_start", "init_stop", "run_start", "submission_org", "submission_platform",
    "submission_division", "submission_status", "submission_benchmark", "submission_poc_name",
    "submission_poc_email", "seed", "tracked_stats", "weights_initialization",
}
# Step-time keys in tracked_stats, one place for every variant seen in published logs:
# ours and NVIDIA llama: "train_step_time"; NVIDIA gpt3 (NeMo 24.09): "train_step_timing in s".
STEP_TIME_KEYS = ("train_step_time", "train_step_timing in s")


@dataclass
class Event:
    key: str
    value: object
    metadata: dict
    time_ms: float
    line: int
    event_type: str = ""


@dataclass
class StepTimes:
    """Seconds per optimizer step, one entry per step (block-derived entries repeat the block mean)."""

    seconds: np.ndarray
    source: str  # "tracked_stats", "blocks" or "none"
    note: str = ""
    steps: np.ndarray = field(default_factory=lambda: np.zeros(0))
    tokens_per_s: list[float] = field(default_factory=list)
    tflops_per_device: list[float] = field(default_factory=list)

    def stats(self) -> dict[str, float | None]:
        s = self.seconds
        if len(s) == 0:
            return {"median": None, "p90": None, "p99": None, "jitter": None, "mean": None}
        p10, med, p90, p99 = np.percentile(s, [10, 50, 90, 99])
        # Jitter: the spread of step times, as the p90-p10 range relative to the median.
        return {
            "median": float(med), "p90": float(p90), "p99": float(p99),
            "jitter": float((p90 - p10) / med) if med > 0 else None, "mean": float(s.mean()),
        }


@dataclass
class RunLog:
    path: Path
    events: list[Event]
    problems: list[str]

    # --- simple look-ups -------------------------------------------------------------------------
    def first(self, key: str) -> Event | None:
        return next((e for e in self.events if e.key == key), None)

    def value(self, key: str, default: object = None) -> object:
        e = self.first(key)
        return e.value if e is not None else default

    def _text(self, key: str) -> str | None:
        v = self.value(key)
        return str(v) if v is not None else None

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def benchmark(self) -> str | None:
        return self._text("submission_benchmark")

    @property
    def org(self) -> str | None:
        return self._text("submission_org")

    @property
    def platform(self) -> str | None:
        return self._text("submission_platform")

    @property
    def division(self) -> str | None:
        return self._text("submission_division")

    @property
    def run_start_ms(self) -> float | None:
        e = self.first("run_start")
        return e.time_ms if e else None

    @property
    def run_stop(self) -> Event | None:
        return self.first("run_stop")

    @property
    def status(self) -> str:
        stop = self.run_stop
        if self.run_start_ms is None:
            return "no run_start"
        if stop is None:
            return "no run_stop"
        return str(stop.metadata.get("status", "no status"))

    @property
    def ttt_min(self) -> float | None:
        """Time to train as the summarizer computes it: first run_stop - first run_start, in minutes."""
        start, stop = self.run_start_ms, self.run_stop
        if start is None or stop is None:
            return None
        return (float(stop.time_ms) - float(start)) / 60 / 1000

    @property
    def gbs(self) -> int | None:
        v = self.value("global_batch_size")
        return int(v) if isinstance(v, int | float) else None

    @property
    def seq_len(self) -> int | None:
        v = self.value("max_sequence_length")
        return int(v) if isinstance(v, int | float) else None

    @property
    def counts_tokens(self) -> bool:
        return self.benchmark in TOKEN_COUNTED

    def count_to_samples(self, count: float) -> float:
        """An eval/block counter in samples (gpt3 counts tokens: samples x 2048)."""
        if self.counts_tokens:
            return count / (self.seq_len or 2048)
        return count

    @cached_property
    def hyperparams(self) -> dict[str, object]:
        """Values logged before run_start (hyperparameters and layout), first occurrence of each key."""
        out: dict[str, object] = {}
        for e in self.events:
            if e.key == "run_start":
                break
            if e.key in _NOT_HPARAMS or e.key in out or e.event_type.startswith("INTERVAL"):
                continue
            out[e.key] = e.value
        return out

    @cached_property
    def evals(self) -> list[tuple[float, float, float]]:
        """(samples, eval_accuracy, minutes since run_start) for every eval_accuracy."""
        start = self.run_start_ms
        out = []
        for e in self.events:
            if e.key != "eval_accuracy" or not isinstance(e.value, int | float):
                continue
            count = e.metadata.get("samples_count", e.metadata.get("epoch_num"))
            if count is None:
                continue
            minutes = (e.time_ms - start) / 60000 if start is not None else math.nan
            out.append((self.count_to_samples(float(count)), float(e.value), minutes))
        return out

    @property
    def samples_to_converge(self) -> float | None:
        """Samples at the last eval before a successful run_stop (the RCP checker's convergence point)."""
        if self.status != "success":
            return None
        stop = self.run_stop
        start = self.run_start_ms or 0.0
        before = [ev for ev in self.evals if stop is None or ev[2] * 60000 + start <= stop.time_ms]
        return before[-1][0] if before else None

    @property
    def steps_to_converge(self) -> float | None:
        s, g = self.samples_to_converge, self.gbs
        return s / g if s is not None and g else None

    @cached_property
    def step_times(self) -> StepTimes:
        return _step_times(self)


# --- reading ---------------------------------------------------------------------------------------

def read_log(path: Path) -> RunLog:
    """Parse one result file; never raises for a bad log (problems are collected instead)."""
    path = Path(path)
    problems: list[str] = []
    events: list[Event] = []
    try:
        raw = path.read_bytes()
    except OSError as e:
        return RunLog(path, [], [f"cannot read: {e.strerror or e}"])
    text = raw.decode("utf-8", errors="replace")
    lines = text.splitlines()
    broken: list[int] = []
    for n, line in enumerate(lines, 1):
        i = line.find(TOKEN)
        if i < 0:
            continue
        payload = line[i + len(TOKEN):].strip()
        try:
            d = json.loads(payload)
            if not isinstance(d, dict) or "key" not in d:
                raise ValueError("not an MLLOG record")
            events.append(Event(
                key=str(d["key"]), value=d.get("value"), metadata=d.get("metadata") or {},
                time_ms=float(d.get("time_ms", math.nan)), line=n, event_type=str(d.get("event_type", "")),
            ))
        except (ValueError, TypeError):
            broken.append(n)
    if broken:
        last = len(lines)
        if broken == [last] and not text.endswith("\n"):
            problems.append(f"truncated: the last line ({last}) is cut off")
        else:
            shown = ", ".join(map(str, broken[:5])) + (" ..." if len(broken) > 5 else "")
            problems.append(f"{len(broken)} line(s) with broken JSON skipped (line {shown})")
    if not events:
        problems.append("no :::MLLOG lines: not an MLPerf result log" if not broken else "no readable records")
        return RunLog(path, events, problems)
    log = RunLog(path, events, problems)
    if log.run_start_ms is None:
        problems.append("no run_start: the run never started its timed region")
    elif log.run_stop is None:
        problems.append("no run_stop: the run did not finish (crashed or the log is truncated)")
    elif log.status not in ("success", "aborted"):
        problems.append(f"run_stop has status {log.status!r}")
    if log.benchmark is None:
        problems.append("no submission_benchmark")
    return log


@dataclass
class ResultSet:
    """One benchmark folder: result_*.txt of one system and benchmark (or a single file)."""

    folder: Path
    files: list[Path]
    system: str
    org_root: Path | None  # the organisation folder when the set sits in a submission tree

    @cached_property
    def runs(self) -> list[RunLog]:
        return [read_log(f) for f in self.files]

    @property
    def label(self) -> str:
        parts = [p for p in (self.org_root.name if self.org_root else None, self.system,
                             self.folder.name) if p]
        return "/".join(parts)

    @cached_property
    def system_desc(self) -> dict | None:
        if self.org_root is None:
            return None
        p = self.org_root / "systems" / f"{self.system}.json"
        try:
            return json.loads(p.read_text())
        except (OSError, ValueError):
            return None

    @property
    def smoke(self) -> bool:
        """A set of our tiny (smoke) runs, per their run records: judged by the smoke rules, with no RCPs."""
        return bool(self.files) and all(run_record(f).get("variant") == "tiny" for f in self.files)

    def devices(self, given: int | None = None) -> tuple[int | None, str]:
        """Device count and where it came from: given, systems/<system>.json, or our run record."""
        if given:
            return given, "given"
        d = self.system_desc
        if d:
            try:
                return int(d["number_of_nodes"]) * max(int(d["accelerators_per_node"]), 1), "systems json"
            except (KeyError, ValueError, TypeError):
                pass
        for f in self.files:
            rec = run_record(f)
            if isinstance(rec.get("devices"), int):
                return rec["devices"], "run record"
        return None, "unknown"


def run_record(result_file: Path) -> dict:
    """Our sidecar result_<i>.json (optional; published logs have none)."""
    p = Path(result_file).with_suffix(".json")
    try:
        d = json.loads(p.read_text())
        return d if isinstance(d, dict) else {}
    except (OSError, ValueError):
        return {}


def find_sets(path: Path) -> list[ResultSet]:
    """Every benchmark folder under PATH: a folder of result_*.txt, a submission tree, or one file."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: no such file or folder")
    if path.is_file():
        return [_make_set(path.parent, [path])]
    folders: dict[Path, list[Path]] = {}
    for f in sorted(path.rglob(RESULT_GLOB)):
        if f.is_file():
            folders.setdefault(f.parent, []).append(f)
    if not folders:
        raise UserError(f"{path}: no result_*.txt files here (expected a benchmark folder of result_*.txt "
                        "or a submission tree ORG/results/<system>/<benchmark>/)")
    return [_make_set(d, _natural(fs)) for d, fs in sorted(folders.items())]


def _natural(files: list[Path]) -> list[Path]:
    def key(p: Path) -> tuple:
        m = re.search(r"(\d+)", p.stem)
        return (int(m.group(1)) if m else -1, p.name)
    return sorted(files, key=key)


def _make_set(folder: Path, files: list[Path]) -> ResultSet:
    folder = folder.resolve()
    system = folder.parent.name
    org_root = None
    # ORG/results/<system>/<benchmark>/result_*.txt
    if folder.parent.parent.name == "results" and (folder.parent.parent.parent / "systems").is_dir():
        org_root = folder.parent.parent.parent
    return ResultSet(folder=folder, files=[f.resolve() for f in files], system=system, org_root=org_root)


# --- per-step times ----------------------------------------------------------------------------------

def _step_times(log: RunLog) -> StepTimes:
    tracked = _from_tracked_stats(log)
    if tracked is not None:
        return tracked
    blocks = _from_blocks(log)
    if blocks is not None:
        return blocks
    return StepTimes(np.zeros(0), "none", "no tracked step times and no block events with sizes")


def _from_tracked_stats(log: RunLog) -> StepTimes | None:
    recs = []
    start, stop = log.run_start_ms, log.run_stop
    for e in log.events:
        if e.key != "tracked_stats" or not isinstance(e.value, dict):
            continue
        if start is not None and e.time_ms < start:
            continue  # warm-up steps before run_start are not part of the timed run
        if stop is not None and e.time_ms > stop.time_ms:
            continue
        t = next((e.value[k] for k in STEP_TIME_KEYS if isinstance(e.value.get(k), int | float)), None)
        if t is None:
            continue
        step = float(e.metadata.get("step", math.nan))
        # NVIDIA also logs a per-block summary (mean step time, throughput) with step 0: a step counter
        # that goes backwards marks such a summary, not a step.
        last = next((r[0] for r in reversed(recs) if math.isfinite(r[0])), None)
        if last is not None and math.isfinite(step) and step <= last:
            continue
        recs.append((step, float(t), e.time_ms, e.value))
    # NVIDIA v5.1 logs block summaries without a step: where steps are logged, keep only those records.
    if any(math.isfinite(r[0]) for r in recs):
        recs = [r for r in recs if math.isfinite(r[0])]
    if not recs:
        return None
    steps = np.array([r[0] for r in recs])
    secs = np.array([r[1] for r in recs])
    times = np.array([r[2] for r in recs])
    # What does metadata.step count? NVIDIA v5.0 llama: samples; NVIDIA gpt3: tokens; ours and NVIDIA
    # v5.1: optimizer steps. Decide from the increments between records.
    unit, per = "steps", 1.0
    gbs, seq = log.gbs, log.seq_len or 1
    if len(steps) > 1 and np.all(np.isfinite(steps)):
        inc = np.diff(steps)
        inc = inc[inc > 0]
        if len(inc) and gbs and gbs > 1:
            d = float(np.median(inc))
            if np.allclose(inc % (gbs * seq), 0) and d >= gbs * seq and seq > 1:
                unit, per = "tokens", float(gbs * seq)
            elif np.allclose(inc % gbs, 0) and d >= gbs:
                unit, per = "samples", float(gbs)
    idx = steps / per
    note = f"tracked_stats; metadata step counts {unit}"
    # Does one record's time cover one step or all the steps since the previous record? Compare with
    # the wall-clock gap between records.
    if len(idx) > 2:
        k = np.diff(idx)
        gap = np.diff(times) / 1000
        multi = k > 1.5
        if multi.any():
            ratio = np.median(gap[multi] / secs[1:][multi])
            kk = np.median(k[multi])
            if abs(ratio - 1) < abs(ratio - kk):  # the time covers the whole interval
                secs = secs.copy()
                secs[1:][multi] = secs[1:][multi] / k[multi]
                note += f"; each record covers {kk:g} steps, divided"
            else:
                note += f"; logged every {kk:g} steps, times are per step"
    tps = [float(r[3]["tokens_per_s"]) for r in recs if isinstance(r[3].get("tokens_per_s"), int | float)]
    tfl = [float(r[3]["tflops_per_device"]) for r in recs
           if isinstance(r[3].get("tflops_per_device"), int | float)]
    return StepTimes(secs, "tracked_stats", note, idx, tps, tfl)


def _from_blocks(log: RunLog) -> StepTimes | None:
    """Mean step time per block (block_start..block_stop), for logs without per-step statistics."""
    gbs = log.gbs
    if not gbs:
        return None
    evals = sorted(
        float(e.metadata.get("samples_count", e.metadata.get("epoch_num")))
        for e in log.events
        if e.key == "eval_accuracy" and e.metadata.get("samples_count", e.metadata.get("epoch_num")) is not None
    )
    out: list[float] = []
    open_start: Event | None = None
    for e in log.events:
        if e.key in ("block_start", "epoch_start"):
            open_start = e
        elif e.key in ("block_stop", "epoch_stop") and open_start is not None:
            md = open_start.metadata
            size = md.get("epoch_count")
            first = md.get("first_epoch_num", md.get("samples_count"))
            if size is None and first is not None:
                nxt = [c for c in evals if c > float(first)]
                size = nxt[0] - float(first) if nxt else None
            if size:
                n_steps = log.count_to_samples(float(size)) / gbs
                dur = (e.time_ms - open_start.time_ms) / 1000
                if n_steps >= 1 and dur > 0:
                    out.extend([dur / n_steps] * round(n_steps))
            open_start = None
    if not out:
        return None
    return StepTimes(np.array(out), "blocks", "block events: block duration / steps in the block (mean per block)")
