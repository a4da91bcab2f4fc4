"""Launchers without training: what a one-process run starts (the rank itself, as torchrun would start it), what a
run of more ranks on this machine starts (mlbench's local agent), SLURM
job folders that never collide, a rendezvous address that does not resolve, the lifeline of a rank, and the
supervisor's prompt end. Real processes where a process is the point."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import MLBENCH, at_rank_start, mlbench, mllog

from mlbench import registry
from mlbench.launch import lifeline, ports, slurm, torchrun
from mlbench.launch.slurm_job import rendezvous_problem
from mlbench.launch.supervise import Command, _alive, supervise
from mlbench.layout import resolve
from mlbench.runner import RunOptions, local_commands


def _layout(nodes: int = 1, nproc: int = 1):
    return resolve(registry.load("gpt3", tiny=True), nodes, nproc, None, None, None, None, None, None)


def test_a_one_process_run_starts_the_rank_without_torchrun(tmp_path: Path) -> None:
    opts = RunOptions(results=tmp_path, system="s")
    one = local_commands(_layout(), opts)(tmp_path / "plan.json", tmp_path, 0, {"X": "1"})
    assert one.argv == [sys.executable, "-m", "mlbench.train", str(tmp_path / "plan.json")]
    env = one.env
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"], env["X"]) == (
        "0", "0", "1", "1", "1")
    assert env["MASTER_ADDR"] == "127.0.0.1" and 0 < int(env["MASTER_PORT"]) < 65536
    # where torchrun's --log-dir/--redirects would put them: <ranks>/<run>/attempt_0/<local rank>/std*.log
    assert one.stdout == tmp_path / "ranks" / "direct" / "attempt_0" / "0" / "stdout.log"
    assert one.stderr == one.stdout.with_name("stderr.log")
    # more ranks on this machine alone: mlbench's agent (torchrun's standalone job without torch's elastic agent)
    two = local_commands(_layout(nproc=2), opts)(tmp_path / "plan.json", tmp_path, 0, {})
    assert two.argv[1:4] == ["-m", "mlbench.launch.local_ranks", "--nproc-per-node=2"]
    assert f"--log-dir={tmp_path / 'ranks'}" in two.argv and two.argv[-3:] == ["-m", "mlbench.train",
                                                                               str(tmp_path / "plan.json")]
    # a rendezvous endpoint (the torchrun launcher, one invocation per node): torchrun itself, at a static rendezvous
    # (node rank R holds global ranks R x nproc..: node 0 hosts rank 0) that waits --rdzv-timeout for the nodes
    rdzv = RunOptions(results=tmp_path, system="s", rdzv_endpoint="h:29500", node_rank=1, rdzv_timeout=5)
    node = local_commands(_layout(nodes=2), rdzv)(tmp_path / "plan.json", tmp_path, 0, {})
    assert "torch.distributed.run" in node.argv and "--rdzv-endpoint=h:29500" in node.argv
    assert {"--rdzv-backend=static", "--rdzv-conf=timeout=5", "--node-rank=1"} <= set(node.argv)
    # each rank claims its node rank first (a second node with the same --node-rank stops), by its node's mark
    assert node.argv[-3:] == ["-m", "mlbench.launch.torchrun_rank", str(tmp_path / "plan.json")]
    assert len(node.env[torchrun.NODE_TOKEN]) == 32 and node.rendezvous.deadline_s == 2 * 5 + torchrun.FORMED_MARGIN_S


def test_the_dry_run_shows_the_command_a_run_starts(tmp_path: Path, cli) -> None:
    one = cli("run", "gpt3", "--tiny", "--dry-run", "--results", str(tmp_path), "--system", "s")
    assert one.returncode == 0, one.stdout + one.stderr
    # as a shell reads it: a checkout at a path with a space has its interpreter quoted
    assert f"each run starts: {shlex.join([sys.executable, '-m', 'mlbench.train', 'PLAN.json'])}" in one.stdout
    two = cli("run", "gpt3", "--tiny", "--dry-run", "--nproc-per-node", "2", "--results", str(tmp_path),
                  "--system", "s")
    assert "-m mlbench.launch.local_ranks --nproc-per-node=2" in two.stdout
    # --rdzv-timeout reaches a SLURM job's torchruns (it was refused with --launcher slurm: torch's 600 s held)
    job = cli("run", "gpt3", "--tiny", "--dry-run", "--nodes", "2", "--launcher", "slurm", "--rdzv-timeout", "45",
                  "--results", str(tmp_path), "--system", "j")
    assert job.returncode == 0 and "--rdzv-conf=timeout=45" in job.stdout, job.stdout + job.stderr
    # an IPv6 address in brackets (as a URL writes it) reaches MASTER_ADDR bare: torch and the driver's resolver read
    # '[::1]' as a host name, and the job failed as it started ("'[::1]' does not resolve")
    v6 = cli("run", "gpt3", "--tiny", "--dry-run", "--nodes", "2", "--launcher", "slurm", "--master-addr", "[::1]",
             "--results", str(tmp_path), "--system", "j")
    assert v6.returncode == 0 and "\nMASTER_ADDR=::1\n" in v6.stdout and "[::1]" not in v6.stdout, v6.stdout


def test_two_slurm_jobs_prepared_in_the_same_second_get_their_own_folders(tmp_path: Path) -> None:
    bench = registry.load("gpt3", tiny=True)
    opts = RunOptions(results=tmp_path, system="s")
    dirs = {slurm.write_job(bench, _layout(2), opts, slurm.SlurmOptions(), tmp_path) for _ in range(5)}
    assert len(dirs) == 5 and all((d / "job.sbatch").is_file() for d in dirs)


@pytest.mark.parametrize("junk", ["file", "dead link"])
def test_a_slurm_folder_that_is_no_folder_is_named_in_the_refusal(tmp_path: Path, junk: str) -> None:
    """.slurm in the results folder a file or a dead link: the refusal said only 'File exists'."""
    from mlbench.errors import UserError

    blocker = tmp_path / ".slurm"
    blocker.write_text("x") if junk == "file" else blocker.symlink_to(tmp_path / "gone")
    opts = RunOptions(results=tmp_path, system="s")
    with pytest.raises(UserError, match=f"cannot write the SLURM job in {tmp_path}: {blocker}: File exists \\(the "
                                        f"job's files go in {blocker}, a folder of its own: move what is in the way"):
        slurm.write_job(registry.load("gpt3", tiny=True), _layout(2), opts, slurm.SlurmOptions(), tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".slurm"]


def test_an_unresolvable_rendezvous_address_is_named() -> None:
    assert rendezvous_problem("127.0.0.1") == ""
    problem = rendezvous_problem("no-such-host.invalid")
    assert "'no-such-host.invalid' does not resolve" in problem and "--master-addr" in problem


def test_a_rendezvous_address_that_is_not_the_first_nodes_is_named() -> None:
    """A --master-addr that resolves but is no address of the job's first node (where the driver runs and node 0's
    torchrun hosts the rendezvous): every node retried it until --rdzv-timeout (600 s), the user seeing only
    'RUNNING'; the driver now says so at once."""
    assert rendezvous_problem("localhost") == ""
    problem = rendezvous_problem("192.0.2.1")  # TEST-NET-1: routed nowhere, held by no host
    assert "'192.0.2.1' (192.0.2.1) is not an address of" in problem and "--master-addr" in problem, problem


def test_free_ports_are_distinct_and_below_the_ephemeral_range() -> None:
    found = ports.free_ports(8, "127.0.0.1")
    assert len(set(found)) == 8
    # where no outgoing connection or bind to port 0 can be handed one between its choice and the rendezvous
    assert all(ports.LOWEST <= p < ports._ephemeral_low() for p in found), found


RANK = """
import sys, time
from mlbench.launch import lifeline
lifeline.install_pdeathsig(SIG)
print("armed", flush=True)
while SIG or lifeline.parent_alive():  # with a signal armed, only the signal can end it
    time.sleep(0.05)
sys.exit(lifeline.ORPHANED_EXIT)
"""


@pytest.mark.parametrize("sig", [signal.SIGKILL, 0], ids=["parent-death-signal", "parent-check-alone"])
def test_a_rank_dies_with_its_launcher(sig: int) -> None:
    """A launcher (here a shell) starts a rank that arms its lifeline; SIGKILL of the launcher ends the rank at
    once: by the parent-death signal, or (0: no signal, as off Linux) by the check of its parent."""
    rank_code = RANK.replace("SIG", str(int(sig)))
    launcher = subprocess.Popen(["bash", "-c", f"{shlex.quote(sys.executable)} -c '{rank_code}' & wait"],
                                stdout=subprocess.PIPE, text=True)
    assert launcher.stdout.readline().strip() == "armed"
    rank = int(subprocess.run(["pgrep", "-P", str(launcher.pid)], capture_output=True, text=True).stdout.split()[0])
    launcher.kill()
    launcher.wait()
    deadline = time.monotonic() + 5
    while _alive(rank):  # a zombie (exited, not yet reaped) counts as dead
        assert time.monotonic() < deadline, "the rank outlived its launcher"
        time.sleep(0.02)
    assert lifeline.parent_alive()  # in this process nothing was armed: always true


def test_the_supervisor_returns_as_soon_as_the_command_exits(tmp_path: Path) -> None:
    cmd = Command([sys.executable, "-c", "pass"], dict(os.environ), stdout=tmp_path / "out.log")
    t0 = time.monotonic()
    outcome = supervise(cmd, log_path=tmp_path / "mlperf.log", events_path=tmp_path / "events.jsonl", poll_s=5)
    assert time.monotonic() - t0 < 2.5, "waited for a poll interval after the command had exited"
    assert outcome.exit_code == 0 and outcome.status == "aborted"  # no run_stop: nothing ran


def test_the_supervisor_wakes_once_a_poll_while_a_run_trains(tmp_path: Path, monkeypatch) -> None:
    """The supervisor shares the rank's cores. Popen.wait(poll_s) checked waitpid between sleeps of up to 50 ms:
    about 55 wakeups a second of a run, each a waitpid; now it sleeps until the command exits or poll_s passes,
    and asks once a wakeup (here 0.2 s: about 5 a second)."""
    calls: list[int] = []
    waitpid = os.waitpid
    monkeypatch.setattr(os, "waitpid", lambda *a: calls.append(1) or waitpid(*a))
    cmd = Command([sys.executable, "-S", "-c", "import time; time.sleep(1.5)"], dict(os.environ),
                  stdout=tmp_path / "out.log")
    t0 = time.monotonic()
    supervise(cmd, log_path=tmp_path / "mlperf.log", events_path=tmp_path / "events.jsonl", poll_s=0.2)
    took = time.monotonic() - t0
    assert len(calls) <= took / 0.2 + 6, f"{len(calls)} waitpid calls in {took:.1f} s"


def test_orphans_of_a_dead_launcher_are_stopped_before_the_run_is_judged(tmp_path: Path) -> None:
    """A launcher that exits leaving a child (a rank) behind: the supervisor (a subreaper) kills and reaps it."""
    pidfile = tmp_path / "orphan.pid"
    script = f"sleep 300 & echo $! > {pidfile}"
    cmd = Command(["bash", "-c", script], dict(os.environ), stdout=tmp_path / "out.log")
    supervise(cmd, log_path=tmp_path / "mlperf.log", events_path=tmp_path / "events.jsonl")
    orphan = int(pidfile.read_text())
    try:
        os.kill(orphan, 0)
        alive = True
    except ProcessLookupError:
        alive = False
    if alive:
        os.kill(orphan, signal.SIGKILL)
    assert not alive, "the launcher's orphan was left running"


def test_a_command_killed_by_a_signal_is_named_in_the_reason(tmp_path: Path) -> None:
    cmd = Command(["bash", "-c", "kill -9 $$"], dict(os.environ), stdout=tmp_path / "out.log",
                  what="rank 0 (the only rank)")
    outcome = supervise(cmd, log_path=tmp_path / "mlperf.log", events_path=tmp_path / "events.jsonl")
    assert outcome.status == "aborted" and outcome.exit_code == -9
    assert outcome.reason == "rank 0 (the only rank) killed by SIGKILL (see the rank logs)"


def test_a_launcher_that_fails_before_any_rank_says_why(tmp_path: Path) -> None:
    """torchrun's rendezvous failing (the store unreachable): no rank ran to say anything, and the reason was only
    'exited with code 1 (a rank failed; see the rank logs)', the rank logs empty. Its own last error line now."""
    said = ("echo '[W] Setting OMP_NUM_THREADS'; echo 'Traceback (most recent call last):'; echo '  File \"x\"'; "
            "echo 'torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to the C10d "
            "store has failed. See inner exception for details.'; exit 1")
    cmd = Command(["bash", "-c", said], dict(os.environ), stdout=tmp_path / "launcher.log", what="the launcher")
    outcome = supervise(cmd, log_path=tmp_path / "mlperf.log", events_path=tmp_path / "events.jsonl")
    assert outcome.status == "aborted" and outcome.exit_code == 1
    assert outcome.reason == ("the launcher exited with code 1: RendezvousConnectionError: The connection to the C10d "
                              "store has failed. See inner exception for details."), outcome.reason


# torch 2.13's own words at a static rendezvous that fails, as torchrun's output ends with them
_TORCH_SAID = {
    "alone": "DistStoreError: Timed out after 6 seconds waiting for clients. 1/2 clients joined.",
    "taken": "DistNetworkError: The server socket has failed to listen on any local network address. port: 29500, "
             "useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use",
    "absent": "DistNetworkError: The client socket has timed out after 5000ms while trying to connect to (h, 29500).",
    "another program": "DistNetworkError: Ping failed, invalid value returned from server. Expected: 4315, Got: 7597",
}


def test_a_failed_rendezvous_is_said_in_plain_words(tmp_path: Path) -> None:
    """torch's message named neither the node nor the option: "Timed out after 6 seconds waiting for clients. 1/2
    clients joined." was the whole reason of a run whose node 1 never came."""
    four = torchrun.Rendezvous("h:29500", 4, 0, 5, tmp_path)
    assert four.explain(_TORCH_SAID["alone"]).startswith("the rendezvous failed: nodes 1 to 3 of 4 did not join "
                                                         "within 5 s (--rdzv-timeout); start every node with "
                                                         "--rdzv-endpoint h:29500 and its own --node-rank (0 to 3)")
    assert four.explain(_TORCH_SAID["alone"].replace("1/2", "3/4")).startswith(
        "the rendezvous failed: 1 of the 4 nodes did not join within 5 s")
    assert "port 29500 (--rdzv-endpoint h:29500) is already in use on this host, by another program or by another " \
           "node started with --node-rank 0" in four.explain(_TORCH_SAID["taken"])
    node1 = torchrun.Rendezvous("h:29500", 4, 1, 5, tmp_path)
    assert node1.explain(_TORCH_SAID["absent"]).startswith("the rendezvous failed: node 0 did not answer at h:29500 "
                                                           "within 5 s (--rdzv-timeout)")
    # node 0 whose endpoint names another host: its store listens here, and its torchrun found none there ("node 0
    # did not answer", said to node 0 itself)
    assert four.explain(_TORCH_SAID["absent"]) == (
        "the rendezvous failed: nothing answered at h:29500 within 5 s (--rdzv-timeout), where this node, node 0, "
        "serves it on its own host: give --rdzv-endpoint this host's name or address (node 0's) and a free port, the "
        "same on every node")
    assert "is not node 0's torchrun (another program holds port 29500 there)" in four.explain(
        _TORCH_SAID["another program"])
    assert four.explain("RuntimeError: something else") == ""  # left to the launcher's own words


