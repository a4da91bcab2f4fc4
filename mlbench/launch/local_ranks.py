"""The ranks of one run on this machine, started and watched as torchrun's standalone agent would, without its
elastic agent: `python -m mlbench.launch.local_ranks --nproc-per-node=N --log-dir=DIR -m mlbench.train PLAN`.

torchrun's agent imports torch before it starts a rank and polls its workers after they exit: about 1.5 s of
start-up and 0.7 s of teardown a run (perf/launch_overhead.py), for no elasticity a single static node can use.
This agent imports nothing but the standard library (and mlbench's port finder). Multi-node runs keep torchrun (its
static rendezvous), and so does every node of a SLURM job.

- Each rank gets torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
  ROLE_RANK, ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and its output in the files torchrun's
  --log-dir/--redirects=3 would give it: DIR/local/attempt_0/<rank>/{stdout,stderr}.log.
- The rendezvous port is held by the agent from the start, a listening socket rank 0's store serves on
  (ports.STORE; mlbench.train.build.init_process_group): no other process can take it while the ranks import
  torch. A rank script initialises its process group with that function, not env:// (which would bind the port).
- The first rank to fail stops the others (SIGTERM, SIGKILL after a grace period), as torchrun does; the agent
  says which, then how each other rank that failed ended, and exits 1.
- SIGTERM/SIGINT are passed on to the ranks. The agent dies with its supervisor (the supervisor arms that), and
  each rank with the agent (its own lifeline).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from mlbench.launch.lifeline import consequent
from mlbench.launch.ports import STORE, held_port

GRACE_S = 10.0
MODULE = "mlbench.launch.local_ranks"


def argv(plan_path: Path, ranks_dir: Path, nproc_per_node: int) -> list[str]:
    return [sys.executable, "-m", MODULE, f"--nproc-per-node={nproc_per_node}", f"--log-dir={ranks_dir}",
            "-m", "mlbench.train", str(plan_path)]


def rank_env(env: dict[str, str], rank: int, nproc: int, port: int) -> dict[str, str]:
    n = str(nproc)
    return dict(env, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=n, LOCAL_WORLD_SIZE=n, GROUP_RANK="0",
                ROLE_RANK=str(rank), ROLE_WORLD_SIZE=n, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))


def _signal(procs: dict[int, subprocess.Popen], codes: dict[int, int], sig: int) -> None:
    """SIG to every rank not yet reaped. os.kill, not Popen.send_signal: that polls first, and its poll would reap
    a rank that has exited behind _reap's back (rank 1 killed and rank 0 ended of it, both before the agent next
    ran: it reaped rank 0, stopped the others, and waited for rank 1 for ever)."""
    for pid in procs:
        if pid not in codes:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)


def _stop(procs: dict[int, subprocess.Popen], codes: dict[int, int]) -> None:
    """SIGTERM every rank still running; SIGKILL what is left after the grace period; reap them all."""
    _signal(procs, codes, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while len(codes) < len(procs) and time.monotonic() < deadline:
        _reap(procs, codes, block=False)
        time.sleep(0.05)
    _signal(procs, codes, signal.SIGKILL)
    while len(codes) < len(procs):
        _reap(procs, codes, block=True)


def _reap(procs: dict[int, subprocess.Popen], codes: dict[int, int], block: bool) -> int | None:
    """Collects one exited rank (waiting for one when `block`); returns its pid, or None."""
    try:
        pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
    except ChildProcessError:
        return None
    if pid == 0 or pid not in procs:
        return None
    codes[pid] = os.waitstatus_to_exitcode(status)
    procs[pid].returncode = codes[pid]  # reaped here: Popen must not wait for it again
    return pid


def describe(code: int) -> str:
    """How a process ended, from its exit code (negative: the signal that killed it)."""
    if code >= 0:
        return f"exited with code {code}"
    try:
        return f"killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


def code_of(how: str) -> int:
    """The exit code `describe` wrote as HOW (negative: the signal)."""
    if how.startswith("exited with code "):
        return int(how.removeprefix("exited with code "))
    name = how.removeprefix("killed by ")
    return -int(name.removeprefix("signal ")) if name.startswith("signal ") else -signal.Signals[name]


_FAILED = re.compile(r"^rank (\d+) (exited with code -?\d+|killed by [\w ]+)(?:;| \(see)", re.M)


def rank_failure(output: str) -> str:
    """Which rank's failure ended the agent and how, from the agent's output (its lines below name the staging
    folder, gone once the run is published): the first one that failed of itself, not one stopped because of it
    (lifeline.consequent: ranks 0 and 1 often end together, and rank 0's gloo error is rank 1's death); "" if the
    agent names none."""
    for rank, how in _FAILED.findall(output):
        if not consequent(code_of(how)):
            return f"rank {rank} {how} (see the rank logs: local/attempt_0/{rank})"
    return ""


def run(nproc: int, log_dir: Path, rank_argv: list[str]) -> int:
    store = held_port()  # rank 0's store serves on it: held from now on (ports.STORE)
    port = store.getsockname()[1]
    procs: dict[int, subprocess.Popen] = {}
    ranks: dict[int, int] = {}
    codes: dict[int, int] = {}  # in the order the ranks were reaped
    received: list[int] = []

    def on_signal(signum, frame):
        received.append(signum)
        _signal(procs, codes, signal.SIGTERM)

    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, on_signal)
    with contextlib.ExitStack() as files:
        for rank in range(nproc):
            logs = log_dir / "local" / "attempt_0" / str(rank)
            logs.mkdir(parents=True, exist_ok=True)
            out = files.enter_context(open(logs / "stdout.log", "ab"))
            err = files.enter_context(open(logs / "stderr.log", "ab"))
            fds = (store.fileno(),) if rank == 0 else ()
            env = dict(rank_env(dict(os.environ), rank, nproc, port), **{STORE: f"serve:{fds[0]}" if fds else "join"})
            p = subprocess.Popen([sys.executable, *rank_argv], env=env, stdout=out, stderr=err, pass_fds=fds)
            procs[p.pid], ranks[p.pid] = p, rank
    store.close()  # rank 0 has it

    def logs(pid: int) -> Path:
        return log_dir / "local" / "attempt_0" / str(ranks[pid])

    while len(codes) < len(procs):
        pid = _reap(procs, codes, block=True)
        if pid is not None and codes[pid] != 0:
            print(f"rank {ranks[pid]} {describe(codes[pid])}; stopping the other ranks (see {logs(pid)})", flush=True)
            _stop(procs, codes)
            for other, code in codes.items():  # which of them failed of itself is rank_failure's to tell
                if other != pid and code != 0:
                    print(f"rank {ranks[other]} {describe(code)} (see {logs(other)})", flush=True)
            return 1
    if received:
        return 128 + received[0]
    return 0


def main(args: list[str]) -> int:
    """`--nproc-per-node=N --log-dir=DIR` and then what each rank runs (`-m module ARGS` or `script ARGS`), as
    torchrun takes them."""
    options = dict(a[2:].split("=", 1) for a in args[:2])
    return run(int(options["nproc-per-node"]), Path(options["log-dir"]), args[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
