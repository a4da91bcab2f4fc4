"""`--launcher torchrun`: one invocation per node meeting at a c10d rendezvous (here two "nodes" on this host)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import MLBENCH, mllog, result_dir

from mlbench.launch.ports import free_port

pytestmark = pytest.mark.slow


def test_two_nodes_meet_at_a_c10d_rendezvous(tmp_path: Path, quick_benchmarks: Path) -> None:
    """20 steps (quick_benchmarks' target): the rendezvous is the point, convergence is test_tiny_gpt3's."""
    endpoint = f"127.0.0.1:{free_port('127.0.0.1')}"
    procs = [subprocess.Popen([*MLBENCH, "run", "gpt3", "--tiny", "--nodes", "2", "--nproc-per-node", "1",
                               "--launcher", "torchrun", "--rdzv-endpoint", endpoint, "--node-rank", str(r),
                               "--results", str(tmp_path / f"node{r}"), "--system", "ci", "--seed", str(30 + r)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=dict(os.environ, COLUMNS="200", MLBENCH_BENCHMARKS=str(quick_benchmarks)))
             for r in (0, 1)]
    try:
        outs = [p.communicate(timeout=300)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], "\n".join(outs)
    # c10d assigns global ranks in rendezvous order: either node may host rank 0, which publishes the run.
    folders = [result_dir(tmp_path / f"node{r}", "gpt3") for r in (0, 1)]
    published = [f for f in folders if (f / "result_0.txt").exists()]
    assert len(published) == 1, outs
    (folder,) = published
    log = mllog(folder / "result_0.txt")
    assert [e["metadata"]["status"] for e in log if e["key"] == "run_stop"] == ["success"]
    seeds = [e["value"] for e in log if e["key"] == "seed"]
    assert len(seeds) == 1 and seeds[0] in (30, 31)  # the leader's seed, broadcast to the other node
    assert json.loads((folder / "result_0.json").read_text())["layout"]["world_size"] == 2
    (other,) = [f for f in folders if f is not folder]
    assert not list(other.glob("result_*")) and list((other / "logs").iterdir())  # only its rank logs
