"""Runs whose mlbench process died before it published them (kill -9, the OOM killer, a lost login session): the
next mlbench command that takes the results folder publishes each as aborted, so that no run that started goes
unrecorded.

Its ranks die with their supervisor (mlbench.launch.lifeline), so what the dead run left is what it had written:
the plan, rank 0's MLPerf log and events, the rank logs. The log is closed as rank 0 closes an aborted one
(mlperf_log.finalize_aborted), the official checker judges it, and the record is the same as any run's, built
from the plan and the events, with the reason saying what happened and `exit_code` null (nobody saw it exit).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from rich.console import Console

from mlbench import mlperf_log, results, runner
from mlbench.launch.supervise import EventTail, Outcome
from mlbench.layout import Layout
from mlbench.run_plan import RunPlan


def publish(folder: Path, console: Console) -> list[Path]:
    """Publishes every dead run of `folder` as aborted; returns the results placed."""
    placed = []
    for staging, owner in results.dead_runs(folder):
        try:
            placed.append(_publish_one(folder, staging, owner))
        except (OSError, ValueError, TypeError, KeyError, results.PublishError) as e:
            # what cannot be read cannot be published: removed, as before dead runs were published, and said so
            shutil.rmtree(staging, ignore_errors=True)
            console.print(f"removed a dead run's folder {staging.name} that could not be published: {e}",
                          highlight=False, soft_wrap=True)
            continue
        console.print(f"published a run whose mlbench process had died as aborted: {placed[-1]}", highlight=False,
                      soft_wrap=True)
    return placed


def _publish_one(folder: Path, staging: Path, owner: str) -> Path:
    plan = RunPlan.load(staging / "plan.json")
    pid = owner.split("-", 1)[0]
    found = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
    reason = (f"mlbench (pid {pid}) died before the run ended (killed, or its session lost); published as "
              f"aborted by a later mlbench command at {found}")
    log = staging / "mlperf.log"
    _drop_cut_line(log)
    mlperf_log.finalize_aborted(log, reason, plan)
    outcome = Outcome(status="aborted", exit_code=-1, reason=reason, events=_events(staging / "events.jsonl"))
    bench, layout = plan.benchmark, Layout.from_dict(plan.layout)
    verdict = runner.compliance_verdict(log, bench)
    rec = runner.record(bench, layout, plan, outcome, verdict, runner.time_to_train(log), {}, "")
    return results.publish(folder, staging, rec | {"exit_code": None})  # nobody saw it exit


def _drop_cut_line(log: Path) -> None:
    """A line the kill cut short (no newline at its end) was never written whole: it goes, so the lines appended
    after it stay lines of their own."""
    with open(log, "rb+") as f:
        data = f.read()
        if data and not data.endswith(b"\n"):
            f.truncate(data.rfind(b"\n") + 1)


def _events(path: Path) -> list[dict]:
    """Rank 0's events as far as they were written, read as the supervisor reads them (a line the kill cut short,
    without its newline, is left out)."""
    tail = EventTail(path)
    tail.poll()
    return [e for e in tail.events if isinstance(e, dict)]
