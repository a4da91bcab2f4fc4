"""What a run tells the world: the MLPerf log, owned by rank 0 alone, and the progress events the launcher follows
for the live display, hang detection and the run record, written by rank 0 and, where every node has a supervisor
of its own (RunPlan.events_every_node: the torchrun launcher), by the first rank of every other node into its
node's plan's folder (a node whose supervisor saw no events stopped a healthy run after 30 minutes as one that
never stepped). Elsewhere the reporter is silent, so the loop reports without asking which rank it is."""

from __future__ import annotations

import json
import time

from mlperf_logging.mllog import constants as C

from mlbench.mlperf_log import MLPerfLog, write_preamble
from mlbench.run_plan import RunPlan
from mlbench.train.interrupt import whole


class Reporter:
    def __init__(self, plan: RunPlan, rank: int, local_rank: int = 0):
        self.plan = plan
        self.active = rank == 0
        self.log = MLPerfLog(plan.log_path) if self.active else None
        follows = self.active or plan.events_every_node and local_rank == 0
        self._events = open(plan.events_path, "a", buffering=1) if follows else None  # noqa: SIM115 - run-long
        bench = plan.benchmark
        gbs = plan.global_batch_size
        self._gbs = gbs
        self._unit = bench.eval_unit_size
        self._key = bench.mlperf.eval_metadata_key
        self._step = 0  # the last step trained
        self._stopped = False  # run_stop written

    @whole
    def emit(self, kind: str, **fields) -> None:
        if self._events:
            self._events.write(json.dumps({"event": kind, "time": time.time(), **fields}) + "\n")

    # ---- the MLPerf log, in the order a run writes it --------------------------------------------------------

    @whole
    def preamble(self) -> None:
        """Submission keys and every hyperparameter, up to init."""
        if self.log:
            write_preamble(self.plan, self.log)

    @whole
    def run_start(self, **start) -> None:
        if self.log:
            self.log.end(C.INIT_STOP)
            self.log.start(C.RUN_START)
        self.emit("start", **start)

    def _block_meta(self, first_step: int, last_step: int) -> dict:
        if self._key == "samples_count":
            return {"samples_count": first_step * self._gbs}
        return {"first_epoch_num": first_step * self._gbs * self._unit,
                "epoch_count": (last_step - first_step) * self._gbs * self._unit}

    @whole
    def block_start(self, first_step: int, last_step: int) -> None:
        if self.log:
            self.log.start(C.BLOCK_START, metadata=self._block_meta(first_step, last_step))

    @whole
    def block_stop(self, first_step: int, last_step: int) -> None:
        if self.log:
            self.log.end(C.BLOCK_STOP, metadata=self._block_meta(first_step, last_step))

    @whole
    def step(self, step: int, stats: dict, **display) -> None:
        """A training step's statistics: in the log (tracked_stats) and the events (with what only the display
        shows: learning rate, gradient norm)."""
        self._step = step
        if self.log:
            self.log.event("tracked_stats", value=stats, metadata={"step": step, "samples_count": step * self._gbs})
        self.emit("step", step=step, loss=stats["reduced_train_loss"], step_time=stats["train_step_time"],
                  tokens_per_s=stats["tokens_per_s"], mfu=stats.get("mfu"),
                  tflops_per_device=stats["tflops_per_device"], **display)

    @whole
    def eval_start(self, samples: int) -> None:
        if self.log:
            self.log.start(C.EVAL_START, metadata={self._key: samples * self._unit})

    @whole
    def eval_stop(self, step: int, samples: int, value: float, scored: float) -> None:
        meta = {self._key: samples * self._unit}
        if self.log:
            self.log.event(C.EVAL_ACCURACY, value=value, metadata=meta)
            self.log.end(C.EVAL_STOP, metadata=meta)
        self.emit("eval", step=step, samples=samples, value=value, scored=scored)

    @whole
    def run_stop(self, step: int, status: str, reason: str = "") -> None:
        if self.log:
            # What the run trained on, once, before run_stop, as NVIDIA's BERT logs it (the RCP checker's
            # --rcp-bert-train-samples reads it) and in the eval unit (tokens for gpt3, as NVIDIA's GPT-3 does).
            self.log.event(C.TRAIN_SAMPLES, value=step * self._gbs * self._unit)
            self.log.end(C.RUN_STOP, metadata={"status": status} | ({"reason": reason} if reason else {}))
        self._stopped = True
        self.emit("stopped", status=status, step=step, reason=reason)

    @whole
    def aborted(self, reason: str) -> None:
        """The run failed: train_samples (the checker wants exactly one) and run_stop with status aborted; after
        run_stop (a failure in what follows it, untimed), the log's status stands and only the event says so."""
        if self._stopped:
            self.emit("failed_after_run_stop", reason=reason)
            return
        self.run_stop(self._step, "aborted", reason)

    @whole
    def stopped_by_another(self, reason: str) -> None:
        """The run failed because another process did first (the launcher's SIGTERM, a peer lost): the event says
        so, marked `consequent`, and run_stop is left to the supervisor, which names the rank that failed first
        once every rank is gone (as for a rank 0 that died without a word)."""
        if self._stopped:
            self.emit("failed_after_run_stop", reason=reason)
            return
        self.emit("stopped", status="aborted", step=self._step, reason=reason, consequent=True)

    @whole
    def close(self) -> None:
        if self.log:
            self.log.close()
        if self._events:
            self._events.close()
