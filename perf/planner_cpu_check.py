"""The planner's CPU prediction against tiny runs measured here: `python perf/planner_cpu_check.py [BENCH] [REPEATS]`.

Each round measures the CPU afresh (mlbench/planner/cpu.py's `measure`, what the cache holds), then runs
`mlbench run BENCH --tiny` at 1 process, 2 processes (data parallel) and 2 processes at tensor parallel 2, and
sets each run's median step time (from its record, `steps[].step_time_s`) beside the planner's prediction for the
same layout from that round's measurement: on a machine shared with other work both sides then see the same load.
Prints every round and the median error per layout over the rounds; also the prediction each run's record holds
(from the cached measurement, as `mlbench run` makes it).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from mlbench import registry
from mlbench.layout import resolve
from mlbench.planner import cpu, devices, plan

MLBENCH = [sys.executable, "-m", "mlbench.cli"]
LAYOUTS = [("1 process", 1, 1), ("2 processes, dp 2", 2, 1), ("2 processes, tp 2", 2, 2)]  # name, nproc, tp


def measured(bench: str, nproc: int, tp: int, root: Path, system: str) -> tuple[float, float | None]:
    """The run's median step time and the prediction its record holds."""
    args = ["--nproc-per-node", str(nproc), "--tp", str(tp)]
    run = subprocess.run([*MLBENCH, "run", bench, "--tiny", *args, "--results", str(root), "--system", system,
                          "--seed", "1"], capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f"mlbench run {bench} --tiny {' '.join(args)} failed: {run.stdout[-400:]}{run.stderr[-400:]}")
    record = json.loads(next((root / system / bench).glob("result_*.json")).read_text())
    return statistics.median(s["step_time_s"] for s in record["steps"]), record["prediction"]["step_time_s"]


def main() -> int:
    bench = sys.argv[1] if len(sys.argv) > 1 else "gpt3"
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    spec = registry.load(bench, tiny=True)
    errors: dict[str, list[float]] = {name: [] for name, _, _ in LAYOUTS}
    print(f"{'round':<6} {'layout':<20} {'measured s':>11} {'predicted s':>12} {'error':>8} {'record s':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            device = cpu.device(devices.get("cpu"), cpu.measure())
            for i, (name, nproc, tp) in enumerate(LAYOUTS):
                m, in_record = measured(bench, nproc, tp, Path(tmp), f"r{r}l{i}")
                p = plan.evaluate(spec, resolve(spec, 1, nproc, tp=tp), device)["step_time_s"]
                errors[name].append((p - m) / m)
                print(f"{r:<6} {name:<20} {m:11.4f} {p:12.4f} {(p - m) / m:+8.1%} {in_record:9.4f}", flush=True)
    print(f"\nmedian error over {rounds} rounds:")
    for name, e in errors.items():
        print(f"  {name:<20} {statistics.median(e):+8.1%}  (each: {', '.join(f'{x:+.1%}' for x in e)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
