"""Where a run's start-up and teardown go, with and without torchrun: `python perf/launch_overhead.py [PAIRS]`
(one process) and `python perf/launch_overhead.py --two [PAIRS]` (two).

Alternates, PAIRS times, the tiny gpt3 run at one process started two ways under the same supervisor
(mlbench.launch.supervise): the rank itself (what `mlbench run` does for one process) and a standalone torchrun
with one worker (what it did before). For each run it prints, from the supervisor's clock and the rank's events:
- start-up: from starting the command to the rank's `start` event (imports, model build, up to run_start);
- teardown: from the rank's `stopped` event (run_stop written) to the supervisor having the exit status;
- whole: start to end of the supervised command.
Then the medians and what the direct start saves. Issue 19 measured torchrun's agent at ~1.5 s of start-up and
its monitor at ~0.7 s of teardown on a loaded 2-core machine.

`--two`: the same at two processes (DP 2): mlbench's local agent (mlbench.launch.local_ranks, what `mlbench run
--nproc-per-node 2` starts) against a standalone torchrun with two workers.

`--cli`: `mlbench run gpt3 --tiny` as a user runs it, N times: whole wall time, from the command's start to the
log's init_start, and from the log's run_stop to the command's exit (the teardown issue 19 measured at 1.9 s:
interpreter shutdown 0.8 s, torchrun's monitor 0.7 s).

`--agent`: torchrun's own teardown instead: from a one-line worker's last output to the standalone torchrun's
exit, at the monitor interval the launcher used (0.5 s) and the one it uses (0.1 s), alternating.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from mlbench import registry
from mlbench.launch import local_ranks, torchrun
from mlbench.launch.supervise import Command, supervise
from mlbench.layout import resolve
from mlbench.run_plan import RunPlan


def _one(mode: str, root: Path, seed: int, nproc: int = 1) -> dict[str, float]:
    bench = registry.load("gpt3", tiny=True)
    layout = resolve(bench, 1, nproc, None, None, None, None, None, None)
    staging = Path(tempfile.mkdtemp(dir=root))
    plan = RunPlan(benchmark=bench, layout=layout.as_dict(), seed=seed, run_dir=str(staging), system="perf")
    plan.save(staging / "plan.json")
    env = dict(os.environ, MLBENCH_THREADS="1", OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    if mode == "direct":
        cmd = torchrun.direct(staging / "plan.json", staging / "ranks", env)
    elif mode == "local":
        cmd = Command(local_ranks.argv(staging / "plan.json", staging / "ranks", nproc), env,
                      stdout=staging / "launcher.log")
    else:
        cmd = Command(torchrun.argv(staging / "plan.json", staging / "ranks", nodes=1, nproc_per_node=nproc), env,
                      stdout=staging / "launcher.log")
    t0 = time.time()
    outcome = supervise(cmd, log_path=plan.log_path, events_path=plan.events_path)
    t1 = time.time()
    events = [json.loads(line) for line in plan.events_path.read_text().splitlines()]
    start = next(e["time"] for e in events if e["event"] == "start")
    stopped = next(e["time"] for e in events if e["event"] == "stopped")
    assert outcome.status == "success", outcome.reason
    return {"start-up": start - t0, "teardown": t1 - stopped, "whole": t1 - t0}


def main(pairs: int, nproc: int = 1) -> None:
    ours = "direct" if nproc == 1 else "local"
    rows: dict[str, list[dict[str, float]]] = {ours: [], "torchrun": []}
    with tempfile.TemporaryDirectory(prefix="mlbench-perf-") as tmp:
        for i in range(pairs):
            for mode in ((ours, "torchrun") if i % 2 == 0 else ("torchrun", ours)):
                r = _one(mode, Path(tmp), seed=1, nproc=nproc)
                rows[mode].append(r)
                print(f"{mode:9s} " + "  ".join(f"{k} {v:6.2f} s" for k, v in r.items()), flush=True)
    med = {m: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for m, rs in rows.items()}
    print(f"medians over {pairs} runs each:")
    for m, values in med.items():
        print(f"{m:9s} " + "  ".join(f"{k} {v:6.2f} s" for k, v in values.items()))
    print("saved    " + "  ".join(f"{k} {med['torchrun'][k] - med[ours][k]:6.2f} s" for k in med[ours]))


def two(pairs: int) -> None:
    main(pairs, nproc=2)


def agent(pairs: int) -> None:
    import subprocess

    times: dict[str, list[float]] = {"0.5": [], "0.1": []}
    with tempfile.TemporaryDirectory(prefix="mlbench-perf-") as tmp:
        worker = Path(tmp) / "worker.py"
        worker.write_text("import time\nprint(time.time(), flush=True)\n")
        for _ in range(pairs):
            for interval in times:
                out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
                                      "--nproc-per-node=1", f"--monitor-interval={interval}", str(worker)],
                                     capture_output=True, text=True, check=True).stdout
                times[interval].append(time.time() - float(out.split()[-1]))
    for interval, ts in times.items():
        print(f"monitor interval {interval} s: teardown median {statistics.median(ts):.2f} s "
              f"({', '.join(f'{t:.2f}' for t in sorted(ts))})")


def cli(runs: int) -> None:
    import subprocess

    for _ in range(runs):
        with tempfile.TemporaryDirectory(prefix="mlbench-perf-") as tmp:
            t0 = time.time()
            subprocess.run([sys.executable, "-m", "mlbench.cli", "run", "gpt3", "--tiny", "--seed", "1", "--results",
                            tmp, "--system", "perf"], capture_output=True, check=True)
            t1 = time.time()
            times = {}
            for line in (Path(tmp) / "perf" / "gpt3" / "result_0.txt").read_text().splitlines():
                event = json.loads(line.removeprefix(":::MLLOG "))
                times.setdefault(event["key"], event["time_ms"] / 1000)
        print(f"whole {t1 - t0:6.2f} s  start to init_start {times['init_start'] - t0:5.2f} s  "
              f"run_stop to exit {t1 - times['run_stop']:5.2f} s", flush=True)


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    flag = next((a for a in sys.argv[1:] if a.startswith("--")), "")
    mode = {"--agent": agent, "--cli": cli, "--two": two}.get(flag, main)
    mode(int(args[0]) if args else 3)
