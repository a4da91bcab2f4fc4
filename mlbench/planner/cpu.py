"""The CPU as a planner device: measured once on this machine with one thread a process (as each tiny-run rank
uses) and cached in ~/.cache/mlbench/cpu-device.json, keyed by the processor.

Measured: the fp32 GEMM rate at the tiny models' shapes; memory copy bandwidth; megatron-core's forward and
backward of one micro-batch of the tiny gpt3 model, per transformer layer and for the rest (at tiny sizes a step
is mostly eager-mode dispatch, not arithmetic: these times, not the FLOPs, predict it); the optimizer's time per
parameter tensor (megatron-core's DDP and optimizer); and the latency of one gloo all-reduce between two
processes on this host.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from mlbench import user_cache


def _cache_file() -> Path:
    return user_cache.folder() / "cpu-device.json"


CACHE = _cache_file()
# The tiny models' GEMM shapes (tokens x in -> out): micro-batch 8 x 64 tokens, hidden 64, ffn 256, vocab 128
SHAPES = [(512, 64, 192), (512, 64, 64), (512, 64, 256), (512, 256, 64), (512, 64, 128)]
VERSION = 11  # of what is measured: an older cache is measured again
# A measurement's fields: its texts, and the figures the predictions read, each within what one thread of a CPU
# can measure of the tiny gpt3 model (low, high): a cache holding another is measured again. Its costs divide
# (0 for a layer and the head both was a ZeroDivisionError in `plan --device cpu --tiny`) and multiply (1e308 made
# every step time infinite or NaN). A time is above a tenth of a microsecond (a timer's resolution, far below any
# step or collective) and at most ten minutes (a tiny step takes milliseconds); a rate is above 1e6 (a megaFLOP or
# a megabyte a second) and below 1e15 FLOP/s (a petaFLOP/s: no CPU thread) or 1e13 bytes/s (10 TB/s: no memory).
_TEXTS = {"key", "megatron_shapes", "measured_at"}
_TIME, _CLAMPED = (1e-7, 600.0), (0.0, 600.0)  # the probe's differences of two timings are clamped at 0: 0 is one
_FIGURES: dict[str, tuple[float, float]] = {
    "gemm_flops": (1e6, 1e15), "bytes_per_s": (1e6, 1e13), "step_1_micro_s": _TIME, "step_2_micro_s": _TIME,
    "step_fb_s": _TIME, "collective_latency_s": _TIME, "optimizer_s_per_tensor": _CLAMPED,
    "megatron_layer_s": _CLAMPED, "megatron_head_s": _CLAMPED,
    "megatron_probe_layer_flops": (1.0, 1e15), "megatron_probe_head_flops": (1.0, 1e15)}


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


# One child process (a one-process megatron world of its own) measures both: first mlbench's training step, then
# megatron-core's forward + backward and optimizer alone.
PROBE = """
import json, os, statistics, time
os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MLBENCH_THREADS="1")
from mlbench import registry
from mlbench.layout import resolve
from mlbench.run_plan import RunPlan
from mlbench.train.build import build, init_distributed
tiny = registry.load("gpt3", tiny=True, directory=registry.SHIPPED_DIR)
mbs = tiny.train.micro_batch_size
plan = RunPlan(benchmark=tiny, layout=resolve(tiny, 1, 1, global_batch_size=2 * mbs).as_dict(), seed=1,
               run_dir=os.getcwd(), system="probe")
device = init_distributed(plan)
from mlbench.train.step import Stepper
stepper = Stepper(plan, build(plan, device), True)
import torch
model = stepper.parts.model[0]
tokens = torch.randint(0, tiny.model.vocab_size, (mbs, tiny.model.seq_length))
positions = torch.arange(tiny.model.seq_length).expand(mbs, -1)
step = [0]
def train_step(gbs):
    stepper.gbs = gbs
    stepper.train_step(step[0])
    step[0] += 1
def forward_backward(_):
    model.zero_grad_buffer()
    model(tokens, positions, None, labels=tokens).float().mean().backward()
# interleaved rounds: the machine's load moves all three alike
cases = {"step_1_micro_s": (train_step, mbs), "step_2_micro_s": (train_step, 2 * mbs),
         "step_fb_s": (forward_backward, 0)}
times = {k: [] for k in cases}
for r in range(8):
    for k, (fn, arg) in cases.items():
        t0 = time.perf_counter()
        for _ in range(4):
            fn(arg)
        if r:  # the first round warms up
            times[k].append((time.perf_counter() - t0) / 4)
out = {k: statistics.median(v) for k, v in times.items()}

import dataclasses
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from mlbench.planner.cpu import _rate
from mlbench.planner.op_flops import flops_by_op
from mlbench.train.model.build import build as build_model
from mlbench.train.model.config import transformer_config
def measure(layers):
    m = dataclasses.replace(tiny.model, num_layers=layers)
    config = transformer_config(m, tp=1, pp=1, vp=1, cp=1, bf16=False)
    model = DistributedDataParallel(config=config, ddp_config=DistributedDataParallelConfig(),
                                    module=build_model(m, config))
    optimizer = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-3, clip_grad=1.0), [model])
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
out.update(layer_s=max(0.0, two - one), head_s=max(0.0, 2 * one - two), optimizer_s_per_tensor=max(0.0, per_tensor),
           layer_flops=(by_op["layer_gemm"] + by_op["layer_attention"]) * mbs, head_flops=by_op["head"] * mbs)
