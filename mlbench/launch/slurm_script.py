"""Render the sbatch script for a multi-node torchrun job. Pure: a SlurmJob in, a string out.

Nothing here submits or touches the cluster, so `--dry-run` can print exactly what would run.

Layout of the script: `#SBATCH` header, exported environment, MASTER_ADDR/MASTER_PORT, then one
`srun --ntasks-per-node=1 ... bash -c '<torchrun ...>'` that starts one torchrun per node. The
torchrun line goes through `bash -c` so that `$SLURM_NODEID` is expanded on each node, not once
in the batch shell (where it is always 0).
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

GENERATOR = "mlbench.launch.slurm_script"

# Matched whole (fullmatch): `$` also matches before a final newline, and '02:00:00\n' went into #SBATCH --time
# with its quote on the next line.
_TIME_RE = re.compile(r"(?:[0-9]+-)?[0-9]{1,3}:[0-5][0-9]:[0-5][0-9]")  # ASCII digits: \d takes '٣' too
# sbatch --signal=[{R|B}:]<sig>[@sig_time]
_SIGNAL_RE = re.compile(r"(?:[RB]{1,2}:)?(?:SIG)?[A-Z0-9]+(?:@[0-9]+)?")
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class SlurmJob:
    """What one sbatch submission needs.

    `command` is what follows torchrun's own options: a script and its args, `-m module ...`, or
    `--no-python exe ...` (torchrun runs a bare first word with python).
    """

    job_name: str
    command: Sequence[str]
    nodes: int = 1
    # Tasks SLURM accounts per node; the launch itself is always one torchrun per node.
    ntasks_per_node: int = 1
    cpus_per_task: int | None = None
    gpus_per_node: int = 0
    # Processes torchrun starts per node; None: gpus_per_node, or 1 on CPU.
    nproc_per_node: int | None = None
    partition: str | None = None
    account: str | None = None
    time_limit: str | None = None  # "HH:MM:SS" (or "D-HH:MM:SS")
    sbatch_options: Sequence[str] = ()  # extra, e.g. ["--exclusive", "--mem=0"]
    container_image: str | None = None  # pyxis/enroot
    container_mounts: Sequence[str] = ()  # "src:dst[:flags]"
    output: str | None = None
    error: str | None = None
    workdir: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    master_addr: str | None = None  # None: first node of the allocation
    master_port: int = 29500
    rdzv_backend: Literal["static", "c10d"] = "static"
    # Preemption warning: SLURM sends SIGTERM to the steps this many seconds before the limit.
    signal: str | None = "TERM@120"
    torchrun: str = "torchrun"
    torchrun_args: Sequence[str] = ()  # extra torchrun options, e.g. --redirects for per-rank logs
    # torchrun's --log-dir, a folder of its own per node under it (node<SLURM_NODEID>): torchrun names the one it
    # makes there by its run id and a random word, so which node's a rank's logs are is told by this folder alone
    log_dir: str | None = None
    # Seconds the nodes wait for each other at the rendezvous (--rdzv-timeout); None: torch's default, 600 s
    rdzv_timeout: float | None = None
    # When set, the script ends by exec-ing this driver on the batch host (which then starts each run with
    # `srun_argv`), instead of a single srun line.
    driver: Sequence[str] | None = None

    def validate(self) -> None:
        if not self.job_name or not self.command:
            raise ValueError("job_name and command are required")
        if self.nodes < 1 or self.ntasks_per_node < 1:
            raise ValueError("nodes and ntasks_per_node must be >= 1")
        if self.gpus_per_node < 0 or (self.nproc_per_node is not None and self.nproc_per_node < 1):
            raise ValueError("gpus_per_node must be >= 0 and nproc_per_node >= 1")
        if self.cpus_per_task is not None and self.cpus_per_task < 1:
            raise ValueError("cpus_per_task must be >= 1")
        if self.time_limit is not None and not _TIME_RE.fullmatch(self.time_limit):
            raise ValueError(f"--time (time_limit) must be HH:MM:SS or D-HH:MM:SS, not {self.time_limit!r}")
        if self.time_limit is not None and time_limit_seconds(self.time_limit) == 0:  # sbatch --time: "0: no limit"
            raise ValueError(f"--time (time_limit) {self.time_limit} is zero, which SLURM reads as no limit at all "
                             f"(the partition's longest); give the job's limit, such as 02:00:00")
        for mount in self.container_mounts:
            if problem := mount_problem(mount):
                raise ValueError(f"container mount {mount!r}: {problem}")
        if self.container_mounts and self.container_image is None:  # srun gets mounts only with an image: dropped
            raise ValueError(f"container mounts {','.join(self.container_mounts)} go into the job's container, and "
                             f"no container image is given: add --container-image IMAGE, or leave "
                             f"--container-mounts out")
        if self.signal is not None and not _SIGNAL_RE.fullmatch(self.signal):
            raise ValueError(f"signal must look like TERM@120 or B:USR1@60, not {self.signal!r}")
        if self.signal is not None and self.time_limit is not None and "@" in self.signal:
            # SLURM would send the warning at once (a 1-minute job with TERM@120 gets SIGTERM at start).
            lead = int(self.signal.rsplit("@", 1)[1])
            if lead >= time_limit_seconds(self.time_limit):
                raise ValueError(f"signal lead {lead}s is not shorter than time_limit {self.time_limit}")
        if not 0 < self.master_port < 65536:
            raise ValueError(f"master_port out of range: {self.master_port}")
        if self.rdzv_backend not in ("static", "c10d"):
            raise ValueError(f"rdzv_backend must be static or c10d, not {self.rdzv_backend!r}")
        if self.rdzv_timeout is not None and not 1 <= self.rdzv_timeout < math.inf:  # also NaN
            raise ValueError(f"rdzv_timeout must be at least 1 second, not {self.rdzv_timeout!r}")
        for name in self.env:
            if not _ENV_NAME_RE.fullmatch(name):
                raise ValueError(f"not an environment variable name: {name!r}")
        for opt in self.sbatch_options:
            if not opt.startswith("-"):
                raise ValueError(f"sbatch option must start with '-': {opt!r}")
            if own := job_option(opt):
                raise ValueError(f"sbatch option {opt!r} sets {own}, which is the job's own: "
                                 f"{_JOB_OPTIONS[own][1]}")
        # A newline would end an #SBATCH line or a shell word early, an ESC colour the terminal that shows the
        # script (--dry-run printed it raw) and its output file: refuse rather than escape.
        texts = [self.job_name, *self.command, *self.sbatch_options, *self.container_mounts,
                 *self.env, *self.env.values()]  # fmt: skip
        opt_texts = [self.partition, self.account, self.container_image, self.output, self.error,
                     self.workdir, self.master_addr, self.log_dir]  # fmt: skip
        for t in [*texts, *(t for t in opt_texts if t is not None)]:
            if not t.isprintable():
                bad = next(c for c in t if not c.isprintable())
                raise ValueError(f"{repr(bad)[1:-1]}, a character that is not printable, in {t!r}")

    @property
    def procs_per_node(self) -> int:
        if self.nproc_per_node is not None:
            return self.nproc_per_node
        return self.gpus_per_node or 1


# sbatch options that are the job's own (it sets them, or must not have them), by long name: the short form getopt
# takes too, and what to give instead. An --sbatch-arg giving one won (the later #SBATCH line): --output=FILE sent
# the job's output where mlbench never looked (no progress; "output .../job.out" named a file never written),
# --signal=USR1 dropped the warning on which a run ends cleanly before the time limit, --array ran the job once a task.
_JOB_OPTIONS = {
    "--nodes": ("N", "give mlbench's --nodes"),
    "--ntasks-per-node": ("", "one task a node, which starts that node's ranks (--nproc-per-node)"),
    "--gpus-per-node": ("", "give mlbench's --gpus-per-node"),
    "--partition": ("p", "give mlbench's --partition"),
    "--account": ("A", "give mlbench's --account"),
    "--time": ("t", "give mlbench's --time"),
    "--output": ("o", "mlbench follows the job's output in the job's folder (.slurm/<job>/job.out); leave it out"),
    "--error": ("e", "mlbench follows the job's output, errors included, in the job's folder; leave it out"),
    "--signal": ("", "SIGTERM 120 s before the time limit, on which a run ends cleanly; leave it out"),
    "--chdir": ("D", "the job runs where mlbench was started, as --results and the data paths were given there; "
                     "leave it out"),
    "--array": ("a", "one job trains its runs one after another (--runs); leave it out"),
    "--requeue": ("", "a requeued job would train its set of runs again from the start; the job is --no-requeue"),
}
# No-argument short options getopt may bundle in front of another (-Qo FILE is --quiet --output FILE).
_NO_ARGUMENT = frozenset("hHkOQsuvVW")
# Whole sbatch option names that begin another's: not abbreviations of it.
_NOT_ABBREVIATIONS = frozenset({"--gpus", "--ntasks"})


def job_option(opt: str) -> str | None:
    """The long name of the option in `_JOB_OPTIONS` that sbatch option OPT sets (None if none): by its name, an
    abbreviation of it (getopt_long takes any unambiguous prefix: --outp is --output) or its short form."""
    if opt.startswith("--"):
        name = re.split(r"[=\s]", opt, maxsplit=1)[0]
        if name in _NOT_ABBREVIATIONS or len(name) < 5:
            return None
        found = [own for own in _JOB_OPTIONS if own.startswith(name)]
        return found[0] if len(found) == 1 else None
    for letter in opt[1:]:
        own = next((own for own, (short, _) in _JOB_OPTIONS.items() if short == letter), None)
        if own or letter not in _NO_ARGUMENT:  # an option that takes an argument ends the bundle
            return own
    return None


def mount_problem(mount: str) -> str:
    """Why pyxis would refuse MOUNT, one entry of --container-mounts (SRC[:DST[:FLAGS]]), "" if it would not: it
    refuses an empty SRC or DST, a SRC that is not a path (starting with / or .), tmpfs or umount, and a DST that
    is not a path (pyxis args.c, parse_mount_option and add_mount). Caught here, a bad one fails before the job is
    written, not when srun starts the job's first step."""
    src, _, rest = mount.partition(":")
    dst = rest.partition(":")[0] if rest else src
    if not src or not dst:
        return "pyxis takes SRC:DST[:FLAGS] (or SRC alone, mounted at the same path), neither empty"
    if not src.startswith(("/", ".")) and src not in ("tmpfs", "umount"):
        return f"the source {src!r} must be a path (starting with / or .), tmpfs or umount"
    if not dst.startswith(("/", ".")):
        return f"the destination {dst!r} must be a path (starting with / or .)"
    return ""


