"""The planner's CPU prediction against tiny runs measured here: `python perf/planner_cpu_check.py [BENCH]`.

Runs `mlbench run BENCH --tiny` at 1 process, 2 processes (data parallel) and 2 processes at tensor parallel 2,
reads each run's per-step times from its record (`steps[].step_time`, median), and prints them beside
`mlbench plan BENCH --tiny --device cpu` for the same layout, with the error. The CPU's figures are measured once
and cached (mlbench/planner/cpu.py); on a machine shared with other work both sides move with its load.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

MLBENCH = [sys.executable, "-m", "mlbench.cli"]
LAYOUTS = [("1 process", ["--nproc-per-node", "1", "--tp", "1"]),
           ("2 processes, dp 2", ["--nproc-per-node", "2", "--tp", "1"]),
           ("2 processes, tp 2", ["--nproc-per-node", "2", "--tp", "2"])]


def measured(bench: str, args: list[str], root: Path, system: str) -> float:
    run = subprocess.run([*MLBENCH, "run", bench, "--tiny", *args, "--results", str(root), "--system", system,
                          "--seed", "1"], capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f"mlbench run {bench} --tiny {' '.join(args)} failed: {run.stdout[-400:]}{run.stderr[-400:]}")
    record = json.loads(next((root / system / bench).glob("result_*.json")).read_text())
    return statistics.median(s["step_time"] for s in record["steps"])


def predicted(bench: str, args: list[str]) -> float:
    out = subprocess.run([*MLBENCH, "plan", bench, "--tiny", "--device", "cpu", *args, "--json"], capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout)["step_time_s"]


def main() -> int:
    bench = sys.argv[1] if len(sys.argv) > 1 else "gpt3"
    print(f"{'layout':<20} {'measured s':>11} {'predicted s':>12} {'error':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, args) in enumerate(LAYOUTS):
            m = measured(bench, args, Path(tmp), f"check{i}")
            p = predicted(bench, args)
            print(f"{name:<20} {m:11.4f} {p:12.4f} {(p - m) / m:+8.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