def test_torchrun_signalled_from_outside_is_the_runs_reason(tmp_path: Path) -> None:
    """SIGTERM to torchrun alone (a one-node --launcher torchrun run): its ranks, stopped by it, said 'Aborted:
    signal SIGTERM', and the run's reason was 'a peer on another node was lost, and no node said why (its mlbench
    or host gone?)'. torchrun's own last words say it was signalled."""
    import json

    (tmp_path / "events.jsonl").write_text(json.dumps({"event": "stopped", "status": "aborted", "step": 3,
                                                       "reason": "Aborted: signal SIGTERM", "consequent": True}) + "\n")
    said = ("echo 'Traceback (most recent call last):'; echo 'torch.distributed.elastic.multiprocessing.api."
            "SignalException: Process 4242 got signal: 15'; exit 1")
    cmd = torchrun.node_command(["bash", "-c", said], dict(os.environ), tmp_path / "launcher.log",
                                torchrun.Rendezvous("127.0.0.1:29500", 1, 0, 5, tmp_path / "ranks"))
    outcome = supervise(cmd, log_path=tmp_path / "mlperf.log", events_path=tmp_path / "events.jsonl")
    assert outcome.status == "aborted"
    assert outcome.reason == ("the launcher (node 0's torchrun) received SIGTERM from another process and stopped "
                              "the ranks"), outcome.reason
    # the supervisor stopping the run while the checkpoint was saved (node 0 told of node 1's failure): torchrun's
    # SignalException is the supervisor's SIGTERM, and the save's failure is the supervisor's reason
    from mlbench.launch import supervise as sup

    saving = [{"event": "checkpoint_saving", "path": "/c"},
              {"event": "checkpoint_failed", "path": "/c", "reason": "Aborted: signal SIGTERM", "consequent": True}]
    judged = sup._judge(cmd, 1, saving, "node 1: hang: no progress for 300 s", "",
                        sup._LogEnd(tmp_path / "mlperf.log", None, False))
    assert judged.checkpoint_error == "node 1: hang: no progress for 300 s", judged
    # a rank signalled from outside instead (torchrun's failure lists it with code 6, stopped): no other node
    cmd = torchrun.node_command(["bash", "-c", "exit 1"], dict(os.environ), tmp_path / "launcher2.log",
                                torchrun.Rendezvous("127.0.0.1:29500", 1, 0, 5, tmp_path / "ranks"))
    outcome = supervise(cmd, log_path=tmp_path / "mlperf.log", events_path=tmp_path / "events.jsonl")
    assert outcome.reason == "Aborted: signal SIGTERM", outcome.reason


class _Stuck:
    """A rendezvous that never forms (torchrun's client on a port of a program that answers nothing)."""

    deadline_s = 0.5
    nodes = 2

    def formed(self) -> bool:
        return False

    def not_formed(self) -> str:
        return "the rendezvous did not form"

    def explain(self, error: str) -> str:
        return ""

    def node0(self) -> tuple[str, int] | None:
        return None


def test_a_rendezvous_that_never_forms_ends_at_its_deadline(tmp_path: Path) -> None:
    """torch's timeouts do not cover a client that connected to a program which answers nothing: node 1 waited for
    the 30-minute start-up limit."""
    cmd = Command(["sleep", "60"], dict(os.environ), stdout=tmp_path / "out.log", rendezvous=_Stuck())
    t0 = time.monotonic()
    outcome = supervise(cmd, log_path=tmp_path / "mlperf.log", events_path=tmp_path / "events.jsonl", poll_s=0.05)
    assert time.monotonic() - t0 < 5 and outcome.status == "aborted"
    assert outcome.reason == "the rendezvous did not form"


def test_a_run_whose_folder_is_removed_is_stopped_at_once_with_the_reason(tmp_path: Path) -> None:
    """rm -rf of the results (or of the run's staging folder) while it trains: the ranks trained on to their end
    into files no one could read any more, and the run ended as 'run ended without run_stop'. Now the supervisor
    stops it as soon as its folder is gone, saying why."""
    run = tmp_path / ".staging-x"
    run.mkdir()
    cmd = Command(["bash", "-c", f"sleep 0.3; rm -rf {run}; sleep 60"], dict(os.environ), stdout=run / "out.log")
    t0 = time.monotonic()
    outcome = supervise(cmd, log_path=run / "mlperf.log", events_path=run / "events.jsonl", poll_s=0.05)
    assert time.monotonic() - t0 < 10 and outcome.status == "aborted"
    assert outcome.reason == (f"the run's folder {run} was removed while the run was in progress (by another "
                              "program or person): nothing of the run can be kept"), outcome.reason


def test_a_command_that_cannot_start_ends_the_run_with_the_reason(tmp_path: Path) -> None:
    cmd = Command([str(tmp_path / "no-such-launcher")], dict(os.environ), stdout=tmp_path / "out.log")
    outcome = supervise(cmd, log_path=tmp_path / "mlperf.log", events_path=tmp_path / "events.jsonl")
    assert outcome.status == "aborted" and outcome.exit_code == 127
    assert outcome.reason.startswith("the run could not start: No such file or directory"), outcome.reason


