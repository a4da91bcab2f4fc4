"""`mlbench run --launcher slurm` on a real two-node SLURM cluster on this machine (Debian's slurmctld/slurmd).

Both "nodes" are this host (127.0.0.1), so the rendezvous address is given (--master-addr 127.0.0.1): the
node names do not resolve. Skips, with the reason, where SLURM cannot run (not root, packages absent).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from pathlib import Path

import pytest
from conftest import MLBENCH, mlbench, mllog, result_dir
from slurm_cluster import SlurmCluster, available
from test_rank_failures import fail_at_step_3

ok, why = available()
pytestmark = [pytest.mark.slurm, pytest.mark.skipif(not ok, reason=why)]


@pytest.fixture(scope="module", autouse=True)
def cpu_measured() -> None:
    """A run's record holds the planner's prediction once this CPU is measured (once a machine, cached): measured
    here, not left to another file's test that may run after these in another worker (on a fresh machine the
    prediction was 'this CPU is not measured yet'). Two workers at once measure once: the second waits."""
    from mlbench.planner import cpu

    cpu.measured()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    """One cluster for the module (starting and stopping one costs seconds): each test's jobs end before it does."""
    with SlurmCluster(tmp_path_factory.mktemp("cluster"), nodes=2, cpus_per_node=2, max_time="00:10:00") as c:
        yield c
    assert not [p.pid for p in c.procs.values() if p.poll() is None], "daemons left behind"


def _run(cluster: SlurmCluster, root: Path, *flags: str, quick_env: dict):
    """20 steps a run (quick_env's target): the launcher is the point here, convergence is test_tiny_gpt3's."""
    return mlbench("run", "gpt3", "--tiny", "--nodes", "2", "--nproc-per-node", "1", "--launcher", "slurm",
                   "--master-addr", "127.0.0.1", "--time", "00:08:00", "--results", str(root), "--system", "ci",
                   "--seed", "21", *flags, env={**cluster.env, **quick_env}, timeout=420)


@pytest.mark.parametrize("flags", [["--runs", "2"], ["--pp", "2", "--save-checkpoint", "CKPT"]],
                         ids=["dp2-two-runs", "pp2-saves-a-checkpoint"])
def test_tiny_gpt3_across_two_slurm_nodes(cluster: SlurmCluster, tmp_path: Path, flags: list[str],
                                          quick_env: dict, cli) -> None:
    # A space, a quote and a dollar in the path: it reaches sbatch's own #SBATCH parser (the job's output file),
    # srun and bash -c (the rank's plan) through the rendered script's quoting.
    root = tmp_path / "odd dir's $results"
    flags = [str(tmp_path / "ckpt") if f == "CKPT" else f for f in flags]
    proc = _run(cluster, root, *flags, quick_env=quick_env)
    assert proc.returncode == 0, proc.stdout + proc.stderr + cluster.logs()
    assert "submitted SLURM job" in proc.stdout and "target reached" in proc.stdout
    assert list(root.glob("ci/gpt3/.slurm/*/job.out")), "sbatch wrote the job's output where #SBATCH said"
    job_id = proc.stdout.split("submitted SLURM job ")[1].split(";")[0]
    # live: the job's state as it changes, each run's progress as rank 0 reports it, the state at its end
    assert f"SLURM job {job_id}: RUNNING on " in proc.stdout and "step 20/" in proc.stdout, proc.stdout
    assert f"SLURM job {job_id}: COMPLETED, exit code 0:0" in proc.stdout, proc.stdout
    folder = result_dir(root, "gpt3")
    stops = [e for e in mllog(folder / "result_0.txt") if e["key"] == "run_stop"]
    assert stops[0]["metadata"]["status"] == "success"
    record = json.loads((folder / "result_0.json").read_text())
    assert record["environment"]["slurm_job_id"] and record["compliance"]["ok"]
    assert record["layout"]["world_size"] == 2 and record["layout"]["nodes"] == 2
    # the planner's prediction, as a local run's record holds it (the driver's layout had its features as a plain
    # dict: "AttributeError: 'dict' object has no attribute 'distributed_optimizer'")
    assert record["prediction"]["device"] == "cpu" and record["prediction"]["step_time_s"] > 0, record["prediction"]
    # every step once: the nodes share the run's plan, and only rank 0 writes its events
    assert [s["step"] for s in record["steps"]] == list(range(1, 21)), record["steps"]
    # one torchrun per node wrote its rank logs into the gathered folder
    assert len(list((folder / "logs" / "result_0").glob("*"))) == 2
    checked = cli("check", folder / "result_0.txt")  # in this process: a subprocess adds nothing here
    assert checked.returncode == 0, checked.stdout
    if "--save-checkpoint" in flags:  # both nodes' ranks wrote their shards; the folder appeared whole
        assert record["saved_checkpoint"]["path"] == str(tmp_path / "ckpt")
        assert (tmp_path / "ckpt" / "metadata.json").is_file() and list((tmp_path / "ckpt").glob("*.distcp"))
    if "--runs" in flags:  # K runs, one after another in one allocation, each with its own seed and result
        second = json.loads((folder / "result_1.json").read_text())
        assert second["status"] == "success" and second["seed"] == record["seed"] + 1
        assert second["environment"]["slurm_job_id"] == record["environment"]["slurm_job_id"]


