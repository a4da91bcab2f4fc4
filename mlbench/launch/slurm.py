"""The SLURM launcher: an sbatch job whose batch step runs the driver (`python -m mlbench.launch.slurm_job`),
which starts each run with srun (one torchrun per node), supervises it and publishes its result, exactly as
a local run does. The submitting side checks the request first (`sbatch --test-only`), submits, follows the
job's output, and reports the runs it produced.
"""

from __future__ import annotations

import codecs
import contextlib
import dataclasses
import errno
import json
import os
import pwd
import re
import select
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.text import Text

from mlbench import seed_claims
from mlbench.errors import SystemFailure, UserError, printable
from mlbench.launch import lifeline
from mlbench.launch.slurm_script import SlurmJob, render, srun_argv, time_limit_seconds
from mlbench.launch.supervise import STOP_SIGNALS, EventTail
from mlbench.layout import Layout
from mlbench.logfile import file_kind
from mlbench.progress import Progress, is_progress_line
from mlbench.runner import RunOptions
from mlbench.runner import seeds as seeds_for
from mlbench.spec import Benchmark

# A job pending for one of these reasons will never start: fail instead of waiting forever.
NEVER_STARTS = ("PartitionConfig", "PartitionNodeLimit", "ReqNodeNotAvail", "BadConstraints", "InvalidAccount",
                "InvalidQOS", "PartitionTimeLimit", "AccountNotAllowed", "QOSMaxNodePerJobLimit")


CURRENT_RUN = "current_run"  # in the job folder: the staging folder of the run the driver is training
# In the job folder: mlbench's user stopped the job (the follower's scancel, on Ctrl-C or SIGTERM), written before
# it signals the batch step: the driver's SIGTERM is then the user's, not SLURM's warning before the time limit
STOP_REQUESTED = "stop_requested"
# The start of the driver's line in job.out for an error it also wrote in the job's summary (a rendezvous address
# that does not resolve): the follower says that error itself, on stderr (SlurmLauncher.collect), so JobOutput does
# not show this line; streamed too, it was said twice, once on stdout among the job's output
SUMMARY_ERROR = "error (the job's summary): "
WARN_LEAD_S = 120  # SLURM's warning (SIGTERM to the batch step) this many seconds before the time limit


@dataclass
class SlurmOptions:
    partition: str | None = None
    account: str | None = None
    time_limit: str = "02:00:00"
    sbatch_args: list[str] = field(default_factory=list)
    container_image: str | None = None
    container_mounts: list[str] = field(default_factory=list)
    master_addr: str | None = None  # None: the first node of the allocation
    master_port: int = 29500
    gpus_per_node: int = 0  # GPUs to request per node (0 on CPU clusters)


def job_for(layout: Layout, opts: SlurmOptions, name: str, job_dir: Path, driver: list[str] | None,
            command: list[str] = (), ranks_dir: Path | None = None, master_port: int | None = None,
            rdzv_timeout: float | None = None) -> SlurmJob:
    warn = f"B:TERM@{WARN_LEAD_S}" if warns(opts) else None
    return SlurmJob(
        job_name=f"mlbench-{name}", command=list(command) or ["-m", "mlbench.train"], nodes=layout.nodes,
        gpus_per_node=opts.gpus_per_node, nproc_per_node=layout.nproc_per_node, partition=opts.partition,
        account=opts.account,
        time_limit=opts.time_limit, sbatch_options=list(opts.sbatch_args), container_image=opts.container_image,
        container_mounts=list(opts.container_mounts), output=str(job_dir / "job.out"),
        env={"PYTHONUNBUFFERED": "1", "PYTHONWARNINGS": "ignore"}, master_addr=opts.master_addr,
        master_port=master_port or opts.master_port, signal=warn,
        torchrun=str(Path(sys.executable).with_name("torchrun")),  # this environment's, on every node
        torchrun_args=["--redirects=3"] if ranks_dir else (), log_dir=str(ranks_dir) if ranks_dir else None,
        driver=driver,
        rdzv_timeout=rdzv_timeout)


def warns(opts: SlurmOptions) -> bool:
    """Whether the job asks SLURM's warning before its time limit (WARN_LEAD_S), where the limit leaves room for it."""
    try:
        return time_limit_seconds(opts.time_limit) > 2 * WARN_LEAD_S
    except ValueError:
        return False  # a malformed limit: SlurmJob.validate names it


def _script(bench: Benchmark, layout: Layout, opts: SlurmOptions, job_dir: Path) -> str:
    driver = [sys.executable, "-m", "mlbench.launch.slurm_job", str(job_dir / "job.json")]
    return render(job_for(layout, opts, bench.name, job_dir, driver))


