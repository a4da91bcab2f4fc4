"""Runs whose mlbench process died before it published them (kill -9, the OOM killer, a lost login session): the
next mlbench command that takes the results folder publishes each, so that no run that started goes unrecorded.

Its ranks die with their supervisor (mlbench.launch.lifeline), so what the dead run left is what it had written:
the plan, rank 0's MLPerf log and events, the rank logs. The log is the source of truth: one without `run_stop` is
closed as rank 0 closes an aborted one (mlperf_log.finalize_aborted) and the run is aborted (a one-node run killed
while its ranks started, before rank 0 began its log, is begun from its plan first, as its supervisor would have
begun it); one whose `run_stop`
was written keeps its status (a run that reached its target and whose mlbench died after it is a success, with
`error_after_run_stop` saying that mlbench died). The official checker judges the log, and the record is the same
as any run's, built from the plan and the events, with `exit_code` null (nobody saw it exit).

A plan that cannot be read (written by another version of mlbench, or garbled) gives way to the log: the benchmark
and layout are the ones the log states. A run that cannot be published even so is set aside under logs/, said in
one line; nothing a dead run left stops the next run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from pathlib import Path

from rich.console import Console

from mlbench import mlperf_log, registry, results, runner
from mlbench.errors import disk_free, printable
from mlbench.launch.supervise import EventTail, Outcome
from mlbench.layout import Layout
from mlbench.run_plan import RunPlan
from mlbench.train.checkpoint import folder as checkpoint_folder


@dataclasses.dataclass(frozen=True)
class Death:
    """What the publisher knows of a dead run's supervisor, for the run's reason: who it was, how it died, and who
    publishes the run. A SLURM job's follower knows more than a later command does: the job's driver died as the
    job ended, and how SLURM ended it (its node failed: it was said as 'killed, or its session lost', 'by a later
    mlbench command')."""

    who: str = "mlbench"
    how: str = "killed, or its session lost"
    by: str = "a later mlbench command"


def publish(folder: Path, console: Console) -> list[Path]:
    """Publishes every dead run of `folder`; returns the results placed."""
    placed = []
    for staging, owner in results.dead_runs(folder):
        with results.taken(staging) as mine:
            if mine:  # (else another command, started at once, publishes it)
                placed += _publish(folder, staging, owner, console)
                results.forget_not_published(staging)
    return placed


def publish_ended(folder: Path, staging: Path, console: Console, death: Death = Death()) -> list[Path]:
    """Publishes STAGING, a staging folder of `folder` whose run's processes are all known to have ended, its owner of
    this host or another (a SLURM job's driver, on the job's first node, once SLURM has ended the job: `publish`
    leaves another host's runs alone, and a driver killed mid-run left its run unpublished for good); returns the
    results placed ([] where it holds no unpublished run, or another command publishes it)."""
    if staging.parent != folder or not staging.name.startswith(results.STAGING) or not results.unplaced(folder,
                                                                                                        staging):
        return []
    with results.taken(staging) as mine:
        return _publish(folder, staging, results.owner_tag(staging), console, death) if mine else []


def _publish(folder: Path, staging: Path, owner: str, console: Console, death: Death = Death()) -> list[Path]:
    """The dead run in STAGING published ([its result]), or set aside, said in one line ([])."""
    try:
        path, note = _publish_one(folder, staging, owner, death)
    except Exception as e:  # a full disk, or whatever a dead run left (a foreign, garbled or linked file)
        if not os.path.lexists(staging):  # another command published it meanwhile (it said so): nothing to say
            return []
        kept = results.set_aside(folder, staging)
        full = isinstance(e, results.PublishError)
        where = (f"its files were moved to {kept}" + (" (a rename: no room needed)" if full else "")
                 if kept else f"its files stay in {staging}")
        if full and (free := disk_free(folder)):
            where += f"; {free}"
        # printable: the folder's name is whatever was put there ("x\nerror: forged" forged a line)
        console.print(printable(f"a run whose mlbench process had died ({staging.name}) could not be published "
                                f"({_why(e)}); {where}"), highlight=False, soft_wrap=True)
        return []
    console.print(printable(f"published a run {note}: {path}"), highlight=False, soft_wrap=True)
    return [path]


def _publish_one(folder: Path, staging: Path, owner: str, death: Death) -> tuple[Path, str]:
    """The run published: its result, and what became of it as the line that announces it says ("a run ...")."""
    _own_files(staging)
    log = staging / "mlperf.log"
    begun = log.exists() and log.stat().st_size > 0  # not yet: killed while its ranks started (results)
    if begun:
        _drop_cut_line(log)
    plan, unread = _plan(staging, folder)
    tail = _events(staging / "events.jsonl")
    events = tail.events
    _remove_partial_saves(plan, events)
    outcome, note = _outcome(log, plan, events, owner.split("-", 1)[0], begun, death)
    outcome.steps = tail.steps
    bench, layout = plan.benchmark, Layout.from_dict(plan.layout)
    verdict = runner.compliance_verdict(log, bench)
    rec = runner.record(bench, layout, plan, outcome, verdict, runner.time_to_train(log), {}, "")
    return (results.publish(folder, staging, rec | {"exit_code": None, "launcher_exit_code": None}),  # nobody saw it
            note + unread)


def _own_files(staging: Path) -> None:
    """A dead run's files are its own: regular files and folders inside its staging folder. A link (to a file
    outside the results, say) is never written through nor published: ValueError, and the run is set aside."""
    if staging.is_symlink():
        raise ValueError(f"{staging.name} is a link, not a folder of its own")
    for p in staging.iterdir():
        if p.is_symlink():
            raise ValueError(f"its {p.name} is a link (to {os.readlink(p)}), not a file of its own")
    log = staging / "mlperf.log"
    if log.exists() and not log.is_file():
        raise ValueError("its mlperf.log is not a regular file")


def _remove_partial_saves(plan: RunPlan, events: list[dict]) -> None:
    """The checkpoint save the dead run had begun (`.NAME.partial-<owner>` beside its destination): removed, its
    owner being gone (a live one's, or another host's, is left alone)."""
    dests = {plan.save_checkpoint} | {e.get("path") for e in events if e.get("event") == "checkpoint_saving"}
    for dest in dests:
        if isinstance(dest, str) and dest:
            with contextlib.suppress(OSError, ValueError):
                checkpoint_folder.remove_dead_partials(Path(dest))


def _outcome(log: Path, plan: RunPlan, events: list[dict], pid: str, begun: bool = True,
             death: Death = Death()) -> tuple[Outcome, str]:
    """How the dead run ended, as its log says (its run_stop, or none: then it is closed as aborted here; a log
    not BEGUN is begun from the plan first, as the supervisor begins the log of a rank that died importing)."""
    at = f"by {death.by} at {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime())}"
    status, logged_reason = _run_stop(log) if begun else (None, "")
    # Its mlbench lived to the end but could not publish it (runner._not_published: no inode left even to set it
    # aside, often after its log could not be closed either)
    if (why := _not_published(events) or results.not_published_reason(log.parent)) is not None:
        said = f"{death.who} (pid {pid}) could not publish the run when it ended ({why}); published {at}"
        if status is None:  # it could not close the log: closed here, as aborted with that reason
            mlperf_log.finalize_aborted(log, said, plan, begin=not begun)
            return (Outcome(status="aborted", exit_code=-1, reason=said, events=events),
                    f"its mlbench could not publish when it ended ({why}; its log had no run_stop: as aborted)")
        outcome = Outcome(status=status, exit_code=-1, events=events, reason=logged_reason,
                          error_after_run_stop=said if status == "success" else None)
        if status != "success":
            outcome = dataclasses.replace(outcome, reason=f"{logged_reason}; {said}" if logged_reason else said)
        return outcome, f"its mlbench could not publish when it ended ({why}; its log: run_stop {status})"
    if status == "success":  # it reached its target; mlbench died after it, before publishing: the status stands
        after = f"{death.who} (pid {pid}) died after the run ended (run_stop success), before it published the run; " \
                f"published {at}"
        saving = any(e.get("event") == "checkpoint_saving" for e in events)
        saved = any(e.get("event") in ("checkpoint_saved", "checkpoint_failed") for e in events)
        unsaved = f"{death.who} (pid {pid}) died while the checkpoint was saved" if saving and not saved else ""
        return (Outcome(status="success", exit_code=-1, events=events, error_after_run_stop=after,
                        checkpoint_error=unsaved),
                "whose mlbench process had died after the run ended (its log: run_stop success)")
    died = f"{death.who} (pid {pid}) died before the run ended ({death.how}); published as aborted {at}"
    if status is None:
        mlperf_log.finalize_aborted(log, died, plan, begin=not begun)
        reason = died
    elif logged_reason.startswith(died[:died.index(";")]):  # a publisher killed after closing it: its words stand
        reason = logged_reason
    else:
        reason = f"{logged_reason}; {died}" if logged_reason else died  # rank 0 had closed it: its reason first
    return Outcome(status="aborted", exit_code=-1, reason=reason, events=events), \
        ("whose mlbench process had died" if death == Death() else f"{death.who} left as it died") + " as aborted"


def _not_published(events: list[dict]) -> str | None:
    """Why the run's own mlbench could not publish it, where it said so (a `not_published` event); None if not."""
    for e in events:
        if e.get("event") == "not_published":
            why = e.get("reason")
            return why if isinstance(why, str) and why.strip() else "its reason not recorded"
    return None


def _run_stop(log: Path) -> tuple[str | None, str]:
    """The status and reason of the log's run_stop ((None, "") without one)."""
    for e in mlperf_log.read(log):
        if e.get("key") == "run_stop":
            meta = e.get("metadata") if isinstance(e.get("metadata"), dict) else {}
            status, reason = meta.get("status"), meta.get("reason")
            return (status if isinstance(status, str) else "aborted"), (reason if isinstance(reason, str) else "")
    return None, ""


def _plan(staging: Path, folder: Path) -> tuple[RunPlan, str]:
    """The run's plan, and ""; or, where its plan.json cannot be read, the plan its log states and a note saying
    so."""
    path = staging / "plan.json"
    try:
        if not path.is_file():  # removed, or a folder in its place: the log still says the run began
            raise ValueError("there is none" if not (path.exists() or path.is_symlink()) else "it is not a file")
        plan = RunPlan.load(path)
        Layout.from_dict(plan.layout)
        return plan, ""
    except Exception as e:  # any file may be there (another version's, a garbled one): its log says the rest
        why = _why(e)
    plan = plan_from_log(staging / "mlperf.log", folder.name, f"its MLPerf log (plan.json could not be read: {why})")
    return plan, f" (its plan.json could not be read: {why}; its benchmark and layout are the ones its log states)"


# The log's keys a plan is read back from (mlperf_log.hyperparameters).
_LOGGED = ("submission_org", "submission_platform", "submission_division", "seed", "global_batch_size",
           "gradient_accumulation_steps", "max_sequence_length", "opt_base_learning_rate",
           "opt_learning_rate_warmup_steps", "tensor_parallelism", "pipeline_parallelism", "context_parallelism",
           "expert_parallelism", "micro_batch_size")


def plan_from_log(log: Path, benchmark: str, source: str) -> RunPlan:
    """A dead run's plan as its MLPerf log states it: `benchmark` (its folder's) in the variant of the log's
    sequence length, at the log's batch, learning rate and warm-up, in the log's layout (on one node: how the ranks
    were spread over nodes is not logged). SOURCE: the layout's `source`. ValueError where the log cannot say."""
    from mlbench import rcp_schedule

    logged: dict = {}
    for e in mlperf_log.read(log):
        if e.get("key") in _LOGGED:
            logged.setdefault(e["key"], e.get("value"))

    def count(key: str, default: int | None = None) -> int:
        v = logged.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int) or not 0 < v < 2**31:
            raise ValueError(f"its log's {key} is {v!r}, not a count")
        return v

    variants = [registry.load(benchmark, tiny=tiny) for tiny in (False, True)
                if not tiny or registry.has_tiny(benchmark)]
    seq = count("max_sequence_length")
    matches = [b for b in variants if b.model.seq_length == seq]
    if len(matches) != 1:
        raise ValueError(f"its log's max_sequence_length {seq} names no single variant of {benchmark}")
    tp, pp, cp, mbs = (count(k) for k in ("tensor_parallelism", "pipeline_parallelism", "context_parallelism",
                                          "micro_batch_size"))
    gbs, gas = count("global_batch_size"), count("gradient_accumulation_steps")
    if gbs % (mbs * gas):
        raise ValueError(f"its log's global_batch_size {gbs} is not micro_batch_size {mbs} x "
                         f"gradient_accumulation_steps {gas} x a data-parallel size")
    lr, warmup = logged.get("opt_base_learning_rate"), logged.get("opt_learning_rate_warmup_steps")
    bench = rcp_schedule.for_run(matches[0], gbs, lr if isinstance(lr, int | float) and not isinstance(lr, bool)
                                 else None,
                                 warmup if isinstance(warmup, int) else None)
    dp = gbs // (mbs * gas)
    layout = Layout(nodes=1, nproc_per_node=tp * pp * cp * dp, tp=tp, pp=pp, vp=1, cp=cp, dp=dp,
                    micro_batch_size=mbs, global_batch_size=gbs, source=source, ep=count("expert_parallelism", 1),
                    features=bench.features, precision=bench.train.precision)
    text = {k: v for k in ("submission_org", "submission_platform", "submission_division")
            if isinstance(v := logged.get(k), str)}
    seed = logged.get("seed")
    return RunPlan(benchmark=bench, layout=layout.as_dict(), seed=seed if isinstance(seed, int) else 0,
                   run_dir=str(log.parent), system=text.get("submission_platform", ""),
                   org=text.get("submission_org", "mlbench"), division=text.get("submission_division", "closed"))


def _why(e: BaseException) -> str:
    """An exception in a few words: its message, else its kind; one line, not a page."""
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= 200 else text[:197] + "..."


_TAIL_BYTES = 1 << 16  # read back from a log's end this much at a time


def _drop_cut_line(log: Path) -> None:
    """A line the kill cut short (no newline at its end) was never written whole: it goes, so the lines appended
    after it stay lines of their own."""
    with open(log, "rb+") as f:  # from its end: read whole, a long run's log was all in memory at once
        end = pos = f.seek(0, os.SEEK_END)
        while pos > 0:
            size = min(_TAIL_BYTES, pos)
            f.seek(pos - size)
            block = f.read(size)
            if pos == end and block.endswith(b"\n"):
                return
            if (i := block.rfind(b"\n")) >= 0:
                f.truncate(pos - size + i + 1)
                return
            pos -= size
        f.truncate(0)


def _events(path: Path) -> EventTail:
    """Rank 0's events as far as they were written, read as the supervisor reads them (a line the kill cut short,
    without its newline, is left out); none where they cannot be read: the record goes without them, its log says
    the rest."""
    tail = EventTail(path)
    try:
        tail.read_all()
    except OSError:
        return EventTail(path)
    return tail
