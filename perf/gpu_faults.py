"""Faults on a real GPU, as a user meets them: `python perf/gpu_faults.py OUT` (needs a CUDA GPU; CI has none).

The CPU suite covers these paths with the CPU's memory and gloo; on a GPU the device table, the allocator and
NCCL take part, so each is tried once there with the GPU-sized llama of perf/gpu_check.py:

1. too_big: a micro-batch whose memory plan exceeds the GPU: refused before launch (exit 2, naming the GPU and
   its memory), nothing written under the results folder.
2. busy: another process holds all but 6 GB of the card before the run starts: refused before launch (exit 2,
   naming the GPU, its free memory and the process that holds it), nothing written.
3. oom: another process takes all but 1 GB of the card once the run has started (after its check), so the rank
   meets a real CUDA out-of-memory error: the run must end aborted (exit 1) with the allocator's words in its
   reason, published as aborted.
4. sigterm: SIGTERM to `mlbench run` mid-training: aborted, "stopped by SIGTERM", no process left on the GPU.
5. kill9: SIGKILL to `mlbench run` mid-training: the ranks die with it (parent-death signal), the GPU is freed.
6. checkpoint: tiny gpt3 saves a checkpoint from the GPU (CUDA tensors through torch.distributed.checkpoint and
   mlbench's checksums), a second run starts from it, and a copy with one byte flipped is refused before launch.

GPU_FAULTS_CASES (a comma-separated list of the names above) runs some of them. Each case prints one line and goes
into OUT/faults.json with what was seen (exit code, status, reason, the GPU's
processes and memory afterwards).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_check  # noqa: E402  (perf/ is not a package)

CLI = gpu_check.CLI
DEADLINE_S = float(os.environ.get("GPU_FAULTS_DEADLINE_S", "240"))
START = time.monotonic()


def gpu_apps() -> list[str]:
    """The GPU's compute processes (pid, MiB), as nvidia-smi lists them."""
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout
    return [line.strip() for line in out.splitlines() if line.strip()]


def wait_gpu_free(timeout: float = 30) -> tuple[list[str], float]:
    """Seconds until no process holds the GPU (or the timeout), and what is left then."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if not gpu_apps():
            return [], time.monotonic() - t0
        time.sleep(0.5)
    return gpu_apps(), time.monotonic() - t0


def record(results: Path, system: str) -> dict:
    rec = gpu_check.newest_record(results / system / "llama31_8b")
    return {k: (rec or {}).get(k) for k in ("status", "reason", "exit_code", "launcher_exit_code")}


def long_benchmarks(folder: Path) -> None:
    """The GPU-sized llama, trained long enough to be stopped, with progress lines every 5 steps."""
    gpu_check.gpu_benchmarks(folder)
    path = folder / "llama31_8b.yaml"
    spec = yaml.safe_load(path.read_text())
    spec["tiny"]["train"]["max_steps"] = 400
    spec["tiny"]["eval"] = {**spec["tiny"]["eval"], "interval_samples": 5 * 16, "samples": 16}
    path.write_text(yaml.safe_dump(spec, sort_keys=False))


def start(argv: list[str], env: dict, log: Path) -> subprocess.Popen:
    f = log.open("a")
    f.write(f"\n$ {' '.join(argv)}\n")
    f.flush()
    return subprocess.Popen(argv, env=env, stdout=f, stderr=subprocess.STDOUT)


def wait_for_step(log: Path, since: int, timeout: float = 120) -> bool:
    """Until the run prints its first progress line after byte SINCE of the log."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if "\nstep " in log.read_text(errors="replace")[since:]:
            return True
        time.sleep(0.5)
    return False


def stop_case(sig: int, run: list[str], env: dict, log: Path, results: Path, system: str) -> dict:
    since = log.stat().st_size if log.exists() else 0
    p = start([*run, "--system", system], env, log)
    started = wait_for_step(log, since)
    time.sleep(2)
    p.send_signal(sig)
    try:
        rc = p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        rc = "hung"
    left, freed_s = wait_gpu_free()
    tail = log.read_text(errors="replace")[since:].strip().splitlines()[-3:]
    return {"training_started": started, "exit_code": rc, "gpu_left": left, "gpu_freed_after_s": round(freed_s, 1),
            "record": record(results, system), "last_lines": tail}


