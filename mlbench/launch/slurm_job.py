"""The driver inside a SLURM allocation (the batch step): runs the set of runs, each through srun."""

from __future__ import annotations

import json
import os
import re
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from mlbench import runner, terminal
from mlbench.errors import Stopped
from mlbench.launch.ports import free_port
from mlbench.launch.slurm import CURRENT_RUN, SUMMARY_ERROR, SlurmOptions, job_for, why_stopped
from mlbench.launch.slurm_script import srun_argv
from mlbench.launch.supervise import Command, set_folder
from mlbench.launch.torchrun import failure_reason, first_failure, formed_deadline_s, rank_logs, ranks_started
from mlbench.layout import Layout
from mlbench.run_plan import benchmark_from_dict


def rendezvous_problem(addr: str) -> str:
    """Why the nodes could not meet at `addr` (the rendezvous host, MASTER_ADDR), or "" if they can. The driver runs
    on the job's first node, node 0, whose torchrun hosts the static rendezvous: `addr` must resolve to an address
    of this host, else every node (node 0 too) retries it until --rdzv-timeout, saying nothing."""
    host = socket.gethostname()
    try:
        found = socket.getaddrinfo(addr, None)
    except (socket.gaierror, UnicodeError) as e:
        return (f"the rendezvous address {addr!r} does not resolve on {host} "
                f"({getattr(e, 'strerror', None) or e}); pass --master-addr with a name or address every node "
                f"resolves")
    ips = sorted({str(info[4][0]) for info in found})
    if not any(_is_local(family, str(sockaddr[0])) for family, _, _, _, sockaddr in found):
        return (f"the rendezvous address {addr!r} ({', '.join(ips)}) is not an address of {host}, the job's first "
                f"node, whose torchrun hosts the rendezvous; pass --master-addr with that node's name or address, "
                f"or leave it out (the first node's name)")
    return ""


def _is_local(family: int, ip: str) -> bool:
    """Whether this host holds `ip` (it can bind it)."""
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.bind((ip, 0))
    except OSError:
        return False
    return True


@dataclass(frozen=True)
class JobRendezvous:
    """The job's nodes meeting at the static rendezvous (srun's torchrun on every node), as the supervisor sees it
    (mlbench.launch.supervise.Rendezvous): the start-up limit counts from the ranks' start, and a run whose ranks
    never start ends past torch's own waits (--rdzv-timeout), as on the torchrun launcher's nodes."""

    addr: str  # MASTER_ADDR:MASTER_PORT
    timeout: float
    ranks_dir: Path  # torchrun's --log-dir on every node: <run id>_<random>/attempt_0 appears as its ranks start
    nodes: int  # the job's nodes

    @property
    def deadline_s(self) -> float:
        return formed_deadline_s(self.timeout)

    def formed(self) -> bool:
        return ranks_started(self.ranks_dir)

    def not_formed(self) -> str:
        return (f"the job's nodes did not meet at {self.addr} within {self.deadline_s:g} s: no node's torchrun "
                f"started its ranks (srun may not have started one on every node); see the run's launcher.log")

    def explain(self, error: str) -> str:
        return ""  # torch's own words (with the launcher's exit code) name what failed; no flag of the user's to give

    def node0(self) -> tuple[str, int] | None:
        return None  # the driver supervises from node 0 itself


def rank_failure(output: str, ranks_dir: Path, nproc_per_node: int) -> str:
    """Which rank's failure ended the job's run, how, and where its output is, from every node's torchrun (srun
    gathers their output); else srun's own failure to start the run (srun_failure); "" if neither is told. Node N's
    rank logs are under RANKS_DIR/nodeN (slurm_script.SlurmJob.log_dir)."""
    failed = first_failure(output)
    if failed is None:
        return srun_failure(output, ranks_dir)
    node = failed.rank // nproc_per_node
    return failure_reason(failed, node, rank_logs(ranks_dir / f"node{node}", failed.local_rank), ranks_dir)


_SRUN_ERROR = re.compile(r"^srun: (?:error|fatal): (.+)$", re.MULTILINE)
# srun's words (SLURM's error strings, slurm_strerror, and srun's own) for a failure to start a step that may not
# recur: the controller or a node's slurmd not answering for a moment, a message lost, the controller restarting.
# Only these are launched again (supervise.LAUNCH_TRIES). Any other srun error is the request's or the job's and
# recurs on every try: an invalid option or partition, "Invalid job id specified" (the job is gone), "More
# processors requested than permitted" / "Requested node configuration is not available" (more tasks than the
# allocation holds), "Job/step already completing or completed", an authentication error: the run is aborted with
# srun's words at once (it took another 10 s, two more tries, before the same end).
SRUN_TRANSIENT = re.compile("|".join((
    r"Socket timed out on send/recv operation",
    r"Communication connection failure",
    r"Unable to contact slurm controller",
    r"Zero Bytes were transmitted or received",
    r"Connection (?:refused|reset by peer|timed out)",
    r"temporarily unavailable",
    r"Slurm backup controller in standby mode",
    r"Transport endpoint is not connected",
    r"[Nn]ode (?:\S+ )?not responding",
)))


