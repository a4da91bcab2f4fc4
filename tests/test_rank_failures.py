"""A rank other than rank 0 fails mid-run: its launcher (mlbench's agent, torchrun) then stops the other ranks, and
rank 0, stopped by that SIGTERM or by its collective's peer gone, logged its own "Aborted: signal SIGTERM" (or gloo's
"Connection reset by peer") as the run's reason; torchrun's "first observed failure" even named rank 0 (the earliest
to the second, the lowest rank on a tie). The log's run_stop and the record now name the rank that failed first."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import mlbench, mllog, result_dir

from mlbench.launch import local_ranks, torchrun
from mlbench.launch.ports import free_port

# Rank 1 fails once rank 0 has logged its third step: it exits 7, or it is killed (SIGKILL: the OOM killer)
_FAIL_AT_STEP_3 = """import os, signal, sys, threading, time
if ("mlbench.train" in sys.orig_argv or "mlbench.launch.torchrun_rank" in sys.orig_argv) \\
        and os.environ.get("RANK") == "1":
    events = os.path.join(os.path.dirname(sys.orig_argv[-1]), "events.jsonl")

    def fail():
        while True:
            try:
                with open(events) as f:
                    if f.read().count('"event": "step"') >= 3:
                        os.kill(os.getpid(), signal.SIGKILL) if {kill} else os._exit(7)
            except OSError:
                pass
            time.sleep(0.05)

    threading.Thread(target=fail, daemon=True).start()
"""


def fail_at_step_3(tmp_path: Path, kill: bool) -> dict:
    """The environment in which rank 1 fails at step 3 (a sitecustomize on its path)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_FAIL_AT_STEP_3.format(kill=kill))
    return {"PYTHONPATH": str(site)}


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["torchrun"])  # mlbench's agent: test_failures.py kills a rank under it
def test_the_rank_that_failed_first_is_the_runs_reason(tmp_path: Path, launcher: str) -> None:
    """torchrun at one node (rank 1 killed; under mlbench's agent, rank 1 exiting 7 gives "rank 1 exited with code
    7 ..."): both said "Aborted: signal SIGTERM" or gloo's "Connection reset by peer", rank 0's."""
    flags = ["--launcher", "torchrun", "--rdzv-endpoint", f"127.0.0.1:{free_port('127.0.0.1')}"] \
        if launcher == "torchrun" else []
    out = mlbench("run", "gpt3", "--tiny", "--nproc-per-node", "2", "--results", str(tmp_path / "r"), "--system", "s",
                  "--seed", "1", *flags, env=fail_at_step_3(tmp_path, kill=launcher == "torchrun"))
    assert out.returncode == 1, out.stdout + out.stderr
    folder = result_dir(tmp_path / "r", "gpt3")
    if launcher == "local":
        reason = "rank 1 exited with code 7 (see the rank logs: local/attempt_0/1)"
    else:
        [logs] = [p.relative_to(folder / "logs" / "result_0") for p in folder.glob("logs/result_0/*/attempt_0/1")]
        reason = f"rank 1 killed by SIGKILL (see the rank logs: {logs})"  # one node: no node named
    log = mllog(folder / "result_0.txt")
    stops = [e for e in log if e["key"] == "run_stop"]
    assert len(stops) == 1 and stops[0]["metadata"]["status"] == "aborted", stops
    assert stops[0]["metadata"]["reason"] == reason, out.stdout
    assert [e["key"] for e in log].count("train_samples") == 1  # the checker wants one: the supervisor wrote it
    assert json.loads((folder / "result_0.json").read_text())["reason"] == reason
    assert f"reason: {reason}\n" in out.stdout, out.stdout


