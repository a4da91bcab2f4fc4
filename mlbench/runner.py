"""A set of runs of one benchmark on this machine or node: plan, start, supervise, check and publish each, one after
another; what a run record holds."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import secrets
import shlex
import signal
import socket
import sys
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.text import Text

from mlbench import compliance, environment, results, seed_claims
from mlbench.errors import UserError, printable
from mlbench.launch import local_ranks, torchrun
from mlbench.launch.supervise import STOP_SIGNALS, Command, Outcome, supervise
from mlbench.layout import Layout, sizes_text
from mlbench.logfile import log_time_to_train
from mlbench.planner import prediction
from mlbench.progress import Progress
from mlbench.quality import operator
from mlbench.registry import ROOT
from mlbench.run_plan import RunPlan
from mlbench.schema import versioned
from mlbench.spec import Benchmark
from mlbench.train.checkpoint import folder as checkpoint_folder


@dataclass
class RunOptions:
    results: Path
    system: str
    runs: int = 1
    seed: int | None = None
    hang_timeout: float = 300.0
    node_rank: int = 0
    rdzv_endpoint: str | None = None  # the torchrun launcher: one invocation per node
    rdzv_timeout: float = 600.0  # the torchrun launcher: how long node 0 waits for the other nodes
    threads: int = 1  # CPU threads per rank
    init_checkpoint: str = ""  # megatron-core distributed checkpoint every run starts from
    # its files as the check before launch read them (integrity.file_stamps): each rank loads those or refuses
    init_checkpoint_stamps: dict = field(default_factory=dict)
    save_checkpoint: str = ""  # where the (single) run saves its final state
    device: str = ""  # the device the memory plan was checked against ("" for none)
    # a SLURM job's driver: the claim on its seeds (seed, seed + 1, ...) its submitter made and handed to it
    # (seed_claims.adopt); "" where the set claims its own
    seed_claim: str = ""


@dataclass
class RunResult:
    path: Path
    status: str
    ttt_s: float | None
    last_eval: float | None
    compliant: bool | None  # None: the checker gave no verdict (killed from outside), not a rejection
    reason: str
    checkpoint_error: str = ""
    published: bool = True  # False: nothing of the run was left in the results folder (e.g. a full disk)
    stopped_by: str = ""  # a stop signal the run received (Ctrl-C, a closed terminal, preemption): the set ends
    error_after_run_stop: str = ""  # the run reached its target, then a rank failed or a signal came
    stopped_after_run_stop: bool = False  # error_after_run_stop is a stop signal alone, no failure
    started: bool = True  # rank 0 reached run_start (its `start` event); False: it failed in the untimed set-up

    @property
    def ok(self) -> bool:  # what the command's exit code reports
        return self.status == "success" and not self.checkpoint_error and not self.error_after_run_stop \
            and self.published


def default_system() -> str:
    return socket.gethostname().split(".")[0] or "local"


def seeds(first: int | None, runs: int, used: Collection[int] = ()) -> list[int]:
    """Distinct seeds, as MLPerf requires: first, first+1, ... or fresh random ones, none of them USED (the seeds of
    the results already in the folder: preflight refuses a given --seed that repeats one)."""
    while True:
        base = first if first is not None else secrets.randbelow(2**31 - runs)
        if first is not None or not any(base <= s < base + runs for s in used):
            return [base + i for i in range(runs)]


def time_to_train(log: Path) -> float | None:
    """Seconds from run_start to run_stop, as the official summarizer reads them (logfile.log_time_to_train)."""
    return log_time_to_train(log)


def exit_code(outcome: Outcome) -> int:
    """The run's exit code in the record, the same for the same end whatever launched it: 0 where the launcher exited
    0, 128 + the signal where a stop signal ended it (as a set stopped by one ends), else 1. The launcher's own code
    differs by launcher (kept as launcher_exit_code): a one-process run's rank exits 3 for a crash and 1 for a target
    not reached, 6 stopped, while mlbench's agent, torchrun and srun exit 1 for any failed rank."""
    if outcome.exit_code == 0:
        return 0
    if outcome.signal:
        with contextlib.suppress(KeyError):
            return 128 + signal.Signals[outcome.signal].value
    return 1


