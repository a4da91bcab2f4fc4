"""What verifying a checkpoint's checksums costs: `python perf/checkpoint_checksums.py [GB] [FILES] [RANKS]` writes
FILES files of GB in all (random bytes) in a scratch folder (removed after), writes their manifest as a save does,
and times `integrity.verify` (every byte: a dry run's check; a real run's launching node before the ranks shared
the read) from the page cache (warm) and after dropping the folder's pages where this user may (posix_fadvise
DONTNEED: cold, what the disk gives), against a plain read of the same bytes; then what a real run's launching node
checks now (`integrity.check_listing`: the listing, no byte read) and the largest of RANKS ranks' shares
(`integrity.verify_share`, cold), each rank on a node of its own."""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

from mlbench.train.checkpoint import integrity


def _drop_pages(folder: Path) -> None:
    os.sync()  # (dirty pages are not dropped)
    for f in folder.iterdir():
        with open(f, "rb") as fh:
            os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def _plain_read(folder: Path) -> None:
    for f in folder.iterdir():
        with open(f, "rb") as fh:
            while fh.read(8 << 20):
                pass


def _timed(what: str, fn, nbytes: int) -> None:
    start = time.perf_counter()
    fn()
    s = time.perf_counter() - start
    print(f"{what:<32} {s:7.2f} s  {nbytes / s / 1e6:8,.0f} MB/s")


def main(gb: float = 2.0, files: int = 8, ranks: int = 8) -> None:
    with tempfile.TemporaryDirectory(prefix="mlbench-crc-", dir=os.environ.get("TMPDIR")) as tmp:
        folder = Path(tmp)
        each = int(gb * 1e9 / files)
        for i in range(files):
            with open(folder / f"__{i}_0.distcp", "wb") as f:
                for _ in range(0, each, 64 << 20):
                    f.write(os.urandom(min(64 << 20, each)))
        nbytes = sum(f.stat().st_size for f in folder.iterdir())
        print(f"{nbytes / 1e9:.2f} GB in {files} files, {integrity._threads()} threads")
        _timed("write manifest (warm)", lambda: integrity.write(folder), nbytes)
        _timed("plain read (warm)", lambda: _plain_read(folder), nbytes)
        _timed("verify (warm)", lambda: integrity.verify(folder), nbytes)
        for _ in range(2):  # each twice, alternating: what the disk gives varies
            _drop_pages(folder)
            _timed("verify (cold)", lambda: integrity.verify(folder), nbytes)
            _drop_pages(folder)
            _timed("plain read (cold)", lambda: _plain_read(folder), nbytes)
        _drop_pages(folder)
        _timed("launcher now: listing (cold)", lambda: integrity.check_listing(folder), nbytes)
        files = integrity._read(folder, folder)
        rank, most = max(((r, sum(files[n]["bytes"] for n in integrity.share(files, r, ranks))) for r in range(ranks)),
                         key=lambda x: x[1])
        _drop_pages(folder)
        _timed(f"rank {rank} of {ranks}: share (cold)", lambda: integrity.verify_share(folder, rank, ranks), most)


if __name__ == "__main__":
    main(*(float(a) if i == 0 else int(a) for i, a in enumerate(sys.argv[1:])))