def test_a_checker_that_cannot_run_gives_a_failed_verdict_saying_why(tmp_path: Path, monkeypatch) -> None:
    """A full /tmp (the checker's scratch folder): the run is still recorded; its verdict says why it failed.
    OSError injected into the checker's call."""
    from mlbench import compliance, runner

    def no_space(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(compliance, "check", no_space)
    verdict = runner.compliance_verdict(tmp_path / "mlperf.log", registry.load("gpt3", tiny=True))
    assert not verdict.ok and verdict.messages == ["the compliance checker could not run: No space left on device"]


def test_a_slurm_run_on_a_terminal_gets_the_live_panel_of_a_local_run(tmp_path: Path) -> None:
    """The submitting side follows the staging folder the job's driver names, with the panel a local run shows
    (a forced terminal writing to a buffer), and closes it when the run is published."""
    import io
    import json

    from rich.console import Console

    from mlbench.progress import is_progress_line

    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=100)
    staging = tmp_path / ".staging-1"
    staging.mkdir()
    current = tmp_path / "current_run"
    current.write_text(f"{staging}\n")
    runs = slurm.StagedRuns(current, "gpt3 (tiny) (SLURM job 7)", console)
    runs.poll()
    events = [{"event": "start", "budget": 300, "target": 1.04, "metric": "log_perplexity", "direction": "min"},
              {"event": "step", "step": 20, "loss": 3.1778, "tokens_per_s": 15234, "tflops_per_device": 0.01},
              {"event": "eval", "step": 20, "value": 3.0543}]
    (staging / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    runs.poll()
    assert runs.current is not None and runs.current[2].state["eval"] == 3.0543
    shutil.rmtree(staging)  # published
    runs.poll()
    assert runs.current is None
    shown = screen.getvalue()
    assert "gpt3 (tiny) (SLURM job 7), run 1" in shown and "3.0543 at step 20" in shown
    assert is_progress_line("step 20/300  loss 3.1778 ...") and not is_progress_line("target reached: ...")


_RANK = """
import os, sys, time
from pathlib import Path
out = Path(sys.argv[1])
(out / f"rank{os.environ['RANK']}").write_text(" ".join(os.environ[k] for k in (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")))
(out / f"forked{os.environ['RANK']}").write_text(f"{open('/proc/self/comm').read().strip()}|{'torch' in sys.modules}")
if os.environ["RANK"] == "1" and (out / "fail").exists():
    sys.exit(3)
time.sleep(60 if (out / "fail").exists() else 0)
"""


def _agent(tmp_path: Path, fail: bool) -> tuple[subprocess.CompletedProcess, float]:
    from mlbench.launch import local_ranks

    script = tmp_path / "rank.py"
    script.write_text(_RANK)
    if fail:
        (tmp_path / "fail").write_text("")
    argv = local_ranks.argv(tmp_path / "plan.json", tmp_path / "ranks", 2)
    argv = argv[:argv.index("-m", 3)] + [str(script), str(tmp_path)]  # a stand-in rank, not mlbench.train
    start = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    return proc, time.monotonic() - start


def test_the_local_agent_starts_each_rank_with_torchruns_environment(tmp_path: Path) -> None:
    proc, _ = _agent(tmp_path, fail=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    envs = [(tmp_path / f"rank{r}").read_text().split() for r in (0, 1)]
    # forked from the agent once it imported torch (a rank's start pays no torch import), each named for `ps`
    assert [(tmp_path / f"forked{r}").read_text() for r in (0, 1)] == ["mlbench rank 0|True", "mlbench rank 1|True"]
    assert [e[:5] for e in envs] == [["0", "0", "2", "2", "127.0.0.1"], ["1", "1", "2", "2", "127.0.0.1"]]
    assert envs[0][5] == envs[1][5]  # one rendezvous port
    logs = tmp_path / "ranks" / "local" / "attempt_0"
    assert sorted(p.relative_to(logs).as_posix() for p in logs.rglob("*.log")) == [
        "0/stderr.log", "0/stdout.log", "1/stderr.log", "1/stdout.log"]


def test_the_local_agent_stops_the_other_ranks_when_one_fails(tmp_path: Path) -> None:
    """As torchrun: rank 1 exits 3 at once, rank 0 would sleep a minute; the agent stops it and exits 1."""
    proc, took = _agent(tmp_path, fail=True)
    assert proc.returncode == 1 and "rank 1 exited with code 3; stopping the other ranks" in proc.stdout
    assert took < 20


_FAKE_SLURM = {  # (sbatch, also squeue and scancel): a controller that does not answer, and one that answers junk
    "hang": ("#!/bin/sh\nexec sleep 1000\n", True),
    "garbage": ('#!/bin/sh\n[ "$1" = "--test-only" ] && exit 0\necho "garbage;"\nexec sleep 1000\n', True),
    "hang-on-submit": ('#!/bin/sh\n[ "$1" = "--test-only" ] && exit 0\nexec sleep 1000\n', True),
    "no-squeue": ("#!/bin/sh\nexit 0\n", False),
}


@pytest.mark.parametrize(("fake", "said"), [
    ("hang", "error: sbatch did not answer within 2 s: is the SLURM controller up? (`scontrol ping`)"),
    # --test-only answered, the submission not: a blocking read of its job id waited for ever, without a word
    ("hang-on-submit", "error: sbatch did not answer within 2 s: is the SLURM controller up? (`scontrol ping`); "
                       "no job id came back"),
    ("garbage", "error: sbatch did not submit the job: it answered 'garbage;', not a job id"),
    ("no-squeue", "error: squeue and scancel not found: --launcher slurm needs the SLURM client commands"),
])
def test_a_slurm_client_that_hangs_or_answers_junk_is_one_line_and_leaves_nothing(tmp_path: Path, fake: str,
                                                                                said: str) -> None:
    """A hanging sbatch or squeue was a TimeoutExpired traceback; a job id of junk was followed as a job; a refusal
    left the job's folder (.slurm/<job>/job.sbatch) behind; without squeue a job was submitted, then unfollowed."""
    proc = _with_fake_slurm(tmp_path, fake, timeout_s=2)
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    # a controller that does not answer, or answers junk, is the system's failure (exit 1); no client, the setup's
    # (a refusal: nothing on stdout). The error is the one line on stderr.
    assert proc.returncode == (2 if fake == "no-squeue" else 1) and err.startswith(said) and err.count("\n") == 1, \
        (out, err)
    assert "error" not in out and "Traceback" not in out + err and (fake != "no-squeue" or out == ""), (out, err)
    assert not (tmp_path / "r").exists(), list((tmp_path / "r").rglob("*"))


@pytest.mark.parametrize("fake", ["hang-on-submit", "hang"])
def test_a_stop_signal_while_sbatch_submits_leaves_nothing(tmp_path: Path, fake: str) -> None:
    """SIGTERM (or Ctrl-C) while sbatch had not yet answered the submission: the job's folder (.slurm/<job>/ with
    job.sbatch and job.json) was left behind in folders made for it. Now removed, as a refused job's is; so it is
    where the stop comes as sbatch --test-only checks the job ("hang": it was left then too)."""
    proc = _with_fake_slurm(tmp_path, fake, timeout_s=60)
    deadline = time.monotonic() + 60
    while not list((tmp_path / "r").glob("ci/gpt3/.slurm/*/job.sbatch")):
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    time.sleep(1)  # sbatch --test-only answered ("hang": not), the submission under way
    proc.send_signal(signal.SIGTERM)
    try:
        out = "".join(proc.communicate(timeout=60))
    finally:
        proc.kill()
    assert proc.returncode == 143 and "aborted (SIGTERM)" in out and "Traceback" not in out, out
    assert not (tmp_path / "r").exists(), list((tmp_path / "r").rglob("*"))


def test_a_stop_as_sbatch_submits_cancels_the_job_it_submitted(tmp_path: Path) -> None:
    """SIGTERM as sbatch submitted (the controller had the job; sbatch had not yet said its id): sbatch was killed,
    'aborted (SIGTERM)' said, and the job ran on, followed and cancelled by nothing (on the real cluster: a result
    published into a folder the user was told nothing of). sbatch's answer is now awaited a little and its job
    cancelled."""
    proc = _fake_cluster(tmp_path, {
        "sbatch": '#!/bin/sh\n[ "$1" = "--test-only" ] && exit 0\nsleep 2\necho 7\nexec sleep 1000\n',
        "scancel": '#!/bin/sh\necho "$@" >> "$FAKE/scancel"\n', "squeue": "#!/bin/sh\nexit 0\n"})
    try:
        deadline = time.monotonic() + 60
        while not list((tmp_path / "r").glob("ci/gpt3/.slurm/*/job.sbatch")):
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        time.sleep(0.5)  # sbatch --test-only answered; the submission is under way
        proc.send_signal(signal.SIGTERM)
        out = "".join(proc.communicate(timeout=60))
    finally:
        proc.kill()
    assert proc.returncode == 143 and "Traceback" not in out, out
    assert "SLURM job 7 was submitted as the stop came: cancelled it\naborted (SIGTERM)\n" in out, out
    assert (tmp_path / "scancel").read_text() == "7\n"
    assert not (tmp_path / "r").exists(), list((tmp_path / "r").rglob("*"))


def _with_fake_slurm(tmp_path: Path, fake: str, timeout_s: float) -> subprocess.Popen:
    """`mlbench run gpt3 --tiny --launcher slurm` started with _FAKE_SLURM[FAKE] for sbatch (and squeue and scancel
    that answer nothing, where it says so), each SLURM client command given TIMEOUT_S."""
    sbatch, with_others = _FAKE_SLURM[fake]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("sbatch", *(("squeue", "scancel") if with_others else ())):
        (bin_dir / name).write_text(sbatch if name == "sbatch" else "#!/bin/sh\nexit 0\n")
        (bin_dir / name).chmod(0o755)
    path = f"{bin_dir}:{os.environ['PATH']}" if with_others else str(bin_dir)
    code = (f"import sys; from mlbench.launch import slurm; slurm.TIMEOUT_S = {timeout_s}; slurm.WITHDRAW_S = 1; "
            f"from mlbench.cli import main; sys.argv[0] = 'mlbench'; main()")
    return subprocess.Popen([sys.executable, "-c", code, "run", "gpt3", "--tiny", "--launcher", "slurm", "--results",
                             str(tmp_path / "r"), "--system", "ci"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PATH": path, "COLUMNS": "200"})


def _plan(tmp_path: Path):
    from mlbench.run_plan import RunPlan

    return RunPlan(benchmark=registry.load("gpt3", tiny=True), layout=_layout().as_dict(), seed=5,
                   run_dir=str(tmp_path), system="s")


def test_a_rank_that_dies_before_logging_leaves_a_whole_aborted_log(tmp_path: Path) -> None:
    """A rank killed while it imports torch wrote no log, and the result was an empty file. The supervisor now
    writes the preamble rank 0 would have written and run_stop `aborted` with the reason; without the plan (a
    node of a multi-node run, where another node may hold the log) it writes nothing."""
    cmd = Command(["bash", "-c", "kill -9 $$"], dict(os.environ), stdout=tmp_path / "out.log",
                  what="rank 0 (the only rank)")
    plan = _plan(tmp_path)
    outcome = supervise(cmd, log_path=plan.log_path, events_path=plan.events_path, plan=plan, owns_log=True)
    assert outcome.status == "aborted" and not outcome.log_error
    events = mllog(plan.log_path)
    keys = [e["key"] for e in events]
    assert keys[:3] == ["cache_clear", "init_start", "submission_org"] and "seed" in keys
    assert next(e["value"] for e in events if e["key"] == "seed") == 5
    assert keys[-2:] == ["train_samples", "run_stop"] and keys.count("run_stop") == 1
    assert events[-1]["metadata"]["status"] == "aborted"
    assert events[-1]["metadata"]["reason"] == "rank 0 (the only rank) killed by SIGKILL (see the rank logs)"
    elsewhere = tmp_path / "node1"
    elsewhere.mkdir()
    supervise(cmd, log_path=elsewhere / "mlperf.log", events_path=elsewhere / "events.jsonl", plan=plan)
    assert not (elsewhere / "mlperf.log").exists()


def test_a_failure_after_a_successful_run_stop_keeps_the_logs_status(tmp_path: Path) -> None:
    """Rank 0 wrote run_stop `success`, then failed (the measured-memory record, a peer in teardown): the log said
    success and the record aborted. The record now keeps the log's status and says what failed after it."""
    plan = _plan(tmp_path)
    script = (f"import json, sys; open({str(plan.events_path)!r}, 'a').write(json.dumps({{'event': 'stopped', "
              f"'status': 'success', 'step': 3, 'reason': ''}}) + chr(10)); "
              f"print('RuntimeError: injected after run_stop', file=sys.stderr); sys.exit(3)")
    cmd = Command([sys.executable, "-c", script], dict(os.environ), stdout=tmp_path / "out.log",
                  what="rank 0 (the only rank)")
    outcome = supervise(cmd, log_path=plan.log_path, events_path=plan.events_path)
    assert outcome.status == "success" and outcome.exit_code == 3
    assert outcome.error_after_run_stop == "rank 0 (the only rank) exited with code 3: RuntimeError: injected " \
                                           "after run_stop", outcome.error_after_run_stop


def test_a_run_whose_rank_dies_at_start_publishes_its_aborted_log(tmp_path: Path, cli) -> None:
    """Through the CLI: the rank exits as the interpreter starts (a sitecustomize on its path), before torch. The
    result is the preamble and run_stop `aborted` with the reason, and `score` judges it: no timed region."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import os, sys\nif 'mlbench.train' in sys.orig_argv:\n    os._exit(7)\n")
    out = mlbench("run", "gpt3", "--tiny", "--results", str(tmp_path / "r"), "--system", "s", "--seed", "1",
                  env={"PYTHONPATH": str(site)})
    assert out.returncode == 1, out.stdout + out.stderr
    folder = tmp_path / "r" / "s" / "gpt3"
    events = mllog(folder / "result_0.txt")
    assert events[0]["key"] == "cache_clear" and events[-1]["key"] == "run_stop"
    reason = "rank 0 (the only rank) exited with code 7 (see the rank logs: direct/attempt_0/0)"
    assert events[-1]["metadata"]["status"] == "aborted" and events[-1]["metadata"]["reason"] == reason
    assert json.loads((folder / "result_0.json").read_text())["reason"] == reason
    score = cli("score", folder)  # in this process: a subprocess adds nothing here
    assert score.returncode == 0 and "no run_start: the run never started its timed region" in score.stdout


def test_a_run_of_two_ranks_whose_rank_dies_at_start_names_it(tmp_path: Path) -> None:
    """Through the CLI, as above with two ranks (mlbench's agent): the reason was "launcher exited with code 1 (a
    rank failed; see the rank logs)", the agent's line naming the rank left in its log with a staging folder that is
    gone once the run is published. The reason now names the rank, how it ended and its logs under the result's."""
    env = at_rank_start(tmp_path / "site", "        if os.environ.get('RANK') == '0':\n            os._exit(7)")
    out = mlbench("run", "gpt3", "--tiny", "--nproc-per-node", "2", "--results", str(tmp_path / "r"), "--system",
                  "s", "--seed", "1", env=env)
    assert out.returncode == 1, out.stdout + out.stderr
    folder = tmp_path / "r" / "s" / "gpt3"
    reason = "rank 0 exited with code 7 (see the rank logs: local/attempt_0/0)"
    assert mllog(folder / "result_0.txt")[-1]["metadata"]["reason"] == reason, out.stdout
    assert json.loads((folder / "result_0.json").read_text())["reason"] == reason
    assert (folder / "logs" / "result_0" / "local" / "attempt_0" / "0" / "stderr.log").is_file()
    assert f"reason: {reason}\n  rank logs in {folder / 'logs' / 'result_0'}\n" in out.stdout, out.stdout


# torch 2.13's last words when a rank of its node is killed (ChildFailedError), after a long traceback
_TORCH_RANK_KILLED = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
mlbench.launch.torchrun_rank FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-27_03:49:13
  host      : localhost
  rank      : 2 (local_rank: 0)
  exitcode  : -15 (pid: 26601) (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 26601
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-27_03:49:13
  host      : localhost
  rank      : 3 (local_rank: 1)
  exitcode  : -9 (pid: 26600) (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 26600
============================================================
"""


def test_torchruns_failed_rank_is_named_in_the_reason(tmp_path: Path) -> None:
    """A node's torchrun whose rank was killed (the OOM killer): the reason was "launcher exited with code 1 (a rank
    failed; see the rank logs)"; torch names the rank at the end of its output, and so does the reason now."""
    ranks = tmp_path / "ranks"
    (ranks / "mlbench-run0_ab12cd34" / "attempt_0" / "1").mkdir(parents=True)
    (tmp_path / "said.txt").write_text(_TORCH_RANK_KILLED)
    rendezvous = torchrun.Rendezvous("127.0.0.1:29500", 2, 1, 60.0, ranks)
    cmd = torchrun.node_command(["bash", "-c", f"cat {tmp_path / 'said.txt'}; exit 1"], dict(os.environ),
                                tmp_path / "launcher.log", rendezvous)
    outcome = supervise(cmd, log_path=tmp_path / "mlperf.log", events_path=tmp_path / "events.jsonl")
    assert outcome.reason == ("rank 3 (node 1's local rank 1) killed by SIGKILL (see the rank logs: "
                              "mlbench-run0_ab12cd34/attempt_0/1)"), outcome.reason


def test_a_slurm_jobs_state_is_read_once_it_has_ended(tmp_path: Path, monkeypatch) -> None:
    """sbatch --wait returns as the job leaves RUNNING; its state was read at once: "COMPLETING, exit code 0:9"
    for a driver killed with -9 (FAILED in the end), and the summary read before the driver had written it. A
    scontrol that says COMPLETING twice (a stand-in: the real cluster rarely shows it long enough to test)."""
    import io

    from rich.console import Console

    calls = tmp_path / "calls"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(
        f'#!/bin/sh\necho x >> {calls}\nif [ "$(wc -l < {calls})" -le 2 ]; then\n'
        '  echo "JobId=5 JobState=COMPLETING ExitCode=0:9"\nelse\n  echo "JobId=5 JobState=FAILED ExitCode=0:9"\nfi\n')
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    said = io.StringIO()
    assert slurm._ended_state("5", Console(file=said)) == "FAILED, exit code 0:9"
    assert said.getvalue() == "SLURM job 5: COMPLETING; waiting for it to end\n"
    calls.unlink()
    assert slurm._ended_state("5", Console(file=io.StringIO()), limit_s=0) == "COMPLETING, exit code 0:9"


# `scontrol show job -o` as the batch step's SIGTERM finds the job (SLURM 22.05 on the test cluster, cut short): at its
# time limit, once a node failed (its NodeList without the failed node), and running
_SCONTROL = {
    "time limit": "JobId=2 JobName=mlbench-gpt3 JobState=COMPLETING Reason=TimeLimit ExitCode=0:0 RunTime=00:01:00 "
                  "TimeLimit=00:01:00 EndTime=2026-11-28T04:08:38 NodeList=node[1-2] BatchHost=node1",
    "node failure": "JobId=4 JobName=mlbench-gpt3 JobState=COMPLETING Reason=NodeDown ExitCode=0:0 "
                    "TimeLimit=00:08:00 EndTime=2026-11-28T04:05:14 NodeList=node1 BatchHost=node1",
    # as seen on a one-host cluster (SLURM 22.05) by the batch step's SIGTERM trap, after someone's `scancel 1`
    "cancelled": "JobId=1 JobName=mlbench-gpt3 JobState=COMPLETING Reason=None ExitCode=0:0 RunTime=00:00:01 "
                 "TimeLimit=00:01:00 EndTime=2026-11-28T07:01:34 NodeList=node1 BatchHost=node1",
    "running": "JobId=5 JobName=mlbench-gpt3 JobState=RUNNING Reason=None ExitCode=0:0 TimeLimit=02:00:00 "
               "EndTime={end} NodeList=node[1-2] BatchHost=node1",
}


def _fake_scontrol(tmp_path: Path, monkeypatch, shown: str) -> None:
    """scontrol on PATH that shows SHOWN for any job, and expands node[1-2] (show hostnames) as SLURM does."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (tmp_path / "shown").write_text(shown + "\n")
    (bin_dir / "scontrol").write_text(
        '#!/bin/sh\nif [ "$2" = hostnames ]; then\n  [ "$3" = "node[1-2]" ] && printf "node1\\nnode2\\n" || echo "$3"\n'
        f'  exit 0\nfi\ncat {tmp_path / "shown"}\n')
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


@pytest.mark.parametrize("sacct", ["no accounting", "by uid 0", "by an unknown uid", "the user's own stop"])
def test_a_job_cancelled_from_outside_says_so(tmp_path: Path, monkeypatch, sacct: str) -> None:
    """Someone's `scancel 1` (not mlbench run's Ctrl-C) had the run recorded "received SIGTERM": the job, COMPLETING
    with no reason of SLURM's as its steps got the signal, was not recognised. Now the reason says it was cancelled
    from outside, and by whom where SLURM's accounting says (sacct's 'CANCELLED by UID', with slurmdbd); with
    srun's end first (no signal) too. mlbench run's own stop (STOP_REQUESTED) stays the user's."""
    _fake_scontrol(tmp_path, monkeypatch, _SCONTROL["cancelled"])
    said = {"no accounting": "echo 'sacct: error: Slurm accounting storage is disabled' >&2; exit 1",
            "by uid 0": "echo 'CANCELLED by 0'", "by an unknown uid": "echo 'CANCELLED by 4000000000'",
            "the user's own stop": "echo 'CANCELLED by 0'"}[sacct]
    (tmp_path / "bin" / "sacct").write_text(f"#!/bin/sh\n{said}\n")
    (tmp_path / "bin" / "sacct").chmod(0o755)
    if sacct == "the user's own stop":  # (a second Ctrl-C cancels the job outright: COMPLETING as well)
        (tmp_path / slurm.STOP_REQUESTED).write_text("SIGINT\n")
        assert slurm.why_stopped("1", tmp_path, slurm.SlurmOptions(), "SIGTERM") == \
            "received SIGINT (mlbench run's, passed to the job's driver as SIGTERM)"
        assert slurm.why_stopped("1", tmp_path, slurm.SlurmOptions(), "") == ""
        return
    by = {"no accounting": "", "by uid 0": " by root (uid 0)", "by an unknown uid": " by uid 4000000000"}[sacct]
    for signal_name in ("SIGTERM", ""):
        assert slurm.why_stopped("1", tmp_path, slurm.SlurmOptions(), signal_name) == \
            f"the SLURM job was cancelled from outside mlbench run (scancel{by}): SLURM stopped it"


@pytest.mark.parametrize("case", ["time limit", "node failure", "warning", "the user's stop", "far from the limit"])
def test_the_driver_asks_slurm_why_its_run_was_stopped(tmp_path: Path, monkeypatch, case: str) -> None:
    """A job at its time limit, or whose node failed, had its run recorded "received SIGTERM" (the batch step's
    signal), SLURM's own line in the job's output alone saying why. The driver now asks slurmctld as the signal
    comes; a SIGTERM the follower sent for its user (Ctrl-C: STOP_REQUESTED in the job's folder) stays the user's,
    said as the signal the user sent (it was "received SIGTERM" for a Ctrl-C), and one far from the limit (a scancel
    --batch of someone's) the signal's: "" leaves "received SIGTERM"."""
    end = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() + 100 if case != "far from the limit"
                                                             else time.time() + 3600))
    _fake_scontrol(tmp_path, monkeypatch, _SCONTROL.get(case, _SCONTROL["running"]).format(end=end))
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[1-2]")
    if case == "the user's stop":
        (tmp_path / slurm.STOP_REQUESTED).write_text("SIGTERM\n")  # (mlbench run's SIGTERM: not said twice)
        assert slurm.why_stopped("5", tmp_path, slurm.SlurmOptions(), "SIGTERM") == \
            "received SIGTERM (mlbench run's, passed to the job's driver)"
        (tmp_path / slurm.STOP_REQUESTED).write_text("SIGINT\n")
    said = slurm.why_stopped("5", tmp_path, slurm.SlurmOptions(time_limit="02:00:00"), "SIGTERM")
    want = {"time limit": "the SLURM job reached its time limit (--time 00:01:00): SLURM stopped it",
            "node failure": "the SLURM job's node node2 failed (NODE_FAIL): SLURM stopped the job",
            "the user's stop": "received SIGINT (mlbench run's, passed to the job's driver as SIGTERM)",
            "far from the limit": ""}
    if case == "warning":  # 100 s before the limit (to the second, as the clock turned meanwhile)
        assert said.startswith("SLURM's warning (SIGTERM) ") and said.endswith(
            " s before the job's time limit (--time 02:00:00): the run was stopped before it"), said
        assert 98 <= int(said.split()[3]) <= 100, said
        # a job too short for the warning (its limit is 240 s or less) asked none: a SIGTERM near its end is not it
        assert slurm.why_stopped("5", tmp_path, slurm.SlurmOptions(time_limit="00:04:00"), "SIGTERM") == ""
    else:
        assert said == want[case], said
    assert slurm.why_stopped("", tmp_path, slurm.SlurmOptions(), "SIGTERM") == ""  # not in a SLURM job


def test_a_run_stopped_from_outside_is_recorded_with_the_launchers_reason(tmp_path: Path) -> None:
    """Command.outside: its words in place of "received SIGTERM" when the stop signal comes, in the log's run_stop
    and the outcome alike, and where the launcher ended non-zero with no signal (srun, killed by SLURM first)."""
    def outside(signal_name: str) -> str:
        return f"the SLURM job reached its time limit ({signal_name or 'no signal'})"

    plan = _plan(tmp_path)
    signalled = Command(["sh", "-c", "kill -TERM $PPID; exec sleep 30"], dict(os.environ), stdout=tmp_path / "a.log",
                        outside=outside)
    outcome = supervise(signalled, log_path=plan.log_path, events_path=plan.events_path, plan=plan, owns_log=True,
                        poll_s=0.05)
    assert (outcome.status, outcome.reason, outcome.signal) == (
        "aborted", "the SLURM job reached its time limit (SIGTERM)", "SIGTERM")
    assert mllog(plan.log_path)[-1]["metadata"]["reason"] == outcome.reason
    ended = Command(["sh", "-c", "exit 143"], dict(os.environ), stdout=tmp_path / "b.log", outside=outside)
    outcome = supervise(ended, log_path=tmp_path / "b.txt", events_path=tmp_path / "b.jsonl")
    assert outcome.reason == "the SLURM job reached its time limit (no signal)", outcome.reason
    nothing = Command(["sh", "-c", "kill -TERM $PPID; exec sleep 30"], dict(os.environ), stdout=tmp_path / "c.log",
                      outside=lambda signal_name: "")
    outcome = supervise(nothing, log_path=tmp_path / "c.txt", events_path=tmp_path / "c.jsonl", poll_s=0.05)
    assert outcome.reason == "received SIGTERM"


def test_the_followers_end_line_says_how_slurm_ended_the_job(tmp_path: Path, monkeypatch) -> None:
    """A job at its time limit ended "SLURM job 5: TIMEOUT, exit code 0:0 (sbatch exit code 0)": sbatch's code said
    nothing of it. The end line now says what the state means; sbatch's code only where SLURM does not say."""
    import io

    from rich.console import Console

    _fake_scontrol(tmp_path, monkeypatch, "JobId=5 JobState=TIMEOUT Reason=TimeLimit ExitCode=0:0 TimeLimit=00:01:00")
    (tmp_path / "bin" / "squeue").write_text("#!/bin/sh\nexit 0\n")
    (tmp_path / "bin" / "squeue").chmod(0o755)
    said = io.StringIO()
    code, ended = slurm.follow(subprocess.Popen(["true"]), "5", tmp_path / "job.out", Console(file=said, width=200))
    line = "TIMEOUT, exit code 0:0: SLURM stopped it at its time limit (--time 00:01:00)"
    assert (code, ended) == (0, line) and said.getvalue().endswith(f"SLURM job 5: {line}\n"), said.getvalue()
    (tmp_path / "shown").write_text("JobId=5 JobState=NODE_FAIL Reason=NodeDown ExitCode=0:0\n")
    assert slurm.final_state("5") == "NODE_FAIL, exit code 0:0: a node failed and SLURM stopped it"
    (tmp_path / "shown").write_text("")  # SLURM no longer holds the job (and no accounting): sbatch's code
    monkeypatch.setattr(slurm, "_slurm", lambda *argv, timeout=None: subprocess.CompletedProcess(argv, 1, "", ""))
    said = io.StringIO()
    assert slurm.follow(subprocess.Popen(["false"]), "5", tmp_path / "job.out", Console(file=said, width=200)) == (
        1, "sbatch exit code 1")
    assert said.getvalue().endswith("SLURM job 5: ended (sbatch exit code 1)\n"), said.getvalue()


def test_the_followers_stop_is_marked_for_the_driver(tmp_path: Path, monkeypatch) -> None:
    """Ctrl-C to mlbench (SIGINT): the follower signals the batch step (scancel --signal=TERM --batch), having left
    STOP_REQUESTED in the job's folder first, so that the driver does not take the SIGTERM for SLURM's warning before
    the time limit when it comes in the warning's last minutes."""
    import io

    from rich.console import Console

    _fake_scontrol(tmp_path, monkeypatch, "JobId=5 JobState=COMPLETED Reason=None ExitCode=0:0")
    bin_dir = tmp_path / "bin"
    sent = tmp_path / "sent"  # the user's Ctrl-C, once, as the follower looks at the job's state
    (bin_dir / "squeue").write_text(f"#!/bin/sh\n[ -e {sent} ] || {{ touch {sent}; kill -INT $PPID; }}\n")
    (bin_dir / "scancel").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/scancel\n')
    for name in ("squeue", "scancel"):
        (bin_dir / name).chmod(0o755)
    stops: list[str] = []
    job = tmp_path / "job"
    job.mkdir()
    slurm.follow(subprocess.Popen(["sleep", "1.5"]), "5", job / "job.out", Console(file=io.StringIO()), stops=stops)
    assert stops == ["SIGINT"] and (job / slurm.STOP_REQUESTED).read_text() == "SIGINT\n"
    assert (tmp_path / "scancel").read_text() == "--signal=TERM --batch 5\n"


_STEPD = "slurmstepd-node1: error: *** JOB 5 ON node1 CANCELLED AT 2026-11-28T06:33:41 ***\n"


def test_slurms_cancelled_line_after_the_users_stop_is_not_shown(tmp_path: Path, monkeypatch) -> None:
    """Ctrl-C to `mlbench run --launcher slurm`: slurmstepd's 'JOB 5 ON node1 CANCELLED AT ...' (its line as the
    batch step is signalled) came in the job's output beside mlbench's own stop lines, and the end line said
    'FAILED, exit code 143:0' (the driver's exit on the SIGTERM passed to it). One account now: mlbench's lines, the
    run's reason, and the end line says the job was stopped at the user's signal. The same line where no stop was
    the user's (someone's scancel) is shown: it then says why."""
    import io

    from rich.console import Console

    _fake_scontrol(tmp_path, monkeypatch, "JobId=5 JobState=FAILED Reason=NonZeroExitCode ExitCode=143:0")
    bin_dir, job = tmp_path / "bin", tmp_path / "job"
    job.mkdir()
    (job / "job.out").write_text("training on cpu\n")
    sent = tmp_path / "sent"
    (bin_dir / "squeue").write_text(f"#!/bin/sh\n[ -e {sent} ] || {{ touch {sent}; kill -INT $PPID; }}\n")
    # slurmstepd's line as the batch step gets the follower's SIGTERM; then the driver's own account of the run
    (bin_dir / "scancel").write_text(f"#!/bin/sh\nprintf '%s' '{_STEPD}' >> {job}/job.out\n"
                                     f"echo '  reason: received SIGINT' >> {job}/job.out\n")
    for name in ("squeue", "scancel"):
        (bin_dir / name).chmod(0o755)
    said, stops = io.StringIO(), []
    slurm.follow(subprocess.Popen(["sleep", "1.5"]), "5", job / "job.out", Console(file=said, width=300),
                 stops=stops)
    assert stops == ["SIGINT"] and "CANCELLED" not in said.getvalue(), said.getvalue()
    assert "training on cpu\n" in said.getvalue() and "  reason: received SIGINT\n" in said.getvalue()
    assert said.getvalue().endswith("SLURM job 5: FAILED, exit code 143:0: stopped at mlbench run's SIGINT\n"), \
        said.getvalue()
    (tmp_path / "other.out").write_text("x\n" + _STEPD)
    shown = io.StringIO()
    slurm.JobOutput(tmp_path / "other.out", Console(file=shown, width=300), drop_progress=False).show(last=True)
    assert shown.getvalue() == "x\n" + _STEPD


@pytest.mark.parametrize("scancel", ["fails", "missing"])
def test_a_stop_that_scancel_cannot_deliver_is_said_and_the_job_followed(tmp_path: Path, monkeypatch,
                                                                         scancel: str) -> None:
    """Ctrl-C with scancel gone from PATH (or not runnable) ended `mlbench run` with 'error: scancel: No such file or
    directory', exit 2, the job running on unfollowed; with a controller that did not answer, 'cancelling the job'
    was said of a job that ran on. Now scancel's words are said, and the job is followed to its end."""
    import io

    from rich.console import Console

    _fake_scontrol(tmp_path, monkeypatch, "JobId=5 JobState=COMPLETED Reason=None ExitCode=0:0")
    bin_dir = tmp_path / "bin"
    sent = tmp_path / "sent"
    (bin_dir / "squeue").write_text(f"#!/bin/sh\n[ -e {sent} ] || {{ : > {sent}; kill -INT $PPID; }}\n")
    (bin_dir / "squeue").chmod(0o755)
    if scancel == "fails":
        (bin_dir / "scancel").write_text("#!/bin/sh\necho 'scancel: error: Kill job error on job id 5: Socket timed "
                                         "out on send/recv operation' >&2\nexit 1\n")
        (bin_dir / "scancel").chmod(0o755)
    else:  # PATH without scancel
        monkeypatch.setenv("PATH", str(bin_dir))
    said, stops = io.StringIO(), []
    code, _ = slurm.follow(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5)"]), "5",
                           tmp_path / "job.out", Console(file=said, width=300), stops=stops)
    why = ("scancel: error: Kill job error on job id 5: Socket timed out on send/recv operation" if scancel == "fails"
           else "scancel: No such file or directory")
    assert code == 0 and stops == [], said.getvalue()  # (a stop not delivered: the job's end gives the exit code)
    assert f"SLURM job 5: SIGINT: could not cancel the job ({why}); it runs on, followed: stop again to retry, or " \
           "`scancel 5`\n" in said.getvalue(), said.getvalue()
    assert "SLURM job 5: COMPLETED, exit code 0:0" in said.getvalue() or scancel != "fails"