def record(bench: Benchmark, layout: Layout, plan: RunPlan, outcome: Outcome, verdict, ttt: float | None,
           env: dict, device: str = "") -> dict:
    evals = [e for e in outcome.events if e.get("event") == "eval"]
    start = next((e for e in outcome.events if e.get("event") == "start"), {})  # {} if no rank ever started
    return versioned({
        "benchmark": bench.name,
        "variant": bench.variant,
        "status": outcome.status,
        "reason": outcome.reason,
        "exit_code": exit_code(outcome),
        "launcher_exit_code": outcome.exit_code,
        "seed": plan.seed,
        "time_to_train_min": None if ttt is None else ttt / 60,  # minutes, as score, compare and plan give it
        "quality": {"metric": bench.quality.metric, "target": bench.quality.target,
                    "direction": bench.quality.direction, "last": evals[-1]["value"] if evals else None,
                    # tokens the last eval scored: every eval sample's (all positions, or the masked ones)
                    "eval_scored": evals[-1].get("scored") if evals else None},
        "layout": layout.as_dict(),
        "devices": layout.world_size,
        # Median over steps; None where MFU is not defined (CPU) or the device's peak is unknown.
        "mfu": outcome.steps.median("mfu"),
        "mfu_note": start.get("mfu_note"),
        "config": dataclasses.asdict(bench),
        # The launcher's packages and host; the device as rank 0 found it (None if it never started).
        "environment": {**env, "device": start.get("device")},
        # What the run started from (path, tensors, whether optimizer state was loaded) and saved to.
        "init_checkpoint": next(({k: v for k, v in e.items() if k not in ("event", "time")}
                                 for e in outcome.events if e.get("event") == "checkpoint_loaded"), None),
        "saved_checkpoint": next(({"path": e.get("path"), "seconds": e.get("seconds")} for e in outcome.events
                                  if e.get("event") == "checkpoint_saved"), None),
        "checkpoint_error": outcome.checkpoint_error or None,
        # a failure after run_stop `success` (the log's status stands): a rank that failed, a signal in teardown
        "error_after_run_stop": outcome.error_after_run_stop or None,
        # rank 0: the planner's per-GPU estimate and the bytes measured after run_stop (train/measured_memory.py)
        "memory": next(({k: e.get(k) for k in ("estimated", "measured")} for e in outcome.events
                        if e.get("event") == "memory"), None),
        # the planner's step time and time-to-train for this layout on `device` (--device) or rank 0's device
        "prediction": prediction.for_run(bench, layout, device, start.get("device")),
        "compliance": {"ok": verdict.ok, "rules": verdict.rules, "messages": verdict.messages},
        # each step's fields (launch.events.Steps), written a row at a time (publish): past the first 10,000 steps
        # one in steps_stride, and the last, so that a long run's record stays a few MiB
        "steps_total": outcome.steps.total,
        "steps_stride": outcome.steps.stride,
        "steps": outcome.steps,
        "evals": [{k: e.get(k) for k in ("step", "samples", "value")} for e in evals],
    })


# How one run is started: (plan file, staging folder, run index, environment) -> the command the supervisor runs.
CommandFor = Callable[[Path, Path, int, dict], Command]


def ranks_forked(layout: Layout, rdzv_endpoint: str | None) -> bool:
    """Whether a node's ranks are forked from mlbench's agent (local_ranks), sharing the torch it imported; else
    each imports its own (the rank itself for one process; torchrun's, with a rendezvous endpoint)."""
    return layout.world_size > 1 and layout.nodes == 1 and not rdzv_endpoint


def local_commands(layout: Layout, opts: RunOptions) -> CommandFor:
    """The local and torchrun launchers' runs: on this machine alone, the rank itself for one process, else
    mlbench's own agent for the node's ranks (local_ranks: torchrun's standalone job without torch's elastic agent);
    with a rendezvous endpoint (the torchrun launcher, one invocation per node), torchrun."""
    def command_for(plan_path: Path, staging: Path, i: int, env: dict) -> Command:
        if layout.world_size == 1 and not opts.rdzv_endpoint:
            return torchrun.direct(plan_path, staging / "ranks", env)
        if ranks_forked(layout, opts.rdzv_endpoint):
            return Command(local_ranks.argv(plan_path, staging / "ranks", layout.nproc_per_node), env,
                           stdout=staging / "launcher.log", rank_failure=local_ranks.rank_failure)
        run_id = f"mlbench-run{i}"  # the same on every node
        argv = torchrun.argv(plan_path, staging / "ranks", nodes=layout.nodes, nproc_per_node=layout.nproc_per_node,
                             node_rank=opts.node_rank, rdzv_endpoint=opts.rdzv_endpoint, rdzv_id=run_id,
                             rdzv_timeout=opts.rdzv_timeout)
        return torchrun.node_command(argv, env, staging / "launcher.log", torchrun.Rendezvous(
            opts.rdzv_endpoint, layout.nodes, opts.node_rank, opts.rdzv_timeout, staging / "ranks", run_id))
    return command_for