def test_a_rank_stopped_from_outside_is_said_alike_at_every_launcher(tmp_path: Path) -> None:
    """kill -TERM of a rank mid-run (no rank failed, no launcher stopped it): mlbench's agent said 'rank 1 was
    stopped by a signal from another process, no rank having failed (...)', while the one rank of a local run and
    rank 0 under torchrun at one node gave their own 'Aborted: signal SIGTERM', and rank 1 under torchrun rank 0's
    gloo error ('RuntimeError: [...pair.cc:553] Connection closed by peer [127.0.0.1]:14733. ... GLHF!'). A rank of
    a one-node torchrun run that failed was named 'rank 1 (node 0's local rank 1)', of a local one 'rank 1'; the one
    rank's reason named no logs ('(a rank failed; see the rank logs)'). Each is now said as the agent says it."""
    from mlbench.launch import supervise as sup

    one = sup.Command(["true"], {}, stdout=tmp_path / "out.log", what="rank 0 (the only rank)",
                      logs="direct/attempt_0/0")
    assert sup._exit_reason(one, 6, otherwise="stopped by SIGTERM") == (
        "rank 0 was stopped by a signal from another process, no rank having failed (exited with code 6; see the "
        "rank logs: direct/attempt_0/0)")
    logs = "(see the rank logs: direct/attempt_0/0)"
    assert sup._exit_reason(one, -9) == f"rank 0 (the only rank) killed by SIGKILL {logs}"
    assert sup._exit_reason(one, 7) == f"rank 0 (the only rank) exited with code 7 {logs}"

    ranks = tmp_path / "ranks"
    for rank, words in ((0, "RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:14733"),
                        (1, "stopped by SIGTERM")):
        (ranks / "mlbench-run0_x" / "attempt_0" / str(rank)).mkdir(parents=True)
        (ranks / "mlbench-run0_x" / "attempt_0" / str(rank) / "stderr.log").write_text(
            f"Traceback ...\n[rank {rank}] run aborted: {words}\n")
    said = _said(_block(1, 1, 6), _block(0, 0, 6))  # both stopped, in the same second
    assert torchrun.rank_failure(said, ranks, 0, nodes=1) == (
        "rank 1 was stopped by a signal from another process, no rank having failed (exited with code 6; see the "
        "rank logs: mlbench-run0_x/attempt_0/1)")
    assert torchrun.rank_failure(said, ranks, 0, nodes=2) == ""  # another node's end: node 0 hears of it apart
    (ranks / "mlbench-run0_x" / "attempt_0" / "0" / "stderr.log").write_text("[rank 0] run aborted: stopped by SIGTERM")
    assert torchrun.rank_failure(said, ranks, 0, nodes=1).startswith(
        "a rank was stopped by a signal from another process, no rank having failed (see the rank logs: ")
    (ranks / "mlbench-run0_x" / "attempt_0" / "1" / "stderr.log").write_text("")  # killed (os._exit) wordless
    assert torchrun.rank_failure(_said(_block(1, 1, 7)), ranks, 0, nodes=1) == (
        "rank 1 exited with code 7 (see the rank logs: mlbench-run0_x/attempt_0/1)")


def test_a_rank_other_than_rank_0_that_raises_is_said_with_its_words(tmp_path: Path) -> None:
    """Rank 0 raising at step 5 gave the run's reason 'RuntimeError: injected at step 5' (its own run_stop); rank 1
    raising the same gave 'rank 1 exited with code 3 (see the rank logs: ...)', its words left in its logs, under
    mlbench's agent and torchrun alike. Its last words now come with it."""
    logs = tmp_path / "local" / "attempt_0" / "1"
    logs.mkdir(parents=True)
    (logs / "stderr.log").write_text("Traceback ...\nRuntimeError: injected at step 5\n"
                                     "[rank 1] run aborted: RuntimeError: injected at step 5\n")
    agent = f"rank 1 exited with code 3; stopping the other ranks (see {logs})\nrank 0 exited with code 6 (see x)\n"
    assert local_ranks.rank_failure(agent) == (
        "rank 1 exited with code 3: RuntimeError: injected at step 5 (see the rank logs: local/attempt_0/1)")
    ranks = tmp_path / "ranks"
    (ranks / "mlbench-run0_x" / "attempt_0").mkdir(parents=True)
    logs.rename(ranks / "mlbench-run0_x" / "attempt_0" / "1")
    assert torchrun.rank_failure(_said(_block(1, 1, 3), _block(0, 0, 6)), ranks, 0, nodes=1) == (
        "rank 1 exited with code 3: RuntimeError: injected at step 5 (see the rank logs: mlbench-run0_x/attempt_0/1)")


def _block(n: int, rank: int, code: int, when: str = "05:47:51", local: int | None = None) -> str:
    """One failed rank as torchrun's last words list it (torch 2.13)."""
    return (f"[{n}]:\n  time      : 2026-11-27_{when}\n  host      : localhost\n  rank      : {rank} (local_rank: "
            f"{rank if local is None else local})\n  exitcode  : {code} (pid: 1{rank}) \n  error_file: <N/A>\n"
            f"  traceback : To enable ...\n")


