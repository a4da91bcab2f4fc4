"""Launchers: how a set of runs is started and followed. `start` is the one entry point the CLI calls; it chooses
the launcher once and takes it through the same contract, whichever it is:

- prepare(folder): checks and files before anything starts; a request that cannot run is refused here
  (UserError), and the result folder it opened is left as it was;
- start(): the runs (a SLURM job) begin; a dry run starts nothing;
- supervise(): followed to their end, with live progress;
- collect(): what they produced, reported; the exit code (0 when every run reached its target).

Launchers: runner.RunSet (`local`: this machine, torchrun or, for one process, the rank itself; `torchrun`: one
invocation per node; also the driver inside a SLURM job), slurm.SlurmLauncher (an sbatch job) and
dry_run.DryRun (starts nothing; shows what the launcher it wraps would start).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from rich.console import Console

    from mlbench.launch.slurm import SlurmOptions
    from mlbench.layout import Layout
    from mlbench.runner import RunOptions
    from mlbench.spec import Benchmark


class Launcher(Protocol):
    def describe(self, folder: Path) -> list[tuple[str, str]]:
        """What it would start, as (what, text) lines: for the dry run."""

    def prepare(self, folder: Path) -> None: ...

    def start(self) -> None: ...

    def supervise(self) -> None: ...

    def collect(self) -> int: ...


def choose(bench: Benchmark, layout: Layout, opts: RunOptions, slurm_opts: SlurmOptions | None, console: Console,
           dry_run: bool) -> Launcher:
    """`slurm_opts` given: an sbatch job; otherwise torchrun on this machine or on each node (the rank itself for
    one process); `dry_run`: that launcher wrapped in one that starts nothing."""
    from mlbench import runner

    if slurm_opts is not None:
        from mlbench.launch.slurm import SlurmLauncher

        launcher: Launcher = SlurmLauncher(bench, layout, opts, slurm_opts, console)
    else:
        if dry_run and layout.nodes > 1 and not opts.rdzv_endpoint:  # shown as each node's torchrun takes it
            opts = dataclasses.replace(opts, rdzv_endpoint="HOST:PORT")
        launcher = runner.RunSet(bench, layout, opts, console, runner.local_commands(layout, opts))
    if dry_run:
        from mlbench.dry_run import DryRun

        return DryRun(bench, layout, opts, console, launcher)
    return launcher


def start(bench: Benchmark, layout: Layout, opts: RunOptions, slurm_opts: SlurmOptions | None, console: Console,
          dry_run: bool) -> int:
    """Runs (or, with `dry_run`, describes) the set of runs; returns the exit code."""
    from mlbench import results

    launcher = choose(bench, layout, opts, slurm_opts, console, dry_run)
    with results.result_folder(opts.results, opts.system, bench.name) as folder:
        launcher.prepare(folder)
        launcher.start()
        launcher.supervise()
        return launcher.collect()
