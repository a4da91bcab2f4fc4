"""Time-to-train as MLPerf times it (run_start to run_stop): steps to converge x step time + evaluations.

Samples to converge come from the reference convergence points (RCPs) shipped in the mlperf-logging package
(rcp_checker/training_<ruleset>/rcps_<benchmark>.json), treated as its RCP checker treats them: each point's
olympic mean (the fastest and slowest run dropped), the points pruned as `_prune_rcps` prunes them, and a batch
between two points interpolated linearly (`_create_interp_rcp`). Below the smallest point: that point's mean;
above the largest: the line through the last two, extended (the checker has no RCP there; said in `rcp`).
A run stops at the first evaluation whose samples reach that mean, so the steps are rounded up to the
benchmark's evaluation cadence; each evaluation runs the eval set forward only, a third of a training sample's
FLOPs, at the step's per-sample rate.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mlbench.run_plan import eval_schedule, first_eval_samples
from mlbench.spec import Benchmark


@dataclass(frozen=True)
class RCPPoint:
    batch: int
    mean: float  # olympic mean of samples to converge


def _rcp_file(benchmark: str, ruleset: str) -> Path:
    from mlbench import mlperf_tools

    return mlperf_tools.rcp_file(benchmark, ruleset)


def rcp_points(bench: Benchmark) -> list[RCPPoint]:
    """The pruned RCPs, in samples (gpt3's count tokens: divided by the sequence length), by batch."""
    return list(_pruned_rcps(bench.mlperf.benchmark, bench.mlperf.ruleset, bench.eval_unit_size))


@functools.cache  # a plan search asks at every layout it evaluates
def _pruned_rcps(benchmark: str, ruleset: str, unit: int) -> tuple[RCPPoint, ...]:
    raw = json.loads(_rcp_file(benchmark, ruleset).read_text())
    points = []
    for rec in raw.values():
        runs = sorted(rec.get("Epochs to converge") or rec["samples to converge"])
        points.append(RCPPoint(rec["BS"], float(np.mean(runs[1:-1])) / unit))
    points.sort(key=lambda p: p.batch)
    # the checker's pruning: nothing below the fastest-converging batch; then drop any point slower than the
    # interpolation of its neighbours, stepping back after each drop
    fastest = min(points, key=lambda p: p.mean)
    points = [p for p in points if p.batch >= fastest.batch]
    i = 1
    while i < len(points) - 1:
        lo, mid, hi = points[i - 1], points[i], points[i + 1]
        if mid.mean > np.interp(mid.batch, [lo.batch, hi.batch], [lo.mean, hi.mean]):
            del points[i]
            i -= 1
        i += 1
    return tuple(points)


def samples_to_converge(bench: Benchmark, gbs: int) -> tuple[float, str]:
    """Mean samples to converge at this global batch, and how the RCP data gave it."""
    pts = rcp_points(bench)
    for p in pts:
        if p.batch == gbs:
            return p.mean, f"RCP at global batch {gbs}"
    if gbs < pts[0].batch:
        return pts[0].mean, f"below the smallest RCP (global batch {pts[0].batch}): its mean"
    below = max((p for p in pts if p.batch < gbs), key=lambda p: p.batch)
    above = [p for p in pts if p.batch > gbs]
    if above:
        hi = min(above, key=lambda p: p.batch)
        mean = float(np.interp(gbs, [below.batch, hi.batch], [below.mean, hi.mean]))
        return mean, f"interpolated between the RCPs at global batch {below.batch} and {hi.batch}"
    lo, hi = pts[-2], pts[-1]
    mean = hi.mean + (gbs - hi.batch) * (hi.mean - lo.mean) / (hi.batch - lo.batch)
    return mean, f"extrapolated beyond the largest RCP (global batch {hi.batch}; the RCP checker has none here)"


def predict(bench: Benchmark, gbs: int, step_time_s: float) -> dict:
    """Minutes from run_start to run_stop, with the steps, evaluations and the RCP they came from."""
    mean, how = samples_to_converge(bench, gbs)
    next_eval = eval_schedule(bench, gbs)
    start = first_eval_samples(bench, gbs)
    step, evals = 0, 0
    while True:
        step = next_eval(step)
        if step * gbs < start:
            continue
        evals += 1
        if step * gbs >= mean:
            break
    eval_s = bench.eval.samples / gbs * step_time_s / 3
    train_s = step * step_time_s
    return {"time_to_train_min": (train_s + evals * eval_s) / 60, "steps": step, "evaluations": evals,
            "samples_to_converge": mean, "rcp": how, "train_s": train_s, "eval_s": evals * eval_s}