def _said(*blocks: str) -> str:
    """torchrun's last words listing the ranks that failed (BLOCKS, _block's)."""
    return "ChildFailedError: \n" + "=" * 60 + "\nFailures:\n" + "".join(blocks) + "=" * 60


def test_a_rank_stopped_by_another_is_not_named_for_it() -> None:
    """The launchers' own words, where the rank reaped (or listed) first is one stopped because another failed:
    rank 0 ends with mlbench's consequent exit code (6: the launcher's SIGTERM, a peer lost) or SIGTERM itself."""
    agent = ("rank 0 exited with code 6; stopping the other ranks (see /s/ranks/local/attempt_0/0)\n"
             "rank 2 killed by SIGTERM (see /s/ranks/local/attempt_0/2)\n"
             "rank 1 killed by SIGSEGV (see /s/ranks/local/attempt_0/1)\n")
    assert local_ranks.rank_failure(agent) == "rank 1 killed by SIGSEGV (see the rank logs: local/attempt_0/1)"
    # none failed of itself, and the agent stopped none before the first ended: a signal from another process
    # stopped that one (kill -TERM of a rank), which was said as its own 'Aborted: signal SIGTERM'
    assert local_ranks.rank_failure(agent.replace("SIGSEGV", "SIGTERM")) == (
        "rank 0 was stopped by a signal from another process, no rank having failed (exited with code 6; see the "
        "rank logs: local/attempt_0/0)")

    # torch 2.13's words: rank 1 exited 7 and rank 0 (its peer gone) 6 in the same second; torch picked rank 0
    said = ("torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n" + "=" * 60 + "\nFailures:\n"
            + _block(1, 1, 7) + "-" * 60 + "\nRoot Cause (first observed failure):\n" + _block(0, 0, 6) + "=" * 60)
    assert torchrun.first_failure(said) == torchrun.Failure(1, 1, 7, "2026-11-27_05:47:51", False)
    assert torchrun.first_failure(said.replace("exitcode  : 7", "exitcode  : -15")) is None
    # two that failed of themselves: torch's root cause on a tie, else the earlier
    assert torchrun.first_failure(said.replace("exitcode  : 6", "exitcode  : 1")).rank == 0
    later = said.replace("exitcode  : 6", "exitcode  : 1").replace("[0]:\n  time      : 2026-11-27_05:47:51",
                                                                    "[0]:\n  time      : 2026-11-27_05:47:52")
    assert torchrun.first_failure(later).rank == 1


def test_another_nodes_rank_that_failed_first_reaches_node_0(tmp_path: Path) -> None:
    """In one process, without torch: what the other nodes' supervisors tell node 0's as their torchrun ends
    (node_failures). Node 0's record had named rank 0's gloo error, its ranks stopped by a peer on another node;
    it now names the earliest rank that failed of itself on any other node, and a node that says nothing (its host
    gone) is waited for no longer than WAIT_S. The ports are the ones node 0's ranks share in the store."""
    import socket
    import time

    from mlbench.launch import node_failures

    def said(*blocks: str) -> str:
        return "ChildFailedError: \n" + "=" * 60 + "\nFailures:\n" + "".join(blocks) + "=" * 60

    ranks = tmp_path / "ranks"
    (ranks / "mlbench-run0_ab12cd34" / "attempt_0" / "1").mkdir(parents=True)
    board = node_failures.Board(nodes=5)  # nodes 1 to 4 tell it; node 4 never does
    port = tmp_path / "port"
    port.write_text(str(board.port))
    with socket.create_connection(("127.0.0.1", board.port)) as stranger:  # not a node: ignored
        stranger.sendall(b"GET / HTTP/1.0\r\n\r\n")
    node_failures.tell("127.0.0.1", port, torchrun.node_report(said(_block(0, 9, 7, "05:47:52", local=1)), ranks, 2))
    node_failures.tell("127.0.0.1", port, torchrun.node_report(said(_block(0, 5, 7, local=1)), ranks, 1))
    node_failures.tell("127.0.0.1", port, torchrun.node_report(said(_block(0, 12, 6, local=0)), ranks, 3))
    start = time.monotonic()
    heard = board.heard(wait_s=0.5)
    assert time.monotonic() - start < 2 and [r["node"] for r in heard] == [1, 2, 3], heard
    assert heard[2] == {"node": 3}  # stopped by another's failure: none of its own
    assert torchrun.elsewhere(heard) == ("rank 5 (node 1's local rank 1) exited with code 7 (see node 1's rank logs: "
                                         "mlbench-run0_ab12cd34/attempt_0/1)")
    assert torchrun.elsewhere(heard[1:]).startswith("rank 9 (node 2's local rank 1) exited with code 7")
    assert torchrun.elsewhere(heard[2:]) == ""
    board.close()
    node_failures.tell("127.0.0.1", port, {"node": 1})  # node 0 gone: nothing to tell, and no error
    node_failures.tell("127.0.0.1", tmp_path / "none", {"node": 1})  # its ranks never shared the port


