"""A run's processes die with their supervisor, so none trains (or writes into a result) unsupervised.

- The supervisor (`mlbench run`) starts the launcher with a parent-death signal (`die_with_parent`, as
  `preexec_fn`) and becomes a child subreaper (`become_subreaper`): ranks orphaned by a dead launcher are
  re-parented to it, so it can still find, stop and reap them.
- Every rank arms its own parent-death signal first thing (`install_pdeathsig`), and the training loop
  checks `parent_alive()` each step: a rank whose launcher is gone stops without writing anything more. A process
  a rank forks (a checkpoint writer) dies with it too.
- A node other than node 0 (the torchrun launcher) watches node 0 (`NodeWatch`), whose supervisor publishes the
  run: its run ends within seconds of node 0's, saying so.
The signals are Linux's (prctl); elsewhere only the check in the loop applies.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import signal
import socket
import sys
import threading
import time

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
PR_SET_CHILD_SUBREAPER = 36
ORPHANED_EXIT = 5  # a rank's exit code when it stops because its launcher died
# A rank's exit code when it stops because another process of the run failed first: its launcher stopped it (SIGTERM,
# no reason given: torchrun's agent and mlbench's stop every rank when one fails) or a peer's connection dropped
STOPPED_EXIT = 6

_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
_parent: int | None = None  # the parent a rank started under (install_pdeathsig)


def _prctl(option: int, arg: int) -> bool:
    return _libc is not None and _libc.prctl(option, arg, 0, 0, 0) == 0


def name_process(name: str) -> None:
    """This process's name in `ps -o comm` and top (PR_SET_NAME: at most 15 bytes are kept)."""
    if _libc is not None:
        _libc.prctl(PR_SET_NAME, ctypes.c_char_p(name.encode()), 0, 0, 0)


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """This process gets `sig` when the thread that started it exits (for `preexec_fn`: async-signal-safe)."""
    _prctl(PR_SET_PDEATHSIG, sig)


# Armed in the child itself, then the command exec'd (the signal survives exec): PR_SET_PDEATHSIG = 1, SIGKILL = 9,
# and ORPHANED_EXIT where the parent died before it was armed
_ARM_THEN_EXEC = ("import ctypes, os, sys; ctypes.CDLL(None).prctl(1, 9, 0, 0, 0); "
                  "os.getppid() == int(sys.argv[1]) or os._exit(5); os.execvp(sys.argv[2], sys.argv[2:])")


def dying_with_parent(argv: list[str]) -> list[str]:
    """ARGV run so that it gets SIGKILL when the thread that started it exits, for a child started from a thread of
    a process that has several: there `preexec_fn` may deadlock the child before it execs (subprocess's own
    warning). A shim without site-packages (about 10 ms) arms the signal and execs ARGV."""
    if _libc is None:
        return argv
    return [sys.executable, "-S", "-c", _ARM_THEN_EXEC, str(os.getpid()), *argv]


def install_pdeathsig(sig: int = signal.SIGKILL) -> None:
    """For a rank, before anything else: killed with `sig` when its launcher dies; `parent_alive()` from now
    on says whether that launcher is still its parent."""
    global _parent
    _parent = os.getppid()
    die_with_parent(sig)
    if os.getppid() != _parent:  # it died before the signal was armed
        os._exit(ORPHANED_EXIT)
    os.register_at_fork(before=_note_forking, after_in_child=_forked_dies_with_parent)


_forking = [0]  # the pid of the process about to fork (the forked child reads its copy)


def _note_forking() -> None:
    _forking[0] = os.getpid()


def _forked_dies_with_parent() -> None:
    """A process a rank forks (megatron-core's checkpoint writer forks one a save) dies with the process that forked
    it: the parent-death signal is not inherited across fork, and a writer forked from a rank killed mid-save
    waited on a lock for good, holding the run's staging folder open so that no later command published the run."""
    die_with_parent(signal.SIGKILL)
    if os.getppid() != _forking[0]:  # it died before the signal was armed
        os._exit(ORPHANED_EXIT)


def parent_alive() -> bool:
    """False once the process that started this rank has died (the rank has been re-parented)."""
    return _parent is None or os.getppid() == _parent


def exit_if_orphaned() -> None:
    """For the training loop, once a step: a rank whose launcher died exits at once, writing nothing more."""
    if not parent_alive():
        os._exit(ORPHANED_EXIT)


