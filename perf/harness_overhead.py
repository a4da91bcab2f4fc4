"""What the harness costs over a bare megatron-core loop: `python perf/harness_overhead.py [PAIRS]`.

Alternates, PAIRS times (the machine's speed drifts), two ways of training the tiny gpt3 model:
- harness: `mlbench run gpt3 --tiny --seed 1` as a user runs it (CLI, launcher, supervision, MLPerf log,
  events, record, compliance check), timed from outside;
- bare: the same model (built by the same megatron-core code), the same data source, optimizer, schedule and
  micro-batches, trained for the same steps with evaluations at the same steps by a loop of a few lines in one
  process started directly: no launcher, no log, no record, no checker.
Prints each run's whole wall time and median per-step time, the medians and the harness / bare ratios.
Targets (issue 19): whole wall <= 1.10x, per-step <= 1.02x.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SEED = 1

BARE = r"""
import json, os, sys, time
import numpy as np, torch, torch.distributed as dist
from mlbench.train import cpu_compat
cpu_compat.enable()
from megatron.core import parallel_state as ps, tensor_parallel
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
from megatron.core.pipeline_parallel import get_forward_backward_func
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
from mlbench import registry
from mlbench.train.data.source import markov_source
from mlbench.train.model import build, transformer_config

steps, eval_steps, seed = int(sys.argv[1]), set(json.loads(sys.argv[2])), int(sys.argv[3])
torch.set_num_threads(1)
dist.init_process_group("gloo", rank=0, world_size=1)
ps.initialize_model_parallel(1, 1)
torch.manual_seed(seed)
model_parallel_cuda_manual_seed(seed)
b = registry.load("gpt3", tiny=True)
m, o, gbs, mbs = b.model, b.optimizer, b.train.global_batch_size, b.train.micro_batch_size
config = transformer_config(m, tp=1, pp=1, vp=1, cp=1, bf16=False)
model = DistributedDataParallel(config=config, ddp_config=DistributedDataParallelConfig(grad_reduce_in_fp32=True),
                                module=build(m, config))
opt = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=o.lr, min_lr=o.min_lr, weight_decay=o.weight_decay,
                             adam_beta1=o.beta1, adam_beta2=o.beta2, adam_eps=o.eps, clip_grad=o.clip_grad), [model])
sched = OptimizerParamScheduler(opt, init_lr=0.0, max_lr=o.lr, min_lr=o.min_lr, lr_warmup_steps=o.warmup_steps,
                                lr_decay_steps=o.warmup_steps + o.decay_steps, lr_decay_style=o.decay_style,
                                start_wd=o.weight_decay, end_wd=o.weight_decay, wd_incr_steps=1,
                                wd_incr_style="constant")
config.finalize_model_grads_func = finalize_model_grads
config.grad_scale_func = opt.scale_loss
fwd_bwd = get_forward_backward_func()
src = markov_source(b)
pos = torch.arange(m.seq_length).unsqueeze(0).expand(mbs, -1).contiguous()

def batches(tokens):
    t = torch.from_numpy(tokens)
    return [(t[i:i + mbs, :-1], t[i:i + mbs, 1:]) for i in range(0, len(t), mbs)]

def step_fn(it, chunk):
    x, y = next(it)
    logits = chunk(x, pos[:len(x)], None)
    def loss(out):
        per = tensor_parallel.vocab_parallel_cross_entropy(out.float().contiguous(), y)
        return per.sum(), torch.tensor(per.numel(), dtype=torch.int), {"loss": per.sum().detach()}
    return logits, loss

eval_rng = np.random.default_rng([b.data.seed, 2**31 - 1])
eval_set = batches(src.sample(b.eval.samples, m.seq_length + 1, eval_rng))
times = []
for step in range(steps):
    t0 = time.perf_counter()
    rng = np.random.default_rng([seed, step])
    data = batches(src.sample(gbs, m.seq_length + 1, rng))
    model.zero_grad_buffer(); opt.zero_grad()
    fwd_bwd(forward_step_func=step_fn, data_iterator=iter(data), model=model, num_microbatches=len(data),
            seq_length=m.seq_length, micro_batch_size=mbs, forward_only=False)
    opt.step(); sched.step(increment=1)
    times.append(time.perf_counter() - t0)
    if step + 1 in eval_steps:
        model.eval()
        with torch.no_grad():
            fwd_bwd(forward_step_func=step_fn, data_iterator=iter(eval_set), model=model,
                    num_microbatches=len(eval_set), seq_length=m.seq_length, micro_batch_size=mbs, forward_only=True)
        model.train()
print(json.dumps({"step_times": times}))
sys.stdout.flush()
os._exit(0)
"""


def harness(tmp: Path, i: int) -> dict:
    results = tmp / f"h{i}"
    t0 = time.perf_counter()
    proc = subprocess.run([str(Path(sys.executable).with_name("mlbench")), "run", "gpt3", "--tiny", "--seed",
                           str(SEED), "--results", str(results), "--system", "perf"], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"harness run failed ({proc.returncode}): {proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    record = json.loads(next(results.rglob("result_*.json")).read_text())
    return {"wall": wall, "step_times": [s["step_time"] for s in record["steps"]],
            "eval_steps": [e["step"] for e in record["evals"]]}


def bare(steps: int, eval_steps: list[int]) -> dict:
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT="29533", PYTHONWARNINGS="ignore")
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", BARE, str(steps), json.dumps(eval_steps), str(SEED)],
                          capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"bare loop failed ({proc.returncode}): {proc.stderr[-3000:]}")
    return {"wall": wall, "step_times": json.loads(proc.stdout.strip().splitlines()[-1])["step_times"]}


def main(pairs: int) -> None:
    walls: dict[str, list[float]] = {"harness": [], "bare": []}
    steps: dict[str, list[float]] = {"harness": [], "bare": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(pairs):
            h = harness(Path(tmp), i)
            b = bare(len(h["step_times"]), h["eval_steps"])
            for name, r in (("harness", h), ("bare", b)):
                walls[name].append(r["wall"])
                steps[name].append(statistics.median(r["step_times"]))
                print(f"{name:7} run {i + 1}: wall {r['wall']:6.2f} s, {len(r['step_times'])} steps, "
                      f"median step {1000 * steps[name][-1]:6.2f} ms", flush=True)
    hw, bw = statistics.median(walls["harness"]), statistics.median(walls["bare"])
    hs, bs = statistics.median(steps["harness"]), statistics.median(steps["bare"])
    print(f"median wall: harness {hw:.2f} s, bare {bw:.2f} s: {hw / bw:.3f}x (target <= 1.10x)")
    print(f"median step: harness {1000 * hs:.2f} ms, bare {1000 * bs:.2f} ms: {hs / bs:.3f}x (target <= 1.02x)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
