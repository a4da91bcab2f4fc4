"""Seconds per optimizer step from a log: tracked per-step statistics where logged, else block events.

Also the one set of step-time statistics (median, p90, p99, jitter) every report shows.
"""

from __future__ import annotations

import bisect
from array import array
from dataclasses import dataclass, field

import numpy as np

# Step-time keys in tracked_stats, one place for every variant seen in published logs:
# ours and NVIDIA llama: "train_step_time"; NVIDIA gpt3 (NeMo 24.09): "train_step_timing in s".
STEP_TIME_KEYS = ("train_step_time", "train_step_timing in s")
MAX_BLOCK_STEPS = 1_000_000  # a block claiming more steps than this is garbage, not a block
MAX_RUN_STEPS = 1_000_000  # entries of a run's step times made from its blocks (a real run has far fewer steps)
# A step time is above 0 and at most this (11 days): anything else is a garbled log, and would show as a negative
# throughput or overflow the statistics (1e308 s)
MAX_STEP_S = 1e6
# ... and at least a microsecond: no optimizer step of a model is shorter (5e-324 s gave tokens/s of inf)
MIN_STEP_S = 1e-6
# TFLOP/s a device: at most an exaFLOP/s (the fastest accelerators do a few thousand at their narrowest precision);
# past it a logged figure is garbled (1e308 on every line summed to inf and was shown as the mean)
MAX_TFLOPS = 1e6
NO_STATS = {"median": None, "p90": None, "p99": None, "jitter": None, "mean": None}


def plausible(rows: np.ndarray) -> np.ndarray:
    """Which tracked rows (step, seconds, time_ms, tokens_per_s, tflops; `Tracked`) hold a plausible step:
    MIN_STEP_S <= seconds <= MAX_STEP_S, a throughput logged (not NaN) not negative, TFLOP/s at most MAX_TFLOPS."""
    secs, tps, tfl = rows[:, 1], rows[:, 3], rows[:, 4]
    return (secs >= MIN_STEP_S) & (secs <= MAX_STEP_S) & ~(tps < 0) & ~(tfl < 0) & ~(tfl > MAX_TFLOPS)


def step_stats(seconds: np.ndarray) -> dict[str, float | None]:
    """Median, p90, p99, mean and jitter of per-step times. Jitter: the spread of step times, as the p90-p10
    range relative to the median."""
    if len(seconds) == 0:
        return dict(NO_STATS)
    with np.errstate(all="ignore"):  # plausible times never overflow; a report must not print numpy's warnings
        return _stats(seconds)


def _stats(seconds: np.ndarray) -> dict[str, float | None]:
    p10, med, p90, p99 = np.percentile(seconds, [10, 50, 90, 99])
    return {"median": float(med), "p90": float(p90), "p99": float(p99),
            "jitter": float((p90 - p10) / med) if med > 0 else None, "mean": float(np.mean(seconds))}


@dataclass
class StepTimes:
    """Seconds per optimizer step, one entry per step (block-derived entries repeat the block mean)."""

    seconds: np.ndarray
    source: str  # "tracked_stats", "blocks" or "none"
    note: str = ""
    steps: np.ndarray = field(default_factory=lambda: np.zeros(0))
    tflops_per_device: np.ndarray = field(default_factory=lambda: np.zeros(0))  # per step, where logged

    def stats(self) -> dict[str, float | None]:
        return step_stats(self.seconds)


# The fields of a tracked record as read, in this order (`Tracked.add`, a row of `add_rows`); those kept
ROW = ("step", "seconds", "time_ms", "tokens_per_s", "tflops")
_KEPT = (0, 1, 2, 4)  # tokens_per_s is checked as it is read (not negative), but no figure uses it per step


