"""Free TCP ports for a rendezvous (torch's MASTER_PORT) or a test cluster's daemons."""

from __future__ import annotations

import contextlib
import socket


def free_ports(n: int, host: str = "") -> list[int]:
    """`n` distinct ports free on `host` now ("": every interface, for a rendezvous other nodes connect to), held
    open together so they differ. Another process may take one before it is bound again: a launcher that loses
    that race fails at rendezvous, and says so."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in socks]


def free_port(host: str = "") -> int:
    return free_ports(1, host)[0]
