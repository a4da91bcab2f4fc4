"""The learning-rate schedule of a benchmark at a global batch: the one resolution the optimizer, the step
budget and the MLPerf log share.

Where a benchmark gives `optimizer.lr` (a number or an expression in the global batch: gpt3, llama31_405b), the
schedule follows from it. llama31_8b and gpt_oss_20b have no rule: their closed rules leave learning rate and
warm-up free, and each reference convergence point (RCP) was produced with its own, so their files hold a
table by global batch (`lr_table`, `warmup_table`, read from the RCPs). At a batch outside the table nothing
defines the schedule: the RCP checker would score the runs against an RCP interpolated between two tables rows
(or the smallest RCP, or none above the largest), but which learning rate converges like that interpolation is
the submitter's experiment, not something to guess. So a run there is refused before launch unless the user
states the learning rate and warm-up (`--lr`, `--warmup-steps`), and the refusal says what the RCP checker
will do with it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from mlbench.errors import UserError
from mlbench.spec import Benchmark, OptimizerSpec, check_decay, evaluate


@dataclass(frozen=True)
class Schedule:
    lr: float
    min_lr: float
    warmup_steps: int
    decay_steps: int  # cosine (or linear, poly) steps after warm-up


def at(bench: Benchmark, gbs: int) -> Schedule:
    """The schedule at global batch `gbs`; a UserError where the benchmark defines none there."""
    sched = of_optimizer(bench.optimizer, gbs)
    if sched is None:
        raise undefined(bench, gbs)
    return sched


def undefined(bench: Benchmark, gbs: int) -> UserError:
    """Why nothing defines the schedule at global batch `gbs`."""
    if not bench.optimizer.lr_table:
        return UserError(f"{bench.name}: optimizer.lr is not given and optimizer.lr_table is empty: give one")
    return UserError(outside_table(bench, gbs))


def of_optimizer(o: OptimizerSpec, gbs: int) -> Schedule | None:
    """The schedule of an optimizer definition at global batch `gbs`; None where its tables have no row."""
    base = o.base_at(gbs)
    if base is None:
        return None
    lr, warmup = base
    min_lr = evaluate(o.min_lr, global_batch_size=gbs, lr=lr)
    decay = int(o.decay_at(gbs, warmup))
    return Schedule(lr=lr, min_lr=min_lr, warmup_steps=warmup, decay_steps=decay)


def outside_table(bench: Benchmark, gbs: int) -> str:
    from mlbench import compliance

    table = "; ".join(f"{b}: lr {lr:g}, warm-up {bench.optimizer.warmup_table.get(b, '?')}"
                      for b, lr in sorted(bench.optimizer.lr_table.items()))
    rcp = compliance.rcp_coverage(bench.mlperf.benchmark, bench.mlperf.ruleset, gbs)
    return (f"{bench.name} defines learning rate and warm-up only at its RCP global batches ({table}); at global "
            f"batch {gbs} the official RCP checker: {rcp}. Choose one of those batches (--global-batch-size), or "
            f"state the schedule for {gbs} with --lr and --warmup-steps")


def for_run(bench: Benchmark, gbs: int, lr: float | None = None, warmup_steps: int | None = None) -> Benchmark:
    """The benchmark a run at `gbs` trains, with the user's learning rate and warm-up (flags) in place of the
    benchmark's; checked to resolve, so a batch without a schedule is refused before launch. The user's values
    become `optimizer.lr` / `warmup_steps`, so the run plan, the optimizer and the log all carry them. With a
    table, a flag left out takes the table's value at `gbs` where there is one."""
    if lr is not None and lr <= 0:
        raise UserError(f"--lr must be positive, got {lr}")
    if warmup_steps is not None and warmup_steps < 0:
        raise UserError(f"--warmup-steps must be at least 0, got {warmup_steps}")
    o = bench.optimizer
    if lr is not None or warmup_steps is not None:
        if o.lr is None and (lr is None or warmup_steps is None):
            if gbs not in o.lr_table or gbs not in o.warmup_table:
                raise UserError(f"{outside_table(bench, gbs)} (both: the table has no row at {gbs})")
            lr = o.lr_table[gbs] if lr is None else lr
            warmup_steps = o.warmup_table[gbs] if warmup_steps is None else warmup_steps
        o = dataclasses.replace(o, lr=o.lr if lr is None else lr,
                                warmup_steps=o.warmup_steps if warmup_steps is None else warmup_steps)
        bench = dataclasses.replace(bench, optimizer=o)
    budget = int(evaluate(bench.train.max_steps, global_batch_size=gbs))  # 0: the schedule's own length
    if warmup_steps is not None and 0 < budget <= warmup_steps:
        raise UserError(f"--warmup-steps {warmup_steps} is not below this run's budget of {budget} steps "
                        f"(train.max_steps at global batch {gbs}): the learning rate would never reach its peak; "
                        f"give fewer than {budget}")
    given = f" with --warmup-steps {warmup_steps}" if warmup_steps is not None else ""
    check_decay(f"{bench.name}{given}", at(bench, gbs).decay_steps, gbs)
    return bench