@dataclass
class Tracked:
    """The tracked_stats records of a log as read: a compact array (8 bytes a number; NaN where absent) per field
    kept (step, seconds, time_ms, tflops), so that a field is read as one contiguous array."""

    step: array = field(default_factory=lambda: array("d"))
    seconds: array = field(default_factory=lambda: array("d"))
    time_ms: array = field(default_factory=lambda: array("d"))
    tflops: array = field(default_factory=lambda: array("d"))

    def add(self, step: float, seconds: float, time_ms: float, tokens_per_s: float, tflops: float) -> None:
        self.step.append(step)
        self.seconds.append(seconds)
        self.time_ms.append(time_ms)
        self.tflops.append(tflops)

    def add_rows(self, rows: np.ndarray) -> None:
        """Records read in a batch (`LogReader.take`): an array of rows of the 5 numbers of `ROW`, float64."""
        for a, c in zip(self._arrays(), _KEPT, strict=True):
            a.frombytes(np.ascontiguousarray(rows[:, c]).view(np.uint8))  # (a batch: a column after another)

    def columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """step, seconds, time_ms, tflops: one number a record each (views: read once the log is read)."""
        return tuple(np.frombuffer(a, np.float64) if a else np.zeros(0) for a in self._arrays())

    def _arrays(self) -> tuple[array, array, array, array]:
        return self.step, self.seconds, self.time_ms, self.tflops


@dataclass
class Block:
    start_ms: float
    stop_ms: float
    size: float | None  # epoch_count: samples (tokens for gpt3) in the block
    first: float | None  # first_epoch_num / samples_count at the block's start


@np.errstate(all="ignore")  # absurd but finite logged numbers overflow to inf here, and are shown as such
def from_tracked(t: Tracked, start_ms: float | None, stop_ms: float | None, gbs: int | None,
                 seq: int | None) -> StepTimes | None:
    """Per-step times from tracked_stats records inside the timed region (run_start..run_stop). (Arrays of one
    number a record are made one or two at a time, each dropped when done: a big log's are tens of MB.)"""
    step, secs, times, tfl = t.columns()
    keep = np.ones(len(secs), dtype=bool)
    if start_ms is not None:
        keep &= times >= start_ms  # warm-up steps before run_start are not part of the timed run
    if stop_ms is not None:
        keep &= times <= stop_ms
    # NVIDIA also logs a per-block summary (mean step time, throughput) with step 0: a step counter that goes
    # backwards marks such a summary, not a step.
    # (a record is dropped where its step is not above every finite step before it; a step not logged stays: NaN
    # is passed over by fmax and compares false)
    every = keep.all()
    s = step if every else step[keep]
    later = np.ones(len(s), dtype=bool)
    later[1:] = ~(s[1:] <= np.fmax.accumulate(s)[:-1])
    timed, behind = len(s), len(s) - int(np.count_nonzero(later))
    if every:
        keep = later
    else:
        keep[keep] = later
    del s, later
    # NVIDIA v5.1 logs block summaries without a step: where steps are logged, keep only those records.
    if (np.isfinite(step) & keep).any():
        keep &= np.isfinite(step)
    if not keep.any():
        return None
    keep = slice(None) if keep.all() else keep  # (all: the columns themselves, not copies)
    steps = step[keep]
    # What does metadata.step count? NVIDIA v5.0 llama: samples; NVIDIA gpt3: tokens; ours and NVIDIA
    # v5.1: optimizer steps. Decide from the increments between records.
    unit, per = "steps", 1.0
    seq = seq or 1
    if len(steps) > 1 and np.all(np.isfinite(steps)):
        inc = np.diff(steps)
        if not (up := inc > 0).all():
            inc = inc[up]
        if len(inc) and gbs and gbs > 1:
            d = float(np.median(inc, overwrite_input=True))  # (INC's order is no matter below)
            if _divides(inc, gbs * seq) and d >= gbs * seq and seq > 1:
                unit, per = "tokens", float(gbs * seq)
            elif _divides(inc, gbs) and d >= gbs:
                unit, per = "samples", float(gbs)
        del inc
    idx = steps / per if per != 1.0 else steps
    note = f"tracked_stats; metadata step counts {unit}"
    if behind:  # said: a step logged the same on every line (garbled) left one record of them all
        note += (f"; {behind} of {timed} records in the timed region left out, their metadata step not above the "
                 f"steps before it (as NVIDIA's block summaries)")
    secs = secs[keep]
    # Does one record's time cover one step or all the steps since the previous record? Compare with the
    # wall-clock gap between records.
    if len(idx) > 2:
        k = np.diff(idx)
        multi = k > 1.5
        if multi.any():
            gap = np.diff(times[keep]) / 1000
            ratio = np.median(gap[multi] / secs[1:][multi])
            kk = np.median(k[multi])
            covers = abs(ratio - 1) < abs(ratio - kk)  # the time covers the whole interval
            if covers and (secs[1:][multi] / k[multi] < MIN_STEP_S).any():
                # a step counter rising 10^12 a record (garbled) made steps of 10^-11 s, 10^13 tokens/s a device
                note += (f"; metadata step rises {kk:g} a record, more steps than a record's time can hold (at "
                         f"least {MIN_STEP_S:g} s a step): times are per record, as logged")
            elif covers:
                secs = secs.copy()
                secs[1:][multi] = secs[1:][multi] / k[multi]
                note += f"; each record covers {kk:g} steps, divided"
            else:
                note += f"; logged every {kk:g} steps, times are per step"
        del k, multi
    tfl = tfl[keep]
    logged = np.isfinite(tfl)
    return StepTimes(secs, "tracked_stats", note, idx, tfl if logged.all() else tfl[logged])