def test_a_stop_is_said_before_scancel_waits_for_the_controller(tmp_path: Path, monkeypatch) -> None:
    """Ctrl-C while the SLURM controller did not answer: nothing was said until scancel had timed out, twice (up to a
    minute in the signal handler). The line saying the job is being stopped comes before scancel is asked now."""
    from rich.console import Console

    monkeypatch.setattr(slurm, "SCANCEL_S", 0.5)
    _fake_scontrol(tmp_path, monkeypatch, "JobId=5 JobState=COMPLETED Reason=None ExitCode=0:0")
    bin_dir, said = tmp_path / "bin", tmp_path / "said"
    sent = tmp_path / "sent"
    (bin_dir / "squeue").write_text(f"#!/bin/sh\n[ -e {sent} ] || {{ : > {sent}; kill -INT $PPID; }}\n")
    # what the follower had said as scancel was asked; then no answer
    (bin_dir / "scancel").write_text(f"#!/bin/sh\ncat {said} >> {tmp_path}/said_then\nexec sleep 5\n")
    for name in ("squeue", "scancel"):
        (bin_dir / name).chmod(0o755)
    with said.open("w") as out:
        slurm.follow(subprocess.Popen(["sleep", "1.5"]), "5", tmp_path / "job.out", Console(file=out, width=300))
    line = "SLURM job 5: SIGINT: stopping the job (scancel; up to 1 s where the SLURM controller does not answer)\n"
    assert (tmp_path / "said_then").read_text().count(line) == 2, said.read_text()
    assert "could not cancel the job (scancel did not answer within 0.5 s" in said.read_text(), said.read_text()


