"""Where mlbench keeps what it measured or computed once for this user: MLBENCH_CACHE, else XDG_CACHE_HOME/mlbench,
else ~/.cache/mlbench (set but empty is unset); where there is no home directory at all (a container's user
without one: Path.home() raises), the temp folder's mlbench-<uid>. Holds the CPU measurement (planner/cpu.py) and
the checker's verdicts (verdicts.py)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def folder() -> Path:
    path = os.environ.get("MLBENCH_CACHE")
    if not path:
        xdg = os.environ.get("XDG_CACHE_HOME")
        try:
            path = Path(xdg) / "mlbench" if xdg else Path.home() / ".cache" / "mlbench"
        except RuntimeError:
            path = Path(tempfile.gettempdir()) / f"mlbench-{os.getuid()}"
    return Path(path)


def write(path: Path, text: str) -> None:
    """PATH, a file of the cache, replaced whole: written beside it, then renamed over it (a reader sees the old
    file or the new one, never a part); OSError where it cannot be, nothing left behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
