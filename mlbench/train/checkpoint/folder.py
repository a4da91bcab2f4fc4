"""What the launching side checks of a checkpoint folder before anything starts, without importing torch: that it
is a distributed checkpoint (metadata.json) in a backend this megatron-core reads."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

from mlbench import owners


class CheckpointError(Exception):
    """A checkpoint that cannot start this run; the message names what is wrong and what would be right."""


def check_readable(path: str | Path) -> None:
    """Fails early, on the launching side, for a path that cannot be a checkpoint to start from."""
    try:
        _check_folder(Path(path), path)
        _check_files_readable(Path(path))
    except PermissionError as e:  # (a folder without search permission: '<path>/metadata.json: Permission denied'
        # alone; other OSErrors, a name too long, are the CLI's one line, which names the limit)
        where = Path(e.filename).name if e.filename else "it"
        raise CheckpointError(f"--init-checkpoint {path}: {where}: {e.strerror or e}; a checkpoint's folder and "
                              f"files must be readable by the user running mlbench") from None


def _check_files_readable(p: Path) -> None:
    """Each file of the checkpoint opens for reading, each folder (a zarr array's) lists: a data file without read
    permission passed every check and failed as the run loaded it, called 'a damaged checkpoint'."""
    for f in sorted(p.iterdir()):
        if f.is_dir():
            with os.scandir(f):
                pass
        else:
            with open(f, "rb"):
                pass


def _check_folder(p: Path, path: str | Path) -> None:
    if not p.is_dir():
        what = "no such folder" if not p.exists() else "not a folder"  # (a file: it said "no such folder")
        raise CheckpointError(f"--init-checkpoint {path}: {what} (a megatron-core distributed checkpoint folder, "
                              f"with metadata.json)")
    meta = p / "metadata.json"
    if os.path.lexists(meta) and not meta.is_file():  # (it said "no metadata.json" of one that is there)
        raise CheckpointError(f"--init-checkpoint {path}: metadata.json is not a regular file (a folder, a FIFO, a "
                              f"device or a broken link); a checkpoint's is the JSON file megatron-core writes")
    if not meta.is_file():
        hint = (" (this looks like a legacy per-rank Megatron checkpoint: convert it to the torch_dist format with "
                "Megatron-LM's checkpoint converter)" if any(p.glob("mp_rank_*")) or any(p.glob("iter_*")) else "")
        raise CheckpointError(f"--init-checkpoint {path}: not a megatron-core distributed checkpoint "
                              f"(no metadata.json){hint}")
    try:
        if (size := meta.stat().st_size) > _METADATA_BYTES:
            raise CheckpointError(f"--init-checkpoint {path}: metadata.json is {size:,} bytes; megatron-core "
                                  f"writes a few dozen")
        data = json.loads(meta.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"--init-checkpoint {path}: cannot read metadata.json ({e})") from None
    except RecursionError:  # (lists nested 100,000 deep)
        raise CheckpointError(f"--init-checkpoint {path}: cannot read metadata.json (nested too deep)") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"--init-checkpoint {path}: metadata.json is not a JSON object")
    # megatron-core's CheckpointingConfig takes these alone: another key was "cannot read its tensor index (TypeError:
    # ... unexpected keyword argument)", blaming the index for metadata.json
    unknown = sorted(set(data) - set(_METADATA_KEYS), key=str)
    if unknown:
        raise CheckpointError(f"--init-checkpoint {path}: metadata.json holds {unknown[0]!r}, which megatron-core's "
                              f"checkpoints do not (its keys: {', '.join(_METADATA_KEYS)})")
    backend = data.get("sharded_backend")
    if backend not in ("torch_dist", "zarr"):
        raise CheckpointError(f"--init-checkpoint {path}: sharded backend {backend!r}; readable: 'torch_dist' "
                              f"(megatron-core's) and 'zarr' (the MLPerf GPT-3 reference checkpoint's)")
    _check_versions(data, path)
    # torch reads a checkpoint's files whole: a FIFO or a device among them blocked the check, and the run, for ever
    odd = next((f for f in sorted(p.iterdir()) if not f.is_file() and not f.is_dir()), None)
    if odd is not None:
        raise CheckpointError(f"--init-checkpoint {path}: {odd.name} is not a regular file or a folder (a FIFO, a "
                              f"device or a broken link); a checkpoint holds files")
    if backend == "torch_dist":
        absent = [n for n in (".metadata", "common.pt") if not (p / n).is_file()]
        if absent:
            raise CheckpointError(f"--init-checkpoint {path}: no {' and no '.join(absent)}: a torch_dist "
                                  f"checkpoint holds its tensor index (.metadata) and its non-tensor state "
                                  f"(common.pt); this one is incomplete")
    elif (p / ".metadata").is_file() and not any((f / ".zarray").is_file() for f in p.iterdir() if f.is_dir()):
        # (zarr's loader found none of the model's tensors: '16 of the model's 16 tensors are not in the checkpoint')
        raise CheckpointError(f"--init-checkpoint {path}: metadata.json says sharded backend 'zarr', and the folder "
                              f"holds no zarr array (a folder with .zarray) but a torch_dist tensor index "
                              f"(.metadata): its metadata.json would say 'torch_dist'")


def _check_versions(data: dict, path: str | Path) -> None:
    """The format versions megatron-core reads: another was 'cannot read its tensor index (CheckpointingException:
    Cannot find a default strategy for: ('load_sharded', 'torch_dist', 99))', blaming the index."""
    for key, readable in (("sharded_backend_version", 1), ("common_backend", "torch"), ("common_backend_version", 1)):
        value = data.get(key, readable)
        if value != readable or type(value) is not type(readable):
            raise CheckpointError(f"--init-checkpoint {path}: metadata.json says {key} {json.dumps(value)}; this "
                                  f"megatron-core reads {json.dumps(readable)} (a checkpoint of another megatron-core, "
                                  f"or an edited metadata.json)")