def _told(tmp_path: Path, board) -> Path:
    """Where another node's first rank would leave node 0's failures port for its supervisor (node_failures.FILE)."""
    port = tmp_path / "node0-failures-port"
    port.write_text(str(board.port))
    return port


def test_node_0_hears_another_node_without_waiting_while_its_run_goes_on(tmp_path: Path) -> None:
    """In one process: node 0's supervisor looks at its board on each poll of its run (Board.news), so what it has
    not been told yet, and a connection that says nothing (not a node), must not hold it up; a report that has come
    is there at once. Before, the board was read only as node 0's run ended (Board.heard, up to WAIT_S)."""
    import socket
    import time

    from mlbench.launch import node_failures

    board = node_failures.Board(nodes=3)
    port = _told(tmp_path, board)
    try:
        with socket.create_connection(("127.0.0.1", board.port)) as silent:
            silent.sendall(b'{"node": 2')  # connected, half a report, and no end
            start = time.monotonic()
            assert board.news() == [] and board.news() == []
            report = torchrun.node_report(_said(_block(0, 1, 7, local=0)), tmp_path, 1)
            node_failures.tell("127.0.0.1", port, report)
            deadline = time.monotonic() + 5
            while not (news := board.news()) and time.monotonic() < deadline:
                time.sleep(0.01)
            assert time.monotonic() - start < 2, "the board waited for a node that said nothing"
            assert news == [report]
            assert torchrun.elsewhere(news) == ("rank 1 (node 1's local rank 0) exited with code 7 (see node 1's rank "
                                                "logs)")
        assert [r["node"] for r in board.heard(wait_s=0.2)] == [1]  # the silent one ended: not a report
    finally:
        board.close()


def test_node_0_stops_its_run_as_soon_as_another_node_tells_of_its_failure(tmp_path: Path) -> None:
    """In one process, node 0's supervisor (torchrun.node_command) and a launcher that would run 30 s: node 1's
    rank died before the process group formed, and node 1 ended within seconds, but node 0's rank 0 waited in
    init_process_group for its 120 s timeout, then named its own timeout. Node 0 now stops its run as node 1's
    supervisor tells it, with node 1's rank as the reason; a node that tells of no failure of its own (its ranks
    stopped by another's) does not stop it."""
    import os
    import sys
    import threading
    import time

    from mlbench.launch import node_failures
    from mlbench.launch.supervise import supervise

    ranks = tmp_path / "ranks"
    (ranks / "mlbench-run0_ab12cd34" / "attempt_0" / "0").mkdir(parents=True)
    rendezvous = torchrun.Rendezvous("127.0.0.1:1", nodes=3, node_rank=0, timeout=60, ranks_dir=ranks)
    cmd = torchrun.node_command([sys.executable, "-c", "import time; time.sleep(30)"], dict(os.environ),
                                tmp_path / "launcher.log", rendezvous)
    port = tmp_path / "port"
    port.write_text(cmd.env[node_failures.PORT])
    node2 = torchrun.node_report("", ranks, 2)  # none of its own
    node1 = torchrun.node_report(_said(_block(0, 1, 7, local=0)), ranks, 1)
    threading.Timer(0.3, node_failures.tell, ("127.0.0.1", port, node2)).start()
    threading.Timer(1.5, node_failures.tell, ("127.0.0.1", port, node1)).start()
    start = time.monotonic()
    outcome = supervise(cmd, log_path=tmp_path / "mlperf.log", events_path=tmp_path / "events.jsonl", poll_s=0.05)
    took = time.monotonic() - start
    assert 1.4 < took < 6, took  # not stopped by node 2's word, stopped within moments of node 1's
    assert outcome.status == "aborted" and outcome.reason == (
        "rank 1 (node 1's local rank 0) exited with code 7 (see node 1's rank logs: mlbench-run0_ab12cd34/attempt_0/0)")