def write_job(bench: Benchmark, layout: Layout, run_opts: RunOptions, opts: SlurmOptions, folder: Path) -> Path:
    """Writes the job folder (the spec for the driver, the sbatch script) under `folder`/.slurm; returns it."""
    job_dir = None
    try:
        (folder / ".slurm").mkdir(exist_ok=True)
        # unique even for two launches in the same second
        job_dir = Path(tempfile.mkdtemp(prefix=time.strftime("%Y%m%d-%H%M%S-"), dir=folder / ".slurm"))
        spec = {"benchmark": dataclasses.asdict(bench), "layout": dataclasses.asdict(layout),
                "run": {k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(run_opts).items()},
                "slurm": dataclasses.asdict(opts)}
        (job_dir / "job.json").write_text(json.dumps(spec, indent=1))
        (job_dir / "job.sbatch").write_text(_script(bench, layout, opts, job_dir))
    except (ValueError, OSError) as e:
        if job_dir:
            shutil.rmtree(job_dir, ignore_errors=True)
        if isinstance(e, OSError):  # the path at fault named: '.slurm' a file or a dead link said only 'File exists'
            raise UserError(f"cannot write the SLURM job in {folder}: {e.filename or folder}: {e.strerror or e} (the "
                            f"job's files go in {folder / '.slurm'}, a folder of its own: move what is in the way, or "
                            f"pass --results DIR elsewhere)") from None
        raise UserError(f"cannot write the SLURM job: {e}") from None
    except BaseException:  # a stop signal as it is written: no job comes of it
        if job_dir:
            shutil.rmtree(job_dir, ignore_errors=True)
        raise
    return job_dir


CLIENT_COMMANDS = ("sbatch", "squeue", "scancel")  # what a run needs before it submits: to follow and to stop it
TIMEOUT_S = 60.0  # the longest one SLURM client command may take: a controller that does not answer


def _slurm(*argv: str, timeout: float | None = None) -> subprocess.CompletedProcess:
    """A SLURM client command's result; UserError where it is not there or does not answer in `timeout` s
    (TIMEOUT_S by default)."""
    if shutil.which(argv[0]) is None:
        raise UserError(f"{argv[0]} not found: --launcher slurm needs the SLURM client commands on PATH")
    timeout = timeout or TIMEOUT_S
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SystemFailure(f"{argv[0]} did not answer within {timeout:g} s: is the SLURM controller up? "
                        f"(`scontrol ping`)") from None


WITHDRAW_S = 10.0  # for sbatch's answer once a stop came as it submitted: the job it may have submitted is cancelled