def checkpoint(out: Path, results: Path) -> dict:
    """Save from the GPU, start from it, and refuse a damaged copy (the shipped tiny gpt3, fp32)."""
    import shutil

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("MLBENCH_BENCHMARKS", None)
    saved, damaged = out / "ckpt", out / "ckpt_damaged"
    base = [*CLI, "run", "gpt3", "--tiny", "--results", str(results)]

    def run(*flags: str) -> dict:
        p = subprocess.run([*base, *flags], env=env, capture_output=True, text=True, timeout=150)
        return {"exit_code": p.returncode, "said": [ln for ln in (p.stdout + p.stderr).strip().splitlines()
                                                      if "Warning" not in ln and "warnings.warn" not in ln][-3:]}

    found = {"save": run("--seed", "1", "--system", "ckpt_save", "--save-checkpoint", str(saved))}
    found["files"] = sorted(f.name for f in saved.iterdir()) if saved.is_dir() else []
    found["load"] = run("--seed", "2", "--system", "ckpt_load", "--init-checkpoint", str(saved))
    if saved.is_dir():
        shutil.copytree(saved, damaged)
        shard = sorted(damaged.glob("*.distcp"))[0]
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0x01
        shard.write_bytes(bytes(data))
        found["damaged"] = run("--seed", "3", "--system", "ckpt_damaged", "--init-checkpoint", str(damaged))
    return found


def main(out: Path) -> int:
    import torch

    if not torch.cuda.is_available():
        print("gpu_faults: no CUDA GPU here", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    results, log, benches = out / "results", out / "faults.log", out / "benchmarks"
    long_benchmarks(benches)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "MLBENCH_BENCHMARKS": str(benches)}
    run = [*CLI, "run", "llama31_8b", "--tiny", "--seed", "1", "--results", str(results), "--hang-timeout", "120"]
    found: dict = {"device": torch.cuda.get_device_name(), "gpu_apps_before": gpu_apps()}

    chosen = os.environ.get("GPU_FAULTS_CASES")  # a comma-separated subset, for a short lease

    def case(name: str, fn) -> None:
        if chosen and name not in chosen.split(","):
            return
        if time.monotonic() - START > DEADLINE_S:
            found[name] = "skipped: deadline"
        else:
            try:
                found[name] = fn()
            except Exception as e:  # a probe: one case's failure must not lose the others
                found[name] = {"error": repr(e)}
        print(f"{name}: {json.dumps(found[name])[:600]}", flush=True)

    def refused(system: str, *flags: str) -> dict:
        p = subprocess.run([*run, "--system", system, *flags], env=env, capture_output=True, text=True, timeout=120)
        return {"exit_code": p.returncode, "said": (p.stdout + p.stderr).strip().splitlines()[-2:],
                "written": sorted(str(q.relative_to(out)) for q in (results / system).rglob("*"))
                if (results / system).exists() else []}

    def hog(leave_bytes: float) -> tuple[subprocess.Popen, Callable[[], None]]:
        """Another process, its CUDA context made; calling the function returned makes it take all of the card's
        free memory but LEAVE_BYTES (at once: CUDA's start-up, seconds, is behind it)."""
        h = subprocess.Popen([sys.executable, "-c", "import sys, time, torch\ntorch.cuda.init(); torch.zeros(1, "
                              "device='cuda')\nprint('ready', flush=True)\nsys.stdin.readline()\n"
                              "free, _ = torch.cuda.mem_get_info()\n"
                              f"x = torch.empty(int(free - {leave_bytes}), dtype=torch.uint8, device='cuda')\n"
                              "print('held', flush=True)\ntime.sleep(600)"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
        h.stdout.readline()

        def take() -> None:
            h.stdin.write("go\n")
            h.stdin.flush()
            h.stdout.readline()

        return h, take

    def busy() -> dict:
        h, take = hog(6e9)
        take()
        try:
            return refused("busy")
        finally:
            h.kill()
            h.wait()

    def oom() -> dict:
        # the run starts on a free card; once its model is built, another process takes all but 1 GB: the
        # optimizer's 12 GB of state and the activations cannot be allocated
        h, take = hog(1e9)
        since = log.stat().st_size if log.exists() else 0
        p = start([*run, "--system", "oom"], env, log)
        t0 = time.monotonic()
        while "training on" not in log.read_text(errors="replace")[since:] and time.monotonic() - t0 < 120:
            time.sleep(0.1)
        take()
        try:
            try:
                rc = p.wait(timeout=60)
            except subprocess.TimeoutExpired:  # the run had its memory before the other process took the rest
                p.send_signal(signal.SIGTERM)
                rc = f"no out-of-memory error in 60 s; stopped: {p.wait(timeout=60)}"
            tail = log.read_text(errors="replace")[since:].strip().splitlines()[-3:]
        finally:
            h.kill()
            h.wait()
        left, _ = wait_gpu_free()
        return {"exit_code": rc, "record": record(results, "oom"), "last_lines": tail, "gpu_left": left}

    case("too_big", lambda: refused("too_big", "--micro-batch-size", "64", "--global-batch-size", "64"))
    case("busy", busy)
    case("oom", oom)
    case("sigterm", lambda: stop_case(signal.SIGTERM, run, env, log, results, "sigterm"))
    case("kill9", lambda: stop_case(signal.SIGKILL, run, env, log, results, "kill9"))
    case("checkpoint", lambda: checkpoint(out, results))
    (out / "faults.json").write_text(json.dumps(found, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "gpu_faults_out")))
