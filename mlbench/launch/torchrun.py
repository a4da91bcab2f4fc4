"""torchrun command lines: `local` is one standalone torchrun on this machine; `torchrun` is one invocation
per node meeting at a c10d rendezvous. Both start `python -m mlbench.train PLAN` on every rank."""

from __future__ import annotations

import sys
from pathlib import Path


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
           f"--log-dir={ranks_dir}", "--redirects=3", "--monitor-interval=0.5"]
    if rdzv_endpoint:
        cmd += [f"--node-rank={node_rank}", "--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}",
                f"--rdzv-id={rdzv_id}"]
    else:
        cmd += ["--standalone"]
    return cmd + ["-m", "mlbench.train", str(plan_path)]
