"""What the bookkeeping of a long run costs: `python perf/long_run_bookkeeping.py [STEPS] [EVALS]`.

A fake rank 0 (no model: the real Reporter, as the training loop drives it) writes the events and MLPerf log of a
run of STEPS steps (100,000 unless given) and EVALS evaluations (500), while the real supervisor (RunSet: supervise,
Progress without a terminal, time to train, the compliance check, the record, publish) follows it; then `compare
--no-score` and `scaling` read the result back. Prints the sizes of events.jsonl, the log and the record, the
supervisor's polls and the bytes it read of the events, the time of each phase and the peak memory of the
supervisor and of each analysis command (each in a process of its own).

2026-11-28, 2 shared cores, 100,000 steps and 500 evals (a fake rank writes 20,000 steps a second: a real one a few):
events.jsonl 22.6 MiB (read once over 20 polls), MLPerf log 36.2 MiB, 502 lines printed.
- before (a2a66af^): record 21.2 MiB, supervisor peak 386 MiB (267 MiB as the run ended: every event a dict, the log
  read whole as dicts to be closed; 386 MiB writing the record), CPU 2.5 s; publish 0.92 s.
- after (a2a66af): record 18.6 MiB, supervisor peak 72 MiB (47 MiB for a run of 1,000 steps; 76 MiB at 200,000,
  was 261), CPU 1.9 s; publish 0.63 s; record 0.03 s (was 0.20).
Both: time to train 0.03 s, the compliance check (the official checker) 6.9-7.0 s, `compare --no-score` of two such
runs 3.4 s in 172 MiB, `scaling` 1.5 s in 169 MiB, `check` 0.4 s.

2026-11-28, the record's step rows thinned past 10,000 (launch.events.Steps) and each record read once by compare
(logfile.records_read_once); 2 shared cores, timings noisy (other work ran beside them), 500 evals:
- 100,000 steps, before (f19b74f): record 18.8 MiB, supervisor peak 78 MiB, publish 1.45 s; compare --no-score 3.7 s
  in 173 MiB, scaling 6.0 s in 171 MiB. After: record 2.9 MiB, supervisor peak 78 MiB, publish 0.55 s; compare
  --no-score 3.0 s in 95 MiB, scaling 1.9 s in 95 MiB.
- 1,200,000 steps (llama31_8b's budget; MLPerf log 434 MiB), before: record 231.5 MiB, supervisor peak 166 MiB,
  publish 31.9 s; compare --no-score 14.9 s in 189 MiB (the record over MAX_JSON_BYTES, read without its rows).
  After: record 3.7 MiB, supervisor peak 89 MiB, publish 0.24 s; compare --no-score 2.6 s in 192 MiB.
"""

from __future__ import annotations

import io
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def rank(plan_path: str, steps: int, evals: int) -> int:
    """Rank 0's writing, as mlbench.train.loop does it, without training."""
    from mlbench.run_plan import RunPlan
    from mlbench.train.reporter import Reporter

    plan = RunPlan.load(plan_path)
    report = Reporter(plan, rank=0)
    report.preamble()
    report.run_start(budget=steps, interval=steps // evals, target=3.3, metric="log_perplexity", direction="min",
                     devices=1, device={"type": "cpu", "name": "fake", "precision": "fp32", "attention": "local"},
                     mfu_note="CPU")
    gbs, every, step = plan.global_batch_size, steps // evals, 0
    while step < steps:
        first, last = step, min(step + every, steps)
        report.block_start(first, last)
        while step < last:
            step += 1
            report.step(step, {"train_step_time": 0.123456789, "reduced_train_loss": 10.0 / (1 + step / 1000),
                               "tokens_per_s": 12345.6789, "tflops_per_device": 0.0123456},
                        lr=1e-4 * (1 - step / steps), grad_norm=1.2345678)
        report.block_stop(first, last)
        report.eval_start(step * gbs)
        value = plan.benchmark.quality.target + (steps - step) / steps  # reaches it at the last one
        report.eval_stop(step, step * gbs, value, 1000)
    report.run_stop(step, "success")
    report.emit("memory", estimated={"total": 1}, measured={"total": 2})
    report.close()
    return 0


