"""The training loop: one path for every benchmark and size, run by every rank (`python -m mlbench.train`).

Initialisation (untimed, MLPerf's init_start..init_stop) builds the model, optimizer and data; the timed
region (run_start..run_stop) trains in blocks of one eval interval, evaluates after each block, and stops
with `success` when the quality target is reached or `aborted` when the step budget runs out or the run
fails. Rank 0 alone writes the MLPerf log and the progress events the launcher shows and watches.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from functools import partial
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from mlbench.mlperf_log import MLPerfLog, write_preamble
from mlbench.run_plan import eval_schedule, max_steps
from mlbench.spec import Benchmark, evaluate
from mlbench.train import cpu_compat
from mlbench.train.plan import RunPlan


class Events:
    """Progress events as JSON lines, read by the launcher for the live display and hang detection."""

    def __init__(self, path: Path | None):
        self._f = open(path, "a", buffering=1) if path else None  # noqa: SIM115 - lives for the run

    def emit(self, kind: str, **fields) -> None:
        if self._f:
            self._f.write(json.dumps({"event": kind, "time": time.time(), **fields}) + "\n")


class Aborted(Exception):
    pass


def _on_sigterm(signum, frame):  # torchrun and SLURM send SIGTERM before killing
    raise Aborted(f"signal {signal.Signals(signum).name}")


def train(plan: RunPlan) -> int:
    rank = int(os.environ.get("RANK", "0"))
    signal.signal(signal.SIGTERM, _on_sigterm)
    log = MLPerfLog(plan.log_path) if rank == 0 else None
    events = Events(plan.events_path if rank == 0 else None)
    bench = plan.benchmark
    try:
        status, save = _train(plan, bench, rank, log, events)
    except (Aborted, Exception) as e:  # any failure is an aborted run, logged as such
        reason = _reason(e)
        if log:
            log.end("run_stop", metadata={"status": "aborted", "reason": reason})
            events.emit("stopped", status="aborted", reason=reason)
        print(f"[rank {rank}] run aborted: {reason}", file=sys.stderr, flush=True)
        os._exit(3)  # skip interpreter teardown: peers may be gone and collectives would hang
    if plan.save_checkpoint and save:  # after run_stop, untimed; a failure here leaves the run's result alone
        events.emit("checkpoint_saving", path=plan.save_checkpoint)
        t0 = time.perf_counter()
        try:
            save()
        except (Aborted, Exception) as e:
            events.emit("checkpoint_failed", path=plan.save_checkpoint, reason=_reason(e))
            print(f"[rank {rank}] checkpoint not saved: {_reason(e)}", file=sys.stderr, flush=True)
            os._exit(4)
        events.emit("checkpoint_saved", path=plan.save_checkpoint, seconds=time.perf_counter() - t0)
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0 if status == "success" else 1


def _reason(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}".splitlines()[0][:300]


def _train(plan: RunPlan, bench: Benchmark, rank: int, log: MLPerfLog | None,
           events: Events) -> tuple[str, Callable[[], None] | None]:
    """Trains to run_stop; returns the status and what saves the final state (None for a dry run)."""
    from mlperf_logging.mllog import constants as C

    layout = plan.layout
    gbs = layout["global_batch_size"]
    if log:
        write_preamble(plan, log)
    if plan.dry_run:
        return "success", None

    on_cpu = cpu_compat.enable()
    if not on_cpu:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    torch.set_num_threads(max(1, int(os.environ.get("MLBENCH_THREADS", "1"))))
    dist.init_process_group("gloo" if on_cpu else "nccl", timeout=timedelta(seconds=120))
    # Every rank uses rank 0's seed (the one logged): nodes started separately may have drawn their own.
    seed_t = torch.tensor([plan.seed], dtype=torch.int64)
    dist.broadcast(seed_t, src=0)
    plan.seed = int(seed_t.item())

    from megatron.core import parallel_state as ps
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from mlbench import flops, hardware
    from mlbench.train import checkpoint, lamb, schedule
    from mlbench.train import data as data_lib
    from mlbench.train import model as model_lib
    from mlbench.train import objective as objective_lib

    tp, pp, vp, cp, dp = layout["tp"], layout["pp"], layout["vp"], layout["cp"], layout["dp"]
    mbs = layout["micro_batch_size"]
    ps.initialize_model_parallel(tp, pp, vp if vp > 1 else None, context_parallel_size=cp)
    torch.manual_seed(plan.seed)
    model_parallel_cuda_manual_seed(plan.seed)

    bf16 = not on_cpu and bench.train.precision == "bf16"
    config = model_lib.transformer_config(
        bench.model, tp=tp, pp=pp, vp=vp, cp=cp, bf16=bf16,
        account_for_embedding_in_pipeline_split=layout.get("account_for_embedding_in_pipeline_split", False),
        account_for_loss_in_pipeline_split=layout.get("account_for_loss_in_pipeline_split", False))
    chunks = [model_lib.build(bench.model, config, vp_stage=i if vp > 1 else None) for i in range(vp)]
    if not on_cpu:
        # As megatron-LM places a model: megatron's parallel layers are built on the GPU, but torch norms and
        # embeddings (and mlbench's post-LN norms) on the CPU, so the whole chunk is moved; bf16 through
        # megatron's Float16Module, which casts the first stage's inputs and the last stage's outputs.
        from megatron.core.transformer.module import Float16Module

        chunks = [c.cuda(torch.cuda.current_device()) for c in chunks]
        if bf16:
            chunks = [Float16Module(config, c) for c in chunks]
    ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=False,
                                               use_distributed_optimizer=False)
    model = [DistributedDataParallel(config=config, ddp_config=ddp_config, module=c) for c in chunks]

    o = bench.optimizer
    opt_config = OptimizerConfig(
        optimizer="adam", lr=evaluate(o.lr, global_batch_size=gbs), min_lr=evaluate(o.min_lr, global_batch_size=gbs),
        weight_decay=o.weight_decay, adam_beta1=o.beta1, adam_beta2=o.beta2, adam_eps=o.eps,
        clip_grad=o.clip_grad, bf16=bf16, params_dtype=config.params_dtype,
    )
    # Adam(W) as megatron builds it, or LAMB inside the same megatron wrapper (clipping, main grads)
    optimizer = lamb.megatron_optimizer(opt_config, model, o.name, o.decay_norms_and_biases)
    scheduler = schedule.build(optimizer, o, gbs,
                               init_step=int(evaluate(bench.train.init_checkpoint_step, global_batch_size=gbs)))
    config.finalize_model_grads_func = finalize_model_grads
    config.grad_scale_func = optimizer.scale_loss
    fwd_bwd = get_forward_backward_func()
    if plan.init_checkpoint:  # untimed: MLPerf loads the starting checkpoint before run_start
        t0 = time.perf_counter()
        loaded = checkpoint.load(plan.init_checkpoint, model, optimizer, bench.model.vocab_size,
                                 bench.train.checkpoint_names)
        if log:
            events.emit("checkpoint_loaded", **loaded, seconds=time.perf_counter() - t0)

    objective = objective_lib.for_benchmark(bench)
    source = data_lib.build_source(bench, plan)  # by data.source: the Markov source or megatron's indexed data
    seq = bench.model.seq_length
    dp_rank = ps.get_data_parallel_rank()

    def microbatches(n: int, fetch: Callable[[slice], np.ndarray], rng: np.random.Generator) -> list[dict]:
        """This data-parallel rank's micro-batches of a batch of n, its rows read by `fetch(rows)`. A batch that
        does not divide into ranks x micro-batches (an eval set; a training batch always does) is padded to
        whole micro-batches, as the pipeline schedule needs, with rows whose zero loss mask keeps them out of
        every loss and metric."""
        per_rank = -(-n // (dp * mbs)) * mbs
        real = fetch(slice(min(dp_rank * per_rank, n), min((dp_rank + 1) * per_rank, n)))
        rows = np.zeros((per_rank, source.row_width), dtype=np.int64)
        rows[:len(real)] = real
        out = []
        for i in range(0, per_rank, mbs):
            b = objective.make_batch(rows[i:i + mbs], rng)
            b["loss_mask"][max(len(real) - i, 0):] = 0
            out.append(b)
        return out

    # Held-out eval set, fixed for every run (the Markov source's own stream, or the eval data's first samples):
    # all eval.samples of it.
    eval_rng = np.random.default_rng([bench.data.seed, 2**31 - 1])
    eval_batches = microbatches(bench.eval.samples, partial(source.eval_set, bench.eval.samples, eval_rng), eval_rng)

    def step_fn(data_iterator, chunk):
        batch = next(data_iterator)
        if not on_cpu:
            batch = {k: v.cuda(non_blocking=True) for k, v in batch.items()}
        return objective.forward(chunk, batch, not chunk.training)

    def run_fwd_bwd(batches: list[dict], forward_only: bool) -> dict[str, float]:
        iters = [iter(batches) for _ in model] if vp > 1 else iter(batches)
        out = fwd_bwd(forward_step_func=step_fn, data_iterator=iters, model=model if vp > 1 else model[0],
                      num_microbatches=len(batches), seq_length=seq, micro_batch_size=mbs,
                      forward_only=forward_only)
        keys = ("loss_sum", "tokens", "correct")
        local = torch.zeros(len(keys), dtype=torch.float64)
        for stats in out or []:
            for i, k in enumerate(keys):
                if k in stats:
                    local[i] += float(stats[k])
        # Only last-stage ranks hold losses; tensor-parallel peers hold equal copies, which cancel in ratios.
        dist.all_reduce(local)
        return dict(zip(keys, local.tolist(), strict=True))

    def evaluate_model() -> tuple[float, float]:
        """The metric, and how many tokens it scored (all of the eval set's, padding excluded)."""
        for c in model:
            c.eval()
        with torch.no_grad():
            totals = run_fwd_bwd(eval_batches, forward_only=True)
        for c in model:
            c.train()
        return objective.value(totals), totals["tokens"]

    budget = max_steps(bench, gbs)
    next_eval = eval_schedule(bench, gbs)
    start_samples = int(evaluate(bench.eval.start_samples, global_batch_size=gbs))
    unit = seq if bench.mlperf.eval_unit == "tokens" else 1  # eval metadata counts tokens or samples
    key = bench.mlperf.eval_metadata_key
    flops_per_step = flops.flops_per_sample(bench.model) * gbs
    devices = layout["world_size"]
    precision = "bf16" if bf16 else "fp32"
    device = {"type": "cpu" if on_cpu else "cuda",
              "name": (platform.processor() or platform.machine()) if on_cpu else torch.cuda.get_device_name(),
              "per_node": int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
              # what ran, so a record says whether it took the GPU path (bf16, te or sdpa attention)
              "precision": precision, "attention": model_lib.attention_backend()}
    peak = None if on_cpu else hardware.peak_tflops(device["name"], precision)

    def block_meta(first_step: int, last_step: int) -> dict:
        if key == "samples_count":
            return {"samples_count": first_step * gbs}
        return {"first_epoch_num": first_step * gbs * unit, "epoch_count": (last_step - first_step) * gbs * unit}

    if log:
        log.end(C.INIT_STOP)
        log.start(C.RUN_START)
        events.emit("start", budget=budget, interval=next_eval(0), target=bench.quality.target,
                    metric=bench.quality.metric, direction=bench.quality.direction, devices=devices,
                    mfu_note=hardware.mfu_note(device["type"], device["name"], precision), device=device)
    step, status = 0, "aborted"
    while step < budget:
        block_first, block_last = step, min(next_eval(step), budget)
        if log:
            log.start(C.BLOCK_START, metadata=block_meta(block_first, block_last))
        while step < block_last:
            t0 = time.perf_counter()
            rng = np.random.default_rng([plan.seed, step])
            batches = microbatches(gbs, partial(source.train_batch, step, rng), rng)
            for c in model:
                c.zero_grad_buffer()
            optimizer.zero_grad()
            totals = run_fwd_bwd(batches, forward_only=False)
            ok, grad_norm, _ = optimizer.step()
            scheduler.step(increment=1)
            step += 1
            dt = time.perf_counter() - t0
            if log:
                loss = totals["loss_sum"] / max(totals["tokens"], 1.0)
                tokens_per_s = gbs * seq / dt
                tflops = flops_per_step / dt / devices / 1e12
                mfu = tflops / peak if peak else None
                stats = {"train_step_time": dt, "reduced_train_loss": loss, "tokens_per_s": tokens_per_s,
                         "tflops_per_device": tflops} | ({"mfu": mfu} if mfu is not None else {})
                log.event("tracked_stats", value=stats, metadata={"step": step, "samples_count": step * gbs})
                events.emit("step", step=step, loss=loss, step_time=dt, tokens_per_s=tokens_per_s, mfu=mfu,
                            tflops_per_device=tflops, lr=scheduler.get_lr(optimizer.param_groups[0]),
                            grad_norm=float(grad_norm) if grad_norm is not None else None)
        if log:
            log.end(C.BLOCK_STOP, metadata=block_meta(block_first, block_last))
        samples = step * gbs
        if samples < start_samples:
            continue
        meta = {key: samples * unit}
        if log:
            log.start(C.EVAL_START, metadata=meta)
        value, scored = evaluate_model()
        if log:
            log.event(C.EVAL_ACCURACY, value=value, metadata=meta)
            log.end(C.EVAL_STOP, metadata=meta)
            events.emit("eval", step=step, samples=samples, value=value, scored=scored)
        if bench.converged(value):
            status = "success"
            break
    if log:
        # What the run trained on, once, before run_stop, as NVIDIA's BERT logs it (the RCP checker's
        # --rcp-bert-train-samples reads it) and in the eval unit (tokens for gpt3, as NVIDIA's GPT-3 logs it).
        log.event(C.TRAIN_SAMPLES, value=step * gbs * unit)
        meta = {"status": status}
        if status != "success":
            meta["reason"] = f"quality target not reached within the step budget ({budget} steps)"
        log.end(C.RUN_STOP, metadata=meta)
        events.emit("stopped", status=status, step=step, reason=meta.get("reason", ""))

    def save() -> None:
        checkpoint.save(plan.save_checkpoint, model, optimizer,
                        {"benchmark": bench.name, "variant": bench.variant, "step": step, "samples": step * gbs,
                         "status": status, "seed": plan.seed, "layout": dict(layout)})

    return status, save


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m mlbench.train PLAN.json", file=sys.stderr)
        return 2
    return train(RunPlan.load(argv[0]))
