"""The training loop: one path for every benchmark and size, run by every rank (`python -m mlbench.train`).

Initialisation (untimed, MLPerf's init_start..init_stop) builds everything (build.py); the timed region
(run_start..run_stop) trains in blocks of one eval interval (step.py), evaluates after each block, and stops
with `success` when the quality target is reached or `aborted` when the step budget runs out or the run fails.
Rank 0's reporter alone writes the MLPerf log; it and, under the torchrun launcher, each other node's first
rank write the progress events their node's launcher shows and watches (reporter.py).
"""

from __future__ import annotations

import errno
import gc
import math
import os
import re
import signal
import sys
import time
import traceback
from collections.abc import Callable

import torch.distributed as dist

from mlbench.errors import clipped, disk_free
from mlbench.launch.lifeline import STOPPED_EXIT, exit_if_orphaned
from mlbench.layout import sizes_text
from mlbench.run_plan import RunPlan, eval_schedule, first_eval_samples, max_steps, stop_reason_path
from mlbench.train import interrupt
from mlbench.train.checkpoint.folder import CheckpointError
from mlbench.train.reporter import Reporter


class Aborted(BaseException):
    """The run stops: a stop signal, or a loss that is not finite. BaseException, as KeyboardInterrupt is: no
    library's `except Exception` (logging's, mlperf-logging's) may swallow it and train on."""

    def __init__(self, reason: str, consequent: bool = False):
        super().__init__(reason)
        self.consequent = consequent  # stopped because another process failed first (see _consequent)


# A collective or store whose peer is gone (gloo's and torch's store's words): that peer, or its node, ended first
_PEER_LOST = re.compile(r"Connection (?:closed|reset) by peer|Connection refused|Broken pipe|Connection was likely "
                        r"closed")


def room_note(e: BaseException, dest: str) -> str:
    """The room left on DEST's disk, for a save's error whose words may not say the disk is full (torch's writer:
    'unexpected pos 704 vs 598'); "" for a stop, a destination another save took meanwhile (CheckpointError: its
    reason is whole) and an OSError of another cause (a parent made a file: NotADirectoryError)."""
    if isinstance(e, Aborted | CheckpointError):
        return ""
    if isinstance(e, OSError) and e.errno is not None and e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EIO):
        return ""
    return disk_free(dest)


def _consequent(e: BaseException) -> bool:
    """Whether this rank failed because another process of the run failed first: its launcher's SIGTERM with no
    reason from the supervisor (torchrun's agent and mlbench's stop every rank when one fails), or a peer's
    connection that dropped. Its own words would then hide the rank that failed first."""
    return getattr(e, "consequent", False) or isinstance(e, RuntimeError) and bool(_PEER_LOST.search(str(e)))


def stop_handler(plan: RunPlan) -> Callable:
    """SIGTERM's handler: the supervisor, torchrun and SLURM send it before killing. The run ends as Aborted, with
    the reason the supervisor left (a hang, a signal it received), raised between the reporter's writes."""
    def on_sigterm(signum, frame):
        try:
            why = stop_reason_path(plan.events_path).read_text()
        except OSError:
            why = ""
        # no reason: the launcher stops every rank because another failed (or someone outside sent it)
        interrupt.deliver(Aborted(why or f"stopped by {signal.Signals(signum).name}", consequent=not why))
    return on_sigterm


def train(plan: RunPlan) -> int:
    rank = int(os.environ.get("RANK", "0"))
    signal.signal(signal.SIGTERM, stop_handler(plan))
    report = Reporter(plan, rank, int(os.environ.get("LOCAL_RANK", "0")))
    try:
        report.preamble()
        status, save = ("success", None) if plan.dry_run else _train(plan, report)
    except (SystemExit, KeyboardInterrupt):
        raise
    # Any other failure is an aborted run, logged as such. BaseException, not Exception: torch's
    # CheckpointException (a damaged checkpoint's) derives from BaseException alone.
    except BaseException as e:
        # on its way out: the launcher's SIGTERM (a peer failed) would cut its last words short, and end it with
        # an exit code of its own (1) that reads as a failure of this rank's
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        consequent = _consequent(e)
        # run_stop is the supervisor's to write for a rank stopped by another's failure: it learns which rank
        # failed first once every rank is gone
        (report.stopped_by_another if consequent else report.aborted)(failure_reason(e))
        if not isinstance(e, Aborted):  # the rank's log keeps where it failed; the last line stays the reason
            traceback.print_exception(e, file=sys.stderr)
        print(f"[rank {rank}] run aborted: {failure_reason(e)}", file=sys.stderr, flush=True)
        os._exit(STOPPED_EXIT if consequent else 3)  # no interpreter teardown: peers may be gone, collectives hang
    if plan.save_checkpoint and save:  # after run_stop, untimed; a failure here leaves the run's result alone
        report.emit("checkpoint_saving", path=plan.save_checkpoint)
        t0 = time.perf_counter()
        try:
            save()
        except (SystemExit, KeyboardInterrupt):
            raise
        except BaseException as e:
            # stopped for another rank's failure (its SIGTERM, a peer lost): said so, for the supervisor to name the
            # rank that failed first (rank 0's 'Aborted: signal SIGTERM' was the record's reason, and a disk note)
            consequent = _consequent(e)
            free = "" if consequent else room_note(e, plan.save_checkpoint)
            why = failure_reason(e) + (f" ({free})" if free else "")
            report.emit("checkpoint_failed", path=plan.save_checkpoint, reason=why, consequent=consequent)
            print(f"[rank {rank}] checkpoint not saved: {why}", file=sys.stderr, flush=True)
            os._exit(STOPPED_EXIT if consequent else 4)
        report.emit("checkpoint_saved", path=plan.save_checkpoint, seconds=time.perf_counter() - t0)
    report.close()
    if dist.is_initialized():
        dist.barrier()  # every rank's last collective is done: nothing left that needs a peer
    return 0 if status == "success" else 1  # the entry point exits without interpreter teardown