@contextlib.contextmanager
def _stops_held() -> Iterator[None]:
    """Within, the stop signals wait (blocked; delivered as it ends): a stop between starting a client command that
    changes the cluster and knowing its process cannot leave that command's effect unknown."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def _submit(script: Path) -> subprocess.Popen:
    """`sbatch --parsable --wait SCRIPT`: it dies with this process (the job runs on without it: its driver supervises
    it), in its own session (a Ctrl-C at the terminal is this process's to handle: sbatch ended by it could take its
    job's id with it), with the stop signals this process holds as it starts it unblocked."""
    def child() -> None:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        lifeline.die_with_parent()

    return subprocess.Popen(["sbatch", "--parsable", "--wait", str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=child)


def scancel(*argv: str) -> str:
    """`scancel ARGV`: "" where it did it, else why not (its own words: a controller that does not answer, a job
    already gone; or no scancel on PATH). An exception from it in a signal handler ended `mlbench run` (exit 2) with
    the job running unfollowed; a scancel that failed was said as done."""
    try:
        done = subprocess.run(["scancel", *argv], capture_output=True, text=True, timeout=SCANCEL_S)
    except subprocess.TimeoutExpired:
        return f"scancel did not answer within {SCANCEL_S:g} s: is the SLURM controller up? (`scontrol ping`)"
    except OSError as e:
        return f"scancel: {e.strerror or e}"
    return "" if done.returncode == 0 else (" ".join(done.stderr.split()) or f"scancel exited with code "
                                             f"{done.returncode}")


SCANCEL_S = 30.0  # for one scancel, in a signal handler: a controller that does not answer is not waited for ever


def _first_line(proc: subprocess.Popen, timeout: float) -> str | None:
    """The first line PROC writes (stripped; "" if it ends first), or None where none comes within TIMEOUT s: a
    blocking readline waited for ever on an sbatch that took --test-only, then did not answer the submission."""
    fd, got, deadline = proc.stdout.fileno(), b"", time.monotonic() + timeout
    while b"\n" not in got:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            return None
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        got += chunk
    return got.split(b"\n", 1)[0].decode(errors="replace").strip()


def refusal_hint(refused: str, gpus_per_node: int) -> str:
    """Which of the user's flags to check for sbatch --test-only's refusal REFUSED. A GPU count no node has was
    refused as an "Invalid generic resource (gres) specification", the hint naming every flag but --gpus-per-node."""
    if gpus_per_node and re.search(r"gres|generic resource", refused, re.IGNORECASE):
        return (f"--gpus-per-node {gpus_per_node}: no node of the partition has that many GPUs, as SLURM counts them "
                f"(`sinfo -o '%P %N %G'` lists each node's); give at most a node's GPUs, or 0 on a CPU cluster")
    return f"check --nodes, --partition, --account, --time{', --gpus-per-node' if gpus_per_node else ''}"


class SlurmLauncher:
    """`--launcher slurm` (mlbench.launch's contract): prepare writes the job and has SLURM check it
    (`sbatch --test-only`: a request it cannot run is refused before submitting); start submits it; supervise
    follows it (its state as it changes, the driver's output with each run's progress, a pending reason that
    means it never starts); collect reports the runs it published."""

    def __init__(self, bench: Benchmark, layout: Layout, run_opts: RunOptions, opts: SlurmOptions, console: Console):
        self.bench, self.layout, self.run_opts, self.opts, self.console = bench, layout, run_opts, opts, console

    def describe(self, folder: Path) -> list[tuple[str, str]]:
        per_run = job_for(self.layout, self.opts, self.bench.name, folder / ".slurm" / "JOB", driver=None,
                          command=["-m", "mlbench.train", "PLAN.json"], ranks_dir=Path("STAGING/ranks"),
                          rdzv_timeout=self.run_opts.rdzv_timeout)
        try:
            script = _script(self.bench, self.layout, self.opts, folder / ".slurm" / "JOB")
        except ValueError as e:
            raise UserError(f"cannot write the SLURM job: {e}") from None
        return [("each run starts (in the job)", shlex.join(srun_argv(per_run))),
                ("sbatch script (not submitted)", script)]

    def prepare(self, folder: Path) -> None:
        missing = [c for c in CLIENT_COMMANDS if shutil.which(c) is None]
        if missing:  # before the job is written: a job submitted that could not be followed or stopped
            raise UserError(f"{' and '.join(missing)} not found: --launcher slurm needs the SLURM client commands "
                            f"({', '.join(CLIENT_COMMANDS)}) on PATH")
        # The folders the job's folder is made in, from the results root down, that are not there yet
        self._made = [p for p in (*reversed(folder.parents[:2]), folder, folder / ".slurm") if not p.exists()]
        self.job_dir, self.folder = None, folder
        try:
            run_opts = self._claim_seeds(folder)
            self.job_dir = write_job(self.bench, self.layout, run_opts, self.opts, folder)
            test = _slurm("sbatch", "--test-only", str(self.job_dir / "job.sbatch"))
        except BaseException:  # (a stop signal as sbatch checks it left the job's folder, job.sbatch in it)
            self._drop_job()
            raise
        if test.returncode != 0:
            self._drop_job()
            msg = " ".join(test.stderr.split()) or "sbatch --test-only refused the job"
            raise UserError(f"SLURM cannot run this job: {msg} ({refusal_hint(msg, self.opts.gpus_per_node)})")

    def _claim_seeds(self, folder: Path) -> RunOptions:
        """The set's seeds claimed here, as the job is submitted, and the claim handed to the job (its run options):
        claimed by its driver as it started, a job pending meanwhile was refused at its start where another set had
        taken them. The claim goes with this process where no job takes it over (a refused or failed submission, a
        job cancelled before it started: `seed_claims.released`, launch.start); it names the job once submitted
        (`start`), and holds while the job is pending, this process gone."""
        seeds = seed_claims.claim(folder, self.run_opts.seed, self.run_opts.runs, seeds_for,
                                  say=lambda note: self.console.print(printable(note), highlight=False,
                                                                      soft_wrap=True))
        self.claim_name = seed_claims.mine(folder)
        return dataclasses.replace(self.run_opts, seed=seeds[0], seed_claim=self.claim_name)

    def _drop_job(self) -> None:
        """The job's folder, when no job was submitted from it, and the folders made for it (when nothing else
        came into them meanwhile): a refused run leaves nothing."""
        if self.job_dir is not None:
            shutil.rmtree(self.job_dir, ignore_errors=True)
        for made in reversed(self._made):
            with contextlib.suppress(OSError):
                made.rmdir()

    def _withdraw(self) -> None:
        """A stop signal while sbatch submits: the controller may have taken the job before sbatch says its id (it
        then ran on, followed by nothing, the user told "aborted"). sbatch's answer is awaited a little (WITHDRAW_S)
        and a job it names is cancelled; then the job's folder goes, as a refused job's."""
        if self.proc is None:
            self._drop_job()
            return
        wait = min(WITHDRAW_S, TIMEOUT_S)
        self.console.print(f"stopping: waiting up to {wait:g} s for sbatch's answer, to cancel the job if it was "
                           f"submitted", highlight=False)
        answer = _first_line(self.proc, wait) or ""
        job_id = answer.split(";")[0]
        if re.fullmatch(r"[0-9]+", job_id):
            failed = scancel(job_id)
            self.console.print(f"SLURM job {job_id} was submitted as the stop came: "
                               + (f"could not cancel it ({failed}); cancel it with `scancel {job_id}`" if failed
                                  else "cancelled it"), highlight=False, soft_wrap=True)
        self._not_submitted()

    def _not_submitted(self, kill: bool = True) -> None:
        """sbatch ended (KILL: stopped) without a job id: its folder goes, as a refused job's."""
        if kill:
            self.proc.kill()
        self.proc.wait()
        self._drop_job()

    def start(self) -> None:
        self.proc = None
        try:
            with _stops_held():  # a stop as sbatch started left its job submitted, with nothing to cancel it
                self.proc = _submit(self.job_dir / "job.sbatch")
            answer = _first_line(self.proc, TIMEOUT_S)
        except BaseException:  # a stop signal while sbatch submits (its job folder was left)
            self._withdraw()
            raise
        if answer is None:  # it hung (the controller took --test-only, then stopped answering): not for ever
            self._not_submitted()
            raise SystemFailure(f"sbatch did not answer within {TIMEOUT_S:g} s: is the SLURM controller up? "
                            f"(`scontrol ping`); no job id came back")
        self.job_id = answer.split(";")[0]
        if not re.fullmatch(r"[0-9]+", self.job_id):  # --parsable: JOBID[;CLUSTER]
            self._not_submitted(kill=bool(self.job_id))
            why = " ".join(self.proc.stderr.read().split()) if not self.job_id else f"it answered {answer!r}, " \
                "not a job id"
            # (the request passed sbatch --test-only: its refusal now is the controller's, exit 1, not the input's)
            raise SystemFailure(f"sbatch did not submit the job: {why}")
        self.console.print(f"submitted SLURM job {self.job_id}; output {self.job_dir / 'job.out'}", highlight=False)
        seed_claims.hand_to_job(self.folder, self.claim_name, self.job_id)  # (held while it is pending)
        with contextlib.suppress(OSError):  # for scripts and tests; the job runs (and says so) without it
            (self.job_dir / "job_id").write_text(self.job_id + "\n")

    def supervise(self) -> None:
        runs = None
        if self.console.is_terminal:
            label = f"{self.bench.name}{' (tiny)' if self.bench.variant == 'tiny' else ''} (SLURM job {self.job_id})"
            runs = StagedRuns(self.job_dir / CURRENT_RUN, label, self.console)
        self.stops: list[str] = []
        self.code, self.ended = follow(self.proc, self.job_id, self.job_dir / "job.out", self.console, runs, self.stops)

    def collect(self) -> int:
        console, job_dir = self.console, self.job_dir
        runs, error = job_runs(job_dir, self.job_id)
        runs += left_run(job_dir, self.ended, console, self.job_id)
        if error:  # the job's driver failed before its set started (an unusable rendezvous address): exit 1
            raise SystemFailure(f"SLURM job {self.job_id}: {error}")
        for r in runs:
            mark = ("success", "green") if r["status"] == "success" else ("aborted", "red")
            console.print(Text.assemble(mark, f" {r['result']}" + (f" ({r['reason']})" if r["reason"] else "")),
                          highlight=False)
        if not runs and not job_dir.exists():  # (it said the job ended before it started: no run)
            console.print(Text(f"the job ended ({self.ended}) without recording a run: its folder {job_dir} was "
                               f"removed while it ran, and its output with it", style="red"))
        elif not runs and not (job_dir / "job.out").exists():  # (pointed at a file that was never written)
            console.print(Text(f"the job ended ({self.ended}) before it started: no run", style="red"))
        elif not runs:
            console.print(Text(f"the job ended ({self.ended}) without recording a run; see "
                               f"{job_dir / 'job.out'}", style="red"))
        if self.stops:  # 128 + the signal, as a local set stopped by one ends (the job's own code was 1 or 0)
            return 128 + signal.Signals[self.stops[0]].value
        # The job's own end where SLURM says it: sbatch --wait killed (or ended) while the job ran on to complete gave
        # exit 1 for a set whose every run succeeded
        completed = self.code == 0 or self.ended.startswith("COMPLETED, exit code 0:0")
        return 0 if runs and completed and all(r["status"] == "success" for r in runs) else 1


def job_runs(job_dir: Path, job_id: str) -> tuple[list[dict], str]:
    """The runs the job published (result, status, reason) and its driver's error, from the summary the driver writes
    as it ends; else, where it has none (the driver killed after publishing: a second stop's outright cancel), from
    the records in the results folder that name the job. Without that, a published run was said to be none: "the job
    ended (CANCELLED) without recording a run"; a summary cut short was a JSONDecodeError traceback."""
    with contextlib.suppress(OSError, ValueError, AttributeError, TypeError):
        ended = json.loads((job_dir / "summary.json").read_text())
        return [dict(r) for r in ended.get("runs", [])], str(ended.get("error") or "")
    runs = []
    for record in sorted(job_dir.parent.parent.glob("result_*.json"), key=lambda p: p.stem.split("_")[-1].zfill(12)):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            r = json.loads(record.read_text())
            if r["environment"]["slurm_job_id"] == job_id:
                runs.append(_run_said(record.with_suffix(".txt"), r))
    return runs, ""


def _run_said(result: Path, record: dict) -> dict:
    """A published run as the job's summary lists it: its RESULT (the .txt), and its RECORD's status and reason."""
    return {"result": str(result), "status": str(record["status"]), "reason": str(record.get("reason") or "")}


def left_run(job_dir: Path, ended: str, console: Console, job_id: str = "") -> list[dict]:
    """The run the job's driver was training as it died (killed, out of memory, its node lost: SLURM then ends the
    job), published as a dead run's is (dead_runs) once the job has ended (none of its processes lives): its staging
    folder, named in CURRENT_RUN, was left unpublished ('the job ended (FAILED, exit code 0:9) without recording a
    run'), and no later run published it but one on the driver's own node. Its reason says how the job ended and the
    driver's node (its node lost was 'mlbench (pid N) died before the run ended (killed, or its session lost);
    published as aborted by a later mlbench command'). [] where the driver left none."""
    from mlbench import dead_runs
    from mlbench.results import STAGING

    if not ended or ended.split(",")[0] in _ACTIVE or ended.startswith("sbatch exit code"):  # (not known to end)
        return []
    try:
        staging = Path((job_dir / CURRENT_RUN).read_text().strip())
    except OSError:
        return []
    if not staging.name.startswith(STAGING):
        return []
    host = job_fields(job_id, timeout=10).get("BatchHost", "") if job_id else ""
    death = dead_runs.Death(who=f"the SLURM job's driver{' on ' + host if host else ''}",
                            how=f"the job ended {ended}", by="mlbench run, following the job,")
    runs = []
    for path in dead_runs.publish_ended(job_dir.parent.parent, staging, console, death):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            runs.append(_run_said(path, json.loads(path.with_suffix(".json").read_text())))
    return runs


class StagedRuns:
    """On a terminal, the live panel of each run the job trains, as a local run shows it: rank 0's events from
    the staging folder the driver names in `current` (results folders are shared by every node and this host),
    until the run is published."""

    def __init__(self, current: Path, label: str, console: Console):
        self.current_file, self.label, self.console = current, label, console
        self.runs = 0
        self.current: tuple[Path, EventTail, Progress] | None = None

    def poll(self) -> None:
        try:
            named = Path(self.current_file.read_text().strip())
        except OSError:
            named = None
        if self.current is not None and self.current[0] != named:
            self.close()
        if self.current is None and named is not None and named.is_dir():
            self.runs += 1
            self.current = (named, EventTail(named / "events.jsonl"),
                            Progress(f"{self.label}, run {self.runs}", self.console).__enter__())
        if self.current is not None:
            staging, tail, progress = self.current
            if new := tail.poll():
                progress.on_events(new)
            if not staging.exists():  # published (or dropped)
                self.close()

    def close(self) -> None:
        if self.current is not None:
            self.current[2].__exit__(None, None, None)
            self.current = None


class _JobStopper:
    """The follower's handler of SIGTERM/SIGINT/SIGHUP. The first stop goes to the batch step alone (SIGTERM): the
    driver stops the run, logs it aborted and publishes it (a plain scancel SIGKILLs everything after KillWait); a
    job with no batch step yet (pending) refuses that ("Job is pending execution") and is cancelled outright, as
    at a second stop. CANCELS: the stops scancel delivered; SAID: what to say next, outside the handler."""

    def __init__(self, job_id: str, job_dir: Path, console: Console, cancels: list[str]):
        self.job_id, self.job_dir, self.console, self.cancels = job_id, job_dir, console, cancels
        self.said: list[str] = []
        self.asking = 0  # stops whose scancel is under way: a second stop meanwhile cancels outright

    def on_signal(self, signum: int, frame: object) -> None:
        self.asking += 1
        try:
            self._stop(signal.Signals(signum).name, first=self.asking == 1 and not self.cancels)
        finally:
            self.asking -= 1

    def _stop(self, name: str, first: bool) -> None:
        job_id, said = self.job_id, self.said
        # said at once: scancel may wait for a controller that does not answer (twice SCANCEL_S for the first stop)
        self.console.print(f"SLURM job {job_id}: {name}: stopping the job (scancel; up to "
                           f"{SCANCEL_S * (2 if first else 1):g} s where the SLURM controller does not answer)",
                           highlight=False)
        with contextlib.suppress(OSError):  # for the driver: this SIGTERM is the user's, not SLURM's warning
            (self.job_dir / STOP_REQUESTED).write_text(name + "\n")
        if first and not scancel("--signal=TERM", "--batch", job_id):
            if not self.cancels:  # (else a second stop, as this scancel waited, has cancelled the job outright)
                said.append(f"SLURM job {job_id}: {name}: stopping its run (it is logged aborted and published); "
                            f"again to cancel the job outright")
        elif failed := scancel(job_id):  # not counted: the job runs on, followed, and ends as it ends
            said.append(f"SLURM job {job_id}: {name}: could not cancel the job ({failed}); it runs on, followed: "
                        f"stop again to retry, or `scancel {job_id}`")
            with contextlib.suppress(OSError):
                if first:  # a SIGTERM the driver gets now is not the user's
                    (self.job_dir / STOP_REQUESTED).unlink()
            return
        else:
            said.append(f"SLURM job {job_id}: {name}: cancelling the job")
        self.cancels.append(name)


def follow(proc: subprocess.Popen, job_id: str, out: Path, console: Console, runs: StagedRuns | None = None,
           stops: list[str] | None = None) -> tuple[int, str]:
    """Follows a submitted job to its end (`sbatch --wait` in `proc`): its state as it changes, its output, and
    with `runs` (on a terminal) each run's live panel in place of the output's progress lines; returns sbatch's
    exit code and how the job ended (its state, or that code where SLURM does not say). SIGTERM/SIGINT/SIGHUP stop
    it (their names appended to STOPS, where scancel delivered them): the first through the driver (the run logged
    aborted and published), or outright where the job has not started; a second outright."""
    stopper = _JobStopper(job_id, out.parent, console, [] if stops is None else stops)
    said = stopper.said
    previous = {s: signal.signal(s, stopper.on_signal) for s in STOP_SIGNALS}
    shown, said_orphan = "", False
    # (the panel shows what progress lines say)
    output = JobOutput(out, console, drop_progress=runs is not None, user_stopped=lambda: bool(stopper.cancels))
    try:
        state: list[str] = []
        while proc.poll() is None or (len(state) == 3 and state[0] in _UNDER_WAY):
            if proc.poll() is None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(1.0)
            else:  # sbatch --wait ended (killed) as the job ran on: followed by its state, not waited 120 s for
                time.sleep(1.0)
            while said:
                console.print(said.pop(0), highlight=False)
            output.show()
            seed_claims.renew_due()
            if runs is not None:
                runs.poll()
            try:  # '|': a pending reason may hold spaces ("Nodes required for job are DOWN, ...")
                state = _slurm("squeue", "-h", "-j", job_id, "-o", "%T|%r|%N", timeout=30).stdout.strip().split("|")
            except UserError:  # the controller did not answer this time: the job's own end still comes
                state = []
            if len(state) == 3 and "|".join(state) != shown:  # as it changes: pending (why), running (where)
                shown = "|".join(state)
                where = f" on {state[2]}" if state[0] == "RUNNING" and state[2] else ""
                # ("None": no reason yet, as the job waits for the scheduler's next pass; said as "PENDING (None)")
                why = f" ({state[1]})" if state[0] == "PENDING" and state[1] not in ("", "None") else ""
                console.print(f"SLURM job {job_id}: {state[0]}{why}{where}", highlight=False)
            if proc.poll() is not None and len(state) == 3 and state[0] in _UNDER_WAY and not said_orphan:
                said_orphan = True
                console.print(f"SLURM job {job_id}: sbatch --wait ended (exit code {proc.returncode}) while the job "
                              f"runs on: following it by its state", highlight=False)
            if len(state) == 3 and state[0] == "PENDING" and state[1] in NEVER_STARTS:
                failed = scancel(job_id)
                if not failed:
                    proc.wait()
                done = f"could not cancel it ({failed}): `scancel {job_id}`" if failed else "cancelled it"
                raise UserError(f"SLURM job {job_id} cannot start ({state[1]}); {done}. Check --nodes, "
                                f"--partition and --account against `sinfo`")
        # sbatch returns as the job's state leaves RUNNING (or when it is interrupted itself); the driver may still
        # be publishing its last run while the job is COMPLETING. Its state, and its summary, are read once ended.
        state = _ended_state(job_id, console)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        if runs is not None:
            runs.close()
    while said:
        console.print(said.pop(0), highlight=False)
    output.show(last=True)
    # sbatch's own exit code said nothing of a job SLURM ended ("sbatch exit code 0" for one at its time limit)
    ended = state or f"ended (sbatch exit code {proc.returncode})"
    if stopper.cancels and state:  # the user's stop: SLURM's state ("FAILED": the driver's exit code for it) and why
        ended = f"{state.split(': ')[0]}: stopped at mlbench run's {stopper.cancels[0]}"
    console.print(f"SLURM job {job_id}: {ended}", highlight=False)
    return proc.returncode, state or f"sbatch exit code {proc.returncode}"


class JobOutput:
    """What the job has written to its output file since the last look, shown as text. The file is the job's (sbatch
    writes it, and anyone may replace it): a folder or an unreadable file in its place ended `mlbench run` with
    "Is a directory" (exit 2) and left the job running unfollowed, and a character cut in two by the read (or bytes
    that are not UTF-8) was a UnicodeDecodeError traceback. Now said once; the job is followed by its state. Only a
    regular file is read: a link to /dev/zero in its place made the final read loop for ever, and a FIFO blocked its
    open (each said once, then the output is no longer looked at)."""

    def __init__(self, path: Path, console: Console, drop_progress: bool,
                 user_stopped: Callable[[], bool] = lambda: False):
        self.path, self.console, self.drop_progress = path, console, drop_progress
        self.user_stopped = user_stopped  # whether mlbench run's user has stopped the job (the follower's scancel)
        self.pos = 0
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.partial = ""  # a line cut by a read's end, shown with its end: a line is judged whole
        self.failed = False
        self.stopped = False  # not a regular file: not looked at again

    CHUNK = 1 << 20  # read and shown at a time: the whole new part at once took 8 times its size (3.2 GB for 400 MB)
    PER_LOOK = 64  # chunks at most a look shows (the follower's other work, its stops, waits meanwhile); all at the end

    def show(self, last: bool = False) -> None:
        """The new output: up to PER_LOOK chunks; LAST: all the file held as this look began (what is appended
        meanwhile is not waited for: a file that grows for ever held the follower for ever)."""
        chunks, end = 0, None
        while True:
            data, size = self._read(self.CHUNK if end is None else max(0, min(self.CHUNK, end - self.pos)))
            end = size if end is None else end
            chunks += 1
            done = len(data) < self.CHUNK or (last and self.pos >= end) or (not last and chunks >= self.PER_LOOK)
            self._show(data, final=last and done)
            if done:
                return

    def _read(self, count: int) -> tuple[bytes, int]:
        """Up to COUNT bytes from where the last read ended, and the file's size ((b"", 0) where it cannot be read)."""
        if self.stopped:
            return b"", 0
        try:
            # not following a link, nor waiting for a FIFO's writer: only a regular file is the job's output
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:  # not yet written (a job pending), or removed
            return b"", 0
        except OSError as e:
            self._say("a symbolic link, not a regular file" if e.errno == errno.ELOOP else e.strerror or e)
            self.stopped = e.errno == errno.ELOOP
            return b"", 0
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                self._say(f"{file_kind(st.st_mode)}, not a regular file")
                self.stopped = True
                return b"", 0
            data = os.pread(fd, count, self.pos)
            self.pos += len(data)
            return data, st.st_size
        except OSError as e:
            self._say(e.strerror or e)
            return b"", 0
        finally:
            os.close(fd)

    def _say(self, why: object) -> None:
        if not self.failed:
            self.failed = True
            self.console.print(printable(f"cannot read the job's output {self.path} ({why}); following the job by "
                                         f"its state"), highlight=False, soft_wrap=True)

    def _show(self, data: bytes, final: bool) -> None:
        chunk = self.partial + self.decoder.decode(data, final=final)
        whole = chunk.rfind("\n") + 1
        if final or len(chunk) - whole > self.CHUNK:  # (a "line" longer than a chunk is shown as it comes)
            self.partial = ""
        else:
            chunk, self.partial = chunk[:whole], chunk[whole:]
        hide_cancel = self.user_stopped()
        if self.drop_progress or hide_cancel or SUMMARY_ERROR in chunk:
            chunk = "".join(ln for ln in chunk.splitlines(keepends=True)
                            if not (self.drop_progress and is_progress_line(ln)
                                    or hide_cancel and _STEPD_CANCELLED.match(ln)
                                    or ln.startswith(SUMMARY_ERROR)))
        if chunk:
            self.console.out(chunk, end="", highlight=False)


# slurmstepd's line in the job's output as the batch step is signalled or the job cancelled: after the user's own
# stop (the follower's scancel) it said "CANCELLED" of a job whose run was being stopped, logged aborted and
# published, beside mlbench's own stop lines; it is not shown then (SLURM's time limit or a node's failure, "...
# CANCELLED AT <time> DUE TO TIME LIMIT", and a cancel by someone else are shown: they say why)
_STEPD_CANCELLED = re.compile(r"slurmstepd(?:-[^:\s]*)?: error: \*\*\* (?:JOB|STEP) [0-9.]+ ON \S+ CANCELLED AT \S+ "
                              r"\*\*\*\s*$")


# States of a job that has not ended (its processes may still run: COMPLETING waits for them)
_ACTIVE = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING",
                     "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD", "REQUEUE_FED", "REQUEUE_HOLD"})