print(json.dumps(out))
"""


def _probe() -> dict:
    """In a child process, which sets up a one-process megatron world: the training loop's own step
    (mlbench.train.step: data, megatron-core's schedule, loss statistics, optimizer and schedule) of the tiny gpt3
    model at one process, timed at one and at two micro-batches a step (what a step costs beyond the model's
    forward and backward); and megatron-core's own forward + backward of one micro-batch on one thread, per
    transformer layer and for the rest (embedding, logits, loss), from models of one and two layers, with its
    DistributedDataParallel gradient finish and optimizer step per parameter tensor."""
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300,
                             cwd=tmp, env=dict(os.environ, PYTHONWARNINGS="ignore"))
    if out.returncode:
        raise RuntimeError(f"measuring megatron-core and mlbench's step on this CPU failed: "
                           f"{out.stderr.strip()[-500:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _collective_worker(rank: int, store: str, out) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    # the two meet through a file, not a port: a port found free and released can be taken before rank 0 binds it
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
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
    import tempfile

    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        procs = [ctx.Process(target=_collective_worker, args=(r, f"{tmp}/store", out)) for r in range(2)]
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
    costs = _probe()
    return {"key": _key(), "gemm_flops": gemm, "bytes_per_s": bandwidth,
            **{k: costs[k] for k in ("step_1_micro_s", "step_2_micro_s", "step_fb_s")},
            "optimizer_s_per_tensor": costs["optimizer_s_per_tensor"],
            "megatron_layer_s": costs["layer_s"], "megatron_head_s": costs["head_s"],
            "megatron_probe_layer_flops": costs["layer_flops"], "megatron_probe_head_flops": costs["head_flops"],
            "megatron_shapes": "tiny gpt3: micro-batch 8 x 64 tokens, hidden 64, ffn 256, vocabulary 128",
            "collective_latency_s": _collective_latency(), "measured_at": time.strftime("%FT%TZ", time.gmtime())}


def cached() -> dict | None:
    """This machine's cached measurement, if it has a usable one: a cache that cannot be read, is garbled, lacks a
    figure or holds one no CPU measures (`_FIGURES`) is measured again (and replaced), never a traceback; nor a hang
    (a pipe in its place: load_json)."""
    return _cache()[0]


def _cache() -> tuple[dict | None, str]:
    """(The cached measurement or None, why a cache that is there is not usable): the why is "" where there is none,
    or it is another machine's (or an older mlbench's: VERSION)."""
    from mlbench.logfile import load_json, shown

    try:
        data = load_json(CACHE)
    except (FileNotFoundError, NotADirectoryError):
        return None, ""
    except OSError as e:
        return None, f"cannot be read ({e.strerror or e})"
    except ValueError as e:
        return None, f"is not JSON ({str(e).splitlines()[0][:80]})"
    if not isinstance(data, dict):
        return None, "is not a JSON object"
    if data.get("key") != _key():
        return None, ""
    for name, (low, high) in _FIGURES.items():
        v = data.get(name)
        if name not in data or type(v) not in (int, float) or not low <= v <= high:
            return None, f"has {name} {shown(v, 40) if name in data else 'missing'}, where a measurement is from " \
                         f"{low:g} to {high:g}"
    if not data["megatron_layer_s"] + data["megatron_head_s"] > 0:  # their sum is a one-layer model's time
        return None, "has megatron_layer_s and megatron_head_s both 0 (their sum is a one-layer model's time)"
    return data, ""


def measured() -> dict:
    """The cached measurement for this machine, measuring (about 17 s, once) when there is none. A cache that is
    there but not usable is measured again with a note saying why; a cache folder that cannot be written costs a
    note, and a measurement next time."""
    data, _ = _cache()
    if data is not None:
        return data
    with _measuring():
        data, why_now = _cache()  # another process that held the lock measured meanwhile
        if data is not None:
            return data
        return _measure_and_keep(why_now)


@contextlib.contextmanager
def _measuring():
    """One process of this user measures at a time (runs or test workers starting together measured side by side:
    each about 17 s of two cores, and each slower for the others); without a cache folder, no lock."""
    import fcntl

    try:
        CACHE.parent.mkdir(parents=True, exist_ok=True)
        fd: int | None = os.open(CACHE.with_suffix(".lock"), os.O_CREAT | os.O_RDWR, 0o644)
    except OSError:
        fd = None
    try:
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        if fd is not None:
            os.close(fd)


def _measure_and_keep(why: str) -> dict:
    if why:
        print(f"note: the cached CPU measurement {CACHE} {why}; measuring this CPU again (about 17 s)", file=sys.stderr)
    data = measure()
    try:
        user_cache.write(CACHE, json.dumps(data, indent=1))
    except OSError as e:
        print(f"note: the CPU measurement is not cached ({CACHE}: {e.strerror or e}); set MLBENCH_CACHE to a folder "
              f"you can write, or it is measured again next time", file=sys.stderr)
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


def _tensors(m, pp: int) -> float:
    return 12 * m.num_layers / pp + 4  # parameter tensors a rank updates: ~12 a layer, embeddings and norms


def harness(cost: dict) -> tuple[float, float]:
    """What mlbench's training step costs beyond megatron-core's forward + backward and optimizer (data, the
    pipeline schedule's per-micro-batch work, loss statistics, the learning-rate schedule): (per micro-batch, per
    step) seconds, from the real step of the tiny gpt3 model at one and two micro-batches less the probe's model
    and optimizer times. Never below zero (two measurements, each moved by the machine's load); none for figures
    measured without the step timings."""
    from mlbench import registry

    if "step_1_micro_s" not in cost:
        return 0.0, 0.0
    tiny = registry.load("gpt3", tiny=True, directory=registry.SHIPPED_DIR).model
    per_micro = cost["step_2_micro_s"] - cost["step_1_micro_s"]
    fixed = cost["step_1_micro_s"] - per_micro
    return max(0.0, per_micro - cost["step_fb_s"]), max(0.0, fixed - _tensors(tiny, 1) * cost["optimizer_s_per_tensor"])


def model_level(cost: dict) -> float:
    """The probe's layer and head times scaled to the forward + backward timed beside the real step (the same
    process, interleaved): the two probes run seconds apart, and a shared machine's load moves between them."""
    from mlbench import registry

    if "step_fb_s" not in cost:
        return 1.0
    tiny = registry.load("gpt3", tiny=True, directory=registry.SHIPPED_DIR).model
    return cost["step_fb_s"] / (tiny.num_layers * cost["megatron_layer_s"] + cost["megatron_head_s"])


