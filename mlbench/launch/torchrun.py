"""How one run starts on a node: `torchrun` is one invocation per node meeting at a static rendezvous (and SLURM
runs one per node); `local` starts the rank itself for one process (`direct`: no agent to start and stop) and
mlbench.launch.local_ranks for more. Every rank runs `python -m mlbench.train PLAN` (a rank of a node that meets
others, by way of mlbench.launch.torchrun_rank).

Static, not c10d: node rank R holds global ranks R x nproc to (R + 1) x nproc - 1, so node 0 always hosts rank 0
and its supervisor owns the run's log. It writes the aborted log of a rank 0 that died before logging, or of a
rendezvous that failed (a node that never came). Under c10d any node may get rank 0, and none of them could tell.
Node 0 also hosts the rendezvous store on the endpoint's port: a port already taken there fails at once. torch's
own words for a rendezvous that failed name neither the node nor the option to change; Rendezvous says them plainly.
Where a rank of another node failed first (or its supervisor stopped its run), that node's supervisor tells node
0's, which stops its own run at once and names it (node_failures).

The static rendezvous counts the nodes that connect, not which: a second node started with the same --node-rank
was given the same global ranks, which hung (or joined another node's). So each rank first claims its node rank
for its node (mlbench.launch.torchrun_rank), then trains; a node whose rank is taken stops before its ranks meet.
A second node 0 is one of them: on node 0's host its store cannot listen (EADDRINUSE, said as such); on another
host it serves a store of its own that nobody joins, while its torchrun counts itself in at the first node 0's
store, so its ranks start and could claim node rank 0 first (the first node 0's ranks then stopped, and the run's
store with them). Node 0's ranks therefore first check that the store the endpoint reaches is their own machine's
(a mark written through the endpoint, read through this machine's port), and a second node 0 stops, saying so."""

from __future__ import annotations

import re
import signal
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from mlbench.launch import lifeline, local_ranks, node_failures
from mlbench.launch.ports import free_port
from mlbench.launch.supervise import Command

RANK_MODULE = ["-m", "mlbench.train"]
NODE_RANK_MODULE = ["-m", "mlbench.launch.torchrun_rank"]  # a rank of a node that meets others: claims, then trains
NODE_TOKEN = "MLBENCH_NODE_TOKEN"  # this node's own mark, set by its supervisor: whose claim a node rank is
# Past torch's own timeouts (2 x --rdzv-timeout at most: node 0's wait for the nodes, then theirs for their ranks),
# what a healthy rendezvous may still take before the ranks start: torchrun's own start, a slow disk
FORMED_MARGIN_S = 120.0
MAX_STOPPED = 500  # another node's supervisor's reason, as node 0 names it: its first characters


