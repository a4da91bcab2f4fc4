"""A real SLURM cluster (one slurmctld, one slurmd per node) on this one host, for tests.

Every "node" is a slurmd on 127.0.0.1 with its own port; all config, state, spool, pid and
log files live in one temporary folder, so nothing depends on /etc/slurm. Authentication is
`auth/none` + `cred/none` (works on SLURM 22.05 and needs no munged) unless `auth="munge"`.

    with SlurmCluster(tmp_path) as cluster:
        subprocess.run(["sbatch", "--wait", script], env=cluster.env, check=True)

The node names do not resolve: jobs must rendezvous on 127.0.0.1 (`cluster.master_addr`).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

from mlbench.launch.ports import free_ports

BINARIES = ("slurmctld", "slurmd", "sbatch", "srun", "scontrol", "sinfo", "squeue", "scancel", "sacct")
MUNGE_KEY = Path("/etc/munge/munge.key")


def available(auth: str = "none") -> tuple[bool, str]:
    """Whether a cluster can be started here, and why not."""
    if os.name != "posix" or os.geteuid() != 0:
        return False, "SLURM test cluster needs root (slurmd runs jobs as root here)"
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if auth == "munge":
        missing += [b for b in ("munged",) if shutil.which(b) is None]
        if not MUNGE_KEY.exists():
            missing.append(str(MUNGE_KEY))
    if missing:
        return False, f"SLURM not installed (missing {', '.join(missing)}); run `make system-deps`"
    return True, ""


class SlurmClusterError(RuntimeError):
    pass


class SlurmCluster:
    """Context manager: start a `nodes`-node cluster in `tmp_dir`, tear it all down on exit."""

    partition = "debug"
    master_addr = "127.0.0.1"

    def __init__(
        self,
        tmp_dir: str | os.PathLike[str],
        nodes: int = 2,
        cpus_per_node: int = 2,
        max_time: str = "00:05:00",
        auth: str = "none",
        enforce_part_limits: bool = True,
        start_timeout: float = 30.0,
    ) -> None:
        if auth not in ("none", "munge"):
            raise ValueError(f"auth must be 'none' or 'munge', not {auth!r}")
        # slurmd keeps unix sockets in its spool dir and those paths max out at 108 bytes: a long
        # tmp_dir (pytest's tmp_path can be) is swapped for a short folder in /tmp, removed on exit.
        self.root = Path(tmp_dir) / f"slurm-{os.getpid()}-{time.monotonic_ns() % 10**6}"
        self._own_root = len(str(self.root)) > 60
        if self._own_root:
            self.root = Path(tempfile.mkdtemp(prefix="slurm-"))
        self.nodes = nodes
        self.cpus_per_node = cpus_per_node
        self.max_time = max_time
        self.auth = auth
        self.enforce_part_limits = enforce_part_limits
        self.start_timeout = start_timeout
        self.munge_dir = self.root / "munge"  # replaced by a folder in /tmp when munged starts
        self.node_names = [f"node{i}" for i in range(1, nodes + 1)]
        self.conf = self.root / "slurm.conf"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.env: dict[str, str] = {}
        self.timings: dict[str, float] = {}

    # -- config ---------------------------------------------------------------------------

    def _render_conf(self, ctld_port: int, node_ports: list[int]) -> str:
        r = self.root
        host = socket.gethostname().split(".")[0]
        if self.auth == "munge":
            auth = [
                "AuthType=auth/munge",
                "CredType=cred/munge",
                f"AuthInfo=socket={self.munge_dir / 'munge.socket'}",
            ]
        else:
            auth = ["AuthType=auth/none", "CredType=cred/none"]
        lines = [
            "# Written by tests/slurm_cluster.py: a throwaway cluster, every path under this folder.",
            "ClusterName=mlbenchtest",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            *auth,
            f"StateSaveLocation={r / 'state'}",
            f"SlurmdSpoolDir={r / 'spool' / '%n'}",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}",
            f"SlurmdPidFile={r / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={r / 'log' / 'slurmd-%n.log'}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            # No cgroups/systemd in containers: track processes by parent pid, bind nothing.
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            # No slurmdbd: finished jobs go to a text file that `sacct --completion` reads.
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/filetxt",
            f"JobCompLoc={r / 'jobcomp.txt'}",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "SchedulerType=sched/backfill",
            "MailProg=/bin/true",
            # Trust the CPU count below, not what slurmd detects (two "nodes" share one host).
            "SlurmdParameters=config_overrides",
            "ReturnToService=2",
            "MpiDefault=none",
            # Fast turnaround: short timeouts; MinJobAge <= 4 keeps `sbatch --wait` polling every 2 s
            # (it backs off 2 s -> 8 s while the poll is under MinJobAge/2).
            "SlurmctldTimeout=10",
            "SlurmdTimeout=10",
            "InactiveLimit=0",
            "KillWait=2",
            "MinJobAge=4",
            "MessageTimeout=5",
            # ALL: a job asking for more nodes than the partition has is rejected at submission
            # ("Node count specification invalid"); without it the job pends forever (PartitionConfig).
            f"EnforcePartLimits={'ALL' if self.enforce_part_limits else 'NO'}",
            f"NodeName=DEFAULT CPUs={self.cpus_per_node} RealMemory=1000 State=UNKNOWN",
        ]
        for name, port in zip(self.node_names, node_ports, strict=True):
            # NodeHostname is not allowed on DEFAULT lines; slurmd -N picks its entry by name.
            lines.append(f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port}")
        lines.append(
            f"PartitionName={self.partition} Nodes={','.join(self.node_names)} Default=YES "
            f"MaxTime={self.max_time} State=UP OverSubscribe=NO"
        )
        return "\n".join(lines) + "\n"

    # -- lifecycle ------------------------------------------------------------------------

    def __enter__(self) -> SlurmCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        ok, why = available(self.auth)
        if not ok:
            raise SlurmClusterError(why)
        t0 = time.monotonic()
        for sub in ("state", "log", "spool", *(f"spool/{n}" for n in self.node_names)):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        if self.auth == "munge":
            self.munge_dir = Path(tempfile.mkdtemp(prefix="munge-"))
        ctld_port, *node_ports = free_ports(1 + self.nodes, "127.0.0.1")
        self.conf.write_text(self._render_conf(ctld_port, node_ports))
        (self.root / "jobcomp.txt").touch()
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        # Our own jobs must not inherit an outer allocation's identity.
        for k in list(self.env):
            if k.startswith(("SLURM_JOB", "SLURM_STEP", "SBATCH_", "SRUN_", "SALLOC_")):
                del self.env[k]
        if self.auth == "munge":
            self._start_munged()
        log = self.root / "log"
        self._spawn("slurmctld", ["slurmctld", "-D", "-c", "-f", str(self.conf)], log / "slurmctld.out")
        for n in self.node_names:
            argv = ["slurmd", "-D", "-N", n, "-f", str(self.conf)]
            self._spawn(f"slurmd-{n}", argv, log / f"slurmd-{n}.out")
        self._wait_idle()
        self.timings["start_s"] = time.monotonic() - t0

    def _spawn(self, name: str, argv: list[str], out: Path) -> None:
        with out.open("wb") as fh:
            # Own session, so teardown can signal the daemon and anything it left in its group.
            self.procs[name] = subprocess.Popen(
                argv, env=self.env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True
            )

    def _start_munged(self) -> None:
        mdir = self.munge_dir
        # munged (user munge) must reach it: tmp_path's parents are 0700, so it lives in /tmp.
        # munged refuses a socket dir it cannot trust; 755 owned by munge works, 700 does not.
        mdir.chmod(0o755)
        try:
            pw = pwd.getpwnam("munge")
            os.chown(mdir, pw.pw_uid, pw.pw_gid)
            user: list[str] = []
        except KeyError:
            # No munge user: run as root, which munged only accepts with --force.
            pw, user = None, ["--force"]
        argv = [
            "munged", "-F", *user,
            f"--socket={mdir / 'munge.socket'}",
            f"--pid-file={mdir / 'munged.pid'}",
            f"--log-file={mdir / 'munged.log'}",
            f"--seed-file={mdir / 'munged.seed'}",
            f"--key-file={MUNGE_KEY}",
        ]  # fmt: skip

        def demote() -> None:
            if pw is not None:
                os.setgid(pw.pw_gid)
                os.setuid(pw.pw_uid)

        with (self.root / "log" / "munged.out").open("wb") as fh:
            self.procs["munged"] = subprocess.Popen(
                argv, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=demote
            )
        sock = mdir / "munge.socket"
        deadline = time.monotonic() + 10
        while not sock.exists():
            if self.procs["munged"].poll() is not None or time.monotonic() > deadline:
                raise SlurmClusterError("munged did not start:\n" + self.logs())
            time.sleep(0.05)

    def _wait_idle(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise SlurmClusterError(f"{name} exited with {p.returncode}:\n" + self.logs())
            r = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False, timeout=10)
            states = dict(line.split() for line in r.stdout.splitlines() if len(line.split()) == 2)
            if all(states.get(n) == "idle" for n in self.node_names):
                return
            time.sleep(0.1)
        raise SlurmClusterError(f"nodes not idle after {self.start_timeout}s: {states}\n" + self.logs())

    def stop(self) -> None:
        """Cancel every job, shut the daemons down, kill whatever is left. Safe to call twice."""
        if not self.procs:
            self._remove_dirs()
            return
        t0 = time.monotonic()
        stepds = [pid for pid in self._pids() if self._stepd_ours(pid)]
        ctld = self.procs.get("slurmctld")
        if ctld is not None and ctld.poll() is None:
            with contextlib.suppress(Exception):
                self.run(["scancel", "--full", "--quiet", "--partition", self.partition], timeout=10)
                # Give the steps a moment to die so slurmstepd is not orphaned by the shutdown.
                deadline = time.monotonic() + 5
                while (
                    time.monotonic() < deadline
                    and self.run(["squeue", "-h", "-t", "PD,R,CG,CF,S", "-o", "%i"], timeout=5).stdout.strip()
                ):
                    time.sleep(0.1)
            with contextlib.suppress(Exception):
                self.run(["scontrol", "shutdown"], timeout=10)
        daemons = [n for n in self.procs if n != "munged"]
        self._reap(daemons, grace=5.0)
        self._kill_strays()
        self._reap(["munged"], grace=2.0)
        # Exited slurmstepds are orphans that pid 1 reaps, with some lag; wait (3 s at most) for
        # ours and for any zombie slurmstepd, so `pgrep slurm` right after a test is clean.
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and (
            any(Path(f"/proc/{pid}").exists() for pid in stepds) or self._zombie_stepds()
        ):
            time.sleep(0.05)
        self.procs.clear()
        self._remove_dirs()
        self.timings["stop_s"] = time.monotonic() - t0

    def _remove_dirs(self) -> None:
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)
        if self.auth == "munge":
            shutil.rmtree(self.munge_dir, ignore_errors=True)

    def _reap(self, names: list[str], grace: float) -> None:
        deadline = time.monotonic() + grace
        for n in names:
            p = self.procs.get(n)
            if p is None:
                continue
            if n == "munged" and p.poll() is None:
                p.terminate()
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=5)
            # Anything still in the daemon's session (it started none of its own) goes too.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)

    def _kill_strays(self) -> None:
        """slurmstepd and job tasks leave the daemons' sessions; find them by our conf/temp path."""
        marker = str(self.root).encode()
        me = os.getpid()
        for pid in self._pids():
            if pid == me:
                continue
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                envb = Path(f"/proc/{pid}/environ").read_bytes()
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                continue
            if marker in cmd or marker in envb or (comm == "slurmstepd" and self._stepd_ours(pid)):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)

    def _stepd_ours(self, pid: int) -> bool:
        # slurmstepd keeps its node's spool dir open (the step socket lives there).
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/comm").read_text().strip() != "slurmstepd":
                return False
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    if str(self.root) in os.readlink(fd):
                        return True
        return False

    @classmethod
    def _zombie_stepds(cls) -> list[int]:
        out = []
        for pid in cls._pids():
            with contextlib.suppress(OSError):
                stat = Path(f"/proc/{pid}/stat").read_text()
                # "pid (comm) state ...": comm may hold spaces, so split at the last ')'.
                if stat.split(" (", 1)[1].startswith("slurmstepd)") and stat.rsplit(")", 1)[1].split()[0] == "Z":
                    out.append(pid)
        return out

    @staticmethod
    def _pids() -> Iterator[int]:
        for p in Path("/proc").iterdir():
            if p.name.isdigit():
                yield int(p.name)

    # -- helpers for tests ----------------------------------------------------------------

    def run(
        self, argv: list[str], check: bool = True, timeout: float = 60, **kw: object
    ) -> subprocess.CompletedProcess[str]:
        """Run a SLURM client command against this cluster."""
        return subprocess.run(argv, env=self.env, capture_output=True, text=True, check=check, timeout=timeout, **kw)  # type: ignore[call-overload]

    def job_state(self, job_id: str) -> str:
        """State from slurmctld (`scontrol show job`), falling back to the jobcomp file."""
        r = self.run(["scontrol", "-o", "show", "job", job_id], check=False, timeout=10)
        for field in r.stdout.split():
            if field.startswith("JobState="):
                return field.split("=", 1)[1]
        r = self.run(["sacct", "--completion", "-n", "-P", "-j", job_id, "-o", "State"], check=False)
        return r.stdout.strip().split("\n")[0].split()[0] if r.stdout.strip() else "UNKNOWN"

    def logs(self, tail: int = 40) -> str:
        out = []
        for f in sorted((self.root / "log").glob("*")) + sorted(self.munge_dir.glob("*.log")):
            with contextlib.suppress(OSError):
                lines = f.read_text(errors="replace").splitlines()[-tail:]
                out.append(f"--- {f.name} ---\n" + "\n".join(lines))
        return "\n".join(out)
