"""The GPU path, run for real on one GPU: `python perf/gpu_check.py OUT` (needs a CUDA GPU; CI has none).

GPU_CHECK_DEADLINE_S (420) bounds the whole check; GPU_CHECK_FEATURES (default,selective,full) picks the settings.

1. Every benchmark's tiny variant through the CLI as a user runs it (`mlbench run NAME --tiny`): NCCL, CUDA,
   PyTorch's fused attention, megatron's fused kernels, the MLPerf log, the official checker, the run record.
2. A GPU-sized variant of llama31_8b (1.02B parameters: 16 layers, hidden 2048, GQA 16 heads over 8 groups, SwiGLU
   8192, vocabulary 4096 (the Markov source's bound), sequence 2048, bf16; the seeded Markov data, so nothing is
   downloaded) for a bounded number of steps, under a few feature settings. Its record holds the memory plan beside
   the bytes measured (tensors, saved activations, the allocator's peak) and the planner's step time beside the
   measured one: printed here as ratios.
3. `mlbench check` and `mlbench score` over everything it wrote.
4. Which of SDPA's kernels take mlbench's attention call (grouped-query heads, causal) in fp32 and bf16 at the tiny
   llama's and the GPU-sized model's shapes, and the bytes the default choice saves for backward: the memory plan
   has to know whether the s x s probabilities are kept.

Writes OUT/results (the results layout), OUT/summary.json, and prints a table. Each step is independent: one
that fails is reported with its exit code and the rest still run.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-c", "from mlbench.cli import main; main()"]
TINY = ["gpt3", "llama31_8b", "gpt_oss_20b", "bert"]

# The GPU-sized model: big enough that the GEMMs, not launch overheads, set the step time (about 0.2 PFLOP a
# step), small enough for one 80 GB GPU without the distributed optimizer's sharding.
GPU_SIZED = {
    "model": {"num_layers": 16, "hidden_size": 2048, "num_attention_heads": 16, "num_query_groups": 8,
              "ffn_hidden_size": 8192, "vocab_size": 4096, "seq_length": 2048, "make_vocab_size_divisible_by": 128},
    "optimizer": {"lr": 3.0e-4, "min_lr": 3.0e-5, "warmup_steps": 5, "decay_steps": 100},
    "train": {"global_batch_size": 16, "micro_batch_size": 2, "max_steps": 30, "init_checkpoint_step": 0,
              "precision": "bf16"},
    # one evaluation, at the end: the steps measured are training steps alone
    "eval": {"interval_samples": 30 * 16, "samples": 32, "start_samples": 0},
}
FEATURES = {
    "default": [],
    "selective": ["--recompute", "selective"],
    "full": ["--recompute", "full", "--recompute-layers", "1"],
}


# the whole check; a step that would start after it is skipped (a device lease is short)
DEADLINE_S = float(os.environ.get("GPU_CHECK_DEADLINE_S", "420"))
START = time.monotonic()


def sh(argv: list[str], env: dict, log: Path, timeout: float = 180, late: bool = False) -> tuple[int, float]:
    """Runs ARGV into LOG; one that would start past the deadline is skipped (-1) unless LATE (the short checks)."""
    t0 = time.monotonic()
    if t0 - START > DEADLINE_S and not late:
        return -1, 0.0
    with log.open("a") as f:
        f.write(f"\n$ {' '.join(argv)}\n")
        f.flush()
        try:
            rc = subprocess.run(argv, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    return rc, time.monotonic() - t0


def gpu_benchmarks(folder: Path) -> None:
    """The repository's benchmark files, with llama31_8b's tiny section made GPU-sized."""
    folder.mkdir(parents=True)
    for f in (ROOT / "benchmarks").glob("*.yaml"):
        shutil.copy(f, folder / f.name)
    spec = yaml.safe_load((ROOT / "benchmarks" / "llama31_8b.yaml").read_text())
    tiny = spec["tiny"]
    for section, values in GPU_SIZED.items():
        tiny[section] = {**tiny.get(section, {}), **values}
    tiny["data"] = {**tiny["data"], "branching": 4}
    (folder / "llama31_8b.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))


def newest_record(folder: Path) -> dict | None:
    records = sorted(folder.glob("result_*.json"), key=lambda p: int(p.stem.split("_")[1]))
    return json.loads(records[-1].read_text()) if records else None


def summarise(rec: dict) -> dict:
    steps = [s["step_time_s"] for s in rec.get("steps", []) if s.get("step_time_s")]
    # the first steps carry allocator warm-up and kernel selection
    steady = steps[3:] or steps
    mem = rec.get("memory") or {}
    est, meas = mem.get("estimated") or {}, mem.get("measured") or {}
    pred = rec.get("prediction") or {}
    out = {"status": rec.get("status"), "reason": rec.get("reason"), "device": (rec.get("environment") or {}).get(
        "device"), "time_to_train_min": rec.get("time_to_train_min"), "steps": len(steps),
        "step_time_median_s": statistics.median(steady) if steady else None, "mfu_median": rec.get("mfu"),
        "predicted_step_time_s": pred.get("step_time_s"), "prediction_reason": pred.get("reason"),
        "compliance_ok": (rec.get("compliance") or {}).get("ok"), "quality_last": (rec.get("quality") or {}).get(
            "last")}
    if out["step_time_median_s"] and out["predicted_step_time_s"]:
        out["predicted_over_measured"] = out["predicted_step_time_s"] / out["step_time_median_s"]
    for k in ("params_bytes", "grads_bytes", "optimizer_bytes"):
        out[k] = {"estimated": est.get(k), "measured": meas.get(k)}
    out["activations"] = {"estimated_per_micro_batch": est.get("activations_per_micro_batch_bytes"),
                          "estimated_in_flight": est.get("activations_bytes"),
                          "measured_per_micro_batch": meas.get("activations_per_micro_batch_bytes")}
    out["total"] = {"estimated": est.get("total_bytes"), "other_estimated": est.get("other_bytes"),
                    "peak_allocated": meas.get("peak_allocated_bytes"),
                    "peak_reserved": meas.get("peak_reserved_bytes")}
    if meas.get("error"):
        out["measure_error"] = meas["error"]
    return out


def _sdpa_saved_bytes(shape: tuple[int, ...], dtype, backend=None) -> int:
    """Bytes saved for backward by one causal grouped-query SDPA call as mlbench makes it; `backend` forces one."""
    import contextlib

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    b, h, g, s, d = shape
    q = torch.randn(b, h, s, d, device="cuda", dtype=dtype, requires_grad=True)
    k, v = (torch.randn(b, g, s, d, device="cuda", dtype=dtype, requires_grad=True) for _ in "kv")
    saved: list[int] = []
    forced = sdpa_kernel(backend) if backend is not None else contextlib.nullcontext()
    with torch.autograd.graph.saved_tensors_hooks(lambda x: saved.append(x.nbytes) or x, lambda x: x), forced:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=h > g)
    out.sum().backward()
    return sum(saved)


def sdpa_kernels() -> dict:
    """For each shape and dtype: which SDPA backends accept the call mlbench makes (train/model/attention.py),
    and the bytes saved for backward by the default choice against the s x s probabilities' bytes."""
    import torch
    from torch.nn.attention import SDPBackend

    shapes = {"tiny_llama": (8, 4, 2, 64, 16), "gpu_sized": (2, 16, 8, 2048, 128)}  # b, heads, groups, s, d
    found: dict = {}
    for name, shape in shapes.items():
        b, h, _, s, _ = shape
        for dtype in (torch.float32, torch.bfloat16):
            row: dict = {"probabilities_bytes": b * h * s * s * torch.finfo(dtype).bits // 8}
            for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION,
                            SDPBackend.MATH):
                try:
                    row[backend.name] = {"ok": True, "saved_bytes": _sdpa_saved_bytes(shape, dtype, backend)}
                except RuntimeError as e:
                    row[backend.name] = {"ok": False, "why": str(e).splitlines()[0][:200]}
            row["default_saved_bytes"] = _sdpa_saved_bytes(shape, dtype)
            found[f"{name}_{str(dtype).split('.')[-1]}"] = row
    return found