def _divides(values: np.ndarray, by: int, chunk: int = 1 << 16) -> bool:
    """np.allclose(values % BY, 0) (values finite), a CHUNK of VALUES at a time: not several arrays their size."""
    for at in range(0, len(values), chunk):
        rest = np.abs(np.remainder(values[at:at + chunk], by))
        if not (rest <= 1e-08).all():
            return False
    return True


def from_blocks(blocks: list[Block], eval_counts: list[float], gbs: int | None,
                samples_per_count: float) -> StepTimes | None:
    """Mean step time per block (block_start..block_stop), for logs without per-step statistics: each block's mean
    repeated once a step it holds, at most MAX_RUN_STEPS entries in all (more are weighted down in proportion). A few
    lines of blocks claiming a million steps each made a list of a billion entries (gigabytes); a block's size read
    off the next evaluation was looked for among every evaluation (minutes for a log of 10^5 blocks)."""
    if not gbs:
        return None
    evals = sorted(eval_counts)
    means: list[float] = []
    counts: list[float] = []
    for b in blocks:
        size = b.size
        if size is None and b.first is not None:
            at = bisect.bisect_right(evals, b.first)  # the first evaluation after the block's start
            size = evals[at] - b.first if at < len(evals) else None
        if size:
            n_steps = size * samples_per_count / gbs
            dur = (b.stop_ms - b.start_ms) / 1000
            if 1 <= n_steps <= MAX_BLOCK_STEPS and MIN_STEP_S <= dur / n_steps <= MAX_STEP_S:
                means.append(dur / n_steps)
                counts.append(n_steps)
    if not means:
        return None
    reps = np.rint(counts)
    note = "block events: block duration / steps in the block (mean per block)"
    if (total := reps.sum()) > MAX_RUN_STEPS:
        reps = np.maximum(np.rint(reps * (MAX_RUN_STEPS / total)), 1)
        note += f"; {total:,.0f} steps claimed, weighted down to {reps.sum():,.0f} entries"
    return StepTimes(np.repeat(np.array(means), reps.astype(np.int64)), "blocks", note)


def none() -> StepTimes:
    return StepTimes(np.zeros(0), "none", "no tracked step times and no block events with sizes")