def consequent(code: int) -> bool:
    """Whether a rank that ended with exit code CODE (negative: the signal that killed it) stopped because another
    process of the run failed first, not of itself: its launcher's SIGTERM (before the rank could take it), its
    launcher gone, or a peer lost (STOPPED_EXIT). Such a rank is not the run's cause while another is."""
    return code in (STOPPED_EXIT, ORPHANED_EXIT, -signal.SIGTERM)


def become_subreaper() -> bool:
    """Orphaned descendants are re-parented to this process instead of init; returns whether that holds."""
    return _prctl(PR_SET_CHILD_SUBREAPER, 1)


ANSWER_S = 10.0  # for node 0's rendezvous to accept a connection (it did moments before, when the nodes met)
CHECK_S = 2.0  # the same, looked at once more as this node's run ends


_RESETS = 10  # connections node 0's rendezvous may reset (it is closing) before it is taken for dead


class NodeWatch:
    """Node 0's lifeline for another node's supervisor: a connection held to the rendezvous store node 0's torchrun
    serves for the whole run. When node 0's processes die, its kernel closes the connection at once, and a fresh
    one is refused (nothing listens any more); when its host stops answering, TCP's keepalive fails (8 s). Without
    it another node learned of node 0's death from its own ranks alone: while they started, from a store client's
    connection retries (about 53 s), and from gloo's timeout (120 s) for a host that stops answering. Watched from
    a thread; `lost()` says why node 0 is gone, "" while it answers."""

    keepalive = (2, 2, 3)  # TCP keepalive: idle seconds, seconds between probes, probes unanswered: the host gone

    def __init__(self, host: str, port: int):
        self.endpoint, self._addr = f"{host}:{port}", (host.strip("[]"), port)
        self._lost = ""
        self._sock: socket.socket | None = None
        self._closed = threading.Event()
        threading.Thread(target=self._watch, name="node-0-watch", daemon=True).start()

    def lost(self) -> str:
        return self._lost

    def check(self) -> str:
        """`lost()`, or else whether node 0 answers now, tried once: this node's ranks may end (their peers gone)
        before the watch has told."""
        if not self._lost and (sock := self._connect(CHECK_S)):
            sock.close()
        return self._lost

    def close(self) -> None:
        self._closed.set()
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)  # wakes the thread from its recv

    def _connect(self, timeout: float) -> socket.socket | None:
        """A connection to node 0's rendezvous; None, saying why node 0 is gone, where there is none."""
        for _ in range(_RESETS):
            try:
                return socket.create_connection(self._addr, timeout=timeout)
            except ConnectionResetError:  # a dying node 0 takes a connection as it closes (under load: 'stopped
                time.sleep(0.1)  # answering' was said of a node 0 that had died): asked again
            except ConnectionRefusedError:
                how = f"died or ended its run: its rendezvous at {self.endpoint} closed, and refuses connections"
                break
            except OSError as e:  # no answer within the time, no route to its host
                how = f"stopped answering: its rendezvous at {self.endpoint} did not answer ({e.strerror or e})"
                break
        else:
            how = f"died or ended its run: its rendezvous at {self.endpoint} resets every connection"
        self._lost = self._lost or f"node 0 {how}; see node 0's record"
        return None

    def _watch(self) -> None:
        while not self._closed.is_set() and not self._lost:
            held = time.monotonic()
            sock = self._connect(ANSWER_S)
            if sock is None:
                return
            with sock:
                self._sock = sock
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
                for option, value in zip(("TCP_KEEPIDLE", "TCP_KEEPINTVL", "TCP_KEEPCNT"), self.keepalive, strict=True):
                    if hasattr(socket, option):  # Linux's; elsewhere the system's own keepalive timing
                        sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)
                sock.settimeout(None)
                try:
                    sock.recv(1)  # the store says nothing unasked: this returns when the connection ends
                except OSError as e:
                    if e.errno == errno.ETIMEDOUT and not self._closed.is_set():  # keepalive probes unanswered
                        idle, interval, probes = self.keepalive
                        self._lost = (f"node 0 stopped answering: its rendezvous at {self.endpoint} has not answered "
                                      f"for {idle + interval * probes} s (its host down or cut off); see node 0's "
                                      f"record")
                        return
            # the connection ended: connecting again tells whether node 0 is gone (a dying node 0 may still take
            # a connection as it closes: reset then), at most 5 times a second
            self._closed.wait(max(0.0, held + 0.2 - time.monotonic()))