def srun_failure(output: str, ranks_dir: Path) -> str:
    """srun's own failure to start the run's step, where no rank started (the controller not answering, or restarted:
    "Unable to confirm allocation for job N: Socket timed out on send/recv operation"): its first error, in its
    words. The run's reason was "launcher exited with code 1 (a rank failed; see the rank logs)": none had run.
    "" where srun said no error, or ranks started (a rank's failure is then torchrun's to tell)."""
    errors = _SRUN_ERROR.findall(output)
    if not errors or ranks_started(ranks_dir):
        return ""
    return f"srun could not start the run on the job's nodes: {errors[0].strip()[:240]} (see the run's launcher.log)"


def srun_transient_failure(output: str, ranks_dir: Path) -> str:
    """srun_failure where srun's first error is one that may not recur (SRUN_TRANSIENT: the launch is tried again),
    "" otherwise: a permanent one ends the run at once, with the same words (rank_failure's)."""
    errors = _SRUN_ERROR.findall(output)
    return srun_failure(output, ranks_dir) if errors and SRUN_TRANSIENT.search(errors[0]) else ""


def run_commands(name: str, layout: Layout, opts: runner.RunOptions, slurm: SlurmOptions,
                 job_dir: Path) -> runner.CommandFor:
    """Each run of the job: srun starts one torchrun per node at a static rendezvous on this (the first) node."""
    def command_for(plan_path: Path, staging: Path, i: int, env: dict) -> Command:
        port = free_port()  # a fresh port per run: the batch step runs on the first node, where the rendezvous lives
        job = job_for(layout, slurm, name, job_dir, driver=None, command=["-m", "mlbench.train", str(plan_path)],
                      ranks_dir=staging / "ranks", master_port=port, rdzv_timeout=opts.rdzv_timeout)
        # srun passes the port on to every node
        return Command(["env", f"MASTER_PORT={port}", *srun_argv(job)], env, stdout=staging / "launcher.log",
                       rendezvous=JobRendezvous(f"{os.environ.get('MASTER_ADDR', '')}:{port}", opts.rdzv_timeout,
                                                staging / "ranks", layout.nodes),
                       rank_failure=lambda out: rank_failure(out, staging / "ranks", layout.nproc_per_node),
                       # srun's step not launched (a node briefly not answering): no run, launched again; a
                       # permanent refusal (an invalid option, the job gone) is not: it would recur
                       not_launched=lambda out: srun_transient_failure(out, staging / "ranks"),
                       # why SLURM stopped the run (its time limit, a node's failure), not "received SIGTERM"
                       outside=lambda signal_name: why_stopped(os.environ.get("SLURM_JOB_ID", ""), job_dir, slurm,
                                                               signal_name))
    return command_for


def _driver_error(job_dir: Path, problem: str) -> None:
    """The driver's error before its set started: in the job's summary, whence `mlbench run` says it (once, on its
    stderr), and in job.out marked so that it is not streamed there too; where the summary cannot be written, said in
    job.out as an error line the follower shows (it then says the job recorded no run, pointing at job.out)."""
    try:
        (job_dir / "summary.json").write_text(json.dumps({"runs": [], "error": problem}, indent=1))
    except OSError as e:  # (was a traceback in job.out)
        print(f"error: {problem} (and cannot write {job_dir / 'summary.json'}: {e.strerror or e})", flush=True)
        return
    print(f"{SUMMARY_ERROR}{problem}", flush=True)


def main(spec_path: str) -> int:
    job_dir = Path(spec_path).parent
    spec = json.loads(Path(spec_path).read_text())
    bench = benchmark_from_dict(spec["benchmark"])
    layout = Layout.from_dict(spec["layout"])  # its features a FeaturesSpec again, not a dict
    opts = runner.RunOptions(**{**spec["run"], "results": Path(spec["run"]["results"])})
    slurm = SlurmOptions(**spec["slurm"])

    problem = rendezvous_problem(os.environ.get("MASTER_ADDR", ""))
    if problem:  # fail at once: torch would retry the address until its 30-minute init timeout
        _driver_error(job_dir, problem)
        return 1

    commands = run_commands(bench.name, layout, opts, slurm, job_dir)
    run_set = runner.RunSet(bench, layout, opts, terminal.console(), commands, announce=job_dir / CURRENT_RUN)
    try:  # (a stop signal before the set's own handlers: its claim on its seeds removed, as `mlbench run`'s)
        with set_folder(opts.results, opts.system, bench.name) as folder:
            run_set.prepare(folder)
            run_set.start()
            run_set.supervise()
    except Stopped as e:
        print(f"error: stopped ({e}) before the set's first run started", flush=True)
        return e.exit_code
    summary = [{"result": str(r.path), "status": r.status, "ttt_s": r.ttt_s, "reason": r.reason}
               for r in run_set.results]
    try:
        (job_dir / "summary.json").write_text(json.dumps({"runs": summary}, indent=1))
    except OSError as e:  # the submitting side then says the job recorded no run, and points here
        print(f"error: cannot write {job_dir / 'summary.json'} ({e.strerror or e}); the runs: {summary}", flush=True)
    return run_set.collect()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
