"""Free TCP ports for a rendezvous (torch's MASTER_PORT) or a test cluster's daemons."""

from __future__ import annotations

import contextlib
import random
import socket
from pathlib import Path

LOWEST = 10000  # above the well-known and the common registered services' ports


def _ephemeral_low() -> int:
    """Where the kernel's ephemeral range starts (Linux's ip_local_port_range; 32768 by default elsewhere)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bind(sock: socket.socket, host: str, port: int) -> bool:
    try:
        sock.bind((host, port))
    except OSError:
        return False
    return True


def free_ports(n: int, host: str = "") -> list[int]:
    """`n` distinct ports free on `host` now ("": every interface, for a rendezvous other nodes connect to), held
    open together so they differ. They are taken below the kernel's ephemeral range, which every outgoing
    connection (gloo opens many) and every bind to port 0 draws from: a port found there and released could be
    handed to one of those before the rendezvous binds it (seen: EADDRINUSE in a SLURM job's rendezvous while
    other runs trained). Another process may still take one first: a launcher that loses that race fails at
    rendezvous, and says so."""
    high = _ephemeral_low()
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            tries = [random.randrange(LOWEST, high) for _ in range(50)] if high > LOWEST + n else []
            if not any(_bind(s, host, port) for port in tries):
                s.bind((host, 0))  # no room (or luck) below the ephemeral range: let the kernel choose
        return [s.getsockname()[1] for s in socks]


def free_port(host: str = "") -> int:
    return free_ports(1, host)[0]


# A launcher's listening socket handed to rank 0, whose rendezvous store serves on it (TCPStore's
# master_listen_fd): the port is never free between the launcher's choosing it and the store's binding it, so no
# other process can take it first (a port found free and released was, under a busy test suite: EADDRINUSE).
# Rank 0 gets "serve:<fd>", every other rank "join" (a client of that store); torchrun's ranks get neither.
STORE = "MLBENCH_STORE"


def held_port(host: str = "127.0.0.1") -> socket.socket:
    """A socket listening on a free port of `host`, for rank 0's store (STORE); the caller closes its copy
    once rank 0 has it."""
    sock = socket.socket()
    try:
        sock.bind((host, 0))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock
