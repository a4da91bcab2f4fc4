"""The learning-rate schedule an `OptimizerSpec` describes, chosen by the spec's fields (never by benchmark).

- Warm-up then decay (GPT-3, Llama 3.1): megatron-core's own `OptimizerParamScheduler` (linear warm-up to lr
  over warmup_steps, then cosine or linear decay to min_lr ending at warmup + decay steps). A poly decay of
  power 1 is linear; megatron has no other poly.
- `warmup_overlaps_decay` (BERT's reference, optimization.py `create_optimizer`): `PolyWarmupOverlay`, a poly
  decay from step 0 over warmup + decay steps, with the linear warm-up (step - start_warmup_step) / warmup x lr
  replacing it while step - start_warmup_step < warmup.

Both have megatron's interface: `step(increment)` sets every param group's lr and weight decay (x wd_mult),
`get_lr(param_group)` and `num_steps`. The run resumes the schedule at `init_checkpoint_step`.
"""

from __future__ import annotations

from typing import Any

from mlbench import rcp_schedule
from mlbench.spec import OptimizerSpec


class PolyWarmupOverlay:
    """lr(step) = (step - start) / warmup x lr while step - start < warmup, else
    (lr - min_lr) x (1 - min(step, total) / total) ^ power + min_lr: TF's polynomial_decay with the reference's
    warm-up overlaid. `step` counts optimizer steps taken, so update k (from 0) uses lr(k)."""

    def __init__(self, optimizer: Any, max_lr: float, min_lr: float, warmup_steps: int, total_steps: int,
                 power: float, start_warmup_step: int, weight_decay: float) -> None:
        if total_steps <= 0:
            raise ValueError(f"poly decay needs a positive number of training steps, got {total_steps}")
        self.optimizer = optimizer
        self.max_lr, self.min_lr = float(max_lr), float(min_lr)
        self.warmup_steps, self.total_steps = warmup_steps, total_steps
        self.power, self.start_warmup_step = power, start_warmup_step
        self.weight_decay = weight_decay
        self.num_steps = 0
        self.step(0)

    def get_lr(self, param_group: dict) -> float:
        max_lr = param_group.get("max_lr", self.max_lr)
        min_lr = param_group.get("min_lr", self.min_lr)
        since_warmup = self.num_steps - self.start_warmup_step
        if self.warmup_steps > 0 and since_warmup < self.warmup_steps:
            return max_lr * max(since_warmup, 0) / self.warmup_steps  # (no negative lr before a late start)
        done = min(self.num_steps, self.total_steps) / self.total_steps
        return (max_lr - min_lr) * (1.0 - done) ** self.power + min_lr

    def step(self, increment: int) -> None:
        self.num_steps += increment
        for group in self.optimizer.param_groups:
            group["lr"] = self.get_lr(group)
            group["weight_decay"] = self.weight_decay * group.get("wd_mult", 1.0)


def build(optimizer: Any, o: OptimizerSpec, global_batch_size: int, init_step: int = 0) -> Any:
    """The scheduler for `optimizer` (a MegatronOptimizer, or anything with `param_groups`), at `init_step`."""
    gbs = global_batch_size
    resolved = rcp_schedule.of_optimizer(o, gbs)  # checked before launch: every planned batch resolves
    if resolved is None:
        raise ValueError(f"no learning rate at global batch {gbs}: not in optimizer.lr_table")
    lr, min_lr = float(resolved.lr), float(resolved.min_lr)
    warmup, decay = resolved.warmup_steps, resolved.decay_steps
    if o.warmup_overlaps_decay:
        sched: Any = PolyWarmupOverlay(optimizer, max_lr=lr, min_lr=min_lr, warmup_steps=warmup,
                                       total_steps=warmup + decay, power=o.decay_power,
                                       start_warmup_step=o.start_warmup_step, weight_decay=o.weight_decay)
    else:
        from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

        style = o.decay_style
        if style == "poly":
            if o.decay_power != 1.0:
                raise ValueError(f"poly decay of power {o.decay_power} after warm-up: megatron-core's scheduler "
                                 f"has only power 1 (linear); set warmup_overlaps_decay for BERT's schedule")
            style = "linear"
        sched = OptimizerParamScheduler(
            optimizer, init_lr=0.0, max_lr=lr, min_lr=min_lr, lr_warmup_steps=warmup,
            lr_decay_steps=warmup + decay, lr_decay_style=style, start_wd=o.weight_decay, end_wd=o.weight_decay,
            wd_incr_steps=warmup + decay, wd_incr_style="constant")
    if init_step > 0:  # MLPerf runs that start from a checkpoint resume its schedule (GPT-3: step 4000 x 1536/gbs)
        sched.step(increment=init_step)
    return sched
