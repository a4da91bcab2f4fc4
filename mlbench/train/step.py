"""One training step and one evaluation, through megatron-core's pipeline schedules: the same code for every
benchmark, layout and device."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch
import torch.distributed as dist

from mlbench.run_plan import RunPlan
from mlbench.train.build import Parts, collectives_device
from mlbench.train.model import context_parallel

# An eval micro-batch holds up to this many training micro-batches' rows: a forward pass saves nothing for
# backward, so it can take more rows at once, and fewer, larger micro-batches cost fewer pipeline and
# tensor-parallel messages per evaluation.
EVAL_ROWS_PER_TRAIN_MICRO_BATCH = 4


@dataclass
class StepResult:
    loss: float
    seconds: float
    lr: float
    grad_norm: float | None


class Stepper:
    def __init__(self, plan: RunPlan, parts: Parts, on_cpu: bool):
        from megatron.core import parallel_state as ps
        from megatron.core.pipeline_parallel import get_forward_backward_func

        self.plan, self.parts, self.on_cpu = plan, parts, on_cpu
        layout = plan.layout
        self.gbs, self.mbs = layout["global_batch_size"], layout["micro_batch_size"]
        self.dp, self.vp, self.pp = layout["dp"], layout["vp"], layout["pp"]
        self.dp_rank = ps.get_data_parallel_rank()
        self.cp, self.cp_rank = ps.get_context_parallel_world_size(), ps.get_context_parallel_rank()
        self.seq = plan.benchmark.model.seq_length
        self._fwd_bwd = get_forward_backward_func()
        bench = plan.benchmark
        # The held-out eval set, fixed for every run (the Markov source's own stream, or the eval data's first
        # samples): all eval.samples of it, cut once into this rank's micro-batches.
        n = bench.eval.samples
        rng = np.random.default_rng([bench.data.seed, 2**31 - 1])
        self.eval_mbs = eval_micro_batch(n, self.dp, self.mbs, self.pp)
        self.eval_batches = self._microbatches(n, self.eval_mbs, partial(parts.source.eval_set, n, rng), rng)

    def _microbatches(self, n: int, mbs: int, fetch: Callable[[slice], np.ndarray],
                      rng: np.random.Generator) -> list[dict]:
        """This data-parallel rank's micro-batches of a batch of n, its rows read by `fetch(rows)`. A batch that
        does not divide into ranks x micro-batches (an eval set; a training batch always does) is padded to
        whole micro-batches, as the pipeline schedule needs, with rows whose zero loss mask keeps them out of
        every loss and metric. A row's draws (masked LM's masks) are the ones it gets on one rank."""
        per_rank = -(-n // (self.dp * mbs)) * mbs
        first = min(self.dp_rank * per_rank, n)
        real = fetch(slice(first, min((self.dp_rank + 1) * per_rank, n)))
        width = self.parts.source.row_width
        rows = np.zeros((per_rank, width), dtype=np.int64)
        rows[:len(real)] = real
        # What the objective draws (masked LM's masks) follows a row's place in the batch, not this rank's order:
        # the same draws on every layout.
        self.parts.objective.skip(rng, first, width)
        out = []
        for i in range(0, per_rank, mbs):
            b = self.parts.objective.make_batch(rows[i:i + mbs], rng)
            b["loss_mask"][max(len(real) - i, 0):] = 0
            out.append(b)
        return out

    def _as_forward_gets_it(self, batch: dict) -> dict:
        if self.cp > 1:  # this rank's load-balanced share of every sequence
            batch = context_parallel.share(batch, self.cp, self.cp_rank)
        if not self.on_cpu:
            batch = {k: v.cuda(non_blocking=True) for k, v in batch.items()}
        return batch

    def _forward_step(self, data_iterator, chunk):
        batch = self._as_forward_gets_it(next(data_iterator))
        return self.parts.objective.forward(chunk, batch, not chunk.training)

    def first_micro_batch(self) -> dict | None:
        """Step 0's first micro-batch on this rank, as the forward step gets it; None outside the first
        pipeline stage, whose chunks take their input from the stage before."""
        from megatron.core import parallel_state as ps

        if not ps.is_pipeline_first_stage(ignore_virtual=True):
            return None
        rng = np.random.default_rng([self.plan.seed, 0])
        batch = self._microbatches(self.gbs, self.mbs, partial(self.parts.source.train_batch, 0, rng), rng)[0]
        return self._as_forward_gets_it(batch)

    def _sum_over_data_parallel(self, value: torch.Tensor) -> torch.Tensor:
        """VALUE summed over this rank's data-parallel group (the ranks that hold other rows of the step)."""
        from megatron.core import parallel_state as ps

        value = value.to(collectives_device(self.on_cpu))
        dist.all_reduce(value, group=ps.get_data_parallel_group())
        return value

    def _run(self, batches: list[dict], mbs: int, forward_only: bool) -> Callable[[], dict[str, float]]:
        """Forward (and backward) over the micro-batches; returns what reads the statistics' sums (see
        start_sum_over_ranks)."""
        model = self.parts.model
        iters = [iter(batches) for _ in model] if self.vp > 1 else iter(batches)
        out = self._fwd_bwd(forward_step_func=self._forward_step, data_iterator=iters,
                            model=model if self.vp > 1 else model[0], num_microbatches=len(batches),
                            seq_length=self.seq, micro_batch_size=mbs, forward_only=forward_only)
        return start_sum_over_ranks(out or [], ("loss_sum", "tokens", "correct"), collectives_device(self.on_cpu))

    def train_step(self, step: int) -> StepResult:
        """Step `step` (0-based): its global batch, forward and backward, the optimizer and the schedule."""
        t0 = time.perf_counter()
        parts = self.parts
        rng = np.random.default_rng([self.plan.seed, step])
        batches = self._microbatches(self.gbs, self.mbs, partial(parts.source.train_batch, step, rng), rng)
        parts.objective.weigh(batches, self.gbs, self._sum_over_data_parallel)
        for c in parts.model:
            c.zero_grad_buffer()
        parts.optimizer.zero_grad()
        read_totals = self._run(batches, self.mbs, forward_only=False)
        _, grad_norm, _ = parts.optimizer.step()
        parts.scheduler.step(increment=1)
        totals = read_totals()  # after the optimizer's kernels are queued: the GPU does not idle while we wait
        return StepResult(loss=totals["loss_sum"] / max(totals["tokens"], 1.0), seconds=time.perf_counter() - t0,
                          lr=parts.scheduler.get_lr(parts.optimizer.param_groups[0]),
                          grad_norm=float(grad_norm) if grad_norm is not None else None)

    def evaluate(self) -> tuple[float, float]:
        """The metric over the whole eval set, and how many tokens it scored (padding excluded)."""
        for c in self.parts.model:
            c.eval()
        with torch.no_grad():
            totals = self._run(self.eval_batches, self.eval_mbs, forward_only=True)()
        for c in self.parts.model:
            c.train()
        return self.parts.objective.value(totals), totals["tokens"]