def test_a_second_stop_while_the_first_ones_scancel_waits_cancels_the_job_outright(tmp_path: Path,
                                                                                     monkeypatch) -> None:
    """A second Ctrl-C while the first one's scancel waited for a slow controller was taken for a first (the stop is
    counted once scancel returns): it asked the batch step to stop again instead of cancelling the job outright."""
    from rich.console import Console

    _fake_scontrol(tmp_path, monkeypatch, "JobId=5 JobState=COMPLETED Reason=None ExitCode=0:0")
    bin_dir, calls, sent = tmp_path / "bin", tmp_path / "calls", tmp_path / "sent"
    (bin_dir / "squeue").write_text(f"#!/bin/sh\n[ -e {sent} ] || {{ : > {sent}; kill -INT $PPID; }}\n")
    # the batch step's stop waits for the controller, and the user presses Ctrl-C again meanwhile
    (bin_dir / "scancel").write_text(f'#!/bin/sh\necho "$*" >> {calls}\n'
                                     f'case "$*" in *--batch*) kill -INT $PPID; sleep 1;; esac\n')
    for name in ("squeue", "scancel"):
        (bin_dir / name).chmod(0o755)
    stops: list[str] = []
    with (tmp_path / "said").open("w") as out:
        slurm.follow(subprocess.Popen(["sleep", "2"]), "5", tmp_path / "job.out", Console(file=out, width=300),
                     stops=stops)
    assert calls.read_text().splitlines() == ["--signal=TERM --batch 5", "5"], calls.read_text()
    said = (tmp_path / "said").read_text()
    assert stops == ["SIGINT", "SIGINT"] and "SIGINT: cancelling the job" in said, said
    assert "again to cancel" not in said, said


@pytest.mark.parametrize("summary", [None, '{"runs": [{"result": '])
def test_the_runs_a_slurm_job_published_are_said_without_its_summary(tmp_path: Path, summary: str | None) -> None:
    """A second Ctrl-C (scancel outright) killed the driver after it had published its run, before its summary:
    'the job ended (CANCELLED ...) without recording a run' was said of a published run (a summary cut short was a
    JSONDecodeError traceback). The results folder's records that name the job are said now. A job folder removed
    while the job ran (the results folder) was 'the job ended ... before it started'."""
    import io

    from rich.console import Console

    folder = tmp_path / "ci" / "gpt3"
    job_dir = folder / ".slurm" / "job"
    job_dir.mkdir(parents=True)
    if summary is not None:
        (job_dir / "summary.json").write_text(summary)
    for i, job, status in [(0, "8", "success"), (1, "7", "aborted"), (10, "7", "success"), (2, None, "success")]:
        (folder / f"result_{i}.json").write_text(json.dumps({"status": status, "reason": "received SIGTERM" if
                                                             status == "aborted" else "", "environment": {
                                                                 "slurm_job_id": job}}))
    (folder / "result_3.json").write_text('{"status": ')
    said = io.StringIO()
    launcher = slurm.SlurmLauncher.__new__(slurm.SlurmLauncher)
    launcher.console, launcher.job_dir, launcher.job_id, launcher.code, launcher.ended = \
        Console(file=said, width=300), job_dir, "7", 1, "CANCELLED, exit code 0:15"
    launcher.stops = ["SIGINT", "SIGINT"]
    assert launcher.collect() == 130
    (folder / "result_1.json").unlink()  # the job's runs all succeeded, and SLURM says it completed: sbatch --wait
    launcher.stops, launcher.ended = [], "COMPLETED, exit code 0:0"  # killed (code 1 here) made it exit 1
    assert launcher.collect() == 0
    launcher.ended = "FAILED, exit code 1:0"
    assert launcher.collect() == 1
    assert said.getvalue().startswith(f"aborted {folder / 'result_1.txt'} (received SIGTERM)\n"
                                      f"success {folder / 'result_10.txt'}\n")
    shutil.rmtree(tmp_path / "ci")
    said.seek(0), said.truncate()
    launcher.stops = []
    assert launcher.collect() == 1
    assert said.getvalue() == (f"the job ended (FAILED, exit code 1:0) without recording a run: its folder "
                               f"{job_dir} was removed while it ran, and its output with it\n")


