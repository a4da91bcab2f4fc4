"""The official checker's verdicts, kept. A verdict depends only on the log's bytes, the rules (a ruleset, or our
smoke rules' file), --quiet and the installed mlperf-logging, so each log is checked once: `score`, `compare` and
`scaling` over the same results (a published folder compared against again and again; logs of hundreds of MB, which
the checker reads at about 5 MB a second) run the checker only on what they have not judged before.

Kept: what a checker that finished said (compliant or not, a crash on its own rules included). Never kept: a
checker stopped at its time limit or killed (no verdict, or one the next try may not share), a file skipped for its
long lines (decided without the checker). One JSON file a verdict under user_cache's folder/verdicts, written
whole (a rename); one that cannot be read is checked again, a cache that cannot be written is done without. At
most KEEP verdicts are kept: past that, the least recently used go (a verdict read is touched), and what a killed
write left behind."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from pathlib import Path

from mlbench import mlperf_tools, user_cache
from mlbench.errors import printable

VERSION = 1  # of what a verdict file holds
_PATH = "\0path\0"  # stands for the log's path in a kept message (the same bytes may lie anywhere)
KEEP = 4096  # verdicts, a file (a disk block) each: mlbench's own test suite adds about 300 new ones a run
_STALE_S = 3600  # a write's temporary file older than this was left by a killed process


def folder() -> Path:
    return user_cache.folder() / "verdicts"


def key(path: Path, rules: str, rules_file: Path | None, quiet: bool) -> str | None:
    """What the verdict on PATH depends on, hashed; None where a file cannot be read (the checker says why)."""
    h = hashlib.sha256(f"{VERSION}\0{mlperf_tools.installed_version()}\0{rules}\0{quiet}\0".encode())
    try:
        if rules_file is not None:
            h.update(rules_file.read_bytes())
        h.update(b"\0")
        with open(path, "rb") as f:
            while block := f.read(1 << 20):
                h.update(block)
    except OSError:
        return None
    return h.hexdigest()


def load(digest: str, path: Path) -> tuple[bool, list[str]] | None:
    """(compliant, messages) kept for DIGEST, the messages naming PATH; None where none is kept or it is garbled."""
    from mlbench.logfile import load_json  # numpy and orjson: not for the CLI's start-up

    file = folder() / f"{digest}.json"
    try:  # capped and never blocking: a pipe or a huge file in its place is a verdict not kept
        data = load_json(file)
        ok, messages = data["ok"], data["messages"]  # type: ignore[index]
    except (OSError, ValueError, TypeError, KeyError):
        return None
    if not isinstance(ok, bool) or not isinstance(messages, list) or not all(isinstance(m, str) for m in messages):
        return None
    with contextlib.suppress(OSError):
        os.utime(file)  # used: the last to go when the cache is pruned
    return ok, [m.replace(_PATH, printable(str(path))) for m in messages]  # as the checker's are (compliance)


def save(digest: str, path: Path, ok: bool, messages: list[str]) -> None:
    """Keeps a finished checker's verdict on PATH; a cache that cannot be written is done without."""
    named = {printable(p) for p in (Path(path).resolve(), path)}  # as the messages name it (compliance._verdict)
    kept = []
    for m in messages:
        for p in sorted(named, key=len, reverse=True):
            m = m.replace(p, _PATH)
        kept.append(m)
    with contextlib.suppress(OSError):
        user_cache.write(folder() / f"{digest}.json", json.dumps({"ok": ok, "messages": kept}))
        prune()


def prune() -> None:
    """Leaves the KEEP most recently used verdicts (the rest, and stale temporary files, removed); each of many
    processes pruning at once removes what it can. Names are listed on every save; the verdicts' times are read
    only once there are more than KEEP."""
    now, base = time.time(), folder()
    names = os.listdir(base)
    for name in names:
        if name.startswith("."):  # a write's temporary file
            with contextlib.suppress(OSError):
                if now - os.lstat(base / name).st_mtime > _STALE_S:
                    os.unlink(base / name)
    kept = [name for name in names if name.endswith(".json") and not name.startswith(".")]
    if len(kept) <= KEEP:
        return
    used = []
    for name in kept:
        with contextlib.suppress(OSError):
            used.append((os.lstat(base / name).st_mtime, name))
    for _, name in sorted(used)[: len(used) - KEEP]:
        with contextlib.suppress(OSError):
            os.unlink(base / name)