def eval_micro_batch(n: int, dp: int, mbs: int, pp: int) -> int:
    """The eval micro-batch for an eval set of n samples: as few micro-batches as rows allow (up to
    EVAL_ROWS_PER_TRAIN_MICRO_BATCH training micro-batches' rows each), at least pp of them so the pipeline
    stages overlap, the rows spread evenly so padding stays under one row per micro-batch."""
    rows = -(-n // dp)
    count = max(min(pp, rows), -(-rows // (EVAL_ROWS_PER_TRAIN_MICRO_BATCH * mbs)))
    return -(-rows // count)


def start_sum_over_ranks(stats: list[dict], keys: tuple[str, ...],
                         device: torch.device) -> Callable[[], dict[str, float]]:
    """Starts each key's sum over this rank's micro-batch statistics and over every rank, in float64, on DEVICE
    (NCCL's: the rank's GPU), and returns what reads the sums. Nothing waits for the GPU until that is called, so
    a step that reads them after queueing the optimizer does not hold the optimizer's launches until backward ends
    (on one H100 the difference was within run-to-run noise: docs/gpu.md). The sums are exact (float32 values of
    one magnitude, and counts, in float64), so their order does not change a digit. Only last-stage ranks hold
    losses; tensor-parallel peers hold equal copies, which cancel in the ratios taken of them."""
    sums = []
    for k in keys:
        values = [torch.as_tensor(s[k], dtype=torch.float64).to(device).reshape(()) for s in stats if k in s]
        sums.append(torch.stack(values).sum() if values else torch.zeros((), dtype=torch.float64, device=device))
    total = torch.stack(sums)
    dist.all_reduce(total)
    if device.type != "cuda":
        return lambda: dict(zip(keys, total.tolist(), strict=True))
    host = total.to("cpu", non_blocking=True)  # queued now, ahead of the optimizer's kernels
    copied = torch.cuda.Event()
    copied.record()

    def read() -> dict[str, float]:
        copied.synchronize()
        return dict(zip(keys, host.tolist(), strict=True))

    return read
