"""Where runs land: `<root>/<system>/<benchmark>/result_<i>.txt` (MLPerf's layout), each beside a record.

A run is staged in a hidden folder next to its destination and published by hard-linking its files into
place: `os.link` refuses an existing name, so a result is never overwritten, and a reader never sees a
half-written file. The record (`result_<i>.json`) is linked first and claims the index; the log follows, so
a reader that finds `result_<i>.txt` finds its record too. Publishing is all or nothing: a failure (a full
disk) removes whatever it had placed and the staging folder, and raises PublishError.

The record is strict JSON, for any script's parser: a number that is not finite (a diverged run's NaN loss) is
null. (The MLPerf log beside it is the official logger's, which writes such a number as NaN, as Python reads it.)

A staging folder is named after its owner (`.staging-<owner tag>-XXXX`, mlbench.owners), so a later run removes
the ones whose owner on this host is dead (killed with -9, say) and leaves other hosts' and containers' alone. One
that holds a run its dead owner never published (a plan and a begun MLPerf log) is kept for the later run to
publish (mlbench.dead_runs: as its log ended, aborted where it had not), once no process holds a file in it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

from mlbench import owners, schema, user_cache
from mlbench.errors import UserError

STAGING = ".staging-"


@contextlib.contextmanager
def log_write_errors_silenced() -> Iterator[None]:
    """While an MLPerf log is written here: Python's logging reports a failed write (a full disk) by printing a
    traceback and going on; the caller judges the file with `log_problem` instead."""
    raising = logging.raiseExceptions
    logging.raiseExceptions = False
    try:
        yield
    finally:
        logging.raiseExceptions = raising


def log_problem(path: Path, last_key: str) -> str:
    """Why the MLPerf log at `path`, written by mlbench, is not whole ("" when it is): a line that is not one whole
    record (a write cut short by a full disk, the next line run into it), its last line cut off, or, once it has
    run_start, no `last_key` line (run_stop for a run; run_start for a log that stops there)."""
    from mlbench import logfile  # here: numpy and orjson, which the CLI's start-up need not import

    if not path.exists() or path.stat().st_size == 0:
        return "" if last_key == "run_stop" else "it is empty"
    started = ended = False
    with open(path, "rb") as f:
        for n, line in enumerate(f, 1):
            if not line.endswith(b"\n"):
                return "its last line is cut off (is the disk full?)"
            event = logfile.whole_record(line[:-1], n)
            if event is None:
                return f"line {n} is not one whole MLPerf record (is the disk full?)"
            started = started or event.key == "run_start"
            ended = ended or event.key == last_key
    if (started or last_key == "run_start") and not ended:
        return f"it has no {last_key} (is the disk full?)"
    return ""


class PublishError(Exception):
    """A finished run could not be published (the message says why); nothing of it was placed."""


# Names that become folders (--system, the benchmark): portable, never hidden, never an option or a path.
FOLDER_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,99}")  # a --system, a benchmark


def check_name(what: str, value: str) -> None:
    """A name that becomes a folder: letters, digits, '-', '_' and '.', not starting with '.' or '-', at most 100."""
    if not FOLDER_NAME.fullmatch(value):
        raise UserError(f"{what} {value!r} cannot name a folder: use ASCII letters and digits, '-', '_' or '.' ('-' "
                        f"and '.' not first), at most 100 characters")


@contextlib.contextmanager
def result_folder(root: str | Path, system: str, benchmark: str) -> Iterator[Path]:
    """The benchmark's result folder, created and checked writable before anything runs. On the way out,
    whatever it created and nothing filled is removed again: a refused or failed run leaves no empty folders."""
    check_name("--system", system)
    check_name("the benchmark", benchmark)
    folder = Path(root) / system / benchmark
    # deepest first; the run's own folders (logs/, .slurm/) only where this run made them: a user's empty logs/ was
    # removed at the end of a run
    created = [p for p in (folder / ".slurm", folder / "logs", folder, *folder.parents) if not os.path.lexists(p)]
    try:  # from the first folder made on: whatever ends this (a stop signal too) removes what is left empty
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=folder):  # unnamed on Linux: nothing to leave behind if killed
                pass
        except OSError as e:
            raise UserError(f"results folder {folder} is not writable ({e.strerror}); pass --results DIR with a "
                            f"folder you can write") from None
        _check_links(folder)
        remove_stale(folder)
        yield folder
    finally:
        _remove_empty(folder, created)


def _check_links(folder: Path) -> None:
    """A result is published by hard links (`publish`): a filesystem that takes none (vfat, some network and FUSE
    mounts) trained the whole run and then could not publish it. Tried with a file of its own, removed again."""
    probe = None
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".mlbench-probe-") as f:
            probe = Path(f"{f.name}.link")
            os.link(f.name, probe)
            probe.unlink()
    except OSError as e:
        with contextlib.suppress(OSError):
            if probe is not None:
                probe.unlink()
        raise UserError(f"results folder {folder} cannot take a hard link ({e.strerror or e}), which publishing a "
                        f"result needs (never overwritten, never half-written); pass --results DIR on a filesystem "
                        f"that takes them (a local disk)") from None


def _remove_empty(folder: Path, created: list[Path]) -> None:
    for p in created:  # deepest first
        with contextlib.suppress(OSError):
            p.rmdir()  # only if empty


def stage(folder: Path) -> Path:
    """A fresh staging folder on the same filesystem as the results (so publishing is a link), named after
    this process (`owners.tag`)."""
    try:
        return Path(tempfile.mkdtemp(prefix=f"{STAGING}{owners.tag()}-", dir=folder))
    except FileNotFoundError:
        # removed meanwhile by another command started at once, whose refused run cleared the empty folders it had
        # made (this run was refused: "cannot write a run's files (No such file or directory)"): made again
        folder.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f"{STAGING}{owners.tag()}-", dir=folder))


def remove_stale(folder: Path) -> list[Path]:
    """Removes the staging folders whose owner (on this host and in this PID namespace) is gone, finishing the
    publishing of a result it had begun to place; returns them. A dead run never published stays (dead_runs)."""
    removed = []
    for staging in _stale(folder):
        with taken(staging) as mine:
            if not mine:
                continue
            _finish_publishing(folder, staging)
            if _unpublished_run(folder, staging):
                continue
            # rank logs left (another node's, whose mlbench died: node 0 holds the log): kept for a person to read
            # (they were deleted, with the only account of why that node's ranks ended)
            if not (_holds_rank_logs(staging) and set_aside(folder, staging)):
                shutil.rmtree(staging, ignore_errors=True)
            removed.append(staging)
    return removed


@contextlib.contextmanager
def taken(staging: Path) -> Iterator[bool]:
    """Whether this process may finish, publish or remove what a dead run left in STAGING: True once it holds the
    folder's lock (flock: let go as the process ends, however it ends), the folder still there. Two commands started
    at once in a results folder each published the same dead run (its log closed twice), or placed a log under
    the other's record; the second now passes it over."""
    try:
        fd = os.open(staging, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:  # gone meanwhile (another command published it), or no folder
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another command holds it
            yield False
            return
        except OSError:  # a filesystem without locks (ENOLCK): taken as before there were any
            pass
        try:
            held = os.path.samestat(os.fstat(fd), os.stat(staging))  # not removed while the lock was sought
        except OSError:
            held = False
        yield held
    finally:
        os.close(fd)


def _holds_rank_logs(staging: Path) -> bool:
    with contextlib.suppress(OSError):
        return any(p.is_file() for p in (staging / "ranks").rglob("*"))
    return False


def dead_runs(folder: Path) -> list[tuple[Path, str]]:
    """(staging folder, owner tag) of each run whose owner died before publishing it, and whose files no live
    process holds any more (its ranks die with their supervisor, a moment later)."""
    found = [s for s in _stale(folder) if _unpublished_run(folder, s) and not _in_use(s)]
    return [(s, owner_tag(s)) for s in sorted(found)]


def half_published(folder: Path) -> list[Path]:
    """Staging folders of publishers that died between their two links (the record placed, its log not): the next
    mlbench run there finishes them (`_finish_publishing`); until then the folder shows a record without its log."""
    return sorted(s for s in _stale(folder)
                  if any(not os.path.lexists(folder / f"{r.stem}.txt") for r in _placed(folder, s)))


def records_without_log(folder: Path) -> list[Path]:
    """The result_<i>.json in FOLDER with no result_<i>.txt beside it (the log removed or moved, or a record copied
    alone): a run that analysis cannot read. Those a publisher that died between its two links placed are left to
    `half_published`, which says them."""
    said = {r.name for s in half_published(folder) for r in _placed(folder, s)}
    return sorted(r for r in folder.glob("result_*.json")
                  if r.name not in said and not os.path.lexists(r.with_suffix(".txt")))


def published_here(record: Path, top: Path) -> bool:
    """Whether RECORD, found under the folder TOP, lies in a benchmark folder: not in a staging folder (a run's own
    copy, or one in progress), nor in a run set aside (logs/unpublished-*), nor in any other hidden folder."""
    parts = record.relative_to(top).parts[:-1]
    aside = len(parts) >= 2 and parts[-2] == "logs" and parts[-1].startswith("unpublished-")
    return not aside and not any(p.startswith(".") for p in parts)


def owner_tag(staging: Path) -> str:
    return staging.name[len(STAGING):].rpartition("-")[0]  # .staging-<owner tag>-XXXX


def unplaced(folder: Path, staging: Path) -> bool:
    """Whether STAGING (a folder of its own, not a link) holds a run whose record was not placed in FOLDER."""
    return staging.is_dir() and not staging.is_symlink() and not _placed(folder, staging)


def _stale(folder: Path) -> list[Path]:
    return [s for s in folder.glob(f"{STAGING}*") if owners.gone(owner_tag(s))]


def _unpublished_run(folder: Path, staging: Path) -> bool:
    """A begun MLPerf log (its plan may be missing: the log states it), or the plan of a run whose log is this
    folder's own and was not begun yet (`_log_not_begun`), and no record of it placed in the folder (a placed one
    was finished by _finish_publishing)."""
    with contextlib.suppress(OSError):  # its plan may be gone or garbled: its log says it began
        log = staging / "mlperf.log"
        begun = os.path.lexists(log) and log.lstat().st_size > 0
        if not begun and not _log_not_begun(staging):
            return False
        return not _placed(folder, staging)
    return False


def _placed(folder: Path, staging: Path) -> list[Path]:
    """The records of STAGING that its publisher placed in FOLDER (the result_<i>.json there is the same file)."""
    placed = []
    for staged in staging.glob("result_*.json"):
        with contextlib.suppress(OSError):
            if (folder / staged.name).samefile(staged):
                placed.append(staged)
    return placed


# The most of a dead run's plan.json read to tell whether it began a run (a plan is a few KB; the staging folder may
# hold anything).
_PLAN_BYTES = 1 << 20


def _log_not_begun(staging: Path) -> bool:
    """A run killed before rank 0 began its MLPerf log (its ranks still importing) whose log is this staging
    folder's to write: a run on one node, not a dry run, with a plan that reads as JSON. Its supervisor, had it
    lived, would have begun the log from the plan and closed it as aborted (supervise._complete_log); a node of a
    multi-node run is left alone, as its supervisor leaves it (another node may hold the log)."""
    path = staging / "plan.json"
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > _PLAN_BYTES:
            return False
        plan = json.loads(path.read_bytes())
        return plan["layout"]["nodes"] == 1 and plan.get("dry_run") is False
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return False


def _in_use(staging: Path) -> bool:
    """Whether a live process (of those this one may see) holds a file open inside `staging`."""
    inside = f"{staging.resolve()}/"
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:  # ended since /proc was listed (a glob raised it: FileNotFoundError), or not ours to see
            continue
        for fd in fds:
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(inside):
                    return True
    return False


# A result's name: result_<i>.txt and its record result_<i>.json, <i> a number (mlbench writes it without leading
# zeros). A name of the pattern written otherwise (result_007.txt, by hand) still holds its number: a run never
# claims 7 beside it, and analysis, which reads every result_*.txt as the official summarizer does, says it.
_NUMBERED = re.compile(r"result_([0-9]{1,18})\.(txt|json)")


def index_of(name: str) -> int | None:
    """The index a result or record file's NAME holds (7 for result_7.txt and result_007.json); None for others."""
    m = _NUMBERED.fullmatch(name)
    return int(m[1]) if m else None


def canonical(name: str) -> bool:
    """Whether NAME is a result or record name as mlbench writes it (result_7.txt, not result_007.txt)."""
    i = index_of(name)
    return i is not None and name in (f"result_{i}.txt", f"result_{i}.json")


def _held_by_hand(folder: Path) -> set[int]:
    """The indices held by result or record names mlbench does not write (result_007.txt holds 7): the next run
    wrote result_7.txt beside result_007.txt, two files of one index."""
    with contextlib.suppress(OSError):
        return {i for n in os.listdir(folder) if (i := index_of(n)) is not None and not canonical(n)}
    return set()


def _taken(folder: Path, i: int, held: set[int] = frozenset()) -> bool:
    return i in held or any(p.exists() or p.is_symlink() for p in (
        folder / f"result_{i}.txt", folder / f"result_{i}.json", folder / "logs" / f"result_{i}"))


# The most of a log read for its seed: rank 0 logs it before run_start, in the first few KB.
_SEED_BYTES = 1 << 20


def logged_seed(log: Path) -> int | None:
    """The seed LOG states (its first `seed` record before run_start, as an integer), or None: no seed there, not a
    regular file (a FIFO would block the read), or unreadable."""
    from mlbench import logfile  # here: numpy and orjson, which the CLI's start-up need not import

    with contextlib.suppress(OSError):
        if not log.is_file():
            return None
        read = 0
        with open(log, "rb") as f:
            for n, line in enumerate(f, 1):
                read += len(line)
                event = logfile.whole_record(line.rstrip(b"\n"), n)
                if event is not None and event.key == "seed":
                    return event.value if type(event.value) is int else None
                if read > _SEED_BYTES or event is not None and event.key == "run_start":
                    break
    return None


def seeds_used(folder: Path) -> dict[int, str]:
    """Each seed the result logs in FOLDER state, and the first log (by name) that states it: a set's runs must each
    have their own (MLPerf's package checker rejects a set in which two runs log one seed from one line)."""
    used: dict[int, str] = {}
    with contextlib.suppress(OSError):
        for log in sorted(folder.glob("result_*.txt")):
            if (seed := logged_seed(log)) is not None:
                used.setdefault(seed, log.name)
    return used


def _write_synced(path: Path, pieces: Iterable[str]) -> None:
    """PIECES (record_text's, written as they come) into the new file PATH, on disk before it returns."""
    with open(path, "x") as f:
        f.writelines(pieces)
        f.flush()
        os.fsync(f.fileno())


def record_text(record: dict) -> Iterator[str]:
    """RECORD as strict JSON (schema.strict), a piece at a time: its steps (a run's longest part,
    launch.events.Steps: 100,000 of them in a long run) one line each, written as they are read back, never all at
    once as dicts and text (that took 21 MiB of record and 100 MiB of memory for 100,000 steps, indented a line a
    field)."""
    steps = record.get("steps")
    if steps is None or isinstance(steps, str | dict):
        yield schema.dumps(record) + "\n"
        return
    mark = f"@@mlbench-steps-{uuid.uuid4().hex}@@"
    head, tail = schema.dumps(record | {"steps": mark}).split(f'"{mark}"')
    yield head + "["
    for n, row in enumerate(steps):
        yield ("," if n else "") + "\n  " + schema.dumps(row, indent=None)
    yield ("\n " if steps else "") + "]" + tail + "\n"


def publish(folder: Path, staging: Path, record: dict) -> Path:
    """Moves a finished run from its staging folder into place under the next free index (free: no result,
    record or rank-log folder of that index, whatever a dead run left); returns the result's path. Raises
    PublishError, with nothing placed, if it cannot: the staging folder stays, for its publisher to set aside
    (`set_aside`: a rename, which a full disk allows)."""
    placed: list[Path] = []
    log = staging / "mlperf.log"
    if not log.exists():  # the supervisor begins the log of a run whose rank 0 never did: not expected here
        raise PublishError("run not published: it left no MLPerf log")
    try:
        with open(log, "rb+") as f:
            os.fsync(f.fileno())  # on disk before it is a result
        i, held = 0, _held_by_hand(folder)
        while True:
            if _taken(folder, i, held):
                i += 1
                continue
            staged = staging / f"result_{i}.json"
            # written anew: one already there is a killed publisher's (or one a full disk or a lost host cut short),
            # never placed (its index is free): linked as it was, it was an empty or cut-short record
            with contextlib.suppress(FileNotFoundError):
                staged.unlink()
            _write_synced(staged, record_text(record | {"result": f"result_{i}.txt", "index": i}))
            try:  # the record claims the index: exclusive, so two runs publishing at once take different ones
                os.link(staged, folder / f"result_{i}.json")
            except FileExistsError:
                i += 1
                continue
            placed.append(folder / f"result_{i}.json")
            try:
                os.link(log, folder / f"result_{i}.txt")
            except FileExistsError:  # a result without its record appeared meanwhile: give the index up
                placed.pop().unlink()
                i += 1
                continue
            placed.append(folder / f"result_{i}.txt")
            break
        _fsync_dir(folder)
    except OSError as e:
        for p in placed:
            with contextlib.suppress(OSError):
                p.unlink()
        raise PublishError(f"run not published: {e.strerror or e} ({e.filename or folder})") from None
    _keep_rank_logs(folder, staging, i, record.get("status") != "success")
    shutil.rmtree(staging, ignore_errors=True)
    return folder / f"result_{i}.txt"


def _keep_rank_logs(folder: Path, staging: Path, i: int, failed: bool) -> None:
    """The rank logs, kept where they can be (the result stands without them), as logs/result_<i>; a failed run's
    launcher log with them (a rendezvous that failed says why there alone)."""
    ranks = staging / "ranks"
    with contextlib.suppress(OSError):
        if failed and (staging / "launcher.log").stat().st_size:
            ranks.mkdir(exist_ok=True)
            (staging / "launcher.log").rename(ranks / "launcher.log")
    if ranks.is_dir():
        with contextlib.suppress(OSError):
            (folder / "logs").mkdir(exist_ok=True)
            ranks.rename(folder / "logs" / f"result_{i}")


def _finish_publishing(folder: Path, staging: Path) -> None:
    """A publisher killed between its two links left a record without its log: the log is linked after it (both
    were on disk before the first link), or, where that name was taken meanwhile, the record is taken back. One
    killed after both finds its result whole: only its rank logs are moved."""
    for staged in staging.glob("result_*.json"):
        if not (index := staged.stem[len("result_"):]).isascii() or not index.isdigit():
            continue  # not a record mlbench staged
        placed, log = folder / staged.name, folder / f"{staged.stem}.txt"
        with contextlib.suppress(OSError):
            if not placed.samefile(staged):
                continue  # the record never claimed its index
            try:
                if not (log.exists() or log.is_symlink()):
                    os.link(staging / "mlperf.log", log)
                elif not log.samefile(staging / "mlperf.log"):
                    placed.unlink()  # the index is another result's: this record gives it up
                    continue
            except OSError:
                placed.unlink()  # the log cannot be placed: the record goes too (complete or absent)
                continue
            _fsync_dir(folder)
            _keep_rank_logs(folder, staging, int(index), _status(staged) != "success")


def _status(record: Path) -> object:
    """A record's status (None where it cannot be read: garbled, as a hostile hand may leave it)."""
    try:
        data = json.loads(record.read_text())
    except (OSError, ValueError, RecursionError):
        return None
    return data.get("status") if isinstance(data, dict) else None


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def set_aside(folder: Path, staging: Path) -> Path | None:
    """A run that cannot be published (its log could not be completed, no room to place it, or, for a dead run,
    whatever it left), moved out of the way (logs/unpublished-<its folder>): kept for a person to read, never taken
    for a result nor published again; a rename, which a full disk allows. None where it could not be moved."""
    dest = folder / "logs" / f"unpublished-{staging.name.lstrip('.')}"
    try:
        dest.parent.mkdir(exist_ok=True)
        staging.rename(dest)
        return dest
    except OSError:
        return None


def say_not_published(staging: Path, why: str) -> None:
    """For the command that publishes STAGING's run later (dead_runs): why its own mlbench, alive, could not. Appended
    to its events (no new file: a full disk allows it); where even that fails (a folder made read-only under the
    run), kept in this user's cache, keyed by the folder: the later record said 'mlbench died', which it had not."""
    try:
        with open(staging / "events.jsonl", "a") as f:
            f.write(json.dumps({"event": "not_published", "reason": why}) + "\n")
    except OSError:
        with contextlib.suppress(OSError):
            user_cache.write(_kept_reason_file(staging), json.dumps({"staging": str(staging.resolve()), "reason": why}))


def not_published_reason(staging: Path) -> str | None:
    """Why STAGING's own mlbench could not publish its run, where it could say so only in this user's cache."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        kept = json.loads(_kept_reason_file(staging).read_text())
        if kept.get("staging") == str(staging.resolve()) and isinstance(kept.get("reason"), str):
            return kept["reason"]
    return None


def forget_not_published(staging: Path) -> None:
    with contextlib.suppress(OSError):
        _kept_reason_file(staging).unlink()


def _kept_reason_file(staging: Path) -> Path:
    name = hashlib.sha256(str(staging.resolve()).encode(errors="surrogateescape")).hexdigest()[:32]
    return user_cache.folder() / "not-published" / name


def discard(staging: Path) -> None:
    """Drops a run that will not be published."""
    shutil.rmtree(staging, ignore_errors=True)


def keep_node_logs(folder: Path, staging: Path, node_rank: int) -> Path | None:
    """On a node other than node 0 (which publishes the run): keep its rank logs and its launcher's output (why a
    rendezvous failed), drop the staging folder. Returns where the logs went (None if they could not be kept, e.g.
    on a full disk). Named by node and time (node 0's result holds the run's seed, which every rank takes from rank
    0: the seed this node drew for itself was not the run's)."""
    dest = folder / "logs" / f"node{node_rank}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    ranks, launcher = staging / "ranks", staging / "launcher.log"
    kept = None
    with contextlib.suppress(OSError):
        if ranks.is_dir():
            dest.parent.mkdir(exist_ok=True)
            ranks.rename(dest)
            kept = dest
        elif launcher.exists():  # torchrun failed before its ranks' folder: its output alone says why
            dest.mkdir(parents=True)
            kept = dest
        if kept and launcher.exists():
            launcher.rename(dest / launcher.name)
    shutil.rmtree(staging, ignore_errors=True)
    return kept
