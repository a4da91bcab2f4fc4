"""The CPU as a planner device: measured once on this machine with one thread a process (as each tiny-run rank
uses) and cached in ~/.cache/mlbench/cpu-device.json, keyed by the processor.

Measured: the fp32 GEMM rate at the tiny models' shapes; memory copy bandwidth; megatron-core's forward and
backward of one micro-batch of the tiny gpt3 model, per transformer layer and for the rest (at tiny sizes a step
is mostly eager-mode dispatch, not arithmetic: these times, not the FLOPs, predict it); the optimizer's time per
parameter tensor (megatron-core's DDP and optimizer); and the latency of one gloo all-reduce between two
processes on this host.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import socket
import statistics
import time
from pathlib import Path

CACHE = Path(os.environ.get("MLBENCH_CACHE", Path.home() / ".cache" / "mlbench")) / "cpu-device.json"
# The tiny models' GEMM shapes (tokens x in -> out): micro-batch 8 x 64 tokens, hidden 64, ffn 256, vocab 128
SHAPES = [(512, 64, 192), (512, 64, 64), (512, 64, 256), (512, 256, 64), (512, 64, 128)]
VERSION = 8  # of what is measured: an older cache is measured again


def _key() -> str:
    return f"v{VERSION} {platform.machine()} {platform.processor()} {os.cpu_count()} cpus"


def _rate(fn, seconds: float) -> float:
    """Seconds per call of fn, the median of 5 timed rounds after a warm-up."""
    fn()
    rounds = []
    for _ in range(5):
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds / 5:
            fn()
            n += 1
        rounds.append((time.perf_counter() - t0) / n)
    return statistics.median(rounds)


MEGATRON_PROBE = """
import dataclasses, json, torch
torch.set_num_threads(1)
from mlbench.train import one_process_world
one_process_world.init()
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from mlbench import registry
from mlbench.planner.cpu import _rate
from mlbench.planner.step_time import flops_by_op
from mlbench.train.model.build import build
from mlbench.train.model.config import transformer_config
tiny = registry.load("gpt3", tiny=True)
mbs = tiny.train.micro_batch_size
def measure(layers):
    m = dataclasses.replace(tiny.model, num_layers=layers)
    config = transformer_config(m, tp=1, pp=1, vp=1, cp=1, bf16=False)
    model = DistributedDataParallel(config=config, ddp_config=DistributedDataParallelConfig(), module=build(m, config))
    optimizer = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-3, clip_grad=1.0), [model])
    tokens = torch.randint(0, m.vocab_size, (mbs, m.seq_length))
    positions = torch.arange(m.seq_length).expand(mbs, -1)
    def forward_backward():
        model.zero_grad_buffer()
        model(tokens, positions, None, labels=tokens).float().mean().backward()
    def step():
        forward_backward()
        finalize_model_grads([model])
        optimizer.step()
    fb = _rate(forward_backward, 1.0)
    return fb, (_rate(step, 1.0) - fb) / sum(1 for _ in model.parameters())
(one, _), (two, per_tensor) = measure(1), measure(2)
by_op = flops_by_op(tiny.model, 1)
# the difference of two timings: a busy machine can push either below zero
print(json.dumps({"layer_s": max(0.0, two - one), "head_s": max(0.0, 2 * one - two),
                  "optimizer_s_per_tensor": max(0.0, per_tensor),
                  "layer_flops": (by_op["layer_gemm"] + by_op["layer_attention"]) * mbs,
                  "head_flops": by_op["head"] * mbs}))
"""


def _megatron_costs() -> dict:
    """megatron-core's own forward + backward of one micro-batch of the tiny gpt3 model on this CPU, one thread:
    per transformer layer and for the rest (embedding, logits, loss), from models of one and two layers; and its
    DistributedDataParallel gradient finish and optimizer step, per parameter tensor. In a child process: it sets
    up a one-process megatron world."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", MEGATRON_PROBE], capture_output=True, text=True, timeout=300)
    if out.returncode:
        raise RuntimeError(f"measuring megatron-core on this CPU failed: {out.stderr.strip()[-500:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _collective_worker(rank: int, port: int, out) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    t = torch.randn(512 * 64)  # a tiny micro-batch's activations
    a, b = torch.randn(512, 64), torch.randn(64, 256)
    times = []
    for i in range(100):
        # between collectives each rank computes, as a training rank does: the two reach the all-reduce at
        # slightly different times and must both be scheduled to finish it (an idle, barrier-synchronised pair
        # measures far less than training sees)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 0.002:
            a @ b
        t0 = time.perf_counter()
        dist.all_reduce(t)
        if i >= 10:
            times.append(time.perf_counter() - t0)
    if rank == 0:
        out.put(statistics.median(times))
    dist.destroy_process_group()


def _collective_latency() -> float:
    """Median seconds of a gloo all-reduce of a tiny micro-batch's activations between two computing processes."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_collective_worker, args=(r, port, out)) for r in range(2)]
    for p in procs:
        p.start()
    latency = out.get(timeout=120)
    for p in procs:
        p.join(30)
    return latency


def measure(seconds: float = 2.0) -> dict:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        mats = [(torch.randn(m, k), torch.randn(k, n)) for m, k, n in SHAPES]
        flops_each = sum(2 * m * k * n for m, k, n in SHAPES)
        gemm = flops_each / _rate(lambda: [a @ b for a, b in mats], seconds / 2)
        src, dst = torch.randn(8 << 20), torch.empty(8 << 20)  # 32 MiB each: beyond the caches
        bandwidth = 2 * src.numel() * 4 / _rate(lambda: dst.copy_(src), seconds / 4)  # read + write
    finally:
        torch.set_num_threads(threads)
    costs = _megatron_costs()
    return {"key": _key(), "gemm_flops": gemm, "bytes_per_s": bandwidth,
            "optimizer_s_per_tensor": costs["optimizer_s_per_tensor"],
            "megatron_layer_s": costs["layer_s"], "megatron_head_s": costs["head_s"],
            "megatron_probe_layer_flops": costs["layer_flops"], "megatron_probe_head_flops": costs["head_flops"],
            "megatron_shapes": "tiny gpt3: micro-batch 8 x 64 tokens, hidden 64, ffn 256, vocabulary 128",
            "collective_latency_s": _collective_latency(), "measured_at": time.strftime("%FT%TZ", time.gmtime())}


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


def device(entry, m: dict | None = None):
    """The `cpu` entry of devices.yaml filled with this machine's measured figures (`m`: a fresh `measure()`,
    else the cached ones)."""
    import psutil

    m = m or measured()
    return dataclasses.replace(entry, peaks={"fp32": m["gemm_flops"]},
                               memory_bytes=float(psutil.virtual_memory().total),
                               hbm_bytes_per_s=m["bytes_per_s"], nvlink_bytes_per_s=m["bytes_per_s"],
                               scaleout_bytes_per_s=m["bytes_per_s"] / 2,
                               collective_latency_s=m["collective_latency_s"], extra={"measured": m})
