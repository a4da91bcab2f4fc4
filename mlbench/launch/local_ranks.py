"""The ranks of one run on this machine, started and watched as torchrun's standalone agent would, without its
elastic agent: `python -m mlbench.launch.local_ranks --nproc-per-node=N --log-dir=DIR -m mlbench.train PLAN`.

torchrun's agent imports torch before it starts a rank and polls its workers after they exit: about 1.5 s of
start-up and 0.7 s of teardown a run (perf/launch_overhead.py), for no elasticity a single static node can use.
Multi-node runs keep torchrun (its static rendezvous), and so does every node of a SLURM job.

- The ranks are forked from this agent once it has imported torch (`preload`): torch's import (1.8 s of CPU a
  process on a 2-core VM, most of a rank's start) is paid once a node, not once a rank. Measured on a two-rank
  tiny run: 8.2 s of CPU against 9.3 s with each rank exec'd, wall time 5.35 s against 5.2 s unloaded (the import
  is no longer side by side). Importing torch initialises no device and starts no thread (numpy's OpenBLAS pool
  is held to the ranks' threads), so a forked rank may still use CUDA; megatron-core and the loop each rank
  imports itself. A forked rank's command line (`ps`, /proc/PID/cmdline and environ) is the agent's; its name
  (`ps -o comm`, top) is "mlbench rank N".

- Each rank gets torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
  ROLE_RANK, ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and its output in the files torchrun's
  --log-dir/--redirects=3 would give it: DIR/local/attempt_0/<rank>/{stdout,stderr}.log.
- The rendezvous port is held by the agent from the start, a listening socket rank 0's store serves on
  (ports.STORE; mlbench.train.build.init_process_group): no other process can take it while the ranks import
  torch. A rank script initialises its process group with that function, not env:// (which would bind the port).
- The first rank to fail stops the others (SIGTERM, SIGKILL after a grace period), as torchrun does; the agent
  says which, then how each other rank that failed ended, and exits 1.
- SIGTERM/SIGINT are passed on to the ranks. The agent dies with its supervisor (the supervisor arms that), and
  each rank with the agent (armed as it is forked, then by its own lifeline).
"""

from __future__ import annotations

import contextlib
import os
import re
import runpy
import signal
import sys
import time
from pathlib import Path

from mlbench.errors import clipped
from mlbench.launch.lifeline import ORPHANED_EXIT, consequent, die_with_parent, name_process
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


def _signal(ranks: dict[int, int], codes: dict[int, int], sig: int) -> None:
    """SIG to every rank (pid -> rank) not yet reaped."""
    for pid in ranks:
        if pid not in codes:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)


