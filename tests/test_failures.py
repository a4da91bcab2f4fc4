"""Runs that fail end cleanly: a dead rank, a dead launcher, a hang and SIGTERM each give run_stop `aborted`, a
record saying why, and a non-zero exit; a killed `mlbench run` takes every process of its run with it, and the
next run removes what it left. Real processes on this machine: mlbench's local agent (mlbench.launch.local_ranks) at
two ranks, the rank itself at one."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import MLBENCH, assert_no_markup, at_rank_start, mllog, quick_env_at, result_dir

pytestmark = pytest.mark.slow


def _start(tmp_path: Path, *extra: str, nproc: int = 2, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([*MLBENCH, "run", "gpt3", "--tiny", "--nproc-per-node", str(nproc), "--results",
                             str(tmp_path), "--seed", "3", "--system", "ci", *extra], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=dict(os.environ, COLUMNS="200", **(env or {})))


def _wait_for_steps(tmp_path: Path, n: int, timeout: float = 120, seed: int | None = None) -> None:
    """Until a run in progress under TMP_PATH (the one of SEED, where given: an earlier run's staging folder is
    still there as it is published) has logged N steps."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for events in tmp_path.glob("ci/gpt3/.staging-*/events.jsonl"):
            with contextlib.suppress(OSError, ValueError):  # (published meanwhile, or its plan not yet written)
                if seed is not None and json.loads((events.parent / "plan.json").read_text())["seed"] != seed:
                    continue
                if sum('"event": "step"' in line for line in events.read_text().splitlines()) >= n:
                    return
        time.sleep(0.2)
    raise AssertionError(f"no {n} steps within {timeout} s")


def _run_pids(tmp_path: Path) -> dict[int, bool]:
    """The live processes of the run under tmp_path: pid -> whether it is the launcher's agent (else a rank)."""
    out = subprocess.run(["pgrep", "-f", f"mlbench.train {tmp_path}"], capture_output=True, text=True).stdout
    pids = {}
    for pid in map(int, out.split()):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue  # exited, not yet reaped
            forked_rank = Path(f"/proc/{pid}/comm").read_text().startswith("mlbench rank")  # its cmdline the agent's
        except OSError:
            continue
        pids[pid] = not forked_rank and (b"torch.distributed.run" in cmd or b"mlbench.launch.local_ranks" in cmd)
    return pids


def _worker_pids(tmp_path: Path) -> list[int]:
    """The rank processes (not the launcher's agent) of the run under tmp_path."""
    return sorted(pid for pid, agent in _run_pids(tmp_path).items() if not agent)


def _communicate_or_explain(proc: subprocess.Popen, tmp_path: Path, timeout: float) -> str:
    """proc's output once it ends; if it does not within TIMEOUT, a failure that says what was still running and
    how the run's own logs end (the rank logs go with the temp folder, so they are shown here)."""
    try:
        return proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        running = {pid: Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:150].decode(errors="replace")
                   for pid in _run_pids(tmp_path)}
        tails = [f"--- {f.relative_to(tmp_path)}\n" + "\n".join(f.read_text(errors="replace").splitlines()[-15:])
                 for f in sorted(tmp_path.rglob("*")) if f.is_file() and f.suffix in (".log", ".jsonl")]
        proc.kill()
        out = proc.communicate()[0]
        raise AssertionError(f"mlbench run did not end within {timeout:g} s; still running: {running}\n{out}\n"
                             + "\n".join(tails)) from None


