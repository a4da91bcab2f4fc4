"""What the CPU layer's one-process all-reduce skip (mlbench/train/cpu_compat.py) saves a tiny run:
`python perf/cpu_collectives.py [PAIRS]`. Runs the tiny gpt3 rank in this machine's processes, without a
launcher, PAIRS times with gloo's all-reduce over one-process groups and PAIRS times with the skip, alternating
(the machine's speed drifts), and prints each run's training time (run_start to run_stop in its MLPerf log),
the medians and their ratio. Both variants train the same steps to the same loss: the skip only drops calls
whose result is their input."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from mlbench import layout, registry
from mlbench.run_plan import RunPlan

ONE_RUN = """
import os, sys
from mlbench.train import cpu_compat, loop
if sys.argv[2] == "gloo":
    cpu_compat._skip_all_reduce_over_one_process = lambda: None
sys.exit(loop.main([sys.argv[1]]))
"""


def _run(folder: Path, variant: str, port: int) -> tuple[float, int]:
    bench = registry.load("gpt3", tiny=True)
    folder.mkdir()
    plan = RunPlan(benchmark=bench, layout=layout.resolve(bench).as_dict(), seed=1, run_dir=str(folder),
                   system="perf")
    plan.save(folder / "plan.json")
    env = dict(os.environ, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(port), PYTHONWARNINGS="ignore")
    subprocess.run([sys.executable, "-c", ONE_RUN, str(folder / "plan.json"), variant], env=env, check=False,
                   capture_output=True)
    times, samples = {}, 0
    for line in plan.log_path.read_text().splitlines():
        if ":::MLLOG" in line:
            e = json.loads(line.split(":::MLLOG", 1)[1])
            times.setdefault(e["key"], e["time_ms"])
            samples = e["value"] if e["key"] == "train_samples" else samples
    return (times["run_stop"] - times["run_start"]) / 1000, samples


def main(pairs: int) -> None:
    seconds: dict[str, list[float]] = {"gloo": [], "skip": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(pairs):
            for variant in seconds:
                s, samples = _run(Path(tmp) / f"{variant}{i}", variant, 29400 + 2 * i + (variant == "skip"))
                seconds[variant].append(s)
                print(f"{variant:4} run {i + 1}: {s:5.1f} s to the target ({samples} tokens trained)")
    gloo, skip = statistics.median(seconds["gloo"]), statistics.median(seconds["skip"])
    print(f"median time-to-train: gloo all-reduce over one process {gloo:.1f} s, skipped {skip:.1f} s: "
          f"{gloo / skip:.2f}x")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
