"""Seconds per optimizer step from a log: tracked per-step statistics where logged, else block events.

Also the one set of step-time statistics (median, p90, p99, jitter) every report shows.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

import numpy as np

# Step-time keys in tracked_stats, one place for every variant seen in published logs:
# ours and NVIDIA llama: "train_step_time"; NVIDIA gpt3 (NeMo 24.09): "train_step_timing in s".
STEP_TIME_KEYS = ("train_step_time", "train_step_timing in s")
MAX_BLOCK_STEPS = 1_000_000  # a block claiming more steps than this is garbage, not a block
# A step time is above 0 and at most this (11 days): anything else is a garbled log, and would show as a negative
# throughput or overflow the statistics (1e308 s)
MAX_STEP_S = 1e6
NO_STATS = {"median": None, "p90": None, "p99": None, "jitter": None, "mean": None}


def plausible(rows: np.ndarray) -> np.ndarray:
    """Which tracked rows (step, seconds, time_ms, tokens_per_s, tflops; `Tracked`) hold a plausible step: 0 <
    seconds <= MAX_STEP_S, and a throughput logged (not NaN) not negative."""
    secs, tps, tfl = rows[:, 1], rows[:, 3], rows[:, 4]
    return (secs > 0) & (secs <= MAX_STEP_S) & ~(tps < 0) & ~(tfl < 0)


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
    tokens_per_s: np.ndarray = field(default_factory=lambda: np.zeros(0))  # per step, where logged
    tflops_per_device: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def stats(self) -> dict[str, float | None]:
        return step_stats(self.seconds)


@dataclass
class Tracked:
    """The tracked_stats records of a log as read, in one compact array (8 bytes a number; NaN where absent):
    a record is 5 numbers, step, seconds, time_ms, tokens_per_s, tflops (one append a record, not five)."""

    rows: array = field(default_factory=lambda: array("d"))

    def add(self, step: float, seconds: float, time_ms: float, tokens_per_s: float, tflops: float) -> None:
        self.rows.extend((step, seconds, time_ms, tokens_per_s, tflops))

    def add_rows(self, rows: np.ndarray) -> None:
        """Records read in a batch (`LogReader.take`): an array of rows of those 5 numbers, float64."""
        self.rows.frombytes(rows.tobytes())

    def columns(self) -> np.ndarray:
        """The records as 5 rows (step, seconds, time_ms, tokens_per_s, tflops) of one number a record."""
        return np.frombuffer(self.rows, np.float64).reshape(-1, 5).T if self.rows else np.zeros((5, 0))


@dataclass
class Block:
    start_ms: float
    stop_ms: float
    size: float | None  # epoch_count: samples (tokens for gpt3) in the block
    first: float | None  # first_epoch_num / samples_count at the block's start


@np.errstate(all="ignore")  # absurd but finite logged numbers overflow to inf here, and are shown as such
def from_tracked(t: Tracked, start_ms: float | None, stop_ms: float | None, gbs: int | None,
                 seq: int | None) -> StepTimes | None:
    """Per-step times from tracked_stats records inside the timed region (run_start..run_stop)."""
    step, secs, times, tps, tfl = t.columns()
    keep = np.ones(len(secs), dtype=bool)
    if start_ms is not None:
        keep &= times >= start_ms  # warm-up steps before run_start are not part of the timed run
    if stop_ms is not None:
        keep &= times <= stop_ms
    # NVIDIA also logs a per-block summary (mean step time, throughput) with step 0: a step counter that goes
    # backwards marks such a summary, not a step.
    # (a record is dropped where its step is not above every finite step before it; a step not logged stays)
    at = np.flatnonzero(keep)
    s = step[at]
    finite = np.isfinite(s)
    before = np.maximum.accumulate(np.where(finite, s, -np.inf))
    keep[at[1:][finite[1:] & (s[1:] <= before[:-1])]] = False
    # NVIDIA v5.1 logs block summaries without a step: where steps are logged, keep only those records.
    if np.isfinite(step[keep]).any():
        keep &= np.isfinite(step)
    if not keep.any():
        return None
    steps, secs, times = step[keep], secs[keep].copy(), times[keep]
    # What does metadata.step count? NVIDIA v5.0 llama: samples; NVIDIA gpt3: tokens; ours and NVIDIA
    # v5.1: optimizer steps. Decide from the increments between records.
    unit, per = "steps", 1.0
    seq = seq or 1
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
    # Does one record's time cover one step or all the steps since the previous record? Compare with the
    # wall-clock gap between records.
    if len(idx) > 2:
        k = np.diff(idx)
        gap = np.diff(times) / 1000
        multi = k > 1.5
        if multi.any():
            ratio = np.median(gap[multi] / secs[1:][multi])
            kk = np.median(k[multi])
            if abs(ratio - 1) < abs(ratio - kk):  # the time covers the whole interval
                secs[1:][multi] = secs[1:][multi] / k[multi]
                note += f"; each record covers {kk:g} steps, divided"
            else:
                note += f"; logged every {kk:g} steps, times are per step"
    tps, tfl = tps[keep], tfl[keep]
    return StepTimes(secs, "tracked_stats", note, idx, tps[np.isfinite(tps)], tfl[np.isfinite(tfl)])


def from_blocks(blocks: list[Block], eval_counts: list[float], gbs: int | None,
                samples_per_count: float) -> StepTimes | None:
    """Mean step time per block (block_start..block_stop), for logs without per-step statistics."""
    if not gbs:
        return None
    evals = sorted(eval_counts)
    out: list[float] = []
    for b in blocks:
        size = b.size
        if size is None and b.first is not None:
            nxt = [c for c in evals if c > b.first]
            size = nxt[0] - b.first if nxt else None
        if size:
            n_steps = size * samples_per_count / gbs
            dur = (b.stop_ms - b.start_ms) / 1000
            if 1 <= n_steps <= MAX_BLOCK_STEPS and 0 < dur / n_steps <= MAX_STEP_S:
                out.extend([dur / n_steps] * round(n_steps))
    if not out:
        return None
    return StepTimes(np.array(out), "blocks", "block events: block duration / steps in the block (mean per block)")


def none() -> StepTimes:
    return StepTimes(np.zeros(0), "none", "no tracked step times and no block events with sizes")
