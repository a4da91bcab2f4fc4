"""The seeds a results folder holds, and a set's claim on the seeds of its runs to come.

Every run in a benchmark's folder needs a seed of its own (MLPerf's package checker rejects a set in which two runs
log one). A folder holds: the seeds its published logs state; those of the runs in its staging folders (a run in
progress, or one whose mlbench was killed, not yet published); and those a set in progress claimed for its runs
(`.seeds-<owner tag>-XXXX`, removed as its set ends, ignored and removed once its owner is gone). A set checks the
folder and writes its claim under the folder's lock (flock), so two sets started at once into one folder never both
take a seed: the second is refused, or draws other ones.

An owner on this host is judged by its pid. One on another host (a folder shared by several) cannot be: the owner
renews its claim's lease (the file's mtime) every RENEW_S while it runs, and a claim of another host's not renewed
for LEASE_S is judged dead (its process crashed, or its host went down), removed with a note. A SLURM set's claim is
made by the submitting `mlbench run` and names its job (`slurm_job`): the job's driver takes it over as it starts
(`adopt`), and until then, its submitter gone, the claim holds while SLURM says the job is pending or running.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Collection, Iterator
from pathlib import Path

from mlbench import owners, results
from mlbench.errors import UserError
from mlbench.spec import SEED_MAX

CLAIM = ".seeds-"
# The most of a staged plan.json or a claim read for its seeds (a plan is a few KB; the folder may hold anything).
_MAX_BYTES = 1 << 20
_MAX_RUNS = 1000  # preflight.MAX_RUNS: no set claims more (a claim of 2**32 seeds, put there, is none)
# A claim of another host's not renewed for this long is judged dead (its owner renews it every RENEW_S): long beside
# RENEW_S, so that a busy host, a slow shared filesystem or clocks a little apart do not lose a live claim
LEASE_S = 600.0
RENEW_S = 60.0
# A SLURM job that has not ended: its claim, handed over from its submitter, holds (squeue's states)
_JOB_ACTIVE = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING",
                         "SIGNALING", "STAGE_OUT", "STOPPED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"})


def held(folder: Path, say: Callable[[str], None] = lambda note: None) -> dict[int, str]:
    """Each seed FOLDER holds, and what holds it (the first published log by name, a run not yet published, a set
    in progress), for the refusal to name. SAY: the note for a claim of another host's judged dead (its lease)."""
    used = results.seeds_used(folder)
    with contextlib.suppress(OSError):
        for staging in sorted(folder.glob(f"{results.STAGING}*")):
            if (seed := _staged_seed(staging)) is not None:
                used.setdefault(seed, f"a run whose mlbench died, not yet published ({staging.name}: the next run "
                                      f"in the folder publishes it)" if owners.gone(results.owner_tag(staging))
                                else f"a run in progress ({staging.name})")
        for claim in sorted(folder.glob(f"{CLAIM}*")):
            first, runs = _claimed(claim, say)
            for seed in range(first, first + runs):
                used.setdefault(seed, f"a set in progress (pid {_owner(claim).split('-')[0]}; its claim {claim.name}, "
                                      f"to remove if that set is no longer running)")
    return used


def check_free(folder: Path, first: int, runs: int, used: dict[int, str] | None = None,
               say: Callable[[str], None] = lambda note: None) -> None:
    """The set's seeds (FIRST, FIRST + 1, ...) are none FOLDER holds: a second `--seed 5` set into one folder
    repeated the first set's runs seed for seed, and the folder became a set the package checker rejects."""
    used = held(folder, say) if used is None else used
    clash = sorted(s for s in used if first <= s < first + runs)
    if not clash:
        return
    mine = f"seeds {first} to {first + runs - 1}" if runs > 1 else f"seed {first}"
    after = max(used) + 1
    free = f"--seed {after} (past every seed the folder holds), " if after + runs - 1 <= SEED_MAX else ""
    raise UserError(f"--seed {first}: this set's {mine} would repeat seed {clash[0]} of {used[clash[0]]} in {folder}"
                    f"{f' (and {len(clash) - 1} more)' if len(clash) > 1 else ''}; a set's runs each need their own "
                    f"seed (MLPerf's package checker rejects a repeated one): give {free}no --seed (a random one), or "
                    f"--results DIR elsewhere")