def _wait_gone(tmp_path: Path, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while _run_pids(tmp_path):
        assert time.monotonic() < deadline, f"left running: {_run_pids(tmp_path)}"
        time.sleep(0.1)


def _assert_aborted(tmp_path: Path, proc: subprocess.Popen, reason_part: str) -> dict:
    folder = result_dir(tmp_path, "gpt3")
    log = mllog(folder / "result_0.txt")
    stops = [e for e in log if e["key"] == "run_stop"]
    assert len(stops) == 1 and stops[0]["metadata"]["status"] == "aborted", stops
    # the checker wants exactly one train_samples: a run_stop rank 0 wrote itself had none
    assert [e["key"] for e in log].count("train_samples") == 1
    record = json.loads((folder / "result_0.json").read_text())
    assert record["status"] == "aborted"
    assert reason_part in record["reason"], record["reason"]
    # the log says why too (rank 0 said only "signal SIGTERM" when the supervisor stopped it for a hang)
    assert reason_part in stops[0]["metadata"]["reason"], stops[0]["metadata"]
    assert proc.returncode != 0
    assert not _worker_pids(tmp_path), "ranks left running"
    assert not list(folder.glob(".staging-*"))
    return record


def test_killed_rank_aborts_the_run_within_30_seconds(tmp_path: Path) -> None:
    """A rank killed (the OOM killer) mid-run is the run's reason, not rank 0's SIGTERM that followed from mlbench's
    agent ("Aborted: signal SIGTERM" before), whichever rank it is (test_rank_failures.py: the same at torchrun)."""
    proc = _start(tmp_path)
    _wait_for_steps(tmp_path, 5)
    pids = _worker_pids(tmp_path)
    assert len(pids) == 2
    rank = Path(f"/proc/{pids[-1]}/comm").read_text().split()[-1]  # "mlbench rank N": forked, its environ the agent's
    killed = time.monotonic()
    os.kill(pids[-1], signal.SIGKILL)
    out = _communicate_or_explain(proc, tmp_path, 60)
    elapsed = time.monotonic() - killed
    assert elapsed < 30, f"took {elapsed:.1f} s to notice and stop"
    _assert_aborted(tmp_path, proc, f"rank {rank} killed by SIGKILL (see the rank logs: local/attempt_0/{rank})")
    assert "target NOT reached" in out
    assert_no_markup(out)


def test_hang_is_detected_and_aborted(tmp_path: Path) -> None:
    """At one process the rank runs without an agent, under the same supervision."""
    proc = _start(tmp_path, "--hang-timeout", "4", nproc=1)
    _wait_for_steps(tmp_path, 3)
    os.kill(_worker_pids(tmp_path)[-1], signal.SIGSTOP)  # a rank that stops making progress
    proc.communicate(timeout=60)
    _assert_aborted(tmp_path, proc, "hang: no progress for 4 s")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1, signal.SIGQUIT], ids=["SIGTERM", "SIGUSR1", "SIGQUIT"])
def test_a_signal_aborts_cleanly_with_the_reason(tmp_path: Path, sig: signal.Signals) -> None:
    """SIGTERM (preemption, scancel), and signals whose default would end the supervisor alone (SIGUSR1; SIGQUIT,
    Ctrl-\\: each left the run unlogged in its staging folder, SIGQUIT with exit -3)."""
    proc = _start(tmp_path, nproc=1)
    _wait_for_steps(tmp_path, 1)
    assert not any(_run_pids(tmp_path).values()), "a one-process run starts no agent"
    _wait_for_steps(tmp_path, 3)
    proc.send_signal(sig)
    out = proc.communicate(timeout=60)[0]
    try:
        _assert_aborted(tmp_path, proc, f"received {sig.name}")
        assert proc.returncode == 128 + sig, proc.returncode  # as every command ends on a stop signal (it was 1)
    except AssertionError as e:
        raise AssertionError(f"{e}\nmlbench run said:\n{out}") from None


