"""`mlbench run --dry-run`: the resolved layout, the commands, and the MLPerf log up to run_start."""

from __future__ import annotations

import os
import shlex
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from mlbench import results
from mlbench.launch import torchrun
from mlbench.layout import Layout
from mlbench.runner import RunOptions, seeds
from mlbench.spec import Benchmark
from mlbench.train.loop import write_preamble
from mlbench.train.plan import RunPlan


def layout_table(bench: Benchmark, layout: Layout) -> Table:
    t = Table(title=f"{bench.name}: resolved layout", show_header=False)
    d = layout.as_dict()
    for key in ("nodes", "nproc_per_node", "world_size", "tp", "pp", "vp", "cp", "dp", "micro_batch_size",
                "global_batch_size", "num_microbatches"):
        t.add_row(key, str(d[key]))
    return t


def run(bench: Benchmark, layout: Layout, opts: RunOptions, console: Console, command: str | None = None) -> Path:
    """`command`: what each run starts (default: the torchrun line of the local/torchrun launchers)."""
    console.print(layout_table(bench, layout))
    console.print(f"layout from: {layout.source}", highlight=False, soft_wrap=True)
    folder = results.run_folder(opts.results, opts.system, bench.name)
    seed = seeds(opts.seed, 1)[0]
    with tempfile.TemporaryDirectory(dir=folder, prefix=".dry-run-") as staging:
        plan = RunPlan(benchmark=bench, layout=layout.as_dict(), seed=seed, run_dir=staging, system=opts.system,
                       dry_run=True)
        write_preamble(plan)
        dest = folder / "dry-run.txt"  # not result_*.txt: scorers never mistake it for a run
        os.replace(plan.log_path, dest)
    if command is None:
        # On several nodes: one torchrun per node at a common rendezvous (the torchrun launcher's command).
        endpoint = opts.rdzv_endpoint or ("HOST:PORT" if layout.nodes > 1 else None)
        command = shlex.join(torchrun.argv(Path("PLAN.json"), Path("RANKS"), nodes=layout.nodes,
                                           nproc_per_node=layout.nproc_per_node, node_rank=opts.node_rank,
                                           rdzv_endpoint=endpoint))
    console.print("each run starts:", command, highlight=False, soft_wrap=True)
    console.print(f"MLPerf log up to run_start: {dest}", highlight=False)
    return dest