def time_limit_seconds(limit: str) -> int:
    days, _, hms = limit.rpartition("-")
    h, m, sec = (int(x) for x in hms.split(":"))
    return int(days or 0) * 86400 + h * 3600 + m * 60 + sec


def _sbatch(opt: str, value: object | None = None) -> str:
    # sbatch parses #SBATCH lines itself and honours ' and " quoting, so shlex.quote is right here.
    return f"#SBATCH {opt}" if value is None else f"#SBATCH {opt}={shlex.quote(str(value))}"


def torchrun_command(job: SlurmJob) -> str:
    """The per-node command (shell text), with SLURM/MASTER variables left for the node to expand."""
    args = [
        shlex.quote(job.torchrun),
        '--nnodes="$SLURM_NNODES"',
        f"--nproc-per-node={job.procs_per_node}",
        '--node-rank="$SLURM_NODEID"',
        f"--rdzv-backend={job.rdzv_backend}",
        '--master-addr="$MASTER_ADDR"',
        '--master-port="$MASTER_PORT"',
    ]
    if job.rdzv_backend == "c10d":
        args += ['--rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT"', '--rdzv-id="$SLURM_JOB_ID"']
    if job.rdzv_timeout is not None:  # as the torchrun launcher's: how long node 0 waits for every node
        key = "timeout" if job.rdzv_backend == "static" else "join_timeout"
        args.append(f"--rdzv-conf={key}={max(1, round(job.rdzv_timeout))}")
    if job.log_dir is not None:
        args.append(f'--log-dir={shlex.quote(job.log_dir)}/node"$SLURM_NODEID"')
    args += [shlex.quote(a) for a in job.torchrun_args]
    return " ".join(args + [shlex.quote(a) for a in job.command])