def test_ctrl_c_stops_the_set_not_only_the_run_in_progress(tmp_path: Path) -> None:
    """Ctrl-C in run 2 of 3: run 1 stays published, run 2 is logged aborted and published, run 3 is not started
    (it was: the set went on after the interrupted run). The tiny target itself (about 120 steps), not the quick
    one of step 20: on a loaded machine run 2 once reached step 20 between the test's second step and its Ctrl-C."""
    proc = subprocess.Popen([*MLBENCH, "run", "gpt3", "--tiny", "--runs", "3", "--results", str(tmp_path), "--seed",
                             "3", "--system", "ci"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "COLUMNS": "200"})
    folder = tmp_path / "ci" / "gpt3"
    deadline = time.monotonic() + 120
    while not (folder / "result_0.json").exists():
        assert time.monotonic() < deadline and proc.poll() is None, "run 1 not published"
        time.sleep(0.2)
    # run 2 (seed 3 + 1) is training: run 1's staging folder may still be there as it is published (a signal then
    # stopped the set before run 2)
    _wait_for_steps(tmp_path, 2, seed=4)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGINT, out
    records = [json.loads((folder / f"result_{i}.json").read_text()) for i in range(2)]
    assert [r["status"] for r in records] == ["success", "aborted"] and records[1]["reason"] == "received SIGINT"
    assert not list(folder.glob("result_2.*")) and not list(folder.glob(".staging-*"))
    assert "SIGINT: the set stops here; 1 more run(s) not started" in out, out


def test_a_closed_terminal_aborts_cleanly_with_the_reason(tmp_path: Path,
                                                        tmp_path_factory: pytest.TempPathFactory) -> None:
    """`mlbench run` on a terminal that closes (an SSH session dropping): SIGHUP, then every write to the terminal
    fails (EIO). It used to die of both, leaving the run unlogged in its staging folder; now the run is stopped,
    logged aborted and published like one stopped by SIGTERM. The run cannot end by itself first (a target no
    model meets in the test's seconds, a budget of 10^5 steps): a test stalled on a loaded machine once let it
    reach its target."""
    import pty

    # a target thousands of steps away (the floor, refused before launch, is 0.888): the test stops it at step 3
    env = quick_env_at(tmp_path_factory, {"min": 0.9, "max": 0.9})
    gpt3 = Path(env["MLBENCH_BENCHMARKS"]) / "gpt3.yaml"
    gpt3.write_text(gpt3.read_text().replace("max_steps: 300,", "max_steps: 100000,"))
    pid, fd = pty.fork()
    if pid == 0:  # the child: `mlbench run` with the pty as its terminal
        os.execvpe(MLBENCH[0], [*MLBENCH, "run", "gpt3", "--tiny", "--results", str(tmp_path), "--seed", "3",
                                "--system", "ci"], dict(os.environ, COLUMNS="100", **env))
    try:
        deadline = time.monotonic() + 120
        while True:  # read what it prints (a terminal left unread would block it) until three steps are logged
            r, _, _ = select.select([fd], [], [], 0.2)
            if r:
                os.read(fd, 1 << 16)
            if any(sum('"event": "step"' in ln for ln in e.read_text().splitlines()) >= 3
                   for e in tmp_path.glob("ci/gpt3/.staging-*/events.jsonl")):
                break
            assert time.monotonic() < deadline, "no 3 steps within 120 s"
    finally:
        os.close(fd)  # the terminal closes: SIGHUP to its session, EIO on writes
    _, status = os.waitpid(pid, 0)
    proc = subprocess.CompletedProcess([], os.waitstatus_to_exitcode(status))
    _assert_aborted(tmp_path, proc, "received SIGHUP")


def test_killed_launcher_aborts_the_run_and_leaves_no_rank(tmp_path: Path) -> None:
    """kill -9 of the local agent: its ranks die with it (parent-death signal), the run is logged aborted."""
    proc = _start(tmp_path)
    _wait_for_steps(tmp_path, 3)
    (agent,) = [pid for pid, is_agent in _run_pids(tmp_path).items() if is_agent]
    os.kill(agent, signal.SIGKILL)
    proc.communicate(timeout=60)
    _assert_aborted(tmp_path, proc, "")


