"""The launcher for a set of runs, chosen once, and the one entry point that takes it through the contract."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from mlbench.launch.contract import Launcher

if TYPE_CHECKING:
    from rich.console import Console

    from mlbench.launch.slurm import SlurmOptions
    from mlbench.layout import Layout
    from mlbench.runner import RunOptions
    from mlbench.spec import Benchmark


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
    from mlbench import dead_runs
    from mlbench.launch.supervise import set_folder

    launcher = choose(bench, layout, opts, slurm_opts, console, dry_run)
    # A stop signal before the runs' own handlers are in place (supervise's) ends the command as an exception, so the
    # folders made for it and the seeds the set claimed (prepare) are removed (Ctrl-C raises KeyboardInterrupt).
    with set_folder(opts.results, opts.system, bench.name) as folder:
        dead_runs.publish(folder, console)  # what a killed mlbench left, before this run takes an index
        launcher.prepare(folder)
        launcher.start()
        launcher.supervise()
        return launcher.collect()