_METADATA_KEYS = ("sharded_backend", "sharded_backend_version", "common_backend", "common_backend_version")
_METADATA_BYTES = 1 << 20  # megatron-core's metadata.json: {"sharded_backend": ..., "sharded_backend_version": ...}


def load_error(e: BaseException) -> str:
    """One line of why a checkpoint file did not load: for a file that is not a pickle, the unpickler's reason, not
    torch.load's advice to load with weights_only=False (which runs whatever the file holds)."""
    if (name := refused_global(e)) is not None:  # (torch's text was its advice, cut short before the name)
        return f"it would import {name} as it is read, which no checkpoint holds: refused, nothing of it run"
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    after = [lines[i + 1] for i, ln in enumerate(lines[:-1]) if ln.endswith("WeightsUnpickler error:")]
    # torch's CheckpointException: each rank's traceback, its error on its last line
    raised = [ln for ln in lines if re.match(r"[\w.]+(Error|Exception): ", ln)]
    line = (after or raised[-1:] or lines or [""])[0]
    # its first sentence: torch's zip reader goes on with advice ('This is an internal miniz error. If you are
    # seeing this error, ...'), which cut the reason's own end off the run's 300 characters
    line = re.sub(r"(?<=[a-z)])\. [A-Z].*", "", line)
    return f"{type(e).__name__}: {line}"[:200]


def refused_global(e: BaseException) -> str | None:
    """The global (module.name) a pickle named that a safe load refused, if that is why E was raised: torch's
    weights_only ('unsupported GLOBAL posix.system') and the index's unpickler say it alike."""
    m = re.search(r"GLOBAL ([\w.]+)", str(e))
    return m.group(1).rstrip(".") if m else None


def partial_prefix(dest: Path) -> str:
    """A save in progress is staged beside its destination as `.NAME.partial-<owner tag>` (mlbench.owners)."""
    return f".{dest.name}.partial-"


def keep_unplaced(staging: Path, dest: Path) -> str:
    """A whole save that could not be renamed to DEST (which appeared meanwhile: another run saved there) is moved
    from its staging folder, which is removed as a dead partial once its rank is gone (a message said it was 'left
    in' a folder deleted a moment later), to `NAME.unplaced-XXXX` beside DEST; where it went, in words."""
    kept = None
    try:
        kept = Path(tempfile.mkdtemp(prefix=f"{dest.name}.unplaced-", dir=dest.parent))
        os.rename(staging, kept)  # onto the empty folder just made: it replaces it
    except OSError as e:
        if kept is not None:
            with contextlib.suppress(OSError):
                kept.rmdir()
        return f"the saved checkpoint could not be kept either ({e.strerror or e}) and is removed"
    return f"the saved checkpoint is kept in {kept}"


def remove_dead_partials(dest: Path) -> None:
    """Removes the staging folders of saves to DEST whose process is gone (a failed save, a run killed with -9);
    another host's or container's, and a live one, are left alone."""
    for partial in dest.parent.glob(f"{partial_prefix(dest)}*"):
        if owners.gone(partial.name[len(partial_prefix(dest)):]):
            shutil.rmtree(partial, ignore_errors=True)