def argv(
    plan_path: Path,
    ranks_dir: Path,
    *,
    nodes: int,
    nproc_per_node: int,
    node_rank: int = 0,
    rdzv_endpoint: str | None = None,
    rdzv_id: str = "mlbench",
    rdzv_timeout: float = 600.0,
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
        # timeout: how long node 0 waits for every node to join (torch's default is 600 s)
        cmd += [f"--node-rank={node_rank}", "--rdzv-backend=static", f"--rdzv-endpoint={rdzv_endpoint}",
                f"--rdzv-id={rdzv_id}", f"--rdzv-conf=timeout={max(1, round(rdzv_timeout))}",
                *NODE_RANK_MODULE]
    else:
        cmd += ["--standalone", *RANK_MODULE]
    return cmd + [str(plan_path)]


def node_command(argv: list[str], env: dict[str, str], stdout: Path, rendezvous: Rendezvous) -> Command:
    """A node's torchrun under the static rendezvous: its ranks claim the node rank with a mark of their own. Node 0
    hears which rank of another node failed first, or why its supervisor stopped it (node_failures): told while its
    run goes on, it stops it for that (its ranks may be waiting for the lost peer until their process group's
    timeout); told at its end, it names it where none of its own ranks failed of itself. Another node tells it,
    once its torchrun has ended."""
    env = {**env, NODE_TOKEN: uuid.uuid4().hex}

    def own(output: str) -> str:
        return rank_failure(output, rendezvous.ranks_dir, rendezvous.node_rank, rendezvous.nodes)

    if node0 := rendezvous.node0():
        told = stdout.parent / "node0-failures-port"  # where this node's first rank leaves node 0's port

        def tell(output: str, stopped: str, at: float) -> None:
            node_failures.tell(node0[0], told, node_report(output, rendezvous.ranks_dir, rendezvous.node_rank,
                                                           stopped, at), (node0[1], rendezvous.run_id))

        return Command(argv, {**env, node_failures.FILE: str(told)}, stdout=stdout, rendezvous=rendezvous,
                       rank_failure=own, ended=tell)
    if rendezvous.nodes == 1:
        return Command(argv, env, stdout=stdout, rendezvous=rendezvous, rank_failure=own)
    board = node_failures.Board(rendezvous.nodes)
    return Command(argv, {**env, node_failures.PORT: str(board.port)}, stdout=stdout, rendezvous=rendezvous,
                   rank_failure=lambda output: own(output) or elsewhere(board.heard()),
                   told=lambda: elsewhere(board.news()), ended=lambda *_: board.close())


# torchrun's last words when a rank fails (ChildFailedError): each rank that failed, and which it saw first
_FAILURE = re.compile(r"^(Root Cause \(first observed failure\):\n)?\[\d+\]:\n  time\s*: (\S+)\n(?:  .*\n)*?"
                      r"  rank\s*: (\d+) \(local_rank: (\d+)\)\n  exitcode\s*: (-?\d+)", re.M)


@dataclass(frozen=True)
class Failure:
    """A rank that failed, as torchrun's last words list it."""

    rank: int
    local_rank: int
    code: int  # negative: the signal that killed it
    time: str  # to the second
    root: bool  # the one torchrun calls the root cause


def failures(output: str) -> list[Failure]:
    """Every failed rank that torchrun's output lists (each node's torchrun, where several write into it)."""
    return [Failure(int(rank), int(local), int(code), time, bool(root))
            for root, time, rank, local, code in _FAILURE.findall(output)]


def first_failure(output: str) -> Failure | None:
    """The rank whose failure ended the run, from torchrun's output: the first that failed of itself. torch's own
    "first observed failure" is the earliest to the second, the lowest rank on a tie: rank 0, stopped by its peer's
    death in the same second, was named for rank 1, which exited first. Ranks stopped because another failed
    (lifeline.consequent) are passed over; None where none failed of itself."""
    own = [f for f in failures(output) if not lifeline.consequent(f.code)]
    return min(own, key=lambda f: (f.time, not f.root), default=None)


def rank_logs(ranks_dir: Path, local_rank: int) -> list[Path]:
    """torchrun's --log-dir: <run id>_<random>/attempt_<n>/<local rank>/, kept as the run's rank logs."""
    return sorted(ranks_dir.glob(f"*/attempt_*/{local_rank}"))


def rank_failure(output: str, ranks_dir: Path, node_rank: int, nodes: int = 0) -> str:
    """Which rank's failure ended this node's torchrun, how, and where its output is (torch's own words, at the end
    of a long traceback, name the rank and its exit code alone); "" if torchrun's output names none. On a run of
    one node (NODES 1), ranks that all ended stopped, none having failed, were stopped from outside: said as
    mlbench's own agent says it (local_ranks.stopped_from_outside)."""
    failed = first_failure(output)
    if failed is None:
        return _stopped_from_outside(output, ranks_dir) if nodes == 1 else ""
    return failure_reason(failed, node_rank, rank_logs(ranks_dir, failed.local_rank), ranks_dir, nodes)


def _stopped_from_outside(output: str, ranks_dir: Path) -> str:
    """Ranks of a one-node run that all ended as stopped ones do: one was signalled by another process, and torchrun
    stopped the others (or they lost it as a peer). It is the first to end; to the second (torchrun's words) a tie
    is broken by the ranks' own last words (the others' were torchrun's SIGTERM or a lost peer: gloo's 'Connection
    closed by peer'); where they cannot tell it apart, no rank is named."""
    listed = failures(output)
    if not listed:
        return ""
    first = min(f.time for f in listed)
    earliest = [f for f in listed if f.time == first]
    if len(earliest) > 1:
        earliest = [f for f in earliest if _said_stopped(rank_logs(ranks_dir, f.local_rank))] or earliest
    if len(earliest) > 1:
        logs = rank_logs(ranks_dir, earliest[0].local_rank)
        return local_ranks.stopped_from_outside(None, "", str(logs[-1].parent.relative_to(ranks_dir)) if logs else
                                                str(ranks_dir.name))
    [rank] = earliest
    logs = rank_logs(ranks_dir, rank.local_rank)
    return local_ranks.stopped_from_outside(rank.rank, local_ranks.describe(rank.code),
                                            str(logs[-1].relative_to(ranks_dir)) if logs else "")


_STOPPED = re.compile(r"^\[rank \d+\] run aborted: stopped by SIG\w+$", re.M)


def _said_stopped(logs: list[Path]) -> bool:
    """Whether a rank's last words (its stderr.log under the last of LOGS) are a stop signal's with no reason."""
    return bool(logs) and bool(_STOPPED.search(local_ranks.last_words(logs[-1])))


def failure_reason(failed: Failure, node_rank: int, logs: list[Path], ranks_dir: Path, nodes: int = 0) -> str:
    """The reason naming FAILED, a rank of node NODE_RANK, whose rank logs are the last of LOGS (under RANKS_DIR);
    NODES 1: a run of one node, whose ranks need no node named (0: not known)."""
    return _named(failed, node_rank, f"see the rank logs: {logs[-1].relative_to(ranks_dir)}" if logs else
                  "see the rank logs", nodes, local_ranks.said(logs[-1]) if logs else "")


def _named(failed: Failure, node_rank: int, where: str, nodes: int = 0, said: str = "") -> str:
    node = "" if nodes == 1 else f" (node {node_rank}'s local rank {failed.local_rank})"
    return f"rank {failed.rank}{node} {local_ranks.describe(failed.code)}{said} ({where})"


def node_report(output: str, ranks_dir: Path, node_rank: int, stopped: str = "", at: float = 0.0) -> dict:
    """What a node other than node 0 tells node 0 as its torchrun ends (node_failures): why its supervisor stopped
    its run (STOPPED, at AT: a signal, a hang; not node 0's loss) and when; else, where its supervisor did not stop
    it (AT 0), that its torchrun was signalled by another process (from torchrun's OUTPUT); else its rank that
    failed first of itself, how, when, and its logs under this node's RANKS_DIR; its node rank alone where none is
    so. The supervisor's reason comes first, then torchrun's signal, as in this node's own words (supervise._judge,
    Rendezvous.explain)."""
    if stopped:
        return {"node": node_rank, "stopped": stopped, "time": _when(at)}
    if not at and (sig := signalled(output)):  # (its supervisor's SIGTERM, which stops a run for node 0's loss too,
        # is no other process's)
        return {"node": node_rank, "stopped": f"its torchrun received {sig} from another process and stopped its "
                                              f"ranks", "time": _when(0.0)}
    failed = first_failure(output)
    if failed is None:
        return {"node": node_rank}
    logs = rank_logs(ranks_dir, failed.local_rank)
    return {"node": node_rank, "rank": failed.rank, "local_rank": failed.local_rank, "code": failed.code,
            "time": failed.time, "logs": str(logs[-1].relative_to(ranks_dir)) if logs else ""}


def _when(at: float) -> str:
    """AT (time.time()) as torchrun's last words give a rank's failure: local time, to the second."""
    return time.strftime("%Y-%m-%d_%H:%M:%S", time.localtime(at or None))


_RANK_FIELDS = {"rank": int, "local_rank": int, "code": int, "time": str, "logs": str}
_STOP_FIELDS = {"stopped": str, "time": str}


def elsewhere(reports: list[dict]) -> str:
    """The reason naming what failed first of itself on another node, from those nodes' REPORTS (node_report): a rank
    ("rank 5 (node 1's local rank 1) exited with code 7 (see node 1's rank logs: ...)") or that node's supervisor's
    stop ("node 1's mlbench received SIGTERM", "node 1: hang: no progress for 300 s"); the earliest, to the second,
    the lowest node on a tie; "" where none failed of itself."""
    failed = [r for r in reports if any(all(type(r.get(k)) is t for k, t in fields.items())
                                        for fields in (_RANK_FIELDS, _STOP_FIELDS))]
    if not failed:
        return ""
    first = min(failed, key=lambda r: (r["time"], r["node"]))
    node = first["node"]
    if type(first.get("stopped")) is str:
        stopped = " ".join(first["stopped"].split())[:MAX_STOPPED]
        return f"node {node}'s mlbench {stopped}" if stopped.startswith("received ") else f"node {node}: {stopped}"
    logs = first["logs"]
    return _named(Failure(first["rank"], first["local_rank"], first["code"], first["time"], False), node,
                  f"see node {node}'s rank logs: {logs}" if logs else f"see node {node}'s rank logs")


def formed_deadline_s(timeout: float) -> float:
    """From a node's start, how long its static rendezvous may take before its ranks start: torch's own waits (2 x
    TIMEOUT, --rdzv-timeout) and a margin."""
    return 2 * timeout + FORMED_MARGIN_S


def ranks_started(ranks_dir: Path) -> bool:
    """Whether torchrun has started ranks under its --log-dir RANKS_DIR: <run id>_<random>/attempt_0 appears there
    (looked for at any depth: torch's layout may change)."""
    return next(ranks_dir.rglob("attempt_*"), None) is not None


@dataclass(frozen=True)
class Rendezvous:
    """This node's view of the static rendezvous (mlbench.launch.supervise.Rendezvous): whether its ranks have
    started, and plain words for torch's failures at it, which name neither the node nor the option to change."""

    endpoint: str
    nodes: int
    node_rank: int
    timeout: float
    ranks_dir: Path  # torchrun's --log-dir: <run id>_<random>/attempt_0 appears there as the ranks start
    run_id: str = "mlbench"  # torchrun's --rdzv-id (argv's), the same on every node

    @property
    def deadline_s(self) -> float:
        return formed_deadline_s(self.timeout)

    def formed(self) -> bool:
        return ranks_started(self.ranks_dir)

    def _port(self) -> str:
        return self.endpoint.rpartition(":")[2]

    def node0(self) -> tuple[str, int] | None:
        return None if self.node_rank == 0 else (self.endpoint.rpartition(":")[0], int(self._port()))

    def not_formed(self) -> str:
        return (f"the rendezvous at {self.endpoint} did not form within {self.deadline_s:g} s: node "
                f"{self.node_rank}'s torchrun neither joined it nor failed (a program other than node 0's torchrun "
                f"may hold port {self._port()} there, answering nothing); give --rdzv-endpoint node 0's host and a "
                f"free port, the same on every node")

    def explain(self, error: str) -> str:
        t, e = f"{self.timeout:g} s (--rdzv-timeout)", self.endpoint
        if sig := signalled(error):
            # torchrun itself signalled, by another process than its supervisor (which stops the run with its own
            # reason): its ranks, stopped by it, said only 'Aborted: signal SIGTERM', and the run's reason was "a
            # peer on another node was lost, and no node said why", on one node too
            return (f"the launcher (node {self.node_rank}'s torchrun) received {sig} from another process and stopped "
                    f"the ranks")
        if m := re.search(r"waiting for clients\. (\d+)/\d+ clients joined", error):  # node 0: not all came
            joined, n = int(m[1]), self.nodes
            missing = (f"node 1 of {n}" if n == 2 else f"nodes 1 to {n - 1} of {n}") if joined == 1 else \
                f"{n - joined} of the {n} nodes"
            return (f"the rendezvous failed: {missing} did not join within {t}; start every node with "
                    f"--rdzv-endpoint {e} and its own --node-rank (0 to {n - 1}), or give a longer --rdzv-timeout")
        if "EADDRINUSE" in error:  # node 0: the store cannot listen
            return (f"the rendezvous failed: port {self._port()} (--rdzv-endpoint {e}) is already in use on this "
                    f"host, by another program or by another node started with --node-rank 0; give a free port, "
                    f"the same on every node")
        if re.search(r"client socket has timed out .* trying to connect", error) and self.node_rank == 0:
            # node 0 serves the store on its own host, whatever host the endpoint names, and meets it there
            return (f"the rendezvous failed: nothing answered at {e} within {t}, where this node, node 0, serves it "
                    f"on its own host: give --rdzv-endpoint this host's name or address (node 0's) and a free port, "
                    f"the same on every node")
        if re.search(r"client socket has timed out .* trying to connect", error):  # another node: nobody listens
            return (f"the rendezvous failed: node 0 did not answer at {e} within {t}; start node 0 "
                    f"(--node-rank 0) on that host with the same --rdzv-endpoint, or give a longer --rdzv-timeout")
        if re.search(r"Ping failed|Connection reset by peer|Broken pipe", error):  # another node: not a store
            return (f"the rendezvous failed: what answered at {e} is not node 0's torchrun (another program holds "
                    f"port {self._port()} there), or node 0 ended (see its record); give --rdzv-endpoint node 0's "
                    f"host and a free port, the same on every node")
        return ""


_SIGNALLED = re.compile(r"SignalException: Process \d+ got signal: (\d+)")


def signalled(output: str) -> str:
    """The signal torchrun says it received (its last words: SignalException) in OUTPUT, by name; "" if none."""
    found = _SIGNALLED.findall(output)
    return _signal_name(int(found[-1])) if found else ""


def _signal_name(n: int) -> str:
    try:
        return signal.Signals(n).name
    except ValueError:
        return f"signal {n}"


def direct(plan_path: Path, ranks_dir: Path, env: dict[str, str]) -> Command:
    """The one rank of a one-process run, started as torchrun would start it (its environment; its output in
    the files torchrun's --log-dir/--redirects would give it)."""
    logs = ranks_dir / "direct" / "attempt_0" / "0"
    return Command([sys.executable, *RANK_MODULE, str(plan_path)],
                   local_ranks.rank_env(env, 0, 1, free_port("127.0.0.1")), stdout=logs / "stdout.log",
                   stderr=logs / "stderr.log", what="rank 0 (the only rank)", logs=str(logs.relative_to(ranks_dir)))