def test_a_slurm_job_whose_driver_failed_before_its_set_says_so_on_stderr(tmp_path: Path) -> None:
    """A job whose driver refused to start its set (an unusable rendezvous address, in its summary) printed
    'error: ...' on stdout, with the run's output (`mlbench run --launcher slurm ... > out.txt` hid it); it is the
    command's one error line now (SystemFailure: stderr, exit 1), naming the job, and nothing is said on stdout."""
    import io

    from rich.console import Console

    from mlbench.errors import SystemFailure

    job_dir = tmp_path / "ci" / "gpt3" / ".slurm" / "job"
    job_dir.mkdir(parents=True)
    (job_dir / "summary.json").write_text(json.dumps({"runs": [], "error": "MASTER_ADDR 'x' does not resolve"}))
    said = io.StringIO()
    launcher = slurm.SlurmLauncher.__new__(slurm.SlurmLauncher)
    launcher.console, launcher.job_dir, launcher.job_id, launcher.code, launcher.ended = \
        Console(file=said, width=300), job_dir, "7", 1, "FAILED, exit code 1:0"
    launcher.stops = []
    with pytest.raises(SystemFailure, match=r"^SLURM job 7: MASTER_ADDR 'x' does not resolve$") as e:
        launcher.collect()
    assert e.value.exit_code == 1 and said.getvalue() == "", said.getvalue()


def test_a_slurm_drivers_error_before_its_set_is_said_once(tmp_path: Path, capsys) -> None:
    """`mlbench run --launcher slurm --master-addr no-such-host.invalid`: the driver's 'error: <reason>' in job.out
    was streamed to stdout, then said again as the command's own 'error: SLURM job N: <reason>' on stderr. The
    driver's line (its reason in the summary) is not streamed now: said once, by the command. Where the summary
    cannot be written, the line is the only word of it, and is shown."""
    import io

    from rich.console import Console

    from mlbench.launch import slurm_job

    job_dir = tmp_path / "job"
    job_dir.mkdir()
    slurm_job._driver_error(job_dir, "the rendezvous address 'no-such-host.invalid' does not resolve")
    (job_dir / "job.out").write_text("starting\n" + capsys.readouterr().out + "ended\n")
    shown = io.StringIO()
    slurm.JobOutput(job_dir / "job.out", Console(file=shown, width=300), drop_progress=False).show(last=True)
    assert shown.getvalue() == "starting\nended\n", shown.getvalue()
    assert slurm.job_runs(job_dir, "7") == ([], "the rendezvous address 'no-such-host.invalid' does not resolve")
    (job_dir / "summary.json").unlink()
    (job_dir / "summary.json").mkdir()  # (cannot be written)
    slurm_job._driver_error(job_dir, "the address does not resolve")
    (job_dir / "job.out").write_text(capsys.readouterr().out)
    shown = io.StringIO()
    slurm.JobOutput(job_dir / "job.out", Console(file=shown, width=300), drop_progress=False).show(last=True)
    assert shown.getvalue().startswith("error: the address does not resolve (and cannot write "), shown.getvalue()


def test_a_huge_job_output_is_shown_in_bounded_memory(tmp_path: Path, monkeypatch) -> None:
    """A job's output file grown huge between two looks was read whole, decoded and split at once: 3.2 GB of memory
    (and 24 s) for 400 MB of output. It is read and shown a chunk at a time now (a bounded number of chunks a look,
    the rest at the next one, all of it at the end), a character cut by a chunk's end still whole."""
    import tracemalloc

    from rich.console import Console

    line = "caf\N{LATIN SMALL LETTER E WITH ACUTE} " * 20 + "\n"  # 2-byte characters cut by the chunks' ends
    monkeypatch.setattr(slurm.JobOutput, "CHUNK", 2**16)  # (1 MiB and 8 MB of output: the same, 8 times slower)
    monkeypatch.setattr(slurm.JobOutput, "PER_LOOK", 4)
    text = line * (2**20 // len(line.encode()))
    (tmp_path / "job.out").write_text(text)
    shown = tmp_path / "shown"
    with shown.open("w") as out:
        output = slurm.JobOutput(tmp_path / "job.out", Console(file=out, width=300), drop_progress=False)
        tracemalloc.start()
        try:
            output.show()
            assert output.pos == 4 * 2**16  # the rest at the next look
            output.show(last=True)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert shown.read_text() == text
    assert peak < 2**21, peak  # (1 MiB read at once: 13 MiB)


def test_a_pending_jobs_state_line_names_a_reason_only_where_slurm_gives_one(tmp_path: Path, monkeypatch) -> None:
    """A job pending before the scheduler's next pass has the reason None: the follower said "PENDING (None)"."""
    import io

    from rich.console import Console

    _fake_scontrol(tmp_path, monkeypatch, "JobId=5 JobState=COMPLETED Reason=None ExitCode=0:0")
    squeue = tmp_path / "bin" / "squeue"
    squeue.write_text(f"#!/bin/sh\necho x >> {tmp_path}/looks\ncase $(wc -l < {tmp_path}/looks) in 1) echo "
                      f"'PENDING|None|';; 2) echo 'PENDING|Resources|';; esac\nexit 0\n")  # then gone
    squeue.chmod(0o755)
    said = io.StringIO()
    slurm.follow(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(2.5)"]), "5", tmp_path / "job.out",
                 Console(file=said, width=300))
    assert said.getvalue().startswith("SLURM job 5: PENDING\nSLURM job 5: PENDING (Resources)\n"), said.getvalue()


def test_the_run_a_killed_slurm_driver_left_is_published_once_the_job_ended(tmp_path: Path, monkeypatch) -> None:
    """kill -9 of the job's driver (the batch step; the OOM killer) mid-run: SLURM ended the job, and its run was left
    unpublished in its staging folder, 'the job ended (FAILED, exit code 0:9) without recording a run' said (on the
    real cluster). Its owner being of the job's node, not this host, no later run here would publish it either. The
    follower publishes it as aborted once the job has ended. The driver's node lost (rank 0's: its slurmd and the
    job's processes on it killed, on the real cluster) ends the job NODE_FAIL: the run's reason said 'mlbench (pid N)
    died before the run ended (killed, or its session lost); published as aborted by a later mlbench command'. It
    names the driver's node and how the job ended now, and who published it."""
    import io
    import re

    from rich.console import Console
    from test_hostile_run_side import _dead_run

    from mlbench import dead_runs, owners

    folder, staging = _dead_run(tmp_path, monkeypatch, run_stop=None)
    monkeypatch.setattr(owners, "gone", lambda tag: False)  # the driver's host is another: not known to be gone
    _fake_scontrol(tmp_path, monkeypatch, "JobId=7 JobState=NODE_FAIL Reason=NodeDown BatchHost=node1 ExitCode=0:0")
    job_dir = folder / ".slurm" / "job"
    job_dir.mkdir(parents=True)
    (job_dir / slurm.CURRENT_RUN).write_text(f"{staging}\n")
    assert dead_runs.publish(folder, Console(file=io.StringIO())) == []  # (another host's: left alone)
    assert slurm.left_run(job_dir, "RUNNING, exit code 0:0", Console(file=io.StringIO())) == []  # not ended yet
    said = io.StringIO()
    launcher = slurm.SlurmLauncher.__new__(slurm.SlurmLauncher)
    ended = "NODE_FAIL, exit code 0:0: a node failed and SLURM stopped it"
    launcher.console, launcher.job_dir, launcher.job_id, launcher.code, launcher.ended, launcher.stops = \
        Console(file=said, width=400), job_dir, "7", 0, ended, []
    assert launcher.collect() == 1
    record = json.loads((folder / "result_0.json").read_text())
    reason = re.fullmatch(r"the SLURM job's driver on node1 \(pid [0-9]+\) died before the run ended \(the job ended "
                          r"NODE_FAIL, exit code 0:0: a node failed and SLURM stopped it\); published as aborted by "
                          r"mlbench run, following the job, at [-0-9: ]+", record["reason"])
    assert record["status"] == "aborted" and reason, record["reason"]
    assert f"aborted {folder / 'result_0.txt'} ({record['reason']})" in said.getvalue(), said.getvalue()
    assert f"published a run the SLURM job's driver on node1 left as it died as aborted: {folder / 'result_0.txt'}" \
        in said.getvalue(), said.getvalue()
    assert not staging.exists() and "without recording a run" not in said.getvalue()


def test_a_job_whose_sbatch_was_killed_is_followed_by_its_state(tmp_path: Path, monkeypatch) -> None:
    """sbatch --wait killed while the job ran (kill -9 of it alone): the follower stopped following, waited up to
    120 s for the job's end without showing its output, and exited 1 for a set whose every run succeeded. It follows
    the job by its state now, its output as it comes, and the exit code is the job's (test_the_runs_...)."""
    import io

    from rich.console import Console

    _fake_scontrol(tmp_path, monkeypatch, "JobId=5 JobState=COMPLETED Reason=None ExitCode=0:0")
    squeue = tmp_path / "bin" / "squeue"  # running for two looks more, then gone from the queue
    squeue.write_text(f"#!/bin/sh\necho x >> {tmp_path}/looks\n[ $(wc -l < {tmp_path}/looks) -le 2 ] && "
                      f"echo 'RUNNING|None|node1' && echo 'step 20' >> {tmp_path}/job.out\nexit 0\n")
    squeue.chmod(0o755)
    said = io.StringIO()
    sbatch = subprocess.Popen([sys.executable, "-c", "import os, time; time.sleep(1.5); os.kill(os.getpid(), 9)"])
    code, ended = slurm.follow(sbatch, "5", tmp_path / "job.out", Console(file=said, width=300))
    assert said.getvalue() == ("SLURM job 5: RUNNING on node1\nstep 20\nSLURM job 5: sbatch --wait ended (exit code "
                               "-9) while the job runs on: following it by its state\nstep 20\n"
                               "SLURM job 5: COMPLETED, exit code 0:0\n"), said.getvalue()
    assert (code, ended) == (-9, "COMPLETED, exit code 0:0")


def test_a_gpu_count_slurm_refuses_is_named_in_the_refusal() -> None:
    """--gpus-per-node 100000 was refused by sbatch --test-only as "Invalid generic resource (gres) specification",
    the hint naming every flag to check but that one (test_slurm_run.py: on the real cluster)."""
    gres = "sbatch: error: Invalid generic resource (gres) specification"
    assert slurm.refusal_hint(gres, 100000) == (
        "--gpus-per-node 100000: no node of the partition has that many GPUs, as SLURM counts them (`sinfo -o "
        "'%P %N %G'` lists each node's); give at most a node's GPUs, or 0 on a CPU cluster")
    assert slurm.refusal_hint("invalid partition specified: nosuch", 0) == \
        "check --nodes, --partition, --account, --time"
    assert slurm.refusal_hint("Requested node configuration is not available", 8).endswith(", --gpus-per-node")


class _FormsLate(_Stuck):
    """A rendezvous that forms after `after` seconds (nodes that come late, within --rdzv-timeout)."""

    deadline_s = 60.0

    def __init__(self, after: float):
        self.at = time.monotonic() + after

    def formed(self) -> bool:
        return time.monotonic() >= self.at


def test_the_start_up_limit_counts_from_the_ranks_start_not_the_rendezvous(tmp_path: Path) -> None:
    """The start-up limit (init_timeout, 1800 s) counted from the launcher's start, so a --rdzv-timeout over 840 s
    (up to a week is taken) stopped node 0 as 'hang: no training step within 1800 s of start' while it still
    waited, rightly, for nodes. Here: a limit of 5 s, nodes that come after 2 s, ranks that end 3.5 s later (the
    limit as it was: 5 s from the start; as it is: 7 s)."""
    cmd = Command(["sleep", "5.5"], dict(os.environ), stdout=tmp_path / "out.log", rendezvous=_FormsLate(2.0))
    outcome = supervise(cmd, log_path=tmp_path / "mlperf.log", events_path=tmp_path / "events.jsonl", poll_s=0.05,
                        init_timeout=5.0)
    assert outcome.exit_code == 0 and not outcome.reason.startswith("hang"), outcome.reason
    stuck = Command(["sleep", "5"], dict(os.environ), stdout=tmp_path / "out2.log", rendezvous=_FormsLate(0.2))
    outcome = supervise(stuck, log_path=tmp_path / "mlperf2.log", events_path=tmp_path / "events2.jsonl",
                        poll_s=0.05, init_timeout=1.0)
    assert outcome.reason == "hang: no training step within 1 s of start"  # from the ranks' start, still judged


def _until(check, timeout: float = 5.0) -> float:
    """Seconds until CHECK() is true (AssertionError after TIMEOUT)."""
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < timeout, "not within the time"
        time.sleep(0.02)
    return time.monotonic() - start


def test_node_0s_watch_says_at_once_when_its_rendezvous_is_gone(tmp_path: Path) -> None:
    """lifeline.NodeWatch, as another node's supervisor holds it, on a stand-in for node 0's store (a listening
    socket): quiet while it answers, also when it drops the watch's connection and still listens; once nothing
    listens, the reason within a second."""
    import socket

    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    watch = lifeline.NodeWatch("127.0.0.1", port)
    try:
        held, _ = server.accept()
        held.close()  # the store dropped this client: it is still there
        again, _ = server.accept()  # the watch connected again
        time.sleep(0.3)
        assert watch.lost() == ""
        server.close()
        again.close()  # node 0's processes are gone: the kernel closes both
        assert _until(watch.lost) < 1.5
        assert watch.lost() == (f"node 0 died or ended its run: its rendezvous at 127.0.0.1:{port} closed, and refuses "
                                f"connections; see node 0's record")
    finally:
        watch.close()
        server.close()


def _threads_after_numpy(env: dict) -> int:
    code = "import mlbench, numpy; print(next(l for l in open('/proc/self/status') if l.startswith('Threads:')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    return int(out.split()[1])


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="on one core OpenBLAS starts no thread: nothing to tell")
def test_numpy_starts_no_blas_threads_in_mlbench_processes_unless_asked() -> None:
    """numpy's OpenBLAS started a thread a core in every mlbench process (0.1 s of CPU each: the CLI, the ranks);
    none now, while a user's setting is kept; the ranks get --threads, as torch's threads."""
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    assert _threads_after_numpy(env) == 1
    assert _threads_after_numpy({**env, "OPENBLAS_NUM_THREADS": "2"}) == 2
    from mlbench.runner import rank_env

    ranks = rank_env(3)
    assert ranks["OPENBLAS_NUM_THREADS"] == ranks["OMP_NUM_THREADS"] == ranks["MLBENCH_THREADS"] == "3"