def failure_reason(e: BaseException) -> str:
    """E in one line (a checkpoint writer's: the first failing rank's), at most 300 characters (`clipped`). A stop
    (Aborted) is its reason alone, in the supervisor's words: the log's run_stop said 'Aborted: hang: no progress
    for 300 s' where the record and the end line said 'hang: no progress for 300 s'."""
    if isinstance(e, Aborted):
        return clipped(str(e)) if str(e) else "stopped"
    failures = getattr(e, "failures", None)  # torch.distributed.checkpoint's: each rank's (exception, traceback)
    if isinstance(failures, dict) and failures:
        rank, failure = next(iter(failures.items()))
        inner = failure[0] if isinstance(failure, tuple) else failure
        if isinstance(inner, BaseException):
            return clipped(f"{type(e).__name__}: rank {rank}: {failure_reason(inner)}")
    return clipped(f"{type(e).__name__}: {e}")


def _train(plan: RunPlan, report: Reporter) -> tuple[str, Callable[[], None]]:
    """Builds, then trains from run_start to run_stop; returns the status and what saves the final state."""
    # No garbage collection while torch and megatron-core load (about 450k objects, none of them garbage): 0.27 s,
    # 14 % of the imports' CPU; then what they made is set apart for the run, so no collection scans it again.
    gc.disable()
    from mlbench.train import cpu_compat

    cpu_compat.enable()  # first, on CPU: megatron-core imported after it skips compiling its fused kernels (2-3 s)
    from mlbench import flops, hardware
    from mlbench.train import checkpoint, measured_memory
    from mlbench.train.build import build, init_distributed
    from mlbench.train.step import Stepper

    gc.freeze()
    gc.enable()

    # The rendezvous and the first collectives wait inside C, where no Python handler runs: a stop signal ended the
    # rank there only at SIGKILL, after the supervisor's grace (10 s). Until they return, SIGTERM ends it at once;
    # its launcher and the supervisor know why, and the supervisor completes the log.
    on_stop = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    device = init_distributed(plan)
    signal.signal(signal.SIGTERM, on_stop)
    parts = build(plan, device)
    if parts.loaded is not None:
        report.emit("checkpoint_loaded", **parts.loaded)
    stepper = Stepper(plan, parts, device.on_cpu)
    bench, layout = plan.benchmark, plan.layout
    gbs, seq, devices = layout["global_batch_size"], bench.model.seq_length, layout["world_size"]
    budget, next_eval = max_steps(bench, gbs), eval_schedule(bench, gbs)
    start_samples = first_eval_samples(bench, gbs)
    flops_per_step = flops.flops_per_sample(bench.model) * gbs
    peak = None if device.on_cpu else hardware.peak_tflops(device.info["name"], device.precision)

    report.run_start(budget=budget, interval=next_eval(0), target=bench.quality.target, metric=bench.quality.metric,
                     direction=bench.quality.direction, devices=devices, device=device.info,
                     layout=sizes_text(layout),
                     mfu_note=hardware.mfu_note(device.info["type"], device.info["name"], device.precision))
    step, status = 0, "aborted"
    while step < budget and status != "success":
        first, last = step, min(next_eval(step), budget)
        report.block_start(first, last)
        while step < last:
            exit_if_orphaned()  # a rank whose launcher died writes nothing more
            r = stepper.train_step(step)
            step += 1
            tflops = flops_per_step / r.seconds / devices / 1e12
            report.step(step, {"train_step_time": r.seconds, "reduced_train_loss": r.loss,
                               "tokens_per_s": gbs * seq / r.seconds, "tflops_per_device": tflops}
                        | ({"mfu": tflops / peak} if peak else {}), lr=r.lr, grad_norm=r.grad_norm)
            if not math.isfinite(r.loss):  # all-reduced: every rank stops here, together
                raise Aborted(f"the training loss is {r.loss} at step {step}: a run whose loss is not a finite "
                              f"number cannot reach its target (diverged, or NaN in its data or checkpoint)")
        report.block_stop(first, last)
        if step * gbs < start_samples:
            continue
        report.eval_start(step * gbs)
        value, scored = stepper.evaluate()
        report.eval_stop(step, step * gbs, value, scored)
        if bench.converged(value):
            status = "success"
    report.run_stop(step, status, "" if status == "success" else
                    f"quality target not reached within the step budget ({budget} steps)")
    report.emit("memory", **measured_memory.record(plan, parts, stepper, device.on_cpu))  # untimed: after run_stop

    def save() -> None:
        checkpoint.save(plan.save_checkpoint, parts.model, parts.optimizer,
                        {"benchmark": bench.name, "variant": bench.variant, "step": step, "samples": step * gbs,
                         "status": status, "seed": plan.seed, "layout": dict(layout)})

    return status, save


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m mlbench.train PLAN.json", file=sys.stderr)
        return 2
    return train(RunPlan.load(argv[0]))