_UNDER_WAY = frozenset({"PENDING", "CONFIGURING", "RUNNING", "SUSPENDED"})  # what sbatch --wait waits through
END_WAIT_S = 120.0  # for the job to end after sbatch returned: the driver stops its run and publishes it


def _ended_state(job_id: str, console: Console, limit_s: float = END_WAIT_S) -> str:
    """`final_state` once the job has ended (waiting up to LIMIT_S, saying so), or its state then."""
    deadline, said = time.monotonic() + limit_s, False
    while True:
        state = final_state(job_id)
        word = state.split(",")[0]
        if word not in _ACTIVE or time.monotonic() > deadline:
            return state
        if not said:
            console.print(f"SLURM job {job_id}: {word}; waiting for it to end", highlight=False)
            said = True
        time.sleep(0.5)


def job_fields(job_id: str, timeout: float = 30) -> dict[str, str]:
    """The job's fields as `scontrol show job` gives them (JobState, Reason, TimeLimit, EndTime, ...) while slurmctld
    holds it (MinJobAge after its end); {} where it does not, or does not answer."""
    with contextlib.suppress(UserError, subprocess.TimeoutExpired):
        shown = _slurm("scontrol", "show", "job", "-o", job_id, timeout=timeout).stdout
        return dict(w.split("=", 1) for w in shown.split() if "=" in w)
    return {}