def test_ranks_read_file_names_as_utf8_where_the_cli_does_not(monkeypatch) -> None:
    """`LC_ALL=POSIX PYTHONUTF8=0 make run` in a clone at '/tmp/a b ü': the rank died importing torch, which encodes
    its own path as UTF-8 ('surrogates not allowed'), and the run was published aborted. Where this process does not
    read file names as UTF-8, the ranks run in Python's UTF-8 mode; elsewhere the environment is left as it is."""
    from mlbench.runner import rank_env

    monkeypatch.delenv("PYTHONUTF8", raising=False)
    monkeypatch.setattr(sys, "getfilesystemencoding", lambda: "ascii")
    assert rank_env(1)["PYTHONUTF8"] == "1"
    monkeypatch.setattr(sys, "getfilesystemencoding", lambda: "utf-8")
    assert "PYTHONUTF8" not in rank_env(1)


# A run that reaches its target at once: the rank's log written whole from its plan (no model: the runner's handling
# of what follows the run is what is tested).
_LOGS_A_SUCCESS = r"""
import sys
from mlbench import mlperf_log
from mlbench.mlperf_log import C
from mlbench.run_plan import RunPlan
plan = RunPlan.load(sys.argv[1])
log = mlperf_log.write_preamble(plan)
log.end(C.INIT_STOP)
log.start(C.RUN_START)
log.event(C.TRAIN_SAMPLES, value=16)
log.end(C.RUN_STOP, metadata={"status": "success"})
log.close()
with open(plan.events_path, "a") as f:  # what rank 0 tells its supervisor
    f.write('{"event": "stopped", "status": "success"}\n')
"""