def test_preemption_signal_aborts_the_run_cleanly(cluster: SlurmCluster, tmp_path: Path) -> None:
    """SIGTERM to the batch step (as SLURM's --signal=B:TERM warning, or scancel --batch, delivers it)."""
    root = tmp_path / "results"
    proc = subprocess.Popen([*MLBENCH, "run", "gpt3", "--tiny", "--nodes", "2", "--nproc-per-node", "1",
                             "--launcher", "slurm", "--master-addr", "127.0.0.1", "--time", "00:08:00",
                             "--results", str(root), "--system", "ci", "--seed", "4"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=cluster.env)
    try:
        deadline = time.monotonic() + 180
        while not any('"event": "step"' in f.read_text() for f in root.glob("ci/gpt3/.staging-*/events.jsonl")):
            assert time.monotonic() < deadline and proc.poll() is None, "no training step"
            time.sleep(0.5)
        job_id = next(root.glob("ci/gpt3/.slurm/*/job_id")).read_text().strip()
        # each node's torchrun waits for the others as long as --rdzv-timeout says (it kept torch's own 600 s
        # whatever the run's; 600 is the run's default): both "nodes" are this host, their torchruns seen here
        assert _torchrun_node_ranks("--rdzv-conf=timeout=600") == {"0", "1"}
        cluster.run(["scancel", "--signal=TERM", "--batch", job_id])
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 1, out
    folder = result_dir(root, "gpt3")
    stops = [e for e in mllog(folder / "result_0.txt") if e["key"] == "run_stop"]
    assert [s["metadata"]["status"] for s in stops] == ["aborted"]
    record = json.loads((folder / "result_0.json").read_text())
    # the driver asked slurmctld why (test_a_node_that_fails_...): the job ran, far from its time limit, and no node
    # failed: the signal is the reason
    assert record["status"] == "aborted" and record["reason"] == "received SIGTERM", record["reason"]


def test_a_rank_of_another_node_that_fails_is_named_in_the_record(cluster: SlurmCluster, tmp_path: Path) -> None:
    """Rank 1 (node 1's only rank) exits 7 at step 3: the reason was rank 0's gloo error ("Connection closed by
    peer", its peer gone), the nodes' torchruns' own words left in the run's launcher.log. It now names the rank,
    its node and its logs (each node's under node<N>)."""
    out = mlbench("run", "gpt3", "--tiny", "--nodes", "2", "--nproc-per-node", "1", "--launcher", "slurm",
                  "--master-addr", "127.0.0.1", "--time", "00:08:00", "--results", str(tmp_path / "r"), "--system",
                  "ci", "--seed", "5", env={**cluster.env, **fail_at_step_3(tmp_path, kill=False)}, timeout=300)
    assert out.returncode == 1, out.stdout + out.stderr + cluster.logs()
    folder = result_dir(tmp_path / "r", "gpt3")
    [logs] = [p.relative_to(folder / "logs" / "result_0") for p in folder.glob("logs/result_0/node1/*/attempt_0/0")]
    reason = f"rank 1 (node 1's local rank 0) exited with code 7 (see the rank logs: {logs})"
    stops = [e for e in mllog(folder / "result_0.txt") if e["key"] == "run_stop"]
    assert [(s["metadata"]["status"], s["metadata"]["reason"]) for s in stops] == [("aborted", reason)], out.stdout
    assert json.loads((folder / "result_0.json").read_text())["reason"] == reason
    assert f"aborted {folder / 'result_0.txt'} ({reason})" in out.stdout, out.stdout


def _torchrun_node_ranks(word: str) -> set[str]:
    """The --node-rank of every torchrun running on this host whose argv holds WORD."""
    ranks = set()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if word in argv and any(a.endswith("torchrun") or a == "torch.distributed.run" for a in argv):
            ranks |= {a.split("=", 1)[1] for a in argv if a.startswith("--node-rank=")}
    return ranks


def test_an_unresolvable_rendezvous_address_fails_fast_with_the_reason(cluster: SlurmCluster, tmp_path: Path) -> None:
    """It hung until the 30-minute init timeout, the user seeing only "submitted SLURM job N"."""
    start = time.monotonic()
    proc = mlbench("run", "gpt3", "--tiny", "--nodes", "2", "--nproc-per-node", "1", "--launcher", "slurm",
                   "--master-addr", "no-such-host.invalid", "--time", "00:08:00", "--results", str(tmp_path),
                   "--system", "ci", env=cluster.env, timeout=180)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert time.monotonic() - start < 90
    job_id = proc.stdout.split("submitted SLURM job ")[1].split(";")[0]
    assert f"SLURM job {job_id}: FAILED, exit code 1:0" in proc.stdout, proc.stdout  # the job's state at its end
    # the reason is the command's error: on stderr, naming the job
    assert proc.stderr.startswith(f"error: SLURM job {job_id}: ") and "'no-such-host.invalid' does not resolve" in \
        proc.stderr, proc.stderr
    assert "does not resolve" not in proc.stdout, proc.stdout  # (said once: the driver's line is not streamed)
    assert not list((tmp_path / "ci" / "gpt3").glob("result_*"))


def test_too_many_nodes_fails_fast(cluster: SlurmCluster, tmp_path: Path) -> None:
    start = time.monotonic()
    proc = mlbench("run", "gpt3", "--tiny", "--nodes", "4", "--nproc-per-node", "1", "--micro-batch-size", "4",
                   "--launcher", "slurm", "--results", str(tmp_path), env=cluster.env, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "SLURM cannot run this job" in proc.stderr and "--nodes" in proc.stderr
    assert time.monotonic() - start < 30


@pytest.mark.parametrize("flags", [["--partition", "nosuch"], ["--gpus-per-node", "100000"]],
                         ids=["partition", "gpus-per-node"])
def test_bad_partition_fails_fast(cluster: SlurmCluster, tmp_path: Path, flags: list[str]) -> None:
    proc = mlbench("run", "gpt3", "--tiny", "--nodes", "2", "--nproc-per-node", "1", "--launcher", "slurm",
                   *flags, "--results", str(tmp_path), env=cluster.env, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "SLURM cannot run this job" in proc.stderr and proc.stdout == "", proc.stdout + proc.stderr
    assert not list(tmp_path.iterdir()), "a refused run leaves no folders"
    if "--gpus-per-node" in flags:  # sbatch's words name no flag ("Invalid generic resource (gres) specification"),
        # and the hint named every flag but this one (check --nodes, --partition, --account, --time)
        assert proc.stderr.count("\n") == 1 and "(--gpus-per-node 100000: no node of the partition has that many " \
            "GPUs, as SLURM counts them" in proc.stderr, proc.stderr


def _two_node_run_training(cluster: SlurmCluster, root: Path, seed: int) -> subprocess.Popen:
    """`mlbench run gpt3 --tiny` over the cluster's two nodes, once its first training step is logged."""
    proc = subprocess.Popen([*MLBENCH, "run", "gpt3", "--tiny", "--nodes", "2", "--nproc-per-node", "1",
                             "--launcher", "slurm", "--master-addr", "127.0.0.1", "--time", "00:08:00",
                             "--results", str(root), "--system", "ci", "--seed", str(seed)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**cluster.env, "COLUMNS": "400"})
    deadline = time.monotonic() + 180
    while not any('"event": "step"' in f.read_text() for f in root.glob("ci/gpt3/.staging-*/events.jsonl")):
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            raise AssertionError(f"no training step: {proc.communicate()[0]}{cluster.logs()}")
        time.sleep(0.2)
    return proc


def test_a_node_that_fails_is_the_runs_reason_not_the_sigterm(cluster: SlurmCluster, tmp_path: Path) -> None:
    """SLURM ends a job whose node fails (NODE_FAIL), SIGTERM to each of its steps: the run was recorded "received
    SIGTERM" (the batch step's signal) in its log, record and summary line, SLURM's own line in the job's output
    alone saying why, and the end line said "NODE_FAIL, exit code 143:0 (sbatch exit code 143)". The driver now asks
    slurmctld as the signal comes. A job at its time limit takes the same path (Reason=TimeLimit, in test_launch.py
    from this cluster's words: a real one costs a minute at least)."""
    root = tmp_path / "results"
    proc = _two_node_run_training(cluster, root, seed=6)
    try:
        cluster.run(["scontrol", "update", "nodename=node2", "state=down", "reason=mlbench-test"])
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
        cluster.run(["scontrol", "update", "nodename=node2", "state=resume"], check=False)  # for the module's next
        cluster._wait_idle()
    assert proc.returncode == 1, out + cluster.logs()
    folder = result_dir(root, "gpt3")
    reason = "the SLURM job's node node2 failed (NODE_FAIL): SLURM stopped the job"
    stops = [e for e in mllog(folder / "result_0.txt") if e["key"] == "run_stop"]
    assert [(s["metadata"]["status"], s["metadata"]["reason"]) for s in stops] == [("aborted", reason)], out
    assert json.loads((folder / "result_0.json").read_text())["reason"] == reason
    assert f"aborted {folder / 'result_0.txt'} ({reason})" in out, out
    job_id = out.split("submitted SLURM job ")[1].split(";")[0]
    assert f"SLURM job {job_id}: NODE_FAIL, exit code " in out and ": a node failed and SLURM stopped it\n" in out, out
    assert "sbatch exit code" not in out, out


def _node_processes(cluster: SlurmCluster, node: str) -> list[int]:
    """What a lost host NODE takes with it: its slurmd, its slurmstepds (they keep its log and spool open) and the
    job's processes there (the driver, srun, torchrun, the ranks: SLURMD_NODENAME in their environment)."""
    pids = [cluster.procs[f"slurmd-{node}"].pid]
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            job_here = f"SLURMD_NODENAME={node}".encode() in (proc / "environ").read_bytes().split(b"\0")
            if job_here or (proc / "comm").read_text().strip() == "slurmstepd" and node in _open_files(proc):
                pids.append(int(proc.name))
    return pids


def _open_files(proc: Path) -> str:
    """The paths PROC has open, one a line."""
    paths = []
    for fd in (proc / "fd").iterdir():
        with contextlib.suppress(OSError):
            paths.append(str(fd.readlink()))
    return "\n".join(paths)


def test_the_drivers_node_lost_mid_run_is_the_runs_reason(cluster: SlurmCluster, tmp_path: Path) -> None:
    """Rank 0's node, where the job's driver runs, lost mid-run (its slurmd, slurmstepds and the job's processes
    there killed at once, and the node marked down as slurmctld marks it once it misses its pings): SLURM ends the
    job NODE_FAIL; the run the driver left was published with 'mlbench (pid
    N) died before the run ended (killed, or its session lost); published as aborted by a later mlbench command'.
    Its reason names the driver's node and the job's end now, and nothing of the job runs on."""
    import os
    import signal

    root = tmp_path / "results"
    proc = _two_node_run_training(cluster, root, seed=7)
    try:
        for pid in _node_processes(cluster, "node1"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        # what slurmctld does once node1 misses SlurmdTimeout (10 s, and up to 10 more to ping it), at once
        cluster.run(["scontrol", "update", "nodename=node1", "state=down", "reason=mlbench-test"])
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
        cluster.procs["slurmd-node1"].wait()
        cluster._spawn("slurmd-node1", ["slurmd", "-D", "-N", "node1", "-f", str(cluster.conf)],
                       cluster.root / "log" / "slurmd-node1.again.out")  # for the module's next test
        cluster.run(["scontrol", "update", "nodename=node1", "state=resume"], check=False)
        cluster._wait_idle()
    assert proc.returncode == 1, out + cluster.logs()
    folder = result_dir(root, "gpt3")
    record = json.loads((folder / "result_0.json").read_text())
    assert record["status"] == "aborted" and record["reason"].startswith(
        "the SLURM job's driver on node1 (pid ") and "died before the run ended (the job ended NODE_FAIL, exit code " \
        "0:0: a node failed and SLURM stopped it); published as aborted by mlbench run, following the job, at " \
        in record["reason"], record["reason"] + out
    stops = [e for e in mllog(folder / "result_0.txt") if e["key"] == "run_stop"]
    assert [(s["metadata"]["status"], s["metadata"]["reason"]) for s in stops] == [("aborted", record["reason"])]
    assert f"aborted {folder / 'result_0.txt'} ({record['reason']})" in out, out
    assert not _torchrun_node_ranks("--rdzv-conf=timeout=600"), "a node's torchrun runs on"