def _stop(ranks: dict[int, int], codes: dict[int, int]) -> None:
    """SIGTERM every rank still running; SIGKILL what is left after the grace period; reap them all."""
    _signal(ranks, codes, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while len(codes) < len(ranks) and time.monotonic() < deadline:
        _reap(ranks, codes, block=False)
        time.sleep(0.05)
    _signal(ranks, codes, signal.SIGKILL)
    while len(codes) < len(ranks):
        _reap(ranks, codes, block=True)


def _reap(ranks: dict[int, int], codes: dict[int, int], block: bool) -> int | None:
    """Collects one exited rank (waiting for one when `block`); returns its pid, or None."""
    try:
        pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
    except ChildProcessError:
        return None
    if pid == 0 or pid not in ranks:
        return None
    codes[pid] = os.waitstatus_to_exitcode(status)
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


# The agent's line where a stop signal came to it alone, from another process than its supervisor (which stops
# the whole run itself, with its reason): its ranks, stopped by it, said only "Aborted: signal SIGTERM", and its
# output named the first of them to exit as if it had failed ("rank 1 exited with code 6; stopping the others").
RECEIVED = "the agent received"
_RECEIVED = re.compile(rf"^{RECEIVED} (SIG\w+);", re.M)
_FAILED = re.compile(r"^rank (\d+) (exited with code -?\d+|killed by \w+(?: \d+)?)(?:;[^(\n]*)?(?: \(see (.+)\))?$",
                     re.M)
# A rank's last words on a failure of its own (mlbench.train.loop), at the end of its stderr.log
_LAST_WORDS = re.compile(r"^\[rank \d+\] (?:run aborted|checkpoint not saved): (.+)$", re.M)


def rank_failure(output: str) -> str:
    """Which rank's failure ended the agent and how, from the agent's output (its lines below name the staging
    folder, gone once the run is published): the first one that failed of itself, not one stopped because of it
    (lifeline.consequent: ranks 0 and 1 often end together, and rank 0's gloo error is rank 1's death); "" if the
    agent names none."""
    failed = _FAILED.findall(output)
    for rank, how, logs in failed:
        if not consequent(code_of(how)):
            words = said(Path(logs)) if logs else ""
            return f"rank {rank} {how}{words} (see the rank logs: local/attempt_0/{rank})"
    if m := _RECEIVED.search(output):
        return f"the launcher (mlbench's local agent) received {m[1]} from another process and stopped the ranks"
    if failed:
        # the first rank to end ended as a stopped one does (a stop signal), yet no rank had failed and the agent had
        # stopped none: a signal from another process (kill -TERM of a rank) stopped it. Said as its own rank's
        # "Aborted: signal SIGTERM", as if a peer's failure had stopped it.
        rank, how, _ = failed[0]
        return stopped_from_outside(rank, how, f"local/attempt_0/{rank}")
    return ""


def said(logs: Path) -> str:
    """': <its words>' where a rank whose logs are LOGS said why it failed (an exception, a save that failed), as
    rank 0 says it in the log itself: a rank other than rank 0 that raised was only 'rank 1 exited with code 3'
    where rank 0 gave 'RuntimeError: ...'; "" where it said nothing (killed, or its logs are gone)."""
    found = _LAST_WORDS.findall(last_words(logs))
    return f": {clipped(found[-1].strip())}" if found else ""


def last_words(logs: Path) -> str:
    """The end (4 KiB) of the stderr.log in a rank's logs LOGS, where it says why it ended; "" if it cannot be read."""
    try:
        with open(logs / "stderr.log", "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def stopped_from_outside(rank: int | str | None, how: str, logs: str) -> str:
    """The reason where a rank ended as one stopped for another's failure does (HOW: its exit), yet none had failed
    and no launcher had stopped it: a signal from another process (kill -TERM of a rank). The same words at every
    launcher (the one rank's own words were 'stopped by SIGTERM', a peer's under torchrun gloo's 'Connection closed
    by peer'); RANK None where the launcher cannot tell which rank it was (LOGS: their folder)."""
    which = f"rank {rank}" if rank is not None else "a rank"
    return (f"{which} was stopped by a signal from another process, no rank having failed "
            f"({how + '; ' if how else ''}see the rank logs: {logs})")


def preload() -> None:
    """What every rank imports first, imported once here for the ranks to fork with (the module docstring)."""
    import torch  # noqa: F401
    import torch.distributed.tensor  # noqa: F401 - megatron-core's import of it is most of torch's own time


def _exit_code(code: object) -> int:
    """The exit status of `raise SystemExit(code)`, as the interpreter gives it."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _run_rank(rank_argv: list[str]) -> int:
    """Runs `-m module ARGS` or `script ARGS` in this (forked) process as `python` would; its exit status."""
    module = rank_argv[0] == "-m"
    target, args = (rank_argv[1], rank_argv[2:]) if module else (rank_argv[0], rank_argv[1:])
    sys.argv = [target, *args]
    try:
        if module:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.path[0] = os.path.dirname(os.path.abspath(target))
            runpy.run_path(target, run_name="__main__")
        return 0
    except SystemExit as e:
        return _exit_code(e.code)
    except KeyboardInterrupt:  # the interpreter's own way out of one: killed by SIGINT
        sys.excepthook(*sys.exc_info())
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        return 130
    except BaseException:
        sys.excepthook(*sys.exc_info())
        return 1


def _fork_rank(rank: int, rank_argv: list[str], env: dict[str, str], logs: Path, store_fd: int | None) -> int:
    """Forks rank RANK with its environment and output files (STORE_FD: the store's socket, closed in all but rank
    0); returns its pid, in the agent."""
    sys.stdout.flush()
    sys.stderr.flush()
    stops, agent = {signal.SIGTERM, signal.SIGINT}, os.getpid()
    signal.pthread_sigmask(signal.SIG_BLOCK, stops)  # the agent's handlers must not run in the rank
    pid = os.fork()
    if pid:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)
        return pid
    code = 1
    try:
        die_with_parent()  # until the rank arms its own lifeline
        if os.getppid() != agent:  # the agent died before the signal was armed
            os._exit(ORPHANED_EXIT)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)
        if store_fd is not None:
            os.close(store_fd)
        for fd, name in ((1, "stdout.log"), (2, "stderr.log")):
            f = os.open(logs / name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
            os.dup2(f, fd)
            os.close(f)
        os.environ.clear()
        os.environ.update(env)
        name_process(f"mlbench rank {rank}")  # (its command line is the agent's)
        code = _run_rank(rank_argv)
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def run(nproc: int, log_dir: Path, rank_argv: list[str]) -> int:
    store = held_port()  # rank 0's store serves on it: held from now on (ports.STORE)
    port = store.getsockname()[1]
    ranks: dict[int, int] = {}  # pid -> rank
    codes: dict[int, int] = {}  # in the order the ranks were reaped
    received: list[int] = []

    def on_signal(signum, frame):
        received.append(signum)
        _signal(ranks, codes, signal.SIGTERM)

    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, on_signal)
    preload()
    fd = store.fileno()
    for rank in range(nproc):
        if received:  # stopped before it started them all: those started are stopped below
            break
        logs = log_dir / "local" / "attempt_0" / str(rank)
        logs.mkdir(parents=True, exist_ok=True)
        env = dict(rank_env(dict(os.environ), rank, nproc, port), **{STORE: f"serve:{fd}" if rank == 0 else "join"})
        ranks[_fork_rank(rank, rank_argv, env, logs, None if rank == 0 else fd)] = rank
    store.close()  # rank 0 has it

    def logs(pid: int) -> Path:
        return log_dir / "local" / "attempt_0" / str(ranks[pid])

    while len(codes) < len(ranks):
        pid = _reap(ranks, codes, block=True)
        if pid is not None and codes[pid] != 0 and received:  # it stopped them: none of them failed
            _stop(ranks, codes)
            break
        if pid is not None and codes[pid] != 0:
            print(f"rank {ranks[pid]} {describe(codes[pid])}; stopping the other ranks (see {logs(pid)})", flush=True)
            _stop(ranks, codes)
            for other, code in codes.items():  # which of them failed of itself is rank_failure's to tell
                if other != pid and code != 0:
                    print(f"rank {ranks[other]} {describe(code)} (see {logs(other)})", flush=True)
            return 1
    if received:  # (before it had started a rank, too: "a rank failed" was the run's reason)
        print(f"{RECEIVED} {signal.Signals(received[0]).name}; it stopped its ranks", flush=True)
        return 128 + received[0]
    return 0


def main(args: list[str]) -> int:
    """`--nproc-per-node=N --log-dir=DIR` and then what each rank runs (`-m module ARGS` or `script ARGS`), as
    torchrun takes them."""
    options = dict(a[2:].split("=", 1) for a in args[:2])
    return run(int(options["nproc-per-node"]), Path(options["log-dir"]), args[2:])


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no interpreter teardown of the torch it preloaded (0.4 s), which nothing here needs
