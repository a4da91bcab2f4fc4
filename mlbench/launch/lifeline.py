"""A run's processes die with their supervisor, so none trains (or writes into a result) unsupervised.

- The supervisor (`mlbench run`) starts the launcher with a parent-death signal (`die_with_parent`, as
  `preexec_fn`) and becomes a child subreaper (`become_subreaper`): ranks orphaned by a dead launcher are
  re-parented to it, so it can still find, stop and reap them.
- Every rank arms its own parent-death signal first thing (`install_pdeathsig`), and the training loop
  checks `parent_alive()` each step: a rank whose launcher is gone stops without writing anything more.
The signals are Linux's (prctl); elsewhere only the check in the loop applies.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
ORPHANED_EXIT = 5  # a rank's exit code when it stops because its launcher died
# A rank's exit code when it stops because another process of the run failed first: its launcher stopped it (SIGTERM,
# no reason given: torchrun's agent and mlbench's stop every rank when one fails) or a peer's connection dropped
STOPPED_EXIT = 6

_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
_parent: int | None = None  # the parent a rank started under (install_pdeathsig)


def _prctl(option: int, arg: int) -> bool:
    return _libc is not None and _libc.prctl(option, arg, 0, 0, 0) == 0


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """This process gets `sig` when the thread that started it exits (for `preexec_fn`: async-signal-safe)."""
    _prctl(PR_SET_PDEATHSIG, sig)


def install_pdeathsig(sig: int = signal.SIGKILL) -> None:
    """For a rank, before anything else: killed with `sig` when its launcher dies; `parent_alive()` from now
    on says whether that launcher is still its parent."""
    global _parent
    _parent = os.getppid()
    die_with_parent(sig)
    if os.getppid() != _parent:  # it died before the signal was armed
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
