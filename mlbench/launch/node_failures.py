"""Which rank of another node failed first, told to node 0, whose supervisor publishes the run (the torchrun
launcher, one invocation per node: the nodes may share no filesystem).

A rank of node 1 that failed (exit 7, the OOM killer) took its peers on node 0 with it: they stopped in consequence
(gloo's "Connection reset by peer", lifeline.consequent), node 0's torchrun named none of its own, and node 0's
record gave rank 0's gloo error as the reason; node 1's own output alone named the rank. The rendezvous store
(node 0's torchrun) goes as node 0's ranks end, often before node 1's torchrun has ended, so node 0's supervisor
listens on a port of its own for the run's length (`Board`, every address of its host). Node 0's ranks post that
port in the store (PORT, `key`); another node's first rank reads it there and leaves it for its supervisor (FILE),
which tells node 0, once its torchrun has ended, which of its ranks failed first of itself, or that none did
(`tell`). Node 0's supervisor, where none of its own ranks failed of itself, waits for the other nodes' word (up to
WAIT_S) and names the earliest failure, as a SLURM job's driver does from every node's torchrun output. The ranks
already meet on ports of any number (gloo's), so a port of the supervisor's asks nothing more of a firewall.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
from pathlib import Path

PORT = "MLBENCH_FAILURES_PORT"  # node 0's ranks: the port their supervisor hears the other nodes on
FILE = "MLBENCH_FAILURES_FILE"  # another node's first rank: where it leaves that port for its supervisor
WAIT_S = 10.0  # for every other node's word, from the time node 0's supervisor asks (its own ranks all ended)
TELL_S = 2.0  # for node 0's supervisor to take the connection (it is listening: at once, unless its host is gone)
MAX_BYTES = 65536  # one report: a line of JSON


def key(run_id: str) -> str:
    """The store key under which node 0's ranks post the port (torchrun's run id: one store per run)."""
    return f"mlbench/{run_id}/failures"


class Board:
    """Node 0's supervisor's ear for the other nodes' word as their runs end: a listening socket, opened before
    its torchrun starts and read once its ranks have all ended. A node that tells before then waits in the
    listening queue (its one short message in the socket's buffer)."""

    def __init__(self, nodes: int):
        self._others = nodes - 1
        if socket.has_dualstack_ipv6():  # every address of this host, IPv4 and IPv6: the endpoint may name either
            self._sock = socket.create_server(("", 0), family=socket.AF_INET6, dualstack_ipv6=True)
        else:
            self._sock = socket.create_server(("", 0))
        self.port: int = self._sock.getsockname()[1]
        self._heard: dict[int, dict] = {}
        self._waited = False

    def heard(self, wait_s: float = WAIT_S) -> list[dict]:
        """Every other node's report (torchrun.node_report), in node order, waiting up to WAIT_S (the first time
        only) for those not yet heard: a node whose host is gone says nothing."""
        deadline = time.monotonic() + (0.0 if self._waited else wait_s)
        self._waited = True
        while len(self._heard) < self._others and self._sock.fileno() != -1:
            self._sock.settimeout(max(0.0, deadline - time.monotonic()))
            try:
                conn, _ = self._sock.accept()
            except OSError:  # the time is up (or, waiting no more, nothing is queued)
                break
            with conn:
                report = _read(conn, deadline)
            if isinstance(report, dict) and type(report.get("node")) is int and 0 < report["node"] <= self._others:
                self._heard[report["node"]] = report
        return [self._heard[n] for n in sorted(self._heard)]

    def close(self) -> None:
        if hasattr(self, "_sock"):  # not where it could not listen
            self._sock.close()

    __del__ = close  # a command described but never run (a dry run's) drops its board unread


def _read(conn: socket.socket, deadline: float) -> object:
    """One report, JSON, read to the end of the connection; None if it is not one (something else connected)."""
    data = b""
    with contextlib.suppress(OSError):
        while len(data) <= MAX_BYTES:
            conn.settimeout(max(0.1, deadline - time.monotonic()))
            if not (chunk := conn.recv(MAX_BYTES)):
                break
            data += chunk
    try:
        return json.loads(data)
    except ValueError:
        return None


def tell(host: str, port_file: Path, report: dict) -> None:
    """Another node's supervisor, once its torchrun has ended: tells node 0's supervisor REPORT, at HOST (the
    endpoint's host) and the port its first rank left in PORT_FILE. Nothing where that rank left none (the ranks
    never started) or node 0 does not answer (it is gone: its record says why)."""
    try:
        port = int(port_file.read_text())
    except (OSError, ValueError):
        return
    with contextlib.suppress(OSError), socket.create_connection((host.strip("[]"), port), timeout=TELL_S) as sock:
        sock.sendall(json.dumps(report).encode())