class NotStaged(UserError):
    """A run's staging folder or plan could not be written (a full disk): the input's fault before the set's first
    run (exit 2, nothing written); after it, the set stops there, its runs so far published (exit 1)."""


def _staged_plan(folder: Path, plan_for: Callable[[Path], RunPlan]) -> tuple[Path, RunPlan]:
    """A staging folder holding the run's plan; a folder that cannot take it (a full disk) refuses the run."""
    staging = None
    try:
        staging = results.stage(folder)
        plan = plan_for(staging)
        plan.save(staging / "plan.json")
    except OSError as e:
        if staging:
            results.discard(staging)
        raise NotStaged(f"results folder {folder}: cannot write a run's files ({e.strerror or e}); free space or "
                        f"pass --results DIR elsewhere") from None
    return staging, plan


def rank_env(threads: int) -> dict[str, str]:
    """The ranks' environment: this one, with --threads for torch's threads and for numpy's OpenBLAS (which would
    otherwise start one a core in every rank). Where file names are not read as UTF-8 (LC_ALL=POSIX PYTHONUTF8=0),
    the ranks are in Python's UTF-8 mode: torch's import encodes its own path as UTF-8, and from a checkout at a
    non-ASCII path every rank died at it ('surrogates not allowed')."""
    n = str(threads)
    env = dict(os.environ, MLBENCH_THREADS=n, OMP_NUM_THREADS=n, OPENBLAS_NUM_THREADS=n, PYTHONWARNINGS="ignore")
    if sys.getfilesystemencoding().lower().replace("-", "") != "utf8":
        env["PYTHONUTF8"] = "1"
    return env


