"""How fast and in how much memory mlbench reads a big MLPerf log, against a plain read and the official checker.

    python perf/log_reading.py [SIZE_MB] [--checkout DIR] [--reads-only] [--step-less]

Writes a llama31_8b log of SIZE_MB (default 250; closed division, a tracked_stats line per step as NVIDIA logs
them, an eval every 100 steps) to a temp folder, then runs each of these in a child process and prints its wall
time, the time of the timed code alone (wall and CPU: the best of 3 runs for the reads, one run for the commands;
imports before it are not timed), peak resident memory (the child's own, and its own children's, e.g. the
checker it starts), and the timed wall time and the peak memory as multiples of the plain line-by-line read's:

  plain line by line    every line of the file read and dropped (the floor for a streaming reader)
  plain f.read()        the whole file read into one bytes object (the floor for any reader)
  mlbench imported      nothing read: the memory of the interpreter with mlbench's reader (and numpy) imported
  mlbench read_log      mlbench's own streaming pass (mlbench.analysis.logs.read_log), per-step records included
  mlbench read (score)  the same pass as score makes it: per-step lines skipped unparsed
  checker alone         python -m mlperf_logging.compliance_checker on the file
  score                 mlbench score (compliance by the checker in a process of its own, the RCP check, the score)
  compare --no-score    mlbench compare of the big set and a small one
  scaling               mlbench scaling of the same two

--checkout DIR runs the mlbench commands from another checkout of the code (e.g. a `git worktree` of an older
commit) for a before/after comparison; --reads-only times the reads alone (no checker, no commands); --step-less
writes the per-step lines as NVIDIA's v6.0 logs do: a samples count, no step, a step time of 16 or 17 digits.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RULESET = "5.1.0"
T0 = 1_750_000_000_000


def _line(t: int, key: str, value: object, md: dict, event_type: str = "POINT_IN_TIME") -> str:
    md = {"file": "/workspace/llm/custom_callbacks.py", "lineno": 263, **md}
    return ":::MLLOG " + json.dumps({"namespace": "", "time_ms": t, "event_type": event_type, "key": key,
                                     "value": value, "metadata": md}) + "\n"


def write_log(path: Path, size_mb: float, gbs: int = 32, seq: int = 8192, step_less: bool = False) -> int:
    """A llama31_8b result log of about SIZE_MB; returns the number of steps in it. STEP_LESS: per-step lines as
    NVIDIA's (v6.0) are, with a samples count for a step and the times as Python writes a float."""
    head = [("cache_clear", True), ("submission_org", "mlbench"), ("submission_platform", "perf"),
            ("submission_division", "closed"), ("submission_status", "onprem"), ("submission_benchmark", "llama31_8b"),
            ("seed", 1), ("global_batch_size", gbs), ("max_sequence_length", seq), ("gradient_accumulation_steps", 1),
            ("opt_name", "adamw"), ("opt_base_learning_rate", 0.001), ("opt_learning_rate_warmup_samples", 0),
            ("opt_learning_rate_decay_steps", 1_200_000), ("opt_end_learning_rate", 0.0001),
            ("opt_adamw_beta_1", 0.9), ("opt_adamw_beta_2", 0.95), ("opt_adamw_epsilon", 1e-5),
            ("opt_adamw_weight_decay", 0.1), ("opt_gradient_clip_norm", 1.0), ("eval_samples", 1024),
            ("train_samples", 0), ("init_checkpoint_step", 0), ("tensor_parallelism", 1)]
    limit = size_mb * 1e6
    with open(path, "w") as f:
        t = T0
        for k, v in head:
            f.write(_line(t, k, v, {}))
        f.write(_line(t, "init_start", None, {}, "INTERVAL_START"))
        f.write(_line(t + 1000, "init_stop", None, {}, "INTERVAL_END"))
        t += 2000
        f.write(_line(t, "run_start", None, {}, "INTERVAL_START"))
        step, eval_every = 0, 100
        while f.tell() < limit:
            if step % eval_every == 0:
                f.write(_line(t, "block_start", None, {"samples_count": step * gbs, "epoch_count": eval_every * gbs},
                              "INTERVAL_START"))
            step += 1
            t += 1500
            if step_less:
                f.write(_line(t, "tracked_stats", {"train_step_time": 1.4 + (step % 7919) / 79190,
                                                   "reduced_train_loss": 12 / (1 + step / 997)},
                              {"samples_count": step * gbs}))
            else:
                f.write(_line(t, "tracked_stats", {"train_step_time": 1.5, "train_loss": 3.1, "lr": 0.001,
                                                   "tokens_per_s": gbs * seq / 1.5, "tflops_per_device": 400.0},
                              {"step": step}))
            if step % eval_every == 0:
                samples = step * gbs
                f.write(_line(t, "block_stop", None, {"samples_count": samples}, "INTERVAL_END"))
                f.write(_line(t, "eval_start", None, {"samples_count": samples}, "INTERVAL_START"))
                f.write(_line(t + 10, "eval_accuracy", 4.0 - step / 1e6, {"samples_count": samples}))
                f.write(_line(t + 10, "eval_stop", None, {"samples_count": samples}, "INTERVAL_END"))
        f.write(_line(t + 20, "train_samples", step * gbs, {}))
        f.write(_line(t + 20, "run_stop", None, {"status": "success"}, "INTERVAL_END"))
    return step


