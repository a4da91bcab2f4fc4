"""Launchers: how a set of runs is started and supervised. `start` is the one entry point the CLI calls."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

    from mlbench.launch.slurm import SlurmOptions
    from mlbench.layout import Layout
    from mlbench.runner import RunOptions
    from mlbench.spec import Benchmark


def start(bench: Benchmark, layout: Layout, opts: RunOptions, slurm_opts: SlurmOptions | None, console: Console,
          dry_run: bool) -> int:
    """Runs (or, with `dry_run`, describes) the set of runs; returns the exit code: 0 when every run reached its
    target. `slurm_opts` given: an sbatch job; otherwise torchrun on this machine or on each node."""
    from mlbench import results

    with results.result_folder(opts.results, opts.system, bench.name) as folder:
        if slurm_opts is not None:
            from mlbench.launch import slurm

            return slurm.launch(bench, layout, opts, slurm_opts, console, folder, dry_run=dry_run)
        if dry_run:
            from mlbench import dry_run as dry

            return dry.run(bench, layout, opts, console, folder)
        from mlbench import runner

        outcomes = runner.run_set(bench, layout, opts, console, folder, runner.local_commands(layout, opts))
        return 0 if all(o.ok for o in outcomes) else 1