def _srun_words(job: SlurmJob, nodes: str) -> list[str]:
    # --ntasks too: srun would otherwise inherit SLURM_NTASKS (nodes x ntasks_per_node) from sbatch.
    words = ["srun", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    if job.container_image is not None:
        words.append(f"--container-image={job.container_image}")
        if job.container_mounts:
            words.append(f"--container-mounts={','.join(job.container_mounts)}")
    return words


def srun_argv(job: SlurmJob) -> list[str]:
    """One torchrun per node through srun, as an argv (for a driver inside the allocation)."""
    job.validate()
    return [*_srun_words(job, str(job.nodes)), "bash", "-c", torchrun_command(job)]


def render(job: SlurmJob) -> str:
    """The full sbatch script for `job`. Deterministic: same job, same text."""
    job.validate()
    lines = [
        "#!/bin/bash",
        f"# Generated by {GENERATOR} (mlbench). Do not edit: re-render it. Submit with `sbatch <file>`.",
        _sbatch("--job-name", job.job_name),
        _sbatch("--nodes", job.nodes),
        _sbatch("--ntasks-per-node", job.ntasks_per_node),
        # SLURM requeues a job whose node failed (JobRequeue=1, its default): the driver then trained the whole set
        # again (runs not asked for, their seeds repeated) while the submitting side waited on a job pending for
        # nodes that were down. A job that fails ends, and says how (NODE_FAIL).
        _sbatch("--no-requeue"),
    ]
    if job.cpus_per_task is not None:
        lines.append(_sbatch("--cpus-per-task", job.cpus_per_task))
    if job.gpus_per_node:
        lines.append(_sbatch("--gpus-per-node", job.gpus_per_node))
    for opt, value in (
        ("--partition", job.partition),
        ("--account", job.account),
        ("--time", job.time_limit),
        ("--output", job.output),
        ("--error", job.error),
        ("--chdir", job.workdir),
        ("--signal", job.signal),
    ):
        if value is not None:
            lines.append(_sbatch(opt, value))
    for opt in job.sbatch_options:
        name, eq, value = opt.partition("=")
        lines.append(_sbatch(name, value) if eq else _sbatch(name))

    lines += ["", "set -euo pipefail", ""]
    for name, value in job.env.items():
        lines.append(f"export {name}={shlex.quote(value)}")
    if job.master_addr is None:
        # The first node of the allocation hosts the rendezvous.
        lines.append('MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)"')
    else:
        lines.append(f"MASTER_ADDR={shlex.quote(job.master_addr)}")
    lines += [f"MASTER_PORT={job.master_port}", "export MASTER_ADDR MASTER_PORT", ""]

    if job.driver is not None:
        # exec: the driver gets SIGTERM itself (preemption, scancel) and ends each run cleanly.
        lines.append("exec " + shlex.join(job.driver))
        return "\n".join(lines) + "\n"
    # The node count is left for the batch shell to expand; every other word is quoted.
    srun = [w if "$SLURM_NNODES" in w else shlex.quote(w) for w in _srun_words(job, '"$SLURM_NNODES"')]
    srun.append(f"bash -c {shlex.quote(torchrun_command(job))}")
    lines.append(" \\\n    ".join(srun))
    return "\n".join(lines) + "\n"