def supervisor(steps: int, evals: int, results: Path) -> dict:
    from rich.console import Console

    from mlbench import layout as layout_lib
    from mlbench import rcp_schedule, registry, runner
    from mlbench.launch import supervise as sup
    from mlbench.launch.supervise import Command

    polls, read = [0], [0]
    poll = sup.EventTail.poll

    def counted(self):
        before = self._pos
        new = poll(self)
        polls[0] += 1
        read[0] += self._pos - before
        return new
    sup.EventTail.poll = counted
    phases: dict[str, float] = {}
    peaks: dict[str, float] = {}  # the supervisor's peak memory (MiB) at the end of each phase

    def timed(name, fn):
        def wrapper(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                phases[name] = phases.get(name, 0.0) + time.perf_counter() - t0
                peaks[name] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        return wrapper
    runner.supervise = timed("supervise (the rank writing)", runner.supervise)
    runner.time_to_train = timed("time to train", runner.time_to_train)
    runner.compliance_verdict = timed("compliance check", runner.compliance_verdict)
    runner.record = timed("record", runner.record)
    runner.results.publish = timed("publish", runner.results.publish)

    bench = registry.load("gpt3", tiny=True)
    layout = layout_lib.resolve(bench)
    bench = rcp_schedule.for_run(bench, layout.global_batch_size)

    def command_for(plan_path: Path, staging: Path, i: int, env: dict) -> Command:
        return Command([sys.executable, __file__, "--rank", str(plan_path), str(steps), str(evals)], env,
                       stdout=staging / "rank.log", what="rank 0 (the only rank)", logs="direct")
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200)
    opts = runner.RunOptions(results=results, system="perf", seed=1)
    folder = results / "perf" / "gpt3"
    folder.mkdir(parents=True)
    runs = runner.RunSet(bench, layout, opts, console, command_for)
    runs.prepare(folder)
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    runs.supervise()
    return {"phases": phases, "peaks": peaks, "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - cpu0,
            "polls": polls[0], "events_bytes_read": read[0], "lines_printed": len(out.getvalue().splitlines()),
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "result": str(runs.results[0].path), "status": runs.results[0].status}


def analysis(args: list[str]) -> tuple[float, float, int]:
    """Wall seconds and peak memory (MiB) of `mlbench ARGS` in a process of its own, and its exit code."""
    code = ("import resource, sys, runpy; sys.argv = ['mlbench', *sys.argv[1:]]\n"
            "try:\n    runpy.run_module('mlbench.cli', run_name='__main__')\nexcept SystemExit as e:\n"
            "    code = e.code\nelse:\n    code = 0\n"
            "print('PEAK', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\nsys.exit(code)\n")
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    wall = time.perf_counter() - t0
    peak = next((int(line.split()[1]) for line in p.stderr.splitlines() if line.startswith("PEAK")), 0)
    return wall, peak / 1024, p.returncode


def main() -> None:
    if sys.argv[1:2] == ["--rank"]:
        sys.exit(rank(sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
    if sys.argv[1:2] == ["--supervise"]:
        print(json.dumps(supervisor(int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]))))
        return
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    evals = int(sys.argv[2]) if len(sys.argv) > 2 else 500
    with tempfile.TemporaryDirectory() as tmp:
        results = Path(tmp) / "results"
        p = subprocess.run([sys.executable, __file__, "--supervise", str(steps), str(evals), str(results)],
                           capture_output=True, text=True)
        if p.returncode:
            sys.exit(p.stderr)
        s = json.loads(p.stdout.splitlines()[-1])
        result = Path(s["result"])
        print(f"{steps:,} steps, {evals} evals: {s['status']}")
        record = result.with_suffix(".json").stat().st_size
        print(f"  MLPerf log {result.stat().st_size / 2**20:.1f} MiB, record {record / 2**20:.1f} MiB")
        print(f"  supervisor: {s['polls']} polls read {s['events_bytes_read'] / 2**20:.1f} MiB of events; "
              f"{s['lines_printed']} lines printed; wall {s['wall_s']:.1f} s, CPU {s['cpu_s']:.1f} s, "
              f"peak RSS {s['peak_rss_mib']:.0f} MiB")
        for name, secs in s["phases"].items():
            print(f"    {name}: {secs:.2f} s (peak memory so far {s['peaks'][name]:.0f} MiB)")
        other = result.parent.with_name("again")  # compare and scaling need two: the same run, copied
        shutil.copytree(result.parent, other)
        pair = [str(result.parent), str(other)]
        for args in (["compare", "--no-score", *pair], ["compare", *pair], ["scaling", *pair], ["check", str(result)]):
            wall, peak, code = analysis(args)
            print(f"  mlbench {args[0]}{' --no-score' if '--no-score' in args else ''}: {wall:.2f} s, "
                  f"peak {peak:.0f} MiB (exit {code})")


if __name__ == "__main__":
    main()
