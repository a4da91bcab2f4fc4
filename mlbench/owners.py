"""Who made a temporary folder (a run's staging folder, a checkpoint being saved), in its name, so that a later run
can tell a dead owner's leftovers (kill -9, a lost node) from a live one's.

A tag is `<pid>-<start time>-<host>@<pid namespace>`: a pid names one process only with its start time, on one
host and in one PID namespace (a container on the same host, with the same host name, numbers its processes
anew). Only an owner on this host and in this namespace is judged; any other is left alone.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (with the pid, it names one process), or None."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _where() -> str:
    try:
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        namespace = 0
    return f"{socket.gethostname()}@{namespace}"


def tag(pid: int | None = None) -> str:
    """This process's tag (or PID's, a process of this host and namespace)."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}-{_start_time(pid)}-{_where()}"


def gone(tag: str) -> bool:
    """Whether the tag's owner is known to be gone: of this host and namespace, and no process of that pid and start
    time lives. False for a live owner, another host's or namespace's, and a name that is not a tag."""
    try:
        pid, start, where = tag.split("-", 2)
        pid_n = int(pid)
    except ValueError:
        return False
    return where == _where() and _start_time(pid_n) != start


def elsewhere(tag: str) -> bool:
    """Whether the tag's owner is of another host or PID namespace (its pid cannot be checked from here)."""
    try:
        _pid, _start, where = tag.split("-", 2)
    except ValueError:
        return False
    return where != _where()