# Runs CODE (which may call mlbench), then writes its own and its children's peak RSS (MiB) to argv[1].
_MEASURED = r"""
import contextlib, io, json, resource, sys, time
out = sys.argv.pop(1)
{setup}
best = (float("inf"), float("inf"))
with contextlib.redirect_stdout(io.StringIO()):
    for _ in range({repeat}):
        wall, cpu = time.perf_counter(), time.process_time()
        try:
{code}
        except SystemExit:
            pass
        best = min(best, (time.perf_counter() - wall, time.process_time() - cpu))
peak = lambda who: resource.getrusage(who).ru_maxrss / 1024
json.dump({{"self": peak(resource.RUSAGE_SELF), "children": peak(resource.RUSAGE_CHILDREN), "wall": best[0],
           "cpu": best[1]}}, open(out, "w"))
"""


def measure(code: str, env: dict, scratch: Path, cwd: Path, setup: str = "", repeat: int = 1) -> dict:
    """CODE in a fresh interpreter, after SETUP (imports, untimed): {"seconds": the whole process, "wall" and
    "cpu": CODE alone (the best of REPEAT runs), "self" and "children": peak MiB of the process and of its
    largest child}."""
    body = "\n".join("            " + ln for ln in code.strip().splitlines())
    out = scratch / "peak.json"
    t = time.perf_counter()
    # In CWD: `python -c` puts the working directory first on sys.path, so it picks the checkout imported.
    subprocess.run([sys.executable, "-c", _MEASURED.format(code=body, setup=setup, repeat=repeat), str(out)],
                   env=env, check=True, stderr=subprocess.DEVNULL, cwd=cwd)
    return {"seconds": time.perf_counter() - t, **json.loads(out.read_text())}


def _mlbench(*args: str) -> str:
    return f"import sys\nsys.argv = {['mlbench', *args]!r}\nfrom mlbench.cli import main\nmain()"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("size_mb", nargs="?", type=float, default=250.0)
    ap.add_argument("--checkout", type=Path, default=Path(__file__).resolve().parents[1],
                    help="the mlbench checkout whose code runs the mlbench commands")
    ap.add_argument("--reads-only", action="store_true", help="only the reads: no checker, no mlbench commands")
    ap.add_argument("--step-less", action="store_true", help="per-step lines without a step, as NVIDIA's")
    args = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=str(args.checkout.resolve()), PYTHONWARNINGS="ignore")
    with tempfile.TemporaryDirectory(prefix="mlbench-perf-") as td:
        td = Path(td)
        big, small = td / "perf-a" / "llama31_8b", td / "perf-b" / "llama31_8b"
        big.mkdir(parents=True)
        small.mkdir(parents=True)
        log = big / "result_0.txt"
        t = time.perf_counter()
        steps = write_log(log, args.size_mb, step_less=args.step_less)
        write_log(small / "result_0.txt", 0.2)
        print(f"log: {log.stat().st_size / 1e6:.0f} MB, {steps:,} steps, written in {time.perf_counter() - t:.1f} s; "
              f"mlbench from {args.checkout}")
        # (name, setup: imports, untimed, code, runs of the code: the best is shown)
        reads = "from mlbench.analysis.logs import read_log"
        cases = [
            ("plain line by line", "", f"for _ in open({str(log)!r}, 'rb'):\n    pass", 3),
            ("plain f.read()", "", f"open({str(log)!r}, 'rb').read()", 3),
            ("mlbench imported", reads, "pass", 1),
            ("mlbench read_log", reads, f"read_log({str(log)!r}).step_times", 3),
            ("mlbench read (score)", reads, f"read_log({str(log)!r}, steps=False)", 3),
            ("checker alone", "import runpy",
             f"sys.argv = ['x', '--usage', 'training', '--ruleset', {RULESET!r}, {str(log)!r}, '--log_output', "
             f"{str(td / 'checker.log')!r}]\nrunpy.run_module('mlperf_logging.compliance_checker', "
             "run_name='__main__')", 1),
            ("score", "", _mlbench("score", str(big), "--ruleset", RULESET), 1),
            ("compare --no-score", "", _mlbench("compare", str(big), str(small), "--no-score"), 1),
            ("scaling", "", _mlbench("scaling", str(big), str(small), "--devices", "8", "--devices", "16"), 1),
        ]
        if args.reads_only:
            cases = cases[:5]
        print(f"{'':20} {'seconds':>8} {'timed s':>8} {'timed cpu s':>12} {'peak MiB':>9} {'child peak MiB':>15} "
              f"{'x plain s':>10} {'x plain MiB':>12}")
        plain = None  # the line-by-line read's timed seconds and peak MiB: what a streaming reader cannot beat
        for name, setup, code, repeat in cases:
            m = measure(code, env, td, args.checkout, setup, repeat)
            plain = (m["wall"], m["self"]) if name == "plain line by line" else plain
            times = (f"{m['wall'] / plain[0]:10.1f} {max(m['self'], m['children']) / plain[1]:12.1f}" if plain
                     else "")
            print(f"{name:20} {m['seconds']:8.1f} {m['wall']:8.3f} {m['cpu']:12.3f} {m['self']:9.0f} "
                  f"{m['children']:15.0f} {times}", flush=True)


if __name__ == "__main__":
    main()