def test_kill_9_of_mlbench_takes_the_run_with_it(tmp_path: Path, benchmarks_copy: Path) -> None:
    """kill -9 of `mlbench run`: the agent and the ranks stop (they trained on, unsupervised, before), nothing is
    published by them, and the next mlbench command in the folder publishes the dead run as aborted (before, it
    removed its staging folder, and the run went unrecorded), its log closed as rank 0 closes an aborted one."""
    # The first evaluation at step 200: under a loaded suite the ranks, ending as their launcher goes, once got to
    # step 24, past the evaluation at 20 that this run must not have reached.
    spec = yaml.safe_load((benchmarks_copy / "gpt3.yaml").read_text())
    spec["tiny"]["eval"]["interval_samples"] = 200 * spec["tiny"]["train"]["global_batch_size"]
    (benchmarks_copy / "gpt3.yaml").write_text(yaml.safe_dump(spec))
    env = {"MLBENCH_BENCHMARKS": str(benchmarks_copy)}
    root = tmp_path / "results"  # beside the benchmarks copy
    proc = _start(root, env=env)
    _wait_for_steps(root, 3)
    assert len(_run_pids(root)) == 3  # the agent and two ranks
    pid = proc.pid
    proc.kill()
    proc.communicate(timeout=30)
    _wait_gone(root)
    folder = result_dir(root, "gpt3")
    (stale,) = folder.glob(".staging-*")
    assert not list(folder.glob("result_*"))
    with open(stale / "mlperf.log", "a") as f:
        f.write(':::MLLOG {"namespace": "", "time_ms": 17')  # a line the kill cut short
    nxt = subprocess.run([*MLBENCH, "run", "gpt3", "--tiny", "--dry-run", "--results", str(root), "--system",
                          "ci"], capture_output=True, text=True, timeout=120, env=dict(os.environ, **env))
    assert nxt.returncode == 0, nxt.stdout + nxt.stderr
    assert "published a run whose mlbench process had died as aborted" in nxt.stdout, nxt.stdout
    assert not stale.exists()
    record = _assert_aborted(root, proc, f"mlbench (pid {pid}) died before the run ended")
    assert record["exit_code"] is None and record["seed"] == 3 and record["steps"], record
    # judged by the checker: not compliant for the evaluation it never reached, its run_stop and lines accepted
    messages = record["compliance"]["messages"]
    assert any("eval_accuracy" in m for m in messages), messages
    assert not any(k in m for m in messages for k in ("run_stop", "train_samples", "line")), messages
    assert (folder / "logs" / "result_0").is_dir()  # its rank logs kept, as any aborted run's


def test_sys_executable_is_used() -> None:
    assert MLBENCH[0] == sys.executable


# rank 1, as it starts, before any handler of its own: rank 0 waits for it inside init_process_group
_RANK_1_LATE = """        if os.environ.get("RANK") == "1":
            __import__("time").sleep(300)"""


def test_a_stop_during_the_rendezvous_ends_the_run_at_once(tmp_path: Path) -> None:
    """Rank 0 waiting for rank 1 inside init_process_group (C code, where no Python handler runs) ignored the
    supervisor's SIGTERM and ended only at its SIGKILL, after the 10 s grace; now SIGTERM ends it there at once,
    and the run is aborted with the supervisor's reason."""
    site = tmp_path.parent / f"{tmp_path.name}-site"  # beside the results, which hold one system folder
    proc = subprocess.Popen([*MLBENCH, "run", "gpt3", "--tiny", "--nproc-per-node", "2", "--results", str(tmp_path),
                             "--seed", "3", "--system", "ci"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=dict(os.environ, COLUMNS="200", **at_rank_start(site, _RANK_1_LATE)))
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob("ci/gpt3/.staging-*/mlperf.log")):  # rank 0's preamble: it is past its imports
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()[0]
        time.sleep(0.2)
    time.sleep(3)  # rank 0 imports torch and megatron-core, then waits in the rendezvous
    stopped = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out = _communicate_or_explain(proc, tmp_path, 60)
    elapsed = time.monotonic() - stopped
    record = _assert_aborted(tmp_path, proc, "received SIGTERM")
    assert record["steps"] == [], out
    assert elapsed < 8, f"{elapsed:.1f} s: the ranks were killed after the grace, not ended by SIGTERM"
