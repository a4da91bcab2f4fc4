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


def test_nodes_started_with_other_layouts_are_refused_by_every_rank(tmp_path: Path) -> None:
    """Two node invocations that disagree (--nproc-per-node 1 and 2 with --gbs 32) trained a world of 3 ranks
    published as the layout of 2, compliant; the same world size with another --gbs hung or trained on. The ranks
    are started here as torchrun starts them (its environment, a plan each), without it."""
    import sys

    from mlbench import layout, registry
    from mlbench.run_plan import RunPlan

    bench = registry.load("gpt3", tiny=True)
    port = str(free_port("127.0.0.1"))

    def rank(name: str, ly, rank: int, world: int) -> subprocess.Popen:
        folder = tmp_path / name
        folder.mkdir()
        RunPlan(benchmark=bench, layout=ly.as_dict(), seed=1, run_dir=str(folder), system="ci").save(
            folder / "plan.json")
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK="0", WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=port)
        return subprocess.Popen([sys.executable, "-m", "mlbench.train", str(folder / "plan.json")], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    two = [layout.resolve(bench, 2, 1, global_batch_size=g) for g in (16, 32)]
    procs = {"world": rank("world", layout.resolve(bench, 1, 1), 0, 3),
             "rank0": rank("rank0", two[0], 0, 2), "rank1": rank("rank1", two[1], 1, 2)}
    outs = {name: p.communicate(timeout=120)[0] for name, p in procs.items()}
    assert all(p.returncode == 3 for p in procs.values()), outs  # each aborted, none trained
    said = {name: json.loads((tmp_path / name / "mlperf.log").read_text().splitlines()[-1].split(" ", 1)[1])
            for name in ("world", "rank0")}  # rank 0's logs
    assert said["world"]["metadata"]["reason"] == ("RuntimeError: torchrun formed 3 ranks, and this node's layout is "
                                                   "1 (1 nodes x 1): give every node the same layout flags")
    assert said["rank0"]["metadata"]["reason"].startswith("RuntimeError: 1 rank(s) were started with another layout")
    assert "run aborted: RuntimeError: 1 rank(s) were started with another layout" in outs["rank1"]