@pytest.mark.parametrize("when", ["checked", "published"])
def test_a_stop_signal_once_the_run_ended_is_said_and_ends_the_command_non_zero(tmp_path: Path, monkeypatch,
                                                                               when: str) -> None:
    """Ctrl-C while the last run's log was checked (or once it was published) was held and then forgotten: exit 0,
    nothing said. While it is checked, the run stays the success it is and its record says the signal apart
    (error_after_run_stop); after it is published, the line says nothing was left to stop; exit 128 + SIGINT either
    way, as every command ends on a stop signal (it was 1: a wrapper could not tell a stop from a missed target)."""
    import io

    from rich.console import Console

    from mlbench import rcp_schedule, results, runner
    from mlbench.launch.supervise import Command

    bench = registry.load("gpt3", tiny=True)
    layout = _layout()
    bench = rcp_schedule.for_run(bench, layout.global_batch_size)
    folder = tmp_path / "ci" / "gpt3"
    folder.mkdir(parents=True)
    console = Console(file=io.StringIO(), width=1 << 20)
    runs = runner.RunSet(bench, layout, RunOptions(results=tmp_path, system="ci", seed=3), console,
                         lambda plan, staging, i, env: Command([sys.executable, "-c", _LOGS_A_SUCCESS, str(plan)], env,
                                                               stdout=staging / "launcher.log"))
    runs.prepare(folder)
    checked, published = runner.compliance_verdict, results.publish

    def interrupted(check):
        def call(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, as the run's check or publication goes on
            return check(*args, **kwargs)
        return call

    monkeypatch.setattr(runner, "compliance_verdict", interrupted(checked) if when == "checked" else checked)
    monkeypatch.setattr(results, "publish", interrupted(published) if when == "published" else published)
    runs.supervise()
    said = console.file.getvalue()
    record = json.loads((folder / "result_0.json").read_text())
    assert runs.collect() == 128 + signal.SIGINT and record["status"] == "success", said
    if when == "checked":
        assert record["error_after_run_stop"] == "SIGINT received while the run was checked and published (held " \
                                                 "until it was published)", record
        assert "  SIGINT received while the run was checked and published (held until it was published): the " \
               "result stands\n" in said and "failed" not in said, said
    else:
        assert record["error_after_run_stop"] is None and "SIGINT received after the last run was published: " \
                                                          "nothing was left to stop" in said, said
    assert runs.results[0].status == "success" and runs.results[0].stopped_by == ("SIGINT" if when == "checked" else "")


def test_a_stop_signal_as_the_run_ends_is_said_as_a_stop_and_a_save_it_prevented_as_not_saved(tmp_path: Path) -> None:
    """Ctrl-C as the run's ranks closed their logs, the checkpoint saved: the end lines said 'checkpoint saved',
    then 'failed after run_stop (the result stands): received SIGINT', which read as contradictory (nothing had
    failed). Ctrl-C before the save began (in the measured-memory record, after run_stop) left the checkpoint
    unsaved without a word: no 'checkpoint not saved', its record's checkpoint_error null. At every launcher."""
    import dataclasses
    import io

    from rich.console import Console

    from mlbench import runner
    from mlbench.launch import supervise as sup

    plan = dataclasses.replace(_plan(tmp_path), save_checkpoint=str(tmp_path / "ck"))
    cmd = Command(["true"], {}, stdout=tmp_path / "out.log", what="rank 0 (the only rank)")
    ended = [{"event": "stopped", "status": "success", "step": 20, "reason": ""}]
    saved = [*ended, {"event": "checkpoint_saving", "path": plan.save_checkpoint},
             {"event": "checkpoint_saved", "path": plan.save_checkpoint, "seconds": 0.1}]
    log = sup._LogEnd(tmp_path / "mlperf.log", plan, False)
    late = sup._judge(cmd, 1, saved, "received SIGINT", "SIGINT", log, by_signal=True)
    assert (late.status, late.checkpoint_error, late.signal) == ("success", "", "SIGINT"), late
    assert late.error_after_run_stop == "received SIGINT after run_stop, as the run ended" and \
        late.stopped_after_run_stop, late
    early = sup._judge(cmd, 1, ended, "received SIGINT", "SIGINT", log, by_signal=True)
    assert early.checkpoint_error == "received SIGINT" and not early.error_after_run_stop, early
    # a rank that failed after run_stop is still a failure, said as one
    failed = sup._judge(cmd, 3, saved, "", "", log)
    assert failed.error_after_run_stop and not failed.stopped_after_run_stop, failed

    console = Console(file=io.StringIO(), width=1 << 20)
    bench = registry.load("gpt3", tiny=True)
    runner._summary(console, bench, runner.RunResult(
        tmp_path / "result_0.txt", "success", 1.0, 3.0, True, "", stopped_by="SIGINT",
        error_after_run_stop=late.error_after_run_stop, stopped_after_run_stop=True))
    said = console.file.getvalue()
    assert "  received SIGINT after run_stop, as the run ended: the result stands\n" in said and "failed" not in said


def test_the_end_lines_are_plain_text_with_paths_printable(tmp_path: Path) -> None:
    """On a terminal the end line '  reason: ...' was coloured by rich's highlighter (its numbers, paths and
    brackets), as no other line of the summary is: written as given."""
    import io

    from rich.console import Console

    from mlbench import runner

    console = Console(file=io.StringIO(), width=1 << 20, force_terminal=True, color_system="standard")
    reason = "rank 1 exited with code 3: RuntimeError: injected at step 5 (see the rank logs: local/attempt_0/1)"
    runner._summary(console, registry.load("gpt3", tiny=True), runner.RunResult(
        tmp_path / "result_0.txt", "aborted", None, None, True, reason))
    assert f"\n  reason: {reason}\n" in console.file.getvalue(), repr(console.file.getvalue())
    # a results path holding a byte that is not UTF-8 (--results $'/tmp/x\\xff') went out raw on the end line
    console = Console(file=io.StringIO(), width=1 << 20)
    runner._summary(console, registry.load("gpt3", tiny=True), runner.RunResult(
        Path("/tmp/x\udcff/result_0.txt"), "success", 1.0, 1.0, True, ""))
    assert console.file.getvalue().endswith("; /tmp/x\\xff/result_0.txt\n"), repr(console.file.getvalue())


def test_a_checkpoint_save_stopped_by_another_ranks_failure_names_that_rank(tmp_path: Path) -> None:
    """Rank 1 killed (kill -9) during the save after run_stop: the record's checkpoint_error was rank 0's own
    words for being stopped ('Aborted: signal SIGTERM', or gloo's 'Connection reset by peer'), with a note of
    the disk's free space; the agent's rank that failed of itself is named now."""
    from mlbench.launch import local_ranks

    plan = _plan(tmp_path)
    events = [{"event": "stopped", "status": "success", "step": 3, "reason": ""},
              {"event": "checkpoint_saving", "path": "ck"},
              {"event": "checkpoint_failed", "path": "ck", "reason": "Aborted: signal SIGTERM", "consequent": True}]
    script = (f"import json; open({str(plan.events_path)!r}, 'a').write(''.join(json.dumps(e) + chr(10) for e in "
              f"{events!r})); print('rank 1 killed by SIGKILL; stopping the other ranks'); raise SystemExit(1)")
    cmd = Command([sys.executable, "-c", script], dict(os.environ), stdout=tmp_path / "out.log", what="the agent",
                  rank_failure=local_ranks.rank_failure)
    outcome = supervise(cmd, log_path=plan.log_path, events_path=plan.events_path)
    assert outcome.status == "success"
    assert outcome.checkpoint_error == "rank 1 killed by SIGKILL (see the rank logs: local/attempt_0/1)", outcome


def test_node_0s_run_ended_by_a_peer_lost_without_word_says_so(tmp_path: Path) -> None:
    """kill -9 of node 1's mlbench: its ranks die, no node tells node 0 anything, and node 0's record gave rank 0's
    raw gloo error ('RuntimeError: [.../gloo/transport/tcp/pair.cc:537] Read error ...: Connection reset by peer')
    as the run's reason. It says in words that a peer on another node was lost, the error after it."""
    from types import SimpleNamespace

    from mlbench.launch import supervise as sup

    gloo = "RuntimeError: [/__w/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error: Connection " \
           "reset by peer"
    events = [{"event": "stopped", "status": "aborted", "step": 7, "reason": gloo, "consequent": True}]
    rendezvous = SimpleNamespace(explain=lambda error: None, nodes=2)
    cmd = Command(["torchrun"], {}, stdout=tmp_path / "out.log", what="torchrun", rendezvous=rendezvous,
                  rank_failure=lambda output: "")
    (tmp_path / "out.log").write_text("")
    outcome = sup._judge(cmd, 1, events, "", "", sup._LogEnd(tmp_path / "mlperf.log", None, False))
    assert outcome.status == "aborted" and outcome.reason == (
        f"a peer on another node was lost, and no node said why (its mlbench or host gone?): {gloo}"), outcome.reason


def test_a_dying_node_0_that_resets_connections_is_said_to_have_died(monkeypatch) -> None:
    """Under load a dying node 0's rendezvous reset the watch's connection as it closed, and node 1 said 'node 0
    stopped answering ... (Connection reset by peer)', the words for a host cut off. It asks again now."""
    import socket

    from mlbench.launch import lifeline

    def watch(errors: list[OSError]) -> lifeline.NodeWatch:
        w = lifeline.NodeWatch.__new__(lifeline.NodeWatch)  # (without its thread)
        w.endpoint, w._addr, w._lost = "h:1", ("h", 1), ""
        said = iter(errors)

        def connect(*_args, **_kwargs):
            raise next(said)
        monkeypatch.setattr(socket, "create_connection", connect)
        monkeypatch.setattr(lifeline.time, "sleep", lambda s: None)
        return w

    w = watch([ConnectionResetError(), ConnectionResetError(), ConnectionRefusedError()])
    assert w._connect(1) is None and w.lost() == ("node 0 died or ended its run: its rendezvous at h:1 closed, and "
                                                 "refuses connections; see node 0's record")
    w = watch([TimeoutError("timed out")])
    assert w._connect(1) is None and w.lost().startswith("node 0 stopped answering")


# A job that stays pending until it is cancelled outright: its batch step cannot be signalled (SLURM: "Job is pending
# execution"), as on the test cluster with both nodes taken
_PENDING_JOB = {
    "sbatch": '#!/bin/sh\n[ "$1" = "--test-only" ] && exit 0\necho 7\nwhile [ ! -e "$FAKE/cancelled" ]; do sleep 0.1; '
              'done\n',
    "scancel": '#!/bin/sh\ncase "$*" in *--batch*) echo "scancel: error: Job is pending execution" >&2; exit 1;; esac\n'
               'touch "$FAKE/cancelled"\n',
    "squeue": '#!/bin/sh\n[ -e "$FAKE/cancelled" ] || echo "PENDING|Resources|"\n',
    "scontrol": '#!/bin/sh\n[ -e "$FAKE/cancelled" ] && echo "JobId=7 JobState=CANCELLED ExitCode=0:0" || '
                'echo "JobId=7 JobState=PENDING ExitCode=0:0"\n',
}
# A job that ends at once, having written its output file as WRITE says (the folder of its job.sbatch is $J)
_ENDED_JOB = {
    "sbatch": '#!/bin/sh\n[ "$1" = "--test-only" ] && exit 0\necho 7\nfor a; do J=$a; done\nJ=$(dirname "$J")\n'
              '{write}\nexit 0\n',
    "squeue": "#!/bin/sh\nexit 0\n",
    "scancel": "#!/bin/sh\nexit 0\n",
    "scontrol": '#!/bin/sh\necho "JobId=7 JobState=FAILED ExitCode=1:0"\n',
}


def _fake_cluster(tmp_path: Path, fakes: dict[str, str]) -> subprocess.Popen:
    """`mlbench run gpt3 --tiny --launcher slurm` against the SLURM client commands FAKES (name: script)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, script in fakes.items():
        (bin_dir / name).write_text(script)
        (bin_dir / name).chmod(0o755)
    return subprocess.Popen([*MLBENCH, "run", "gpt3", "--tiny", "--launcher", "slurm", "--results", str(tmp_path / "r"),
                             "--system", "ci"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE": str(tmp_path),
                                 "COLUMNS": "200"})


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_while_the_job_is_pending_cancels_it(tmp_path: Path, signum: int) -> None:
    """Ctrl-C or SIGTERM while the job pended was passed over without a word (`scancel --signal=TERM --batch` fails
    for a job with no batch step yet), the job left pending; a second one cancelled it, then 'see job.out', a file
    never written, and exit 1. Now cancelled at the first, said, and the exit code is the signal's, as a local set's.
    The set's seeds are claimed as the job is submitted, the claim handed to the job (its job.json names it, and it
    names the job: held while the job is pending, its submitter gone); the job cancelled before it started, the claim
    goes (the job's driver claimed them as it started: while it pended, another set could take them)."""
    from mlbench import seed_claims

    proc = _fake_cluster(tmp_path, _PENDING_JOB)
    folder = tmp_path / "r" / "ci" / "gpt3"
    try:
        deadline = time.monotonic() + 60
        while not list(folder.glob(".slurm/*/job_id")):
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
            time.sleep(0.1)
        time.sleep(1)
        [claim] = folder.glob(f"{seed_claims.CLAIM}*")
        held = json.loads(claim.read_text())
        [spec] = folder.glob(".slurm/*/job.json")
        run = json.loads(spec.read_text())["run"]
        assert (run["seed_claim"], run["seed"], held["runs"], held["slurm_job"]) == (claim.name, held["first"], 1,
                                                                                       "7"), (run, held)
        proc.send_signal(signum)
        out = "".join(proc.communicate(timeout=60))
    finally:
        proc.kill()
    name = signal.Signals(signum).name
    assert proc.returncode == 128 + signum and "Traceback" not in out, out
    assert f"SLURM job 7: {name}: cancelling the job\n" in out, out
    assert "SLURM job 7: CANCELLED, exit code 0:0" in out and "before it started: no run" in out, out
    assert (tmp_path / "cancelled").exists()
    assert not list(folder.glob(f"{seed_claims.CLAIM}*"))


@pytest.mark.parametrize(("write", "said"), [
    ('mkdir "$J/job.out"', "cannot read the job's output "),  # it ended `mlbench run` (exit 2), the job unfollowed
    # a character cut in two by a read: a UnicodeDecodeError traceback; bytes that are not UTF-8 too
    (r"printf 'caf\303' > $J/job.out; sleep 2; printf '\251 \377ok\n' >> $J/job.out",
     "café \N{REPLACEMENT CHARACTER}ok\n"),
])
def test_a_jobs_output_that_cannot_be_read_as_text_is_no_crash(tmp_path: Path, write: str, said: str) -> None:
    proc = _fake_cluster(tmp_path, {**_ENDED_JOB, "sbatch": _ENDED_JOB["sbatch"].replace("{write}", write)})
    try:
        out = "".join(proc.communicate(timeout=120))
    finally:
        proc.kill()
    assert proc.returncode == 1 and said in out and "Traceback" not in out, out
    assert "SLURM job 7: FAILED, exit code 1:0" in out, out


@pytest.mark.parametrize(("kind", "said"), [("link", "a symbolic link, not a regular file"),
                                            ("fifo", "a named pipe, not a regular file")])
def test_a_jobs_output_that_is_not_a_regular_file_is_not_read(tmp_path: Path, kind: str, said: str) -> None:
    """job.out replaced by a link to /dev/zero made the follower's final read loop for ever; a FIFO in its place
    blocked its open. Each is said once now, and the output no longer looked at (the job followed by its state)."""
    import io
    import threading

    from rich.console import Console

    out = tmp_path / "job.out"
    out.symlink_to("/dev/zero") if kind == "link" else os.mkfifo(out)
    shown = io.StringIO()
    output = slurm.JobOutput(out, Console(file=shown, width=300), drop_progress=False)
    looks = threading.Thread(target=lambda: (output.show(), output.show(), output.show(last=True)), daemon=True)
    looks.start()
    looks.join(timeout=10)
    assert not looks.is_alive() and output.pos == 0, shown.getvalue()[:300]
    assert shown.getvalue() == f"cannot read the job's output {out} ({said}); following the job by its state\n"


def test_the_final_read_of_a_jobs_output_ends_at_what_it_held(tmp_path: Path, monkeypatch) -> None:
    """A job's output file that something went on appending to as the job ended held the follower's final read (all
    of it, to the end) for as long as it grew. It ends at what the file held as the final read began now."""
    import io

    from rich.console import Console

    monkeypatch.setattr(slurm.JobOutput, "CHUNK", 4)
    out = tmp_path / "job.out"
    out.write_text("x" * 10)
    show, shows = slurm.JobOutput._show, []

    def growing(output: slurm.JobOutput, data: bytes, final: bool) -> None:  # a writer as fast as it is read
        shows.append(data)
        assert len(shows) < 50, "the final read does not end"
        with out.open("a") as f:
            f.write("y" * 4)
        show(output, data, final)

    monkeypatch.setattr(slurm.JobOutput, "_show", growing)
    shown = io.StringIO()
    slurm.JobOutput(out, Console(file=shown, width=300), drop_progress=False).show(last=True)
    assert shown.getvalue().startswith("x" * 10) and len(shown.getvalue()) <= 14, shown.getvalue()


@pytest.mark.parametrize("ended", ["target reached", "aborted", "crashed", "stopped by SIGINT", "stopped by SIGTERM"])
def test_the_records_exit_code_is_the_same_for_the_same_end_whatever_launched_it(ended: str) -> None:
    """The record's exit_code was the launcher's own: a one-process run's rank exits 3 for a crash (mlbench's agent,
    torchrun and srun: 1) and 6 when stopped (the agent: 128 + the signal). Now one code for one end; the launcher's
    kept as launcher_exit_code."""
    from mlbench.launch.supervise import Outcome
    from mlbench.runner import exit_code

    # each launcher's own exit status for that end: the rank itself (one process), mlbench's agent, torchrun, srun
    codes = {"target reached": (0, 0, 0, 0), "aborted": (1, 1, 1, 1), "crashed": (3, 1, 1, 1),
             "stopped by SIGINT": (6, 130, 1, 1), "stopped by SIGTERM": (6, 143, 1, 1)}[ended]
    sig = ended.rpartition(" ")[2] if ended.startswith("stopped") else ""
    status = "success" if ended == "target reached" else "aborted"
    said = {exit_code(Outcome(status=status, exit_code=c, signal=sig)) for c in codes}
    assert said == {{"target reached": 0, "stopped by SIGINT": 130, "stopped by SIGTERM": 143}.get(ended, 1)}, said


def test_a_runs_first_and_last_lines_name_its_layout() -> None:
    """A log of a multi-rank run did not say what ran: 'training on cpu x86_64 (fp32, local attention)' and
    'target reached: ...; compliance (ok); <path>' for 1 process and for CP2 x DP2 alike. Both lines now name the
    parallel sizes (the trainer's start event carries them; the runner's end line has its layout)."""
    import io

    from rich.console import Console

    from mlbench import runner
    from mlbench.layout import Layout, sizes_text
    from mlbench.progress import Progress

    layout = Layout(nodes=1, nproc_per_node=4, tp=1, pp=1, vp=1, cp=2, dp=2, micro_batch_size=8,
                    global_batch_size=16).as_dict()
    sizes = sizes_text(layout)
    assert sizes == "tp1 pp1 cp2 ep1 dp2 over 4 processes"
    assert sizes_text(layout | {"nodes": 2, "pp": 2, "vp": 2, "ep": 2}) == \
        "tp1 pp2 x vp2 cp2 ep2 dp2 over 8 processes on 2 nodes"
    console = Console(file=io.StringIO(), width=1 << 20)
    with Progress("gpt3 (tiny) run 1/1, seed 3", console) as p:
        p.on_events([{"event": "start", "budget": 300, "target": 1.04, "metric": "log_perplexity",
                      "direction": "min", "device": {"type": "cpu", "name": "x86_64", "precision": "fp32",
                                                     "attention": "local"}, "layout": sizes}])
    runner._summary(console, registry.load("gpt3", tiny=True),
                    runner.RunResult(Path("r/result_0.txt"), "success", 6.3, 1.0368, True, ""), sizes)
    first, last = console.file.getvalue().splitlines()
    assert first == f"training on cpu x86_64 (fp32, local attention), {sizes}"
    assert f"time-to-train 6.3 s (0.105 min); {sizes}; compliance (ok); r/result_0.txt" in last, last