def predict(m, layout, device) -> dict:
    """Seconds per step on the CPU, where tiny models make a step mostly eager-mode dispatch: megatron-core's
    measured forward + backward time of a tiny layer and of the rest (embedding, logits, loss) per micro-batch,
    plus the arithmetic beyond the probe's at the measured GEMM rate; the training loop's own work per micro-batch
    and per step (`harness`); each collective a measured gloo latency (tensor parallel: 2 all-reduces a layer
    forward and 2 backward, 4 in the vocabulary-parallel embedding and loss; data parallel: one gradient
    all-reduce a step; every multi-rank step: the loss statistics' all-reduce; pipeline: a send and a receive a
    micro-batch); the optimizer per tensor."""
    from mlbench import flops
    from mlbench.planner.op_flops import flops_by_op

    cost = device.extra["measured"]
    rate, latency = device.peaks["fp32"], device.collective_latency_s
    tp, pp, vp, dp, cp = layout.tp, layout.pp, layout.vp, layout.dp, layout.cp
    micro = layout.num_microbatches
    by_op = flops_by_op(m, tp)
    per_micro = layout.micro_batch_size / (tp * cp)
    layer_flops = (by_op["layer_gemm"] + by_op["layer_attention"]) * per_micro
    # the probe's times hold its own arithmetic: only what this model does beyond it is added, at the GEMM rate
    layer_extra = max(0.0, layer_flops - cost["megatron_probe_layer_flops"]) / rate
    head_extra = max(0.0, by_op["head"] * per_micro - cost["megatron_probe_head_flops"]) / rate
    level = model_level(cost)
    layer_s, head_s = cost["megatron_layer_s"] * level, cost["megatron_head_s"] * level
    layer, head = layer_s + layer_extra, head_s + head_extra
    harness_micro, harness_step = harness(cost)
    tp_comm = (4 * m.num_layers / pp + 4 / pp) * latency if tp > 1 else 0.0
    stage = m.num_layers / pp * layer + head / pp + tp_comm + harness_micro
    bubble = (pp - 1) / vp * (stage + 2 * latency)
    pp_comm = 2 * latency * micro if pp > 1 else 0.0
    params = flops.param_count(m, tp) / (tp * pp)
    dp_comm = latency + 2 * params * 4 / device.scaleout_bytes_per_s if dp * cp > 1 else 0.0
    framework = micro * (m.num_layers * layer_s + head_s) / pp + pp_comm
    stats_comm = latency if layout.world_size > 1 else 0.0  # the loss statistics' all-reduce (train/step.py)
    terms = {"gemm": micro * (m.num_layers * layer_extra + head_extra) / pp, "attention": 0.0,
             "elementwise": 0.0, "tp_comm": micro * tp_comm, "cp_comm": 0.0, "recompute": 0.0,
             "framework": framework, "harness": micro * harness_micro + harness_step + stats_comm,
             "pipeline_bubble": bubble, "dp_comm": dp_comm,
             "optimizer": _tensors(m, pp) * cost["optimizer_s_per_tensor"]}
    return {"step_time_s": sum(terms.values()), "terms_s": terms,
            "links_bytes_per_s": {"collective_latency_s": latency}}