def main(out: Path, tiny: bool = True, gpu_sized: bool = True) -> int:
    import torch

    if not torch.cuda.is_available():
        print("gpu_check: no CUDA GPU here; this check is for a machine with one", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    results, log = out / "results", out / "commands.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    summary: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "tiny": {}, "gpu_sized": {}}
    for name in TINY if tiny else ():
        rc, wall = sh([*CLI, "run", name, "--tiny", "--seed", "1", "--results", str(results), "--system", "tiny"],
                      env, log)
        rec = newest_record(results / "tiny" / name)
        summary["tiny"][name] = {"exit_code": rc, "wall_s": round(wall, 1), **(summarise(rec) if rec else {})}
        print(f"tiny {name}: exit {rc} in {wall:.1f} s", flush=True)
    bench_dir = out / "gpu_benchmarks"
    gpu_benchmarks(bench_dir)
    features = os.environ.get("GPU_CHECK_FEATURES", ",".join(FEATURES)).split(",")
    for label, flags in [(f, FEATURES[f]) for f in features] if gpu_sized else ():
        system = f"gpu_sized_{label}"
        rc, wall = sh([*CLI, "run", "llama31_8b", "--tiny", "--seed", "1", "--results", str(results), "--system",
                       system, "--hang-timeout", "120", *flags], {**env, "MLBENCH_BENCHMARKS": str(bench_dir)}, log)
        rec = newest_record(results / system / "llama31_8b")
        summary["gpu_sized"][label] = {"exit_code": rc, "wall_s": round(wall, 1),
                                       **(summarise(rec) if rec else {})}
        print(f"gpu-sized llama {label}: exit {rc} in {wall:.1f} s", flush=True)
    try:
        summary["sdpa_kernels"] = sdpa_kernels()
    except Exception as e:  # a probe: its failure must not lose the figures above
        summary["sdpa_kernels"] = {"error": repr(e)}
    for cmd in (["check", str(results)], ["score", str(results / "tiny" / "gpt3"), "--json"]):
        rc, _ = sh([*CLI, *cmd], env, log, timeout=60, late=True)
        summary[f"mlbench {cmd[0]}"] = rc
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    # --skip-tiny / --skip-gpu-sized: rerun one part within a short device lease
    args = [a for a in sys.argv[1:] if not a.startswith("--skip-")]
    sys.exit(main(Path(args[0] if args else "gpu_check_out"), tiny="--skip-tiny" not in sys.argv,
                  gpu_sized="--skip-gpu-sized" not in sys.argv))