class RunSet:
    """The local and torchrun launchers, and the driver inside a SLURM job: the runs one after another on this
    machine or node, each started with `command_for`, supervised, checked and published (the launcher contract
    of mlbench.launch). A set shares its devices, so each run starts once the one before it is published: start()
    starts nothing ahead, supervise() starts and follows each in turn. It stops early when a run cannot be
    published (the disk is full, and the next run's would not fit either), on a stop signal, and when two runs in a
    row fail alike before run_start (failed_alike_before_start)."""

    def __init__(self, bench: Benchmark, layout: Layout, opts: RunOptions, console: Console,
                 command_for: CommandFor, announce: Path | None = None):
        """`announce`: a file that names the staging folder of the run in progress (for a SLURM job's submitter)."""
        self.bench, self.layout, self.opts, self.console, self.command_for = bench, layout, opts, console, command_for
        self.announce = announce
        self.results: list[RunResult] = []
        self.held: list[str] = []  # stop signals held while a run was checked and published (supervise)
        self.cut_short = ""  # why the set stopped before its last run, where no stop signal did (_not_started)

    def describe(self, folder: Path) -> list[tuple[str, str]]:
        return [("each run starts", shlex.join(self.command_for(Path("PLAN.json"), Path("STAGING"), 0, {}).argv))]

    def prepare(self, folder: Path) -> None:
        self.folder = folder
        if self.opts.save_checkpoint:  # what a save killed with its run (kill -9) left beside the destination
            checkpoint_folder.remove_dead_partials(Path(self.opts.save_checkpoint))
        # node 0's seeds are the run's (every rank takes rank 0's): claimed in the folder, checked against its own
        # under its lock, so that a set started at the same moment cannot take them too
        self.seeds = self._claim(folder) if self.opts.node_rank == 0 else seeds(self.opts.seed, self.opts.runs)
        self.env_info = environment.collect(ROOT)

    def _claim(self, folder: Path) -> list[int]:
        """The set's seeds, claimed in FOLDER (seed_claims), or the claim its submitter handed to a SLURM job taken
        over: made as the job was submitted, it holds while the job is pending (another set took them meanwhile,
        and the job was refused as it started)."""
        opts = self.opts
        if opts.seed_claim and opts.seed is not None and \
                (adopted := seed_claims.adopt(folder, opts.seed_claim, opts.seed, opts.runs)) is not None:
            return adopted
        return seed_claims.claim(folder, opts.seed, opts.runs, seeds,
                                 say=lambda note: self.console.print(printable(note), highlight=False, soft_wrap=True))

    def start(self) -> None:
        """Nothing ahead of time: see the class."""

    def supervise(self) -> None:
        env = rank_env(self.opts.threads)
        # A stop signal (Ctrl-C, a closed terminal, preemption) ends the set, not only the run in progress; one that
        # comes between runs (while a run is checked and published) is held until that run is published.
        received = self.held
        previous = {s: signal.signal(s, lambda n, _: received.append(signal.Signals(n).name)) for s in STOP_SIGNALS}
        try:
            for i, seed in enumerate(self.seeds):
                if received:  # between runs: the last one is published, this one is not started
                    self._not_started(received[0], len(self.seeds) - i)
                    break
                try:
                    result = self._run(i, seed, env)
                except NotStaged as e:
                    if not self.results:  # nothing of the set written: refused, as before launch
                        raise
                    self.console.print(Text(str(e), "red"), highlight=False, soft_wrap=True)
                    self._not_started("the next run's files could not be written", len(self.seeds) - i)
                    break
                self.results.append(result)
                if not result.published:  # (the next run's files would not fit either): said, as for a signal
                    self._not_started("the run could not be published", len(self.seeds) - i - 1)
                    break
                if result.stopped_by:
                    self._not_started(result.stopped_by, len(self.seeds) - i - 1)
                    break
                if why := failed_alike_before_start(self.results):
                    self._not_started(why, len(self.seeds) - i - 1)
                    break
            else:
                if received and not self.results[-1].stopped_by:  # after the last run was published: said
                    self.console.print(f"{received[0]} received after the last run was published: nothing was "
                                       f"left to stop", highlight=False)
        finally:
            seed_claims.release(self.folder)  # its runs' seeds are in their logs now, those not started free again
            for s, handler in previous.items():
                signal.signal(s, handler)

    def _not_started(self, why: str, left: int) -> None:
        """WHY (a stop signal's name, or a few words) the set ends with LEFT runs not started, said where any are."""
        if left:
            self.cut_short = why
            self.console.print(f"{why}: the set stops here; {left} more run(s) not started", highlight=False)

    def collect(self) -> int:
        """0 where every run reached its target; 128 + the signal where a stop signal ended the set (as a shell
        reports a process it stopped, and as every other command ends on one), its runs published first; else 1."""
        stop = next((r.stopped_by for r in self.results if r.stopped_by), None) or next(iter(self.held), None)
        if len(self.seeds) > 1:
            self.console.print(set_summary(self.results, len(self.seeds), stop or self.cut_short), highlight=False,
                               soft_wrap=True)
        if stop:
            return 128 + signal.Signals[stop].value
        complete = len(self.results) == len(self.seeds)
        return 0 if complete and all(r.ok for r in self.results) else 1

    def _run(self, i: int, seed: int, env: dict) -> RunResult:
        bench, layout, opts, folder, console = self.bench, self.layout, self.opts, self.folder, self.console
        staging, plan = _staged_plan(folder, lambda d: RunPlan(
            benchmark=bench, layout=layout.as_dict(), seed=seed, run_dir=str(d), system=opts.system,
            init_checkpoint=opts.init_checkpoint, init_checkpoint_stamps=opts.init_checkpoint_stamps,
            save_checkpoint=opts.save_checkpoint,
            events_every_node=opts.rdzv_endpoint is not None))
        cmd = self.command_for(staging / "plan.json", staging, i, env)
        if self.announce:
            with contextlib.suppress(OSError):  # only a display follows it
                self.announce.write_text(f"{staging}\n")
        label = f"{bench.name}{' (tiny)' if bench.variant == 'tiny' else ''} run {i + 1}/{opts.runs}, seed {seed}"
        with Progress(label, console, announce=len(self.seeds) > 1) as progress:
            # Node 0 hosts global rank 0, which writes the log (every launcher's rendezvous is static: one node,
            # torchrun's nodes, a SLURM job whose driver runs on its first node); its supervisor owns the log.
            outcome = supervise(cmd, log_path=plan.log_path, events_path=plan.events_path,
                                hang_timeout=opts.hang_timeout, on_events=progress.on_events,
                                plan=plan, owns_log=opts.node_rank == 0,
                                say=lambda line: console.print(Text(printable(line)), highlight=False, soft_wrap=True))
        if opts.node_rank != 0:  # node 0 publishes the run; this one keeps its rank logs
            logs = results.keep_node_logs(folder, staging, opts.node_rank)
            status = "success" if outcome.exit_code == 0 else "aborted"
            said = outcome.reason if status == "aborted" and outcome.reason else \
                f"launcher exited with code {outcome.exit_code}"
            console.print(f"node {opts.node_rank}: {said}; rank logs in {logs}", highlight=False, soft_wrap=True)
            return RunResult(logs or folder, status, None, None, True, outcome.reason, stopped_by=outcome.signal,
                             started=_started(outcome))
        if outcome.checkpoint_error:
            checkpoint_folder.remove_dead_partials(Path(opts.save_checkpoint))
        try:
            if outcome.log_error:
                raise results.PublishError(f"run not published: {outcome.log_error}")
            ttt = time_to_train(plan.log_path)
            verdict = compliance_verdict(plan.log_path, bench)
            outcome = self._held_signal(outcome)
            rec = record(bench, layout, plan, outcome, verdict, ttt, self.env_info, opts.device)
            path = results.publish(folder, staging, rec)
        except results.PublishError as e:
            return self._not_published(str(e), staging, outcome)
        result = RunResult(path, outcome.status, ttt, rec["quality"]["last"], verdict.ok, outcome.reason,
                           outcome.checkpoint_error, stopped_by=outcome.signal,
                           error_after_run_stop=outcome.error_after_run_stop,
                           stopped_after_run_stop=outcome.stopped_after_run_stop, started=_started(outcome))
        _summary(console, bench, result, sizes_text(layout.as_dict()))
        return result

    def _held_signal(self, outcome: Outcome) -> Outcome:
        """A stop signal that came once the run had ended (held while its log was checked): a run that reached its
        target stays a success, and its record says the signal apart, as any failure after run_stop (exit 1); the
        set ends with it."""
        if not self.held or outcome.signal:
            return outcome
        what = f"{self.held[0]} received while the run was checked and published (held until it was published)"
        after = f"{outcome.error_after_run_stop}; {what}" if outcome.error_after_run_stop else what
        if outcome.status != "success":
            return dataclasses.replace(outcome, signal=self.held[0])
        return dataclasses.replace(outcome, signal=self.held[0], error_after_run_stop=after,
                                   stopped_after_run_stop=not outcome.error_after_run_stop)

    def _not_published(self, why: str, staging: Path, outcome: Outcome) -> RunResult:
        """A run whose log could not be completed or placed (a full disk): its files are set aside under logs/, for
        a person to read and never taken for a result. Where even that fails (no inode left for logs/), they stay
        in the staging folder, never deleted (they were, a run that reached its target with them): the next
        command in the folder publishes it as its log says, as a dead run's."""
        kept = results.set_aside(self.folder, staging)
        gone = not kept and not os.path.lexists(staging)  # removed from outside while the run was in progress
        if not kept and not gone:  # for the command that publishes it: why this one did not
            results.say_not_published(staging, why)
        where = f"its files were moved to {kept}" if kept else \
            f"its folder {staging} was removed while the run was in progress: nothing of it is left" if gone else \
            f"its files stay in {staging}, which the next mlbench command in {self.folder} publishes"
        self.console.print(Text.assemble((why, "red"), f"; {where} (the run ended: {outcome.status}"
                                         f"{', ' + outcome.reason if outcome.reason else ''})"),
                           highlight=False, soft_wrap=True)
        return RunResult(self.folder, "aborted", None, None, False, why, published=False, stopped_by=outcome.signal)


