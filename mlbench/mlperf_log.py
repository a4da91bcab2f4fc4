"""The MLPerf log of a run, written with the official `mlperf_logging.mllog`.

Each log gets its own `mllog.MLLogger` on its own `logging.Logger` with one file handler, rather than the
package's global logger (whose `config()` adds a handler per call and so duplicates lines when a process
writes several runs, or finalises a run another process started).
"""

from __future__ import annotations

import logging
import re
import sys
from pathlib import Path
from typing import Any

from mlperf_logging.mllog import constants as C
from mlperf_logging.mllog import mllog
from mlperf_logging.mllog.mllog import MLLogger

from mlbench import logfile, rcp_schedule
from mlbench.run_plan import RunPlan, max_steps
from mlbench.spec import Benchmark, evaluate


def call_site(stack_index: int = 2, root_dir: str | None = None) -> dict:
    """mllog.get_caller's answer (the file and line that logged a record: every line's metadata), read from the
    frame itself. Its own reads them through inspect.getframeinfo, which finds the frame's module (a scan of
    sys.modules) and source (linecache's stat of the file): 40-75 us of CPU a line, most of what a line costs, and
    rank 0 logs one a training step (tracked_stats). The same file (co_filename) and line (f_lineno)."""
    frame = sys._getframe(stack_index)  # the frame get_caller reaches: its own, stack_index frames back
    filename = frame.f_code.co_filename
    if root_dir is not None:
        filename = re.sub("^" + root_dir + "/", "", filename)
    return {"file": filename, "lineno": frame.f_lineno}


mllog.get_caller = call_site  # MLLogger._log_helper calls it by its module's name


class MLPerfLog:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._logger = logging.getLogger(f"mlbench.mllog.{self.path.resolve()}")
        self._logger.propagate = False
        self._logger.setLevel(logging.INFO)
        if not self._logger.handlers:
            self._handler = logging.FileHandler(self.path)
            self._logger.addHandler(self._handler)
        self._ml = MLLogger(logger=self._logger, default_stack_offset=2)

    def event(self, key: str, value: Any = None, metadata: dict | None = None, time_ms: int | None = None):
        self._ml.event(key=key, value=value, metadata=metadata, time_ms=time_ms)
        self.flush()

    def start(self, key: str, value: Any = None, metadata: dict | None = None):
        self._ml.start(key=key, value=value, metadata=metadata)
        self.flush()

    def end(self, key: str, value: Any = None, metadata: dict | None = None):
        self._ml.end(key=key, value=value, metadata=metadata)
        self.flush()

    def flush(self) -> None:
        for h in self._logger.handlers:
            h.flush()

    def close(self) -> None:
        for h in list(self._logger.handlers):
            h.close()
            self._logger.removeHandler(h)


def hyperparameters(bench: Benchmark, layout: dict, seed: int) -> list[tuple[str, Any]]:
    """The hyperparameter lines a run logs, in the order the closed rules need.

    Order matters to the checker for llama31_405b: global_batch_size before the learning-rate, warm-up and
    decay keys, and warm-up before decay (they are checked against values logged before them).
    """
    gbs = layout["global_batch_size"]
    o = bench.optimizer
    sched = rcp_schedule.at(bench, gbs)
    warmup, decay, lr, min_lr = sched.warmup_steps, sched.decay_steps, sched.lr, sched.min_lr
    keys: list[tuple[str, Any]] = [
        (C.SEED, seed),
        (C.GLOBAL_BATCH_SIZE, gbs),
        (C.GRADIENT_ACCUMULATION_STEPS, layout["num_microbatches"]),
        ("max_sequence_length", bench.model.seq_length),
        (C.OPT_NAME, o.name),
        (C.OPT_BASE_LR, lr),
        (C.OPT_LR_WARMUP_STEPS, warmup),
    ]
    if o.name in ("adam", "adamw"):
        keys += [
            ("opt_learning_rate_decay_steps", decay + warmup if bench.mlperf.decay_steps_logged == "end" else decay),
            ("opt_end_learning_rate", min_lr),
            ("opt_learning_rate_decay_schedule", f"{o.decay_style} with linear warmup"),
            (f"opt_{o.name}_beta_1", o.beta1),
            (f"opt_{o.name}_beta_2", o.beta2),
            (f"opt_{o.name}_epsilon", o.eps),
        ]
        # adamw's rules name opt_adamw_weight_decay; gpt3's (adam) name opt_weight_decay.
        keys.append((f"opt_{'adamw_' if o.name == 'adamw' else ''}weight_decay", o.weight_decay))
    else:  # lamb: BERT's keys
        keys += [
            ("opt_lamb_epsilon", o.eps),
            ("opt_epsilon", o.eps),  # the rules' BERT table names this one; the checker requires the other
            ("opt_lamb_beta_1", o.beta1),
            ("opt_lamb_beta_2", o.beta2),
            ("opt_lamb_weight_decay_rate", o.weight_decay),
            ("opt_learning_rate_training_steps", warmup + decay),
            ("num_warmup_steps", warmup),
            ("start_warmup_step", o.start_warmup_step),
            ("opt_lamb_learning_rate_decay_poly_power", o.decay_power),
        ]
    keys += [
        ("opt_gradient_clip_norm", o.clip_grad),
        ("init_checkpoint_step", int(evaluate(bench.train.init_checkpoint_step, global_batch_size=gbs))),
        (C.EVAL_SAMPLES, bench.eval.logged_samples or bench.eval.samples),
        *([("max_predictions_per_seq", bench.data.max_predictions_per_seq)] if bench.data.max_predictions_per_seq
          else []),
        *([("max_steps", max_steps(bench, gbs))] if bench.mlperf.log_max_steps else []),
        ("tensor_parallelism", layout["tp"]),
        ("pipeline_parallelism", layout["pp"]),
        ("context_parallelism", layout["cp"]),
        *([("expert_parallelism", layout.get("ep", 1))] if bench.model.num_experts else []),
        ("micro_batch_size", layout["micro_batch_size"]),
    ]
    return keys