# What a job's end state means, where SLURM (or someone) ended it: said after it on the follower's end line
_ENDED = {"TIMEOUT": "SLURM stopped it at its time limit{limit}", "NODE_FAIL": "a node failed and SLURM stopped it",
          "CANCELLED": "cancelled (scancel)", "PREEMPTED": "preempted by SLURM for another job",
          "OUT_OF_MEMORY": "a step ran out of memory", "BOOT_FAIL": "its nodes failed to boot",
          "DEADLINE": "its deadline (--deadline) passed"}


def final_state(job_id: str) -> str:
    """The ended job's state and exit code as SLURM records them, and what the state means where SLURM ended it
    (e.g. "COMPLETED, exit code 0:0", "TIMEOUT, exit code 0:15: SLURM stopped it at its time limit (--time
    00:01:00)"), or "": from slurmctld while it still holds the job, then from accounting, then from the job
    completion log."""
    fields = job_fields(job_id)
    if "JobState" in fields:
        return _said_state(fields["JobState"], fields.get("ExitCode", "?"), fields.get("TimeLimit", ""))
    for extra in ([], ["--completion"]):
        with contextlib.suppress(UserError, subprocess.TimeoutExpired):
            out = _slurm("sacct", *extra, "-n", "-X", "-P", "-j", job_id, "-o", "State,ExitCode", timeout=30)
            line = out.stdout.strip().splitlines()[:1]
            if out.returncode == 0 and line and "|" in line[0]:
                state, code = line[0].split("|", 1)
                return _said_state(state.split()[0], code, "")
    return ""


