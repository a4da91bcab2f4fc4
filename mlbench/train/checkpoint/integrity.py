"""Checksums of a checkpoint's files: written when mlbench saves one, verified before a run starts from it.

Every check before this one reads a checkpoint's structure (its index, the byte records, the sizes, finite
values once loaded): bytes flipped inside a tensor, or a shard replaced by another checkpoint's of the same
shape, kept every structure and loaded silently, the run training from garbage. A save therefore writes
MANIFEST beside megatron-core's files: each file's size and CRC32-C (google-crc32c, hardware CRC, several GB/s a
core). Before launch the launching node checks the listing (`check_listing`: the files, their sizes); each rank then
reads its share of the bytes against it before it loads (`verify_share`), so the whole checkpoint is read once,
spread over the ranks. `mlbench run --dry-run` reads every byte on its own (`verify`). No torch: the launching
side imports it.

A checkpoint without the manifest (the MLPerf reference checkpoints, one saved by megatron-LM or NeMo, or by an
older mlbench) loads, its bytes unverified, and the check says so: refusing it would refuse every checkpoint the
benchmarks start from.
"""

from __future__ import annotations

import heapq
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import google_crc32c

from mlbench.train.checkpoint.folder import CheckpointError

MANIFEST = "mlbench_checksums.json"
_BLOCK = 8 << 20
_MANIFEST_BYTES = 64 << 20  # a few hundred bytes a file: a checkpoint of 100,000 files is ~10 MB


def crc32c(path: Path) -> str:
    """The file's CRC32-C, as 8 hex digits (read in blocks: google-crc32c releases the GIL, so files go in
    parallel)."""
    crc = 0
    with open(path, "rb") as f:
        while block := f.read(_BLOCK):
            crc = google_crc32c.extend(crc, block)
    return f"{crc:08x}"


def _files(folder: Path) -> list[str]:
    """Every regular file below FOLDER (a zarr array's chunks are in folders), relative, the manifest left out."""
    found = []
    for root, _, names in os.walk(folder):
        for name in names:
            rel = os.path.relpath(os.path.join(root, name), folder)
            if rel != MANIFEST:
                found.append(rel)
    return sorted(found)


def _threads() -> int:
    return min(8, os.cpu_count() or 1)


def sums(folder: Path, names: list[str]) -> dict[str, dict]:
    """{name: {'bytes', 'crc32c'}} of the files NAMES in FOLDER, read in parallel."""
    with ThreadPoolExecutor(_threads()) as pool:
        crcs = list(pool.map(lambda n: crc32c(folder / n), names))
    return {n: {"bytes": (folder / n).stat().st_size, "crc32c": c} for n, c in zip(names, crcs, strict=True)}


def write(folder: Path, known: dict[str, dict] | None = None) -> None:
    """Writes the manifest of every file in FOLDER (a save's staging folder, once every rank has written). KNOWN:
    sums already taken (each rank sums the files it wrote, which it may still have in memory: rank 0 reading a
    405B checkpoint's 5.7 TB alone would take hours); the rest are taken here."""
    known = dict(known or {})
    names = _files(folder)
    known.update(sums(folder, [n for n in names if n not in known]))
    files = {n: known[n] for n in names}
    tmp = folder / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps({"algorithm": "crc32c", "files": files}, indent=0))
    os.replace(tmp, folder / MANIFEST)


