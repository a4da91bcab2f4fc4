"""Which rank of another node failed first, told to node 0, whose supervisor publishes the run (the torchrun
launcher, one invocation per node: the nodes may share no filesystem).

A rank of node 1 that failed (exit 7, the OOM killer) took its peers on node 0 with it: they stopped in consequence
(gloo's "Connection reset by peer", lifeline.consequent), node 0's torchrun named none of its own, and node 0's
record gave rank 0's gloo error as the reason; node 1's own output alone named the rank. The rendezvous store
(node 0's torchrun) goes as node 0's ranks end, often before node 1's torchrun has ended, so node 0's supervisor
listens on a port of its own for the run's length (`Board`, every address of its host). Node 0's ranks post that
port in the store (PORT, `key`); another node's first rank reads it there and leaves it for its supervisor (FILE),
which tells node 0, once its torchrun has ended, which of its ranks failed first of itself, or why it stopped the
run itself (a signal, a hang: its ranks then end by its SIGTERM, a failure of none of their own), or that neither
is so (`tell`). Node 0's supervisor looks at what has come on each poll of its run (`Board.news`), and stops its
run as soon as another node tells of a failure of its own: node 0's ranks would otherwise wait for the lost peer,
in init_process_group (a rank of node 1 dead before the process group formed) until its 120 s timeout. Where node
0's ranks ended first and none of them failed of itself, it waits for the other nodes' word (up to WAIT_S,
`Board.heard`). Either way it names the earliest failure, as a SLURM job's driver does from every node's torchrun
output. The ranks already meet on ports of any number (gloo's), so a port of the supervisor's asks nothing more of
a firewall. Where another node's first rank died before it left the port (as its interpreter started), that node's
supervisor reads it from the store itself (`port_from_store`, a helper process: the supervisor imports no torch);
node 0's ranks, waiting for the lost peer, keep the store up.
"""

from __future__ import annotations

import contextlib
import json
import selectors
import socket
import subprocess
import sys
import time
from pathlib import Path

PORT = "MLBENCH_FAILURES_PORT"  # node 0's ranks: the port their supervisor hears the other nodes on
FILE = "MLBENCH_FAILURES_FILE"  # another node's first rank: where it leaves that port for its supervisor
WAIT_S = 10.0  # for every other node's word, from the time node 0's supervisor asks (its own ranks all ended)
TELL_S = 2.0  # for node 0's supervisor to take the connection (it is listening: at once, unless its host is gone)
MAX_BYTES = 65536  # one report: a line of JSON
MAX_OPEN = 64  # connections read at once (each node tells once; anything else connected is not a node)
STORE_S = 5.0  # for the store to answer, and to hold the port (node 0's ranks post it as they start)


def key(run_id: str) -> str:
    """The store key under which node 0's ranks post the port (torchrun's run id: one store per run)."""
    return f"mlbench/{run_id}/failures"