def _said_state(state: str, code: str, limit: str) -> str:
    meaning = _ENDED.get(state, "").format(limit=f" (--time {limit})" if limit else "")
    return f"{state}, exit code {code}{': ' + meaning if meaning else ''}"


def stopped_by_slurm(fields: dict[str, str], down: str = "") -> str:
    """Why SLURM itself ended the job, in a run's reason's words, from its `scontrol show job` FIELDS: its Reason
    while it completes (TimeLimit, NodeDown: the batch step's SIGTERM comes then), its state once ended; DOWN: the
    job's nodes that failed. "" where SLURM did not end it."""
    state, why = fields.get("JobState", ""), fields.get("Reason", "")
    if state == "TIMEOUT" or why == "TimeLimit":
        return f"the SLURM job reached its time limit (--time {fields.get('TimeLimit', '?')}): SLURM stopped it"
    if state == "NODE_FAIL" or why == "NodeDown":
        which = f"the SLURM job's node{'s' if ',' in down else ''} {down}" if down else "a node of the SLURM job"
        return f"{which} failed (NODE_FAIL): SLURM stopped the job"
    return ""


def time_limit_warning(fields: dict[str, str], now: float) -> str:
    """The run's reason where the batch step's SIGTERM is SLURM's warning before the job's time limit (the job asks
    it WARN_LEAD_S s before): the job is running and its end that near; "" otherwise."""
    try:
        end = time.mktime(time.strptime(fields.get("EndTime", ""), "%Y-%m-%dT%H:%M:%S"))  # slurmctld's local time
    except ValueError:  # "Unknown", or no answer
        return ""
    left = end - now
    # slurmctld sends it on a periodic check (every 30 s), once the end is within the lead and that period
    if fields.get("JobState") != "RUNNING" or not -30 <= left <= WARN_LEAD_S + 60:
        return ""
    return (f"SLURM's warning (SIGTERM) {max(0, round(left))} s before the job's time limit (--time "
            f"{fields.get('TimeLimit', '?')}): the run was stopped before it")