def _started(outcome: Outcome) -> bool:
    return any(e.get("event") == "start" for e in outcome.events)


def failed_alike_before_start(done: list[RunResult]) -> str:
    """Why the set stops after DONE's last run ("" where it goes on): it and the run before it both failed before
    run_start, for the same reason (a data file removed, a broken install, a rendezvous no node joins). The untimed
    set-up fails the same way for every run after them: a --runs 1000 set was 1000 runs published aborted. A run
    that fails after run_start is the run's own failure, which MLPerf counts: the set goes on."""
    if len(done) < 2:
        return ""
    last, before = done[-1], done[-2]
    if any(r.started or r.status == "success" or r.stopped_by or not r.published or not r.reason
           for r in (last, before)) or _alike(last.reason) != _alike(before.reason):
        return ""
    return f"runs {len(done) - 1} and {len(done)} failed the same way before run_start"


def _alike(reason: str) -> str:
    """A reason without its paths, which name each run's own folders (its staging folder, its rank logs)."""
    return re.sub(r"\S*/\S*", "/", reason)


def set_summary(done: list[RunResult], planned: int, stop: str) -> Text:
    """The set's last line: how many of its PLANNED runs reached their target, did not (their results named), were
    not published and were not started (and why, STOP: the stop signal, or what cut the set short)."""
    reached = [r for r in done if r.published and r.status == "success"]
    failed = [r for r in done if r.published and r.status != "success"]
    lost = [r for r in done if not r.published]
    left = planned - len(done)
    after = sum(not r.ok for r in reached)  # a checkpoint not saved, a failure or a stop after run_stop
    parts = [Text(f"{len(reached)} reached the target" + (f" ({after} with an error after it)" if after else ""),
                  "green" if len(reached) == planned and not after else "")]
    if failed:
        names = ", ".join(printable(r.path.name) for r in failed[:5]) + (", ..." if len(failed) > 5 else "")
        parts.append(Text(f"{len(failed)} did not ({names})", "red"))
    if lost:
        parts.append(Text(f"{len(lost)} not published", "red"))
    if left:
        parts.append(Text(f"{left} not started" + (f" ({stop})" if stop else ""), "yellow"))
    return Text.assemble(f"set of {planned} runs: ", *sum(([p, ", "] for p in parts), [])[:-1])