@pytest.mark.parametrize("stopped", ["hang", "SIGTERM", "node 0 lost", "torchrun signalled"])
def test_a_node_whose_supervisor_stopped_its_run_tells_node_0_why(tmp_path: Path, stopped: str) -> None:
    """In one process, node 1's supervisor (torchrun.node_command) and node 0's board: node 1's supervisor stopped
    its run (its hang limit; SIGTERM to its mlbench, as Ctrl-C or a scheduler sends), its ranks ended by SIGTERM (a
    failure of none of its ranks' own), and node 1 told node 0 nothing of its own: node 0 named rank 0's gloo
    error. Node 1 now tells node 0 its supervisor's reason, which node 0 names; where node 1's supervisor stopped its
    run because node 0 was lost, that is node 0's story, not node 1's: nothing of its own. SIGTERM to node 1's
    torchrun alone (from another process, not its supervisor): node 1's record said so, but node 0 heard nothing
    and said 'a peer on another node was lost, and no node said why'; node 1 now tells it. The launcher here ends as
    torchrun does on SIGTERM, its last words SignalException, whoever sent it."""
    import os
    import socket
    import sys
    import threading

    from mlbench.launch import node_failures
    from mlbench.launch.supervise import supervise

    board = node_failures.Board(nodes=2)
    store = socket.create_server(("127.0.0.1", 0))  # node 0's rendezvous store, watched once node 1's ranks start
    ranks = tmp_path / "ranks"
    if stopped == "node 0 lost":
        (ranks / "mlbench-run0_ab12cd34" / "attempt_0" / "0").mkdir(parents=True)

        def node_0_ends() -> None:  # once node 1 watches it: the watch's connection closed, a new one refused
            with store, store.accept()[0]:
                pass

        threading.Thread(target=node_0_ends, daemon=True).start()
    rendezvous = torchrun.Rendezvous(f"127.0.0.1:{store.getsockname()[1]}", nodes=2, node_rank=1, timeout=60,
                                     ranks_dir=ranks)
    # a launcher and its rank (torchrun's), 30 s unless stopped; SIGTERM: to its supervisor (this process) first;
    # torchrun signalled: to the launcher alone
    launcher = ("import os, signal, subprocess, sys\n"
                "def said(n, _): sys.exit(f'torch.distributed.elastic.multiprocessing.api.SignalException: Process "
                "{os.getpid()} got signal: {n}')\n"
                "signal.signal(signal.SIGTERM, said)\n"
                f"if {stopped == 'SIGTERM'}: os.kill(os.getppid(), signal.SIGTERM)\n"
                f"if {stopped == 'torchrun signalled'}: os.kill(os.getpid(), signal.SIGTERM)\n"
                "subprocess.run(['sleep', '30'])")
    cmd = torchrun.node_command([sys.executable, "-c", launcher], dict(os.environ), tmp_path / "launcher.log",
                                rendezvous)
    _told(tmp_path, board)
    try:
        outcome = supervise(cmd, log_path=tmp_path / "mlperf.log", events_path=tmp_path / "events.jsonl",
                            init_timeout=1.0 if stopped == "hang" else 60.0, poll_s=0.05)
        heard = board.heard(wait_s=5)
    finally:
        board.close()
        store.close()
    said = {"hang": "hang: no training step within 1 s of start", "SIGTERM": "received SIGTERM",
            "node 0 lost": f"node 0 died or ended its run: its rendezvous at {rendezvous.endpoint} closed, and refuses "
                           f"connections; see node 0's record",
            "torchrun signalled": "the launcher (node 1's torchrun) received SIGTERM from another process and stopped "
                                  "the ranks"}[stopped]
    assert outcome.status == "aborted" and outcome.reason == said, outcome
    assert outcome.signal == ("SIGTERM" if stopped == "SIGTERM" else "")
    assert [r["node"] for r in heard] == [1], heard
    assert torchrun.elsewhere(heard) == {
        "hang": "node 1: hang: no training step within 1 s of start", "SIGTERM": "node 1's mlbench received SIGTERM",
        "node 0 lost": "", "torchrun signalled": "node 1: its torchrun received SIGTERM from another process and "
                                                 "stopped its ranks"}[stopped]


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def _agent(tmp_path: Path, script: Path) -> subprocess.Popen:
    """mlbench's local agent starting SCRIPT as two ranks (their logs under TMP_PATH/ranks), its output piped."""
    return subprocess.Popen([sys.executable, "-m", "mlbench.launch.local_ranks", "--nproc-per-node=2",
                             f"--log-dir={tmp_path / 'ranks'}", str(script)], stdout=subprocess.PIPE, text=True)


