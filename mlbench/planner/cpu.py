"""The CPU as a planner device: its fp32 GEMM rate and memory bandwidth, measured once on this machine with one
thread (as each tiny-run rank uses) and cached in ~/.cache/mlbench/cpu-device.json, keyed by the processor."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import time
from pathlib import Path

CACHE = Path(os.environ.get("MLBENCH_CACHE", Path.home() / ".cache" / "mlbench")) / "cpu-device.json"
# The tiny models' GEMM shapes (tokens x in -> out): micro-batch 8 x 64 tokens, hidden 64, ffn 256, vocab 128
SHAPES = [(512, 64, 192), (512, 64, 64), (512, 64, 256), (512, 256, 64), (512, 64, 128)]


def _key() -> str:
    return f"{platform.machine()} {platform.processor()} {os.cpu_count()} cpus"


def measure(seconds: float = 2.0) -> dict:
    """fp32 GEMM FLOP/s at the tiny shapes (forward and the two backward products) and copy bandwidth, 1 thread."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        mats = [(torch.randn(m, k), torch.randn(k, n)) for m, k, n in SHAPES]
        flops_each = sum(2 * m * k * n for m, k, n in SHAPES)
        for a, b in mats:  # warm up
            a @ b
        reps, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds / 2:
            for a, b in mats:
                a @ b
            reps += 1
        gemm = reps * flops_each / (time.perf_counter() - t0)
        src, dst = torch.randn(8 << 20), torch.empty(8 << 20)  # 32 MiB each: beyond the caches
        reps, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds / 2:
            dst.copy_(src)
            reps += 1
        bandwidth = reps * 2 * src.numel() * 4 / (time.perf_counter() - t0)  # read + write
    finally:
        torch.set_num_threads(threads)
    return {"key": _key(), "gemm_flops": gemm, "bytes_per_s": bandwidth, "measured_at": time.strftime("%FT%TZ")}


def measured() -> dict:
    """The cached measurement for this machine, measuring (a few seconds) when there is none."""
    if CACHE.exists():
        data = json.loads(CACHE.read_text())
        if data.get("key") == _key():
            return data
    data = measure()
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    tmp = CACHE.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(CACHE)
    return data


def device(entry) -> object:
    """The `cpu` entry of devices.yaml filled with this machine's measured figures."""
    import psutil

    m = measured()
    return dataclasses.replace(entry, peaks={"fp32": m["gemm_flops"]},
                               memory_bytes=float(psutil.virtual_memory().total),
                               hbm_bytes_per_s=m["bytes_per_s"], nvlink_bytes_per_s=m["bytes_per_s"],
                               scaleout_bytes_per_s=m["bytes_per_s"] / 2, extra={"measured": m})
