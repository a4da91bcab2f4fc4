"""How one run starts on a node: `torchrun` is one invocation per node meeting at a c10d rendezvous (and SLURM
runs one per node); `local` starts the rank itself for one process (`direct`: no agent to start and stop) and
mlbench.launch.local_ranks for more. Every rank runs `python -m mlbench.train PLAN`."""

from __future__ import annotations

import sys
from pathlib import Path

from mlbench.launch import local_ranks
from mlbench.launch.ports import free_port
from mlbench.launch.supervise import Command

RANK_MODULE = ["-m", "mlbench.train"]


def argv(
    plan_path: Path,
    ranks_dir: Path,
    *,
    nodes: int,
    nproc_per_node: int,
    node_rank: int = 0,
    rdzv_endpoint: str | None = None,
    rdzv_id: str = "mlbench",
) -> list[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nodes}",
           f"--nproc-per-node={nproc_per_node}",
           # per-rank stdout/stderr files under ranks_dir, gathered with the result
           f"--log-dir={ranks_dir}", "--redirects=3",
           # how often the agent looks at its workers: a dead rank, and the run's end, are noticed sooner than
           # at 0.5 s (teardown from the worker's end to torchrun's exit: median 0.63 s against 1.06 s,
           # perf/launch_overhead.py --agent)
           "--monitor-interval=0.1"]
    if rdzv_endpoint:
        cmd += [f"--node-rank={node_rank}", "--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}",
                f"--rdzv-id={rdzv_id}"]
    else:
        cmd += ["--standalone"]
    return cmd + [*RANK_MODULE, str(plan_path)]


def direct(plan_path: Path, ranks_dir: Path, env: dict[str, str]) -> Command:
    """The one rank of a one-process run, started as torchrun would start it (its environment; its output in
    the files torchrun's --log-dir/--redirects would give it)."""
    logs = ranks_dir / "direct" / "attempt_0" / "0"
    return Command([sys.executable, *RANK_MODULE, str(plan_path)],
                   local_ranks.rank_env(env, 0, 1, free_port("127.0.0.1")), stdout=logs / "stdout.log",
                   stderr=logs / "stderr.log", what="rank 0 (the only rank)")