def _read(folder: Path, path: str | Path) -> dict[str, dict]:
    """The manifest's files, each {'bytes': int, 'crc32c': hex}; a manifest that cannot be read is refused."""
    where = f"--init-checkpoint {path}: {MANIFEST}"
    try:
        if (size := (folder / MANIFEST).stat().st_size) > _MANIFEST_BYTES:
            raise CheckpointError(f"{where} is {size:,} bytes; mlbench writes a few hundred a file (a damaged "
                                  f"checkpoint: save or copy it again)")
        data = json.loads((folder / MANIFEST).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise CheckpointError(f"{where} cannot be read ({type(e).__name__}: {e}); the checksums mlbench saved "
                              f"with the checkpoint are damaged: save or copy it again") from None
    files = data.get("files") if isinstance(data, dict) and data.get("algorithm") == "crc32c" else None
    good = isinstance(files, dict) and all(
        isinstance(v, dict) and type(v.get("bytes")) is int and isinstance(v.get("crc32c"), str)
        and Path(k).parts and ".." not in Path(k).parts and not Path(k).is_absolute() for k, v in files.items())
    if not good:
        raise CheckpointError(f"{where} is not the manifest mlbench writes ({{'algorithm': 'crc32c', 'files': "
                              f"{{name: {{'bytes', 'crc32c'}}}}}}): a damaged checkpoint, save or copy it again")
    return files


def has_manifest(path: str | Path) -> bool:
    return os.path.lexists(Path(path) / MANIFEST)


def check_listing(path: str | Path) -> int | None:
    """The cheap half of `verify`, a stat a file and no byte read: the manifest reads, and the folder holds the
    files it lists, no other, each of the size saved. Returns the bytes listed, None where there is no manifest.
    What runs before launch: the bytes themselves are the ranks' to verify, each its share (`verify_share`), as a
    405B checkpoint with its Adam state (~5 TB) read on the launching node alone took ~30 min at 3 GB/s."""
    files = _listed(Path(path), path)
    return None if files is None else sum(v["bytes"] for v in files.values())


def _listed(folder: Path, path: str | Path) -> dict[str, dict] | None:
    """`check_listing`'s check; the manifest's files, None where there is none."""
    if not has_manifest(folder):
        return None
    files = _read(folder, path)
    have = set(_files(folder))
    if missing := sorted(set(files) - have):
        raise CheckpointError(f"--init-checkpoint {path}: {missing[0]} is missing; the checkpoint was saved with it "
                              f"({MANIFEST}): a damaged or partly copied checkpoint, save or copy it again")
    if extra := sorted(have - set(files)):
        raise CheckpointError(f"--init-checkpoint {path}: {extra[0]} was not saved with the checkpoint (not in "
                              f"{MANIFEST}): a file added or renamed since, remove it or copy the checkpoint again")
    for name in sorted(files):
        got = (folder / name).stat().st_size
        if got != files[name]["bytes"]:
            raise CheckpointError(f"--init-checkpoint {path}: {name} is {got:,} bytes; it was saved with "
                                  f"{files[name]['bytes']:,} ({MANIFEST}): a damaged or partly copied checkpoint, "
                                  f"save or copy it again")
    return files


def _check_sums(folder: Path, path: str | Path, files: dict[str, dict], names: list[str]) -> None:
    """The files NAMES of FOLDER read against their CRC32-C in the manifest FILES; the first that differs refused."""
    for name, got in sums(folder, names).items():
        if got["crc32c"] != files[name]["crc32c"]:
            raise CheckpointError(f"--init-checkpoint {path}: {name}: its bytes differ from those saved (CRC32-C "
                                  f"{got['crc32c']}, saved {files[name]['crc32c']}, {MANIFEST}): a damaged "
                                  f"checkpoint, or a file replaced by another checkpoint's; save or copy it again")


def verify(path: str | Path) -> int | None:
    """Checks every file of the checkpoint at PATH against its manifest: the same files, each of its size and
    CRC32-C, every byte read here (`mlbench run --dry-run`, `python -m mlbench.train.checkpoint.check`). Returns
    the bytes verified, None where there is no manifest (not saved by mlbench)."""
    if (files := _listed(Path(path), path)) is None:
        return None
    _check_sums(Path(path), path, files, sorted(files))
    return sum(v["bytes"] for v in files.values())


def share(files: dict[str, dict], rank: int, world: int) -> list[str]:
    """The files of manifest FILES that RANK of WORLD verifies: every file to one rank, balanced by bytes (the
    largest first, each to the rank with the fewest bytes so far; ties by name and rank: every rank computes the
    same split from the same manifest, without a word to the others)."""
    load = [(0, r) for r in range(max(world, 1))]  # (bytes so far, rank): a heap, the least loaded on top
    mine = []
    for name in sorted(files, key=lambda n: (-files[n]["bytes"], n)):
        got, least = heapq.heappop(load)
        heapq.heappush(load, (got + files[name]["bytes"], least))
        if least == rank:
            mine.append(name)
    return sorted(mine)


def verify_share(path: str | Path, rank: int, world: int) -> int | None:
    """What a rank checks before it loads: the CRC32-C of its share of the files (`share`), which the check before
    launch left to the ranks (`check_listing`): together the ranks read the checkpoint once. Returns the bytes this
    rank verified, None where there is no manifest. A file whose bytes differ is refused, named."""
    folder = Path(path)
    if not has_manifest(folder):
        return None
    files = _read(folder, path)
    mine = share(files, rank, world)
    _check_sums(folder, path, files, mine)
    return sum(files[n]["bytes"] for n in mine)


def stamp(path: str | Path) -> dict[str, tuple[int, int, int]]:
    """Each top-level entry's (size, mtime_ns, inode): compared before and after a rank reads the checkpoint, it
    tells cheaply (a stat an entry, no byte read; a zarr array's folder, not its thousands of chunks) whether
    the folder changed meanwhile: a file rewritten, replaced, added or removed."""
    out = {}
    with os.scandir(path) as entries:
        for e in entries:
            s = e.stat()
            out[e.name] = (s.st_size, s.st_mtime_ns, s.st_ino)
    return out


def changed(path: str | Path, before: dict[str, tuple[int, int, int]]) -> str | None:
    """The first file added, removed or rewritten in PATH since BEFORE (`stamp`), or None."""
    after = stamp(path)
    for name in sorted(set(before) | set(after)):
        if before.get(name) != after.get(name):
            return name
    return None


def file_stamps(path: str | Path) -> dict[str, list[int]]:
    """Every file's [size, mtime_ns, inode] below PATH, relative names (the manifest's too): what the check before
    launch read, carried in the run plan so that each rank tells, by a stat a file and no byte read, that the files
    it loads are the ones checked (`changed_since_check`). A list, as JSON gives it back."""
    folder = Path(path)
    out = {}
    for name in [*_files(folder), *([MANIFEST] if has_manifest(folder) else [])]:
        s = (folder / name).stat()
        out[name] = [s.st_size, s.st_mtime_ns, s.st_ino]
    return out


def changed_since_check(path: str | Path, checked: dict[str, list[int]]) -> str | None:
    """The first file of PATH added, removed, rewritten or replaced since CHECKED (`file_stamps` when the check
    before launch read it), said as a run's reason; None where every file is the one checked."""
    try:
        now = file_stamps(path)
    except OSError as e:  # (a file removed as it was listed)
        return f"{getattr(e, 'filename', None) or path}: {e.strerror or e}"
    for name in sorted(set(checked) | set(now)):
        was, got = checked.get(name), now.get(name)
        if was != got:
            what = ("added" if was is None else "removed" if got is None else
                    f"{'rewritten' if got[2] == was[2] else 'replaced'} ({got[0]:,} bytes, was {was[0]:,})")
            return f"{name} {what}"
    return None