def claim(folder: Path, first: int | None, runs: int,
          choose: Callable[[int | None, int, Collection[int]], list[int]],
          say: Callable[[str], None] = lambda note: None) -> list[int]:
    """The set's seeds, claimed in FOLDER: FIRST's (refused where the folder holds one of them) or, with FIRST None,
    those CHOOSE draws clear of the folder's. Checked and claimed under the folder's lock; the claim holds until
    `release` (or this process's end), its lease renewed meanwhile."""
    path = None
    try:
        with _locked(folder):
            used = held(folder, say)
            if first is not None:
                check_free(folder, first, runs, used)
            seeds = choose(first, runs, used)
            fd, path = tempfile.mkstemp(prefix=f"{CLAIM}{owners.tag()}-", dir=folder)
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps({"first": seeds[0], "runs": runs}) + "\n")
    except OSError as e:  # a full disk: as a run's staging folder that cannot be made (runner.NotStaged)
        if path:
            with contextlib.suppress(OSError):
                os.unlink(path)
        raise UserError(f"results folder {folder}: cannot write a run's files ({e.strerror or e}); free space or pass "
                        f"--results DIR elsewhere") from None
    _renewer.add(folder)
    return seeds


def mine(folder: Path) -> str:
    """The name of this process's claim in FOLDER ("" where it has none): handed to a SLURM job (`adopt`)."""
    return next((p.name for p in sorted(folder.glob(f"{CLAIM}{owners.tag()}-*"))), "")


def hand_to_job(folder: Path, name: str, job_id: str) -> None:
    """This process's claim NAME in FOLDER names the SLURM job JOB_ID it was made for: should this process end before
    the job's driver takes it over (`adopt`), the claim holds while the job is pending or running. Best effort."""
    path = folder / name
    with contextlib.suppress(OSError), _locked(folder):
        data = _json(path)
        if isinstance(data, dict) and _owner(path) == owners.tag():  # (not yet taken over by the job's driver)
            fd, tmp = tempfile.mkstemp(prefix=".tmp-claim-", dir=folder)
            try:
                with os.fdopen(fd, "w") as f:
                    f.write(json.dumps({**data, "slurm_job": job_id}) + "\n")
                os.replace(tmp, path)
            except OSError:  # (a full disk): the claim stays as it was, no stray file beside it in the results
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise


def adopt(folder: Path, name: str, first: int, runs: int) -> list[int] | None:
    """The seeds of the claim NAME in FOLDER, handed to this process (a SLURM job's driver, by its submitter), made
    this process's own (renamed to its tag: judged by its pid and lease from now on, removed by `release`); None
    where that claim is gone or is not of FIRST and RUNS (the set then claims its seeds as any set does)."""
    path = folder / name
    with contextlib.suppress(OSError), _locked(folder):
        data = _json(path)
        if not name.startswith(CLAIM) or "/" in name or not isinstance(data, dict) or \
                (data.get("first"), data.get("runs")) != (first, runs):
            return None
        os.rename(path, folder / f"{CLAIM}{owners.tag()}-{name.rpartition('-')[2]}")
        _renewer.add(folder)
        return list(range(first, first + runs))
    return None


def release(folder: Path) -> None:
    """This process's claims in FOLDER removed: its set has ended (its runs' seeds are in their logs now). A claim it
    handed to a SLURM job that has not ended is left (`hand_to_job`): judged by the job's state from now on, as a
    killed submitter's is. A submitter that raised while its job was pending removed it, and the job lost its seeds."""
    _renewer.discard(folder)
    with contextlib.suppress(OSError):
        for path in folder.glob(f"{CLAIM}{owners.tag()}-*"):
            data = _json(path)
            job = data.get("slurm_job") if isinstance(data, dict) else None
            # (the job's driver, having taken the claim over, is that job: its set has ended, no squeue to ask)
            if job == os.environ.get("SLURM_JOB_ID") or not _job_holds(data):
                path.unlink()


def renew() -> None:
    """This process's claims' leases renewed (their mtime now), in every folder it holds some in."""
    for folder in _renewer.folders():
        with contextlib.suppress(OSError):
            for path in folder.glob(f"{CLAIM}{owners.tag()}-*"):
                os.utime(path)


def renew_due() -> None:
    """`renew`, where RENEW_S has passed since the last: called from the loops that wait on a run (the supervisor's
    poll, the SLURM follower's), so a process that hangs or dies renews nothing. Not a thread: the supervisor starts
    ranks with preexec_fn, which may deadlock a child forked while another thread runs (lifeline.dying_with_parent)."""
    now = time.monotonic()
    if _renewer.folders() and now - _renewer.renewed >= RENEW_S:
        _renewer.renewed = now
        renew()


