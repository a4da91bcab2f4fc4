"""A real two-node SLURM cluster on this host (tests/slurm_cluster.py) and the scheduler behaviours mlbench's SLURM
launcher relies on: a job too big refused at submission, scancel's final state, munge authentication. mlbench's
own runs on it: test_slurm_run.py; the sbatch renderer: test_slurm_script.py."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

try:  # tests/ may or may not be a package, depending on who else adds files there
    from tests.slurm_cluster import SlurmCluster, available
except ImportError:
    from slurm_cluster import SlurmCluster, available  # type: ignore[no-redef]

OK, WHY = available()
needs_slurm = pytest.mark.skipif(not OK, reason=WHY or "SLURM available")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """One cluster for the module's tests that share one (starting and stopping one costs seconds)."""
    with SlurmCluster(tmp_path_factory.mktemp("cluster"), nodes=2, cpus_per_node=2) as c:
        yield c
    assert not _our_procs(c), "daemons left behind"


def _our_procs(c: SlurmCluster) -> list[int]:
    return [p.pid for p in c.procs.values() if p.poll() is None]


def _wait_state(c: SlurmCluster, job_id: str, want: set[str], timeout: float = 20) -> str:
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        state = c.job_state(job_id)
        if state in want:
            return state
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} is {state}, wanted {want}\n{c.logs()}")


def _sbatch_too_many(c: SlurmCluster, *extra: str) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    r = c.run(["sbatch", "--parsable", f"--nodes={c.nodes + 1}", "--time=00:00:30", *extra,
               "--wrap", "true"], check=False, timeout=20)  # fmt: skip
    return r, time.monotonic() - t0


@pytest.mark.slurm
@needs_slurm
def test_too_many_nodes_fails_fast(cluster: SlurmCluster) -> None:
    # EnforcePartLimits=ALL (the cluster's default): slurmctld refuses the job at submission.
    r, took = _sbatch_too_many(cluster)
    assert r.returncode != 0 and "Node count specification invalid" in r.stderr, r
    assert took < 5
    assert cluster.run(["squeue", "-h"]).stdout.strip() == ""


@pytest.mark.slurm
@needs_slurm
def test_too_many_nodes_test_only_precheck(tmp_path: Path) -> None:
    # Without EnforcePartLimits the job would pend forever (reason PartitionConfig); sbatch 22.05
    # has no --immediate. `sbatch --test-only` asks the scheduler without submitting and fails at once.
    with SlurmCluster(tmp_path, enforce_part_limits=False) as c:
        r, took = _sbatch_too_many(c, "--test-only")
        assert r.returncode != 0 and "Requested node configuration is not available" in r.stderr, r
        assert took < 5
        r, _ = _sbatch_too_many(c)  # the trap itself: accepted, then stuck
        assert r.returncode == 0, r
        job_id = r.stdout.strip()
        time.sleep(0.5)
        reason = c.run(["squeue", "-h", "-j", job_id, "-o", "%T %r"]).stdout.split()
        assert reason == ["PENDING", "PartitionConfig"], reason
    # ...and teardown cancelled it and still stopped everything.
    assert not _our_procs(c)


@pytest.mark.slurm
@needs_slurm
def test_scancel_leaves_cancelled(cluster: SlurmCluster, tmp_path: Path) -> None:
    """Someone's scancel: the job ends CANCELLED, and its batch step, as it gets the SIGTERM, sees what the driver's
    reasoning (launch.slurm.why_stopped) needs to say so: the run was recorded "received SIGTERM" before."""
    (tmp_path / "why.py").write_text("import os, sys\nfrom pathlib import Path\n"
                                     "from mlbench.launch.slurm import SlurmOptions, why_stopped\n"
                                     "print(why_stopped(os.environ['SLURM_JOB_ID'], Path(sys.argv[1]), "
                                     "SlurmOptions(), 'SIGTERM'))\n")
    # detached from the step (reparented: proctrack/linuxproc follows children only), so that SLURM's SIGKILL
    # KillWait (2 s here) after the SIGTERM does not take it while a loaded machine still imports mlbench
    trap = (f"trap '( setsid {sys.executable} {tmp_path}/why.py {tmp_path} > {tmp_path}/reason.part && "
            f"mv {tmp_path}/reason.part {tmp_path}/reason & ); exit 143' TERM")
    r = cluster.run(["sbatch", "--parsable", "--nodes=2", "--time=00:01:00", f"--output={tmp_path}/%j.out",
                     "--wrap", f"{trap}; srun sleep 60 & wait"])  # fmt: skip
    job_id = r.stdout.strip()
    _wait_state(cluster, job_id, {"RUNNING"})
    cluster.run(["scancel", job_id])
    assert _wait_state(cluster, job_id, {"CANCELLED"}) == "CANCELLED"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (tmp_path / "reason").exists():
        time.sleep(0.2)
    assert (tmp_path / "reason").read_text() == \
        "the SLURM job was cancelled from outside mlbench run (scancel): SLURM stopped it\n"
    # The jobcomp text file (no slurmdbd) records it too; sacct --completion reads that.
    deadline = time.monotonic() + 10
    rows: list[str] = []
    while time.monotonic() < deadline and not rows:
        out = cluster.run(["sacct", "--completion", "-n", "-P", "-j", job_id, "-o", "JobID,State"]).stdout
        rows = [ln for ln in out.splitlines() if ln.strip()]
        time.sleep(0.2)
    assert rows and rows[0].split("|")[1].startswith("CANCELLED"), rows


@pytest.mark.slurm
@pytest.mark.skipif(not available("munge")[0], reason=available("munge")[1] or "munge available")
def test_munge_auth_cluster(tmp_path: Path) -> None:
    # The default cluster uses auth/none; real clusters use munge, which works here too.
    with SlurmCluster(tmp_path, auth="munge") as c:
        out = tmp_path / "nodes.out"
        r = c.run(["sbatch", "--wait", "--nodes=2", "--time=00:00:30", f"--output={out}",
                   "--wrap", "srun --ntasks-per-node=1 printenv SLURMD_NODENAME"], check=False)  # fmt: skip
        assert r.returncode == 0, r.stderr + c.logs()
        assert sorted(out.read_text().split()) == ["node1", "node2"]
    assert not _our_procs(c)
