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
    from mlbench import dead_runs, results

    launcher = choose(bench, layout, opts, slurm_opts, console, dry_run)
    with results.result_folder(opts.results, opts.system, bench.name) as folder:
        dead_runs.publish(folder, EscapingConsole(console))  # what a killed mlbench left, before this run takes one
        launcher.prepare(folder)
        launcher.start()
        launcher.supervise()
        return launcher.collect()


class EscapingConsole:
    """CONSOLE whose `print` writes its text `printable`: for the notes on dead runs (mlbench.dead_runs), which
    name a staging folder and an error as they are ("... ({staging.name}) could not be published: ..."): a
    folder named "x\\nerror: forged" forged a line, an ESC in it reached the terminal."""

    def __init__(self, console: Console):
        self._console = console

    def print(self, *objects: object, **kwargs: object) -> None:
        from mlbench.errors import printable

        self._console.print(*(printable(o) if isinstance(o, str) else o for o in objects), **kwargs)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> object:
        return getattr(self._console, name)