def read(path: str | Path) -> list[dict]:
    """The events of a log as logged, skipping lines that are not MLLOG records (mlbench.logfile reads them)."""
    return logfile.read(path)


def finalize_aborted(path: str | Path, reason: str, plan: RunPlan | None = None, *, begin: bool = False) -> bool:
    """If the log has no run_stop, append train_samples (the checker wants exactly one) and run_stop with status
    aborted, as rank 0 itself does for a run that fails (before run_start too). Returns whether it did.

    With BEGIN, a log rank 0 never began (missing or empty: a rank killed while it imported) is begun from PLAN
    first, with the preamble rank 0 would have written, so the result says which run died and why. Without it (a
    node of a multi-node run, where another node may hold the log) such a log is left alone.

    Called by the supervisor after every rank is gone, so one writer at a time still holds.
    """
    path = Path(path)
    if not path.exists() or path.stat().st_size == 0:
        if plan is None or not begin:
            return False
        write_preamble(plan, MLPerfLog(path)).close()
    # streamed, these keys alone: read whole (every record a dict), a long run's log took the supervisor to 260 MiB
    # at 200,000 steps as it ended, run_stop written or not
    keys, last_step = set(), None
    for e in logfile.LogReader(path, keys=frozenset({C.RUN_STOP, C.TRAIN_SAMPLES, "tracked_stats"})):
        keys.add(e.key)
        if e.key == "tracked_stats":
            last_step = e
    if C.RUN_STOP in keys:
        return False
    log = MLPerfLog(path)
    try:
        if C.TRAIN_SAMPLES not in keys:  # the last logged step's samples, in the unit rank 0 logs them in
            meta = last_step.metadata if last_step is not None and isinstance(last_step.metadata, dict) else {}
            samples = meta.get("samples_count", 0) if logfile.is_number(meta.get("samples_count")) else 0
            log.event(C.TRAIN_SAMPLES, value=samples * (plan.benchmark.eval_unit_size if plan else 1))
        log.end(C.RUN_STOP, metadata={"status": C.ABORTED, "reason": reason})
    finally:
        log.close()
    return True


def write_preamble(plan: RunPlan, log: MLPerfLog | None = None) -> MLPerfLog:
    """Rank 0's log up to init: submission keys and every hyperparameter (also what --dry-run writes)."""
    log = log or MLPerfLog(plan.log_path)
    bench = plan.benchmark
    log.event(C.CACHE_CLEAR, value=True)
    log.start(C.INIT_START)
    for key, value in (
        (C.SUBMISSION_ORG, plan.org),
        (C.SUBMISSION_PLATFORM, plan.system),
        (C.SUBMISSION_DIVISION, plan.division),
        (C.SUBMISSION_STATUS, "onprem"),
        (C.SUBMISSION_BENCHMARK, bench.mlperf.benchmark),
    ):
        log.event(key, value=value)
    for key, value in hyperparameters(bench, plan.layout, plan.seed):
        log.event(key, value=value)
    if plan.dry_run:  # what a real run logs next, with nothing built or trained
        log.end(C.INIT_STOP)
        log.start(C.RUN_START)
    return log