class Board:
    """Node 0's supervisor's ear for the other nodes' word as their runs end: a listening socket, opened before
    its torchrun starts, looked at without waiting on each of the supervisor's polls while the run goes on (`news`:
    a failure another node reports stops node 0's run at once), and waited on once its ranks have all ended
    (`heard`). A node that tells in between waits in the listening queue (its one short message in the socket's
    buffer)."""

    def __init__(self, nodes: int):
        self._others = nodes - 1
        if socket.has_dualstack_ipv6():  # every address of this host, IPv4 and IPv6: the endpoint may name either
            self._sock = socket.create_server(("", 0), family=socket.AF_INET6, dualstack_ipv6=True)
        else:
            self._sock = socket.create_server(("", 0))
        self._sock.setblocking(False)
        self.port: int = self._sock.getsockname()[1]
        self._ear = selectors.DefaultSelector()
        self._ear.register(self._sock, selectors.EVENT_READ)
        self._reading: dict[socket.socket, bytes] = {}  # connections accepted, what each has sent so far
        self._heard: dict[int, dict] = {}
        self._waited = False

    def news(self) -> list[dict]:
        """Every other node's report heard so far, without waiting (what has come is taken in)."""
        self._take(0.0)
        return self._reports()

    def heard(self, wait_s: float = WAIT_S) -> list[dict]:
        """Every other node's report (torchrun.node_report), in node order, waiting up to WAIT_S (the first time
        only) for those not yet heard: a node whose host is gone says nothing."""
        deadline = time.monotonic() + (0.0 if self._waited else wait_s)
        self._waited = True
        self._take(0.0)
        while len(self._heard) < self._others and self._sock.fileno() != -1 and time.monotonic() < deadline:
            self._take(deadline - time.monotonic())
        return self._reports()

    def _reports(self) -> list[dict]:
        return [self._heard[n] for n in sorted(self._heard)]

    def _take(self, timeout: float) -> None:
        """Accepts the nodes' connections and reads what has come on them, waiting up to TIMEOUT for something to
        come; a connection ended is one report, JSON (not one: something else connected, ignored)."""
        if self._sock.fileno() == -1:
            return
        for key, _ in self._ear.select(max(0.0, timeout)):
            if key.fileobj is self._sock:
                self._accept()
            else:
                self._read(key.fileobj)

    def _accept(self) -> None:
        with contextlib.suppress(OSError):  # nothing queued after all, or a connection already reset
            while True:
                conn, _ = self._sock.accept()
                conn.setblocking(False)
                if len(self._reading) >= MAX_OPEN:  # connected and silent (not a node): the oldest goes
                    self._drop(next(iter(self._reading)))
                self._reading[conn] = b""
                self._ear.register(conn, selectors.EVENT_READ)

    def _read(self, conn: socket.socket) -> None:
        try:
            chunk = conn.recv(MAX_BYTES)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        data = self._reading[conn] = self._reading[conn] + chunk
        if chunk and len(data) <= MAX_BYTES:
            return
        self._drop(conn)
        try:
            report = json.loads(data) if chunk == b"" else None
        except ValueError:
            return
        if isinstance(report, dict) and type(report.get("node")) is int and 0 < report["node"] <= self._others:
            self._heard[report["node"]] = report

    def _drop(self, conn: socket.socket) -> None:
        self._ear.unregister(conn)
        del self._reading[conn]
        conn.close()

    def close(self) -> None:
        if hasattr(self, "_reading"):  # not where it could not listen
            for conn in list(self._reading):
                self._drop(conn)
            self._ear.close()
        if hasattr(self, "_sock"):
            self._sock.close()

    __del__ = close  # a command described but never run (a dry run's) drops its board unread


def tell(host: str, port_file: Path, report: dict, store: tuple[int, str] | None = None) -> None:
    """Another node's supervisor, once its torchrun has ended: tells node 0's supervisor REPORT, at HOST (the
    endpoint's host) and the port its first rank left in PORT_FILE, or, where that rank left none and REPORT has
    news (a failure, a stop), that the rendezvous store holds (STORE: its port and the run id). Nothing where neither
    has it (node 0's ranks never started) or node 0 does not answer (it is gone: its record says why)."""
    try:
        port = int(port_file.read_text())
    except (OSError, ValueError):
        port = port_from_store(host, *store) if store and set(report) - {"node"} else None
    if port is None:
        return
    with contextlib.suppress(OSError), _connect(host, port) as sock:
        sock.sendall(json.dumps(report).encode())


def _connect(host: str, port: int) -> socket.socket:
    """A connection to node 0's HOST (the endpoint's: an IPv6 address in brackets) at PORT, within TELL_S."""
    return socket.create_connection((host.strip("[]"), port), timeout=TELL_S)


def port_from_store(host: str, store_port: int, run_id: str) -> int | None:
    """Node 0's failures port as its ranks posted it in the rendezvous store at HOST:STORE_PORT, read by a helper
    process (torch's store client); None where the store does not answer or holds none. Nothing is started where
    the store's port refuses a connection (node 0 is gone: torch's client would retry it for STORE_S)."""
    try:
        _connect(host, store_port).close()
        from mlbench.launch import lifeline

        out = subprocess.run([sys.executable, "-m", __name__, host, str(store_port), run_id], capture_output=True,
                             text=True, timeout=STORE_S + 30,  # its own time: torch's import
                             preexec_fn=lifeline.die_with_parent)
        return int(out.stdout.strip())
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None


def _print_port(host: str, store_port: str, run_id: str) -> None:
    from datetime import timedelta

    from torch.distributed import DistError, TCPStore

    with contextlib.suppress(DistError, OSError, ValueError):
        store = TCPStore(host.strip("[]"), int(store_port), is_master=False, timeout=timedelta(seconds=STORE_S),
                         wait_for_workers=False)
        print(store.get(key(run_id)).decode())


if __name__ == "__main__":  # HOST STORE_PORT RUN_ID: port_from_store's helper
    _print_port(*sys.argv[1:4])
