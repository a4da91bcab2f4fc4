"""Where runs land: `<root>/<system>/<benchmark>/result_<i>.txt` (MLPerf's layout), each beside a record.

A run is staged in a hidden folder next to its destination and published by hard-linking its files into
place: `os.link` refuses an existing name, so a result is never overwritten, and a reader never sees a
half-written file.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path

from mlbench.errors import UserError


def run_folder(root: str | Path, system: str, benchmark: str) -> Path:
    """The benchmark's result folder, created and checked writable before anything runs."""
    for name, value in (("system", system), ("benchmark", benchmark)):
        if not value or "/" in value or value.startswith("."):
            raise UserError(f"--{name} {value!r} cannot name a folder; use letters, digits, '-', '_' or '.'")
    folder = Path(root) / system / benchmark
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".probe-{uuid.uuid4().hex}"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise UserError(f"results folder {folder} is not writable ({e.strerror}); pass --results DIR with a "
                        f"folder you can write") from None
    return folder


def stage(folder: Path) -> Path:
    """A fresh staging folder on the same filesystem as the results (so publishing is a link)."""
    return Path(tempfile.mkdtemp(prefix=".staging-", dir=folder))


def _claim(folder: Path, src: Path) -> int:
    i = 0
    while True:
        try:
            os.link(src, folder / f"result_{i}.txt")
            return i
        except FileExistsError:
            i += 1


def write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str) + "\n")
    try:
        os.link(tmp, path)  # never replaces an existing file
    finally:
        tmp.unlink()


def publish(folder: Path, staging: Path, record: dict) -> Path:
    """Move a finished run from its staging folder into place under the next free index."""
    log = staging / "mlperf.log"
    if not log.exists():
        log.write_text("")  # a run that died before logging still gets its (empty) result and record
    i = _claim(folder, log)
    record = record | {"result": f"result_{i}.txt", "index": i}
    write_json_atomic(folder / f"result_{i}.json", record)
    ranks = staging / "ranks"
    if ranks.is_dir():
        dest = folder / "logs" / f"result_{i}"
        dest.parent.mkdir(exist_ok=True)
        ranks.rename(dest)
    shutil.rmtree(staging, ignore_errors=True)
    return folder / f"result_{i}.txt"


def keep_node_logs(folder: Path, staging: Path, node_rank: int, seed: int) -> Path:
    """On a node other than node 0 (which publishes the run): keep its rank logs, drop the staging folder."""
    dest = folder / "logs" / f"node{node_rank}-seed{seed}-{uuid.uuid4().hex[:6]}"
    dest.parent.mkdir(exist_ok=True)
    ranks = staging / "ranks"
    if ranks.is_dir():
        ranks.rename(dest)
    shutil.rmtree(staging, ignore_errors=True)
    return dest