def compliance_verdict(log: Path, bench: Benchmark) -> compliance.Verdict:
    smoke = bench.variant == "tiny"
    try:
        return compliance.check(log, bench.mlperf.ruleset, smoke=smoke)
    except OSError as e:  # the checker's scratch folder (a full /tmp): the run is recorded, its verdict says why
        return compliance.Verdict(path=log, ok=False, rules="smoke rules" if smoke else
                                  f"training {bench.mlperf.ruleset} rules",
                                  messages=[f"the compliance checker could not run: {e.strerror or e}"])


def _summary(console: Console, bench: Benchmark, r: RunResult, sizes: str = "") -> None:
    """The run's last line (and why it failed): its outcome, time-to-train, layout SIZES (what ran, in a log of a
    multi-rank run; left out where not known), compliance and record."""
    op = operator(bench.quality.direction)
    reached = r.status == "success"
    colour = "green" if reached else "red"
    # a time-to-train is a converged run's alone (MLPerf scores no other); a run that stopped short says how long
    # it trained ("time-to-train 5.0 s" followed an out-of-memory error on a GPU)
    if r.ttt_s is None:
        ttt = "time-to-train n/a"
    elif reached:
        ttt = f"time-to-train {r.ttt_s:.1f} s ({r.ttt_s / 60:.3f} min)"
    else:
        ttt = f"no time-to-train (stopped {r.ttt_s:.1f} s after run_start)"
    last = f"{r.last_eval:.4f}" if r.last_eval is not None else "n/a (no evaluation)"
    checked = "ok" if r.compliant else "not checked" if r.compliant is None else "FAILED"
    console.print(Text.assemble(("target reached" if reached else "target NOT reached", colour),
                                f": {bench.quality.metric} {last} (target {op} {bench.quality.target}); "
                                f"{ttt}; {sizes + '; ' if sizes else ''}compliance ({checked}); "
                                f"{printable(r.path)}"))
    if not reached:
        console.print(f"  reason: {printable(r.reason)}", highlight=False, soft_wrap=True)  # (rich coloured numbers)
        if (logs := r.path.parent / "logs" / r.path.stem).is_dir():  # a reason's "see the rank logs" is here
            console.print(f"  rank logs in {printable(logs)}", highlight=False, soft_wrap=True)
    if r.checkpoint_error:
        console.print(Text.assemble("  ", ("checkpoint not saved", "red"), f": {printable(r.checkpoint_error)}"))
    if r.error_after_run_stop and r.stopped_after_run_stop:  # a stop signal as the run ended: nothing failed
        console.print(Text.assemble("  ", (r.error_after_run_stop, "yellow"), ": the result stands"))
    elif r.error_after_run_stop:
        console.print(Text.assemble("  ", ("failed after run_stop", "red"), f" (the result stands): "
                                    f"{r.error_after_run_stop}"))