def test_the_agent_ends_when_its_ranks_end_together(tmp_path: Path) -> None:
    """Rank 1 killed, rank 0 ending of it before the agent looked (both exited when it next ran): the agent reaped
    rank 0 first, and stopping the others, Popen.send_signal's poll reaped rank 1 behind its back; then it waited
    for rank 1 for ever (seen as a suite's test_killed_rank_aborts_the_run_within_30_seconds: 'still running:
    ...local_ranks'). Ranks without torch, the agent held stopped until both have exited."""
    script = tmp_path / "rank.py"
    script.write_text("import os, signal, time\ntime.sleep(0.5)\n"
                      "os.kill(os.getpid(), signal.SIGKILL) if os.environ['RANK'] == '1' else os._exit(6)\n")
    agent = _agent(tmp_path, script)
    try:
        deadline = time.monotonic() + 20
        ranks: list[int] = []
        while len(ranks) < 2 and time.monotonic() < deadline:  # both started: hold the agent
            children = Path(f"/proc/{agent.pid}/task/{agent.pid}/children")
            ranks = [int(p) for p in children.read_text().split()] if children.exists() else []
            time.sleep(0.01)
        os.kill(agent.pid, signal.SIGSTOP)
        while any(_state(p) not in ("Z", "gone") for p in ranks) and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(agent.pid, signal.SIGCONT)
        out, _ = agent.communicate(timeout=30)
    finally:
        agent.kill()
    assert agent.returncode == 1, out
    assert "rank 1 killed by SIGKILL" in out and "rank 0 exited with code 6" in out, out


def test_a_stop_signal_sent_to_the_agent_alone_is_the_runs_reason(tmp_path: Path) -> None:
    """SIGTERM to mlbench's local agent from another process (not its supervisor): the run's reason was its ranks'
    'Aborted: signal SIGTERM', and the agent's output said the first of them to exit had (rank 1 exited with code
    6; stopping the other ranks), exit code 1. Now it says it received the signal, and ends with 128 + it."""
    script = tmp_path / "rank.py"  # a rank without torch, ending on SIGTERM as a rank stopped by its launcher does
    script.write_text("import os, signal, time\nsignal.signal(signal.SIGTERM, lambda *a: os._exit(6))\n"
                      "print('started', flush=True)\ntime.sleep(60)\n")
    agent = _agent(tmp_path, script)
    try:
        deadline = time.monotonic() + 60
        logs = [tmp_path / "ranks" / "local" / "attempt_0" / str(r) / "stdout.log" for r in (0, 1)]
        while not all(f.exists() and f.read_text() for f in logs):
            assert time.monotonic() < deadline and agent.poll() is None, "the ranks did not start"
            time.sleep(0.05)
        agent.send_signal(signal.SIGTERM)
        out, _ = agent.communicate(timeout=30)
    finally:
        agent.kill()
    assert agent.returncode == 128 + signal.SIGTERM, out
    assert out == "the agent received SIGTERM; it stopped its ranks\n", out
    assert local_ranks.rank_failure(out) == ("the launcher (mlbench's local agent) received SIGTERM from another "
                                             "process and stopped the ranks")


def _catches(pid: int, sig: int) -> bool:
    """Whether process PID has a handler for SIG (/proc's SigCgt mask)."""
    status = Path(f"/proc/{pid}/status").read_text()
    mask = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
    return bool(mask >> (sig - 1) & 1)


def test_a_stop_signal_sent_to_the_agent_before_its_ranks_start_is_the_runs_reason(tmp_path: Path) -> None:
    """SIGTERM as the agent imports torch, before any rank: it exited 143 without a word, and the run's reason was
    'launcher exited with code 143 (a rank failed; see the rank logs)', with no rank ever started."""
    agent = _agent(tmp_path, tmp_path / "rank.py")
    try:
        deadline = time.monotonic() + 30
        while not _catches(agent.pid, signal.SIGTERM):  # its handler is in place: it is importing torch
            assert time.monotonic() < deadline and agent.poll() is None
            time.sleep(0.005)
        agent.send_signal(signal.SIGTERM)
        out, _ = agent.communicate(timeout=30)
    finally:
        agent.kill()
    assert agent.returncode == 128 + signal.SIGTERM, out
    assert local_ranks.rank_failure(out) == ("the launcher (mlbench's local agent) received SIGTERM from another "
                                             "process and stopped the ranks"), out
    assert not (tmp_path / "ranks").exists()
