"""`--launcher torchrun`: one invocation per node meeting at a static rendezvous (here "nodes" on this host): node 0
hosts global rank 0 and publishes the run, and a rendezvous that fails ends with the reason in plain words."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import MLBENCH, assert_cpu_rank_bytes, mllog, result_dir, sample_private_memory
from test_rank_failures import fail_at_step_3

from mlbench.launch.ports import free_port, free_ports
from mlbench.preflight import CPU_OWN_RANK_BYTES

pytestmark = pytest.mark.slow


def _node(tmp_path: Path, name: str, endpoint: str, rank: int, *flags: str,
          env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([*MLBENCH, "run", "gpt3", "--tiny", "--nodes", "2", "--nproc-per-node", "1",
                             "--launcher", "torchrun", "--rdzv-endpoint", endpoint, "--node-rank", str(rank),
                             "--results", str(tmp_path / name), "--system", "ci", *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, COLUMNS="200", **(env or {})))


def _ends(procs: dict[str, subprocess.Popen], timeout: float = 300) -> dict[str, str]:
    try:
        return {name: p.communicate(timeout=timeout)[0] for name, p in procs.items()}
    finally:
        for p in procs.values():
            p.kill()


def test_two_nodes_meet_at_a_static_rendezvous_and_node_0_publishes(tmp_path: Path, quick_benchmarks: Path) -> None:
    """20 steps (quick_benchmarks' target): the rendezvous is the point, convergence is test_tiny_gpt3's. Under c10d
    either node could get global rank 0 and publish; now node 0 always does. A third node started with --node-rank 1
    as well was given rank 1 too and hung (or joined the others' process group); now it stops at once, saying why,
    and the run goes on without it. Each rank, one that torchrun started, imports torch itself: it samples its
    private memory (conftest.sample_private_memory), and what it holds beyond its plan is what preflight charges
    such a rank, CPU_OWN_RANK_BYTES (measured on x86_64: 225 MiB)."""
    endpoint = f"127.0.0.1:{free_port('127.0.0.1')}"
    env = {"MLBENCH_BENCHMARKS": str(quick_benchmarks), **sample_private_memory(tmp_path / "memory")}
    procs = {name: _node(tmp_path, name, endpoint, rank, "--seed", str(seed), "--rdzv-timeout", "120", env=env)
             for name, rank, seed in (("node0", 0, 30), ("node1", 1, 31), ("again1", 1, 32))}
    outs = _ends(procs)
    codes = {name: p.returncode for name, p in procs.items()}
    assert codes["node0"] == 0 and sorted([codes["node1"], codes["again1"]]) == [0, 1], outs
    folder = result_dir(tmp_path / "node0", "gpt3")
    log = mllog(folder / "result_0.txt")
    assert [e["metadata"]["status"] for e in log if e["key"] == "run_stop"] == ["success"]
    assert [e["value"] for e in log if e["key"] == "seed"] == [30]  # node 0's seed, broadcast to the other node
    record = json.loads((folder / "result_0.json").read_text())
    assert record["layout"]["world_size"] == 2
    assert sorted(assert_cpu_rank_bytes(tmp_path / "memory", record, CPU_OWN_RANK_BYTES)) == [0, 1]
    for name in ("node1", "again1"):  # the other nodes keep their rank logs and their launcher's output
        other = result_dir(tmp_path / name, "gpt3")
        assert not list(other.glob("result_*")) and [p.name for p in other.glob("logs/node1-*/launcher.log")], outs
    stopped = "again1" if codes["again1"] else "node1"
    trained = "node1" if stopped == "again1" else "again1"
    # node 1's first rank tells its own supervisor its steps: its progress shows there, and its hang watch sees
    # steps (with none it stopped a healthy run after 30 minutes as one that never stepped)
    assert "step 20/" in outs[trained] and "step 20/" in outs["node0"], outs
    assert ("node 1: two nodes were started with --node-rank 1: the other joined the rendezvous first and trains; "
            "this one stops. Give every node its own --node-rank, 0 to 1; rank logs in") in outs[stopped], outs


def test_a_rendezvous_that_fails_ends_at_once_with_the_reason(tmp_path: Path) -> None:
    """Without training. Node 0 alone (a node that never comes): torch's default 600 s join timeout, then "exited
    with code 1" and, under c10d, no record on any node; now the aborted run is published after --rdzv-timeout, its
    log begun by node 0's supervisor (rank 0 never ran) and the reason in plain words. Node 1 whose node 0 never
    came ends the same way, within seconds. (Node 0 on a port another program listens on is refused before it starts:
    test_preflight; torchrun's own report of it, should the port be taken after that check: test_launch.)"""
    alone, absent = free_ports(2, "127.0.0.1")
    start = time.monotonic()
    procs = {"alone": _node(tmp_path, "alone", f"127.0.0.1:{alone}", 0, "--rdzv-timeout", "1"),
             "node1": _node(tmp_path, "node1", f"127.0.0.1:{absent}", 1, "--rdzv-timeout", "1")}
    outs = _ends(procs, timeout=120)
    assert time.monotonic() - start < 60 and all(p.returncode == 1 for p in procs.values()), outs
    reason = (f"the rendezvous failed: node 1 of 2 did not join within 1 s (--rdzv-timeout); start every node with "
              f"--rdzv-endpoint 127.0.0.1:{alone} and its own --node-rank (0 to 1), or give a longer --rdzv-timeout")
    folder = result_dir(tmp_path / "alone", "gpt3")
    log = mllog(folder / "result_0.txt")
    keys = [e["key"] for e in log]
    assert keys[:3] == ["cache_clear", "init_start", "submission_org"] and "seed" in keys, keys
    assert keys[-1] == "run_stop" and log[-1]["metadata"] == {**log[-1]["metadata"], "status": "aborted",
                                                             "reason": reason}, outs["alone"]
    assert json.loads((folder / "result_0.json").read_text())["reason"] == reason
    assert f"reason: {reason}" in outs["alone"] and (folder / "logs" / "result_0" / "launcher.log").is_file()
    assert (f"node 1: the rendezvous failed: node 0 did not answer at 127.0.0.1:{absent} within 1 s "
            f"(--rdzv-timeout); start node 0 (--node-rank 0) on that host with the same --rdzv-endpoint, or give a "
            f"longer --rdzv-timeout; rank logs in") in outs["node1"], outs["node1"]
    assert not list(result_dir(tmp_path / "node1", "gpt3").glob("result_*"))


# Node 1's first rank exits 7 as soon as it has left node 0's failures port for its supervisor (node_failures): past
# its node rank's claim, before its process group forms (mlbench.train still importing)
_NODE_1_AT_START = """import os, sys
if "mlbench.launch.torchrun_rank" in sys.orig_argv and os.environ.get("RANK") == "1":
    os._exit(7)  # as its interpreter starts: before it could leave node 0's port for its supervisor
"""


@pytest.mark.parametrize("failing", ["node 0 at start", "node 1 mid-run", "node 1 at start"],
                         ids=["node-0-at-start", "node-1-mid-run", "node-1-at-start"])
def test_a_rank_that_fails_is_named_in_node_0s_published_record(tmp_path: Path, failing: str) -> None:
    """Node 0's rank 0 exits 7 as its interpreter starts (a sitecustomize on node 0's path), before it logs anything:
    node 0's record and log said only "launcher exited with code 1 (a rank failed; see the rank logs)" (torchrun's
    own words name the rank at the end of a long traceback). Node 1's rank 1 exits 7 at step 3: its peer on node 0
    stopped in consequence, and node 0's record said rank 0's gloo error ("RuntimeError: [...] Read error
    [127.0.0.1]:<port>: Connection reset by peer. ..."); node 1's own output alone named the rank. Node 1's rank 1
    exits 7 as its interpreter starts, before the process group forms: node 1 ended within seconds, but node 0's
    rank 0 waited in init_process_group for its 120 s timeout and node 0 named that timeout; now node 0's supervisor
    stops its run as node 1 tells it, within seconds (node 1's supervisor reads node 0's port from the rendezvous
    store: its rank died before it could leave it). Every record now names the rank, how it ended and its logs
    (node 1's, on node 1: node 1 tells node 0, node_failures)."""
    site = tmp_path / "site"
    if failing == "node 0 at start":
        site.mkdir()
        (site / "sitecustomize.py").write_text(
            "import os, sys\nif 'mlbench.launch.torchrun_rank' in sys.orig_argv and os.environ.get('RANK') == '0':\n"
            "    os._exit(7)\n")
        envs = {"PYTHONPATH": str(site)}, {}
    elif failing == "node 1 mid-run":
        envs = {}, fail_at_step_3(tmp_path, kill=False)
    else:
        site.mkdir()
        (site / "sitecustomize.py").write_text(_NODE_1_AT_START)
        envs = {}, {"PYTHONPATH": str(site)}
    endpoint = f"127.0.0.1:{free_port('127.0.0.1')}"
    node0 = _node(tmp_path, "node0", endpoint, 0, "--rdzv-timeout", "60", env=envs[0])
    node1 = _node(tmp_path, "node1", endpoint, 1, "--rdzv-timeout", "60", env=envs[1])
    try:
        if failing == "node 1 at start":  # node 0 ends within seconds of node 1 (it waited 120 s for rank 1)
            node1.wait(timeout=120)
            ended = time.monotonic()
        out = node0.communicate(timeout=180)[0]
        if failing == "node 1 at start":
            took = time.monotonic() - ended
            assert took < 15, (took, out)
    finally:  # node 0's rank dead at start: node 1's ranks would wait for node 0's store to answer (about a minute)
        if failing == "node 0 at start":
            node1.terminate()
        outs = _ends({"node0": node0, "node1": node1}, timeout=60)
    assert node0.returncode == 1, out
    folder = result_dir(tmp_path / "node0", "gpt3")
    if failing == "node 0 at start":
        [logs] = [p.relative_to(folder / "logs" / "result_0") for p in folder.glob("logs/result_0/*/attempt_0/0")]
        reason = f"rank 0 (node 0's local rank 0) exited with code 7 (see the rank logs: {logs})"
    else:
        kept = result_dir(tmp_path / "node1", "gpt3") / "logs"
        [logs] = [p.relative_to(p.parents[2]) for p in kept.glob("node1-*/*/attempt_0/0")]
        reason = f"rank 1 (node 1's local rank 0) exited with code 7 (see node 1's rank logs: {logs})"
        assert node1.returncode == 1 and (f"node 1: rank 1 (node 1's local rank 0) exited with code 7 (see the rank "
                                          f"logs: {logs}); rank logs in {kept}") in outs["node1"], outs["node1"]
    log = mllog(folder / "result_0.txt")
    assert log[-1]["key"] == "run_stop" and log[-1]["metadata"]["status"] == "aborted", out
    assert log[-1]["metadata"]["reason"] == reason, out
    assert json.loads((folder / "result_0.json").read_text())["reason"] == reason
    assert f"reason: {reason}\n  rank logs in {folder / 'logs' / 'result_0'}\n" in out, out


def _staged(root: Path, what: str) -> bool:
    """Whether the run in progress under ROOT has started its ranks (`ranks`) or logged a step (`step`)."""
    if what == "ranks":
        return any(root.glob("ci/gpt3/.staging-*/ranks/*/attempt_0"))
    return any('"event": "step"' in f.read_text() for f in root.glob("ci/gpt3/.staging-*/events.jsonl"))


@pytest.mark.parametrize("when", ["ranks", "step"], ids=["as-node-1s-ranks-start", "mid-run"])
def test_node_1_ends_within_seconds_of_node_0s_death_saying_so(tmp_path: Path, when: str) -> None:
    """kill -9 of node 0's `mlbench run` (its torchrun and ranks die with it). As node 1's ranks started, node 1
    learned it from a store client's connection retries: 40 to 77 s, then "node 0 ended before node 1's ranks
    started"; mid-run from gloo within a second, saying "Connection closed by peer [127.0.0.1]:<port>". Node 1 now
    watches node 0's rendezvous store (lifeline.NodeWatch), and ends within seconds saying node 0 died."""
    endpoint = f"127.0.0.1:{free_port('127.0.0.1')}"
    node0 = _node(tmp_path, "node0", endpoint, 0, "--rdzv-timeout", "60")
    node1 = _node(tmp_path, "node1", endpoint, 1, "--rdzv-timeout", "60")
    try:
        deadline = time.monotonic() + 120
        while not _staged(tmp_path / ("node1" if when == "ranks" else "node0"), when):
            assert time.monotonic() < deadline and node0.poll() is None and node1.poll() is None, f"no {when} yet"
            time.sleep(0.05)
        node0.kill()
        killed = time.monotonic()
        out = node1.communicate(timeout=120)[0]
        took = time.monotonic() - killed
    finally:
        _ends({"node0": node0, "node1": node1}, timeout=30)
    assert node1.returncode == 1 and took < 15, (took, out)
    assert (f"node 1: node 0 died or ended its run: its rendezvous at {endpoint} closed, and refuses connections; "
            f"see node 0's record; rank logs in") in out, out


@contextlib.contextmanager
def _other_host() -> Iterator[tuple[list[str], str]]:
    """Another host for one node: a network namespace of its own (held by a process in `unshare --net`), joined to
    this one by a veth pair; both go when it ends. Yields (the prefix that runs a command there, this host's
    address as the other sees it)."""
    import secrets
    import shutil

    if os.geteuid() != 0 or not all(shutil.which(t) for t in ("ip", "unshare", "nsenter")):
        pytest.skip("another network namespace needs root, ip, unshare and nsenter")
    holder = subprocess.Popen(["unshare", "--net", "sleep", "300"])
    here, there = f"mlb{secrets.token_hex(3)}", f"mlb{secrets.token_hex(3)}"
    try:
        deadline = time.monotonic() + 20
        while True:
            if holder.poll() is not None:  # a container without CAP_SYS_ADMIN
                pytest.skip(f"unshare --net failed here (exit {holder.returncode}): no network namespace to use")
            with contextlib.suppress(OSError):  # it may end meanwhile: then polled again
                if os.readlink(f"/proc/{holder.pid}/ns/net") != os.readlink("/proc/self/ns/net"):
                    break  # unshared
            assert time.monotonic() < deadline, "unshare --net did not start"
            time.sleep(0.02)
        ns = ["nsenter", "-t", str(holder.pid), "-n"]
        net = 4 * secrets.randbelow(64)  # a /30 of TEST-NET-1 (192.0.2.0/24: documentation, never routed)
        a, b = f"192.0.2.{net + 1}", f"192.0.2.{net + 2}"
        for argv in (["ip", "link", "add", here, "type", "veth", "peer", "name", there, "netns", str(holder.pid)],
                     ["ip", "addr", "add", f"{a}/30", "dev", here], ["ip", "link", "set", here, "up"],
                     [*ns, "ip", "addr", "add", f"{b}/30", "dev", there], [*ns, "ip", "link", "set", there, "up"],
                     [*ns, "ip", "link", "set", "lo", "up"]):
            done = subprocess.run(argv, capture_output=True, text=True)
            if done.returncode != 0:  # e.g. no CAP_NET_ADMIN, or no veth driver, in a container
                pytest.skip(f"cannot join another network namespace here: {' '.join(argv[:4])}: "
                            f"{done.stderr.strip()[:160]}")
        # a link set up is not yet carrying: a connection made then fails at once (no route to host), not retried
        with socket.create_server((a, 0)) as probe:
            reach = [*ns, "bash", "-c", f"exec 3<>/dev/tcp/{a}/{probe.getsockname()[1]}"]
            reach_by = time.monotonic() + 30
            while subprocess.run(reach, capture_output=True).returncode != 0:
                if time.monotonic() > reach_by:  # the machine's networking, not mlbench: seen once under load
                    pytest.skip(f"the other network namespace did not reach {a} over its veth within 30 s")
                time.sleep(0.1)
        yield ns, a
    finally:
        holder.kill()
        holder.wait()
        subprocess.run(["ip", "link", "del", here], capture_output=True)  # gone with the namespace, unless it failed


_WAIT_BEFORE_TRAINING = """import os, sys, time
class _Gate:
    def find_spec(self, name, path=None, target=None):
        if name == "mlbench.train.loop":  # imported as the rank starts training, after its claim
            while not os.path.exists({go!r}):
                time.sleep(0.05)
        return None
if "mlbench.launch.torchrun_rank" in sys.orig_argv:
    sys.meta_path.insert(0, _Gate())
"""


def test_a_second_node_0_on_another_host_stops_and_the_run_goes_on(tmp_path: Path, quick_benchmarks: Path) -> None:
    """A second invocation with --node-rank 0 on another host (a network namespace here) serves a rendezvous store
    of its own there, which nobody joins, and its torchrun meets the first node 0's at the endpoint: it counted as
    a node, took global rank 0 too, and its ranks could claim node rank 0 first; the first node 0's ranks stopped
    and its store went with them, so node 1 and the second node 0 failed after 2 minutes. The second node 0 now
    stops at once, saying why, and the run goes on."""
    # Node 0's rank, once it has claimed its node rank, waits for the second node 0 to have stopped: on a loaded
    # machine the run (20 steps) could end, and its store with it, before the second one's rank asked (which then
    # said that node 0 had ended, also true).
    go = tmp_path / "go"
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_WAIT_BEFORE_TRAINING.format(go=str(go)))
    with _other_host() as (ns, host):
        endpoint = f"{host}:{free_port(host)}"
        env = {"MLBENCH_BENCHMARKS": str(quick_benchmarks)}
        procs = {"node0": _node(tmp_path, "node0", endpoint, 0, "--rdzv-timeout", "60",
                                env={**env, "PYTHONPATH": str(site)})}
        dup = subprocess.Popen([*ns, *MLBENCH, "run", "gpt3", "--tiny", "--nodes", "2", "--nproc-per-node", "1",
                                "--launcher", "torchrun", "--rdzv-endpoint", endpoint, "--node-rank", "0",
                                "--results", str(tmp_path / "again0"), "--system", "ci", "--rdzv-timeout", "60"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=dict(os.environ, COLUMNS="200", **env))
        procs |= {"again0": dup, "node1": _node(tmp_path, "node1", endpoint, 1, "--rdzv-timeout", "60", env=env)}
        with contextlib.suppress(subprocess.TimeoutExpired):
            dup.wait(timeout=120)
        go.touch()
        outs = _ends(procs, timeout=120)
    # The second node 0 is refused before it launches anything (exit 2): the endpoint is no address of its host, and
    # node 0 serves the rendezvous. (Past that check, its rank says "two nodes were started with --node-rank 0".)
    assert {name: p.returncode for name, p in procs.items()} == {"node0": 0, "again0": 2, "node1": 0}, outs
    assert "target reached" in outs["node0"], outs
    assert (f"--rdzv-endpoint '{endpoint}': node 0 (--node-rank 0) serves the rendezvous there, and {host} is no "
            f"address of this host") in " ".join(outs["again0"].split()), outs["again0"]
    assert not (tmp_path / "again0").exists(), list((tmp_path / "again0").rglob("*"))


# Ranks of several worlds forked from one interpreter that imported torch first (as mlbench's agent forks its
# ranks: local_ranks.preload, _fork_rank), each with its own environment and output files: one torch import for
# them all, not one a rank (about 2.5 s of CPU each). argv: a JSON list of [name, environment, folder] per rank;
# prints {name: exit code}.
_FORKED_RANKS = """
import json, sys
from pathlib import Path
from mlbench.launch import local_ranks
local_ranks.preload()
ranks = {}
for name, env, folder in json.loads(sys.argv[1]):
    pid = local_ranks._fork_rank(0, ["-m", "mlbench.train", str(Path(folder) / "plan.json")], env, Path(folder), None)
    ranks[pid] = name
codes = {}
while len(codes) < len(ranks):
    pid, status = local_ranks.os.wait()
    codes[ranks[pid]] = local_ranks.os.waitstatus_to_exitcode(status)
print(json.dumps(codes))
"""


def test_nodes_started_with_other_layouts_are_refused_by_every_rank(tmp_path: Path) -> None:
    """Two node invocations that disagree (--nproc-per-node 1 and 2 with --gbs 32) trained a world of 3 ranks
    published as the layout of 2, compliant; the same world size with another --gbs hung or trained on. The ranks
    are started here with torchrun's environment and a plan each, without it (forked, _FORKED_RANKS)."""
    import sys

    from mlbench import layout, registry
    from mlbench.run_plan import RunPlan

    bench = registry.load("gpt3", tiny=True)
    port = str(free_port("127.0.0.1"))

    def rank(name: str, ly, rank: int, world: int, port: str, bench=bench) -> list:
        folder = tmp_path / name
        folder.mkdir()
        RunPlan(benchmark=bench, layout=ly.as_dict(), seed=1, run_dir=str(folder), system="ci").save(
            folder / "plan.json")
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK="0", WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=port)
        return [name, env, str(folder)]

    two = [layout.resolve(bench, 2, 1, global_batch_size=g) for g in (16, 32)]
    # The same layout, another learning rate on node 1 (--lr, or its own benchmark file): node 0 published a
    # success that logged its own lr.
    other_lr = dataclasses.replace(bench, optimizer=dataclasses.replace(bench.optimizer, lr=0.02))
    port_lr = str(free_port("127.0.0.1"))
    ranks = [rank("world", layout.resolve(bench, 1, 1), 0, 3, port),
             rank("rank0", two[0], 0, 2, port), rank("rank1", two[1], 1, 2, port),
             rank("lr0", two[0], 0, 2, port_lr), rank("lr1", two[0], 1, 2, port_lr, other_lr)]
    proc = subprocess.run([sys.executable, "-c", _FORKED_RANKS, json.dumps(ranks)], capture_output=True, text=True,
                          timeout=120)
    outs = {name: (tmp_path / name / "stdout.log").read_text() + (tmp_path / name / "stderr.log").read_text()
            for name, _, _ in ranks}
    assert proc.returncode == 0, proc.stdout + proc.stderr
    codes = json.loads(proc.stdout.splitlines()[-1])
    assert codes == dict.fromkeys(outs, 3), (codes, outs)  # each aborted, none trained
    said = {name: json.loads((tmp_path / name / "mlperf.log").read_text().splitlines()[-1].split(" ", 1)[1])
            for name in ("world", "rank0", "lr0")}  # rank 0's logs
    assert said["lr0"]["metadata"]["reason"] == (
        "RuntimeError: 1 rank(s) were started with another benchmark definition (hyperparameters) than rank 0's: "
        "give every node the same hyperparameter flags (--lr, --warmup-steps) and benchmark file")
    assert said["world"]["metadata"]["reason"] == ("RuntimeError: torchrun formed 3 ranks, and this node's layout is "
                                                   "1 (1 nodes x 1): give every node the same layout flags")
    assert said["rank0"]["metadata"]["reason"].startswith("RuntimeError: 1 rank(s) were started with another layout")
    assert "run aborted: RuntimeError: 1 rank(s) were started with another layout" in outs["rank1"]


def test_nodes_compare_the_definition_they_train_not_how_its_file_writes_it() -> None:
    """A node whose benchmark file writes max_steps as '150 * 2' (or lr 0.003 as 3.0e-3) trains what node 0 does:
    it was refused as 'another benchmark definition'. Another value is not."""
    import dataclasses

    from mlbench import layout, registry
    from mlbench.run_plan import RunPlan
    from mlbench.train.build import trained_definition

    bench = registry.load("gpt3", tiny=True)
    ly = layout.resolve(bench, 2, 1).as_dict()

    def plan(**train) -> RunPlan:
        b = dataclasses.replace(bench, train=dataclasses.replace(bench.train, **train), path="/elsewhere/gpt3.yaml")
        return RunPlan(benchmark=b, layout=ly, seed=1, run_dir="", system="ci")

    assert trained_definition(plan(max_steps="150 * 2")) == trained_definition(plan(max_steps=300))
    assert trained_definition(plan(max_steps=301)) != trained_definition(plan(max_steps=300))


def test_node_0s_host_that_stops_answering_is_noticed_within_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Node 0's host cut off (its link down, in a network namespace): no connection closes, and another node's
    ranks waited out gloo's 120 s timeout. The watch another node's supervisor holds on node 0's rendezvous
    (lifeline.NodeWatch) says so once TCP's keepalive fails: 8 s as run, 3 s as set here."""
    import re
    import sys

    from mlbench.launch import lifeline

    monkeypatch.setattr(lifeline.NodeWatch, "keepalive", (1, 1, 2))
    with _other_host() as (ns, _):
        links = subprocess.run([*ns, "ip", "-o", "-4", "addr", "show", "scope", "global"], capture_output=True,
                               text=True).stdout
        dev, there = re.search(r"^\d+: (\S+)\s+inet ([\d.]+)/", links, re.M).groups()
        store = subprocess.Popen([*ns, sys.executable, "-c", "import socket, time; s = socket.create_server(("
                                  "'0.0.0.0', 0)); print(s.getsockname()[1], flush=True); s.accept(); time.sleep(60)"],
                                 stdout=subprocess.PIPE, text=True)
        try:
            port = int(store.stdout.readline())
            watch = lifeline.NodeWatch(there, port)
            time.sleep(0.5)
            assert watch.lost() == ""
            subprocess.run([*ns, "ip", "link", "set", dev, "down"], check=True)
            cut = time.monotonic()
            while not watch.lost():
                assert time.monotonic() - cut < 20, "not noticed"
                time.sleep(0.05)
            assert time.monotonic() - cut < 6
            # keepalive's ETIMEDOUT, or no route to the host as the connection is tried again
            assert re.fullmatch(rf"node 0 stopped answering: its rendezvous at {there}:{port} (has not answered for 3 "
                                rf"s \(its host down or cut off\)|did not answer \(No route to host\)); see node 0's "
                                rf"record", watch.lost()), watch.lost()
        finally:
            store.kill()
            store.wait()