class _Renewer:
    """The folders this process holds claims in, and when it last renewed them."""

    def __init__(self) -> None:
        self._folders: set[Path] = set()
        self.renewed = time.monotonic()

    def add(self, folder: Path) -> None:
        self._folders.add(folder)

    def discard(self, folder: Path) -> None:
        self._folders.discard(folder)

    def folders(self) -> list[Path]:
        return list(self._folders)


_renewer = _Renewer()


@contextlib.contextmanager
def released(folder: Path) -> Iterator[None]:
    """Within: a set claims its seeds in FOLDER and runs; on every way out (its end, an error, a stop signal raised
    as `errors.Stopped` between its claim and its first run) this process's claims there are removed, rather than
    left until the next command in the folder finds their owner gone."""
    try:
        yield
    finally:
        release(folder)


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """FOLDER's lock, held while its seeds are read and a claim written (a moment); let go as the process ends,
    however it ends. A filesystem without locks (ENOLCK) goes unlocked, as before there were any."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:  # removed meanwhile by a command refused at once, as it cleared its empty folders
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _owner(claim_path: Path) -> str:
    return claim_path.name[len(CLAIM):].rpartition("-")[0]  # .seeds-<owner tag>-XXXX


def _claimed(path: Path, say: Callable[[str], None]) -> tuple[int, int]:
    """The seeds a claim holds (first, runs); (0, 0) for a dead owner's (removed: SAY says so of another host's), and
    for one that cannot be read (one being written, or whatever was put there)."""
    data = _json(path)
    first, runs = (data.get("first"), data.get("runs")) if isinstance(data, dict) else (None, None)
    if (dead := _dead(path, data)) is not None:
        with contextlib.suppress(OSError):
            path.unlink()
        if dead:
            say(dead)
        return 0, 0
    if type(first) is not int or type(runs) is not int or not 0 <= first <= SEED_MAX or not 0 < runs <= _MAX_RUNS:
        return 0, 0
    return first, runs


def _dead(path: Path, data: object) -> str | None:
    """Why the claim at PATH (holding DATA) is dead: "" for an owner of this host that is gone (said by none), the
    note for another host's whose lease ran out; None where it holds (a live owner, a SLURM job it names that has
    not ended, one SLURM does not answer for)."""
    owner = _owner(path)
    if owners.gone(owner):
        why = ""
    elif owners.elsewhere(owner) and (age := _age(path)) is not None and age > LEASE_S:
        why = (f"note: seed claim {path} removed: its owner (pid {owner.split('-')[0]} on "
               f"{owner.split('-', 2)[2].rpartition('@')[0]}) has not renewed it for {age / 60:.0f} min (a claim's "
               f"lease is {LEASE_S / 60:g} min): its set is judged to have died")
    else:
        return None
    return None if _job_holds(data) else why


def _job_holds(data: object) -> bool:
    """Whether a claim holding DATA was handed to a SLURM job that has not ended (or SLURM does not answer for)."""
    job = data.get("slurm_job") if isinstance(data, dict) else None
    return isinstance(job, str) and job.isdigit() and _job_active(job) is not False


def _age(path: Path) -> float | None:
    """Seconds since PATH's lease was last renewed (its mtime); None where it cannot be told."""
    try:
        return time.time() - path.stat().st_mtime
    except OSError:
        return None


def _job_active(job_id: str) -> bool | None:
    """Whether SLURM job JOB_ID has not ended (squeue lists it pending, running, ...); None where SLURM does not answer
    (its claim is then kept); False on a host without squeue (the claim is judged as its owner is: its lease)."""
    try:
        out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        return False
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:  # "Invalid job id specified": ended and gone from slurmctld; else no answer
        return False if "Invalid job id" in out.stderr else None
    return out.stdout.strip() in _JOB_ACTIVE


def _staged_seed(staging: Path) -> int | None:
    """The seed of the run in STAGING: its log's (only rank 0 writes one), or, before rank 0 logged it, its plan's
    where the run is of one node (another node's plan holds the seed that node drew, not the run's: node 0's own
    set, with the same --seed into a shared folder, was refused for it)."""
    if (seed := results.logged_seed(staging / "mlperf.log")) is not None:
        return seed
    plan = _json(staging / "plan.json")
    with contextlib.suppress(AttributeError, KeyError, TypeError):
        if plan["layout"]["nodes"] == 1 and type(plan["seed"]) is int:
            return plan["seed"]
    return None


def _json(path: Path) -> object:
    """PATH's JSON (None where it is no regular file of at most _MAX_BYTES, or no JSON)."""
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > _MAX_BYTES:
            return None
        return json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return None