def _hostnames(hostlist: str) -> list[str]:
    """HOSTLIST (node[1-2]) expanded by scontrol (here: no controller asked); [] where it cannot be."""
    with contextlib.suppress(UserError, subprocess.TimeoutExpired):
        out = _slurm("scontrol", "show", "hostnames", hostlist, timeout=10) if hostlist else None
        return out.stdout.split() if out is not None and out.returncode == 0 else []
    return []


def lost_nodes(allocated: str, remaining: str) -> str:
    """The nodes of ALLOCATED (the job's host list, SLURM_JOB_NODELIST) not in REMAINING (its NodeList once a node
    failed: slurmctld drops the failed ones), comma-separated; "" where they cannot be told."""
    before, after = _hostnames(allocated), _hostnames(remaining)
    return ",".join(n for n in before if n not in after) if before and after else ""


def why_stopped(job_id: str, job_dir: Path, opts: SlurmOptions, signal_name: str) -> str:
    """Why SLURM stopped the job's run (the driver's Command.outside), asked of slurmctld when the batch step's stop
    signal SIGNAL_NAME comes ("": srun ended first): the job's time limit, a node's failure, a cancel from outside
    (someone's scancel), or (a SIGTERM the follower did not send: STOP_REQUESTED) SLURM's warning before the limit;
    "" where SLURM did not. Each was "received SIGTERM", the cause said only by SLURM's line in the job's output."""
    if not job_id:
        return ""
    fields = job_fields(job_id, timeout=10)  # (the job's processes are killed KillWait s after its end)
    failed = fields.get("JobState") == "NODE_FAIL" or fields.get("Reason") == "NodeDown"
    down = lost_nodes(os.environ.get("SLURM_JOB_NODELIST", ""), fields.get("NodeList", "")) if failed else ""
    if ended := stopped_by_slurm(fields, down):
        return ended
    if signal_name == "SIGTERM" and (requested := users_stop(job_dir)):
        return requested
    if not (job_dir / STOP_REQUESTED).exists() and (outside := cancelled(job_id, fields)):
        return outside  # (a SIGTERM, or srun's end first: scancel signals every step)
    if signal_name != "SIGTERM":
        return ""
    return time_limit_warning(fields, time.time()) if warns(opts) else ""


def cancelled(job_id: str, fields: dict[str, str]) -> str:
    """The run's reason where someone cancelled the job (scancel, not mlbench run's stop: the caller checks
    STOP_REQUESTED), from its `scontrol show job` FIELDS as its steps get the SIGTERM: ending (COMPLETING, or
    CANCELLED once ended) with no reason of SLURM's own (TimeLimit, NodeDown: stopped_by_slurm's). The job's batch
    step is this driver, still running: the job is not ending of itself. "" otherwise. It was "received SIGTERM"."""
    if fields.get("JobState") not in ("COMPLETING", "CANCELLED") or fields.get("Reason", "None") != "None":
        return ""
    by = f" by {who}" if (who := cancelled_by(job_id)) else ""
    return f"the SLURM job was cancelled from outside mlbench run (scancel{by}): SLURM stopped it"


def cancelled_by(job_id: str) -> str:
    """'USER (uid N)' where SLURM's accounting says who cancelled the job (sacct's State 'CANCELLED by N', with
    slurmdbd); "" where it does not say (no accounting database: jobcomp's state has no user) or does not answer."""
    with contextlib.suppress(UserError, subprocess.TimeoutExpired):  # (briefly: KillWait s until SIGKILL)
        out = _slurm("sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State", timeout=5)
        if out.returncode == 0 and (m := re.search(r"\bCANCELLED by (\d{1,10})\b", out.stdout)):
            uid = int(m.group(1))
            with contextlib.suppress(KeyError):
                return f"{printable(pwd.getpwuid(uid).pw_name)} (uid {uid})"
            return f"uid {uid}"
    return ""


def users_stop(job_dir: Path) -> str:
    """The run's reason where the batch step's SIGTERM is the follower's, sent for its user's stop (STOP_REQUESTED
    names the signal mlbench run got: Ctrl-C's SIGINT was recorded "received SIGTERM", where a local run says
    "received SIGINT"); "" where the follower sent none."""
    try:
        name = (job_dir / STOP_REQUESTED).read_text().strip()
    except OSError:
        return ""
    name = name if re.fullmatch(r"SIG[A-Z0-9]{1,8}", name) else "a stop signal"
    return f"received {name} (mlbench run's, passed to the job's driver{' as SIGTERM' if name != 'SIGTERM' else ''})"
