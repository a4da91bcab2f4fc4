"""Everything checked before a run starts: the request's values, the benchmark, its data, the parallel layout and
its features against the model and the device, the checkpoints, the results folder and the closed rules.

`prepare(RunRequest) -> PreparedRun` is what `mlbench run` calls after parsing its options; a test (or a script)
calls it without the CLI. Bad input raises `UserError` (one line, exit 2) before anything is written; the cheap
checks come first, the ones that start a helper process (checkpoint, closed rules) last.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import math
import os
import socket
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from mlbench import gpus_here, rcp_schedule, registry, results, seed_claims, spec
from mlbench.cli_numbers import shown
from mlbench.errors import IncompleteInstall, UserError, missing_package, printable, unprintable

if TYPE_CHECKING:
    from rich.console import Console

    from mlbench.launch.slurm import SlurmOptions
    from mlbench.layout import Layout
    from mlbench.planner.memory import MemoryPlan
    from mlbench.runner import RunOptions
    from mlbench.spec import Benchmark

# numpy's legacy seeding takes 0 .. 2**32 - 1 and every library a run seeds accepts that range; run i of a set
# uses seed + i, so the last run's seed must fit too.
SEED_MAX = spec.SEED_MAX
MAX_DEVICES = spec.MAX_DEVICES
MAX_GLOBAL_BATCH = spec.MAX_GLOBAL_BATCH
# Runs in one set: 100 times the most any MLPerf benchmark requires (10: bert, llama31_8b, gpt_oss_20b). Each run is
# a result_<i> and a seed of its own, and the set is planned before the first starts: 3,000,000,000 was a traceback
# (the random first seed's range), 200,000,000 ran out of memory, and a dry run took 100,000,000,000.
MAX_RUNS = 1000
# FP8 tensor cores: compute capability 8.9 (Ada) and newer (Hopper 9.0, Blackwell 10.0); what Transformer
# Engine's FP8 recipes require.
FP8_COMPUTE_CAPABILITY = 8.9


@dataclass(frozen=True)
class LayoutRequest:
    """The layout options as the user gave them; None (or absent from `features`) means the benchmark's own."""

    nodes: int = 1
    nproc_per_node: int = 1
    tp: int | None = None
    pp: int | None = None
    vp: int | None = None
    cp: int | None = None
    ep: int | None = None
    micro_batch_size: int | None = None
    global_batch_size: int | None = None
    precision: Literal["bf16", "fp8"] | None = None
    features: dict = field(default_factory=dict)  # FeaturesSpec fields the user set
    asymmetric_split: bool | None = None  # embedding and loss counted as pipeline layers; None: the reference's


@dataclass(frozen=True)
class RunRequest:
    """`mlbench run`'s options, unchecked."""

    name: str
    tiny: bool = False
    layout: LayoutRequest = LayoutRequest()
    seed: int | None = None
    runs: int = 1
    results_root: Path = Path("results")
    system: str | None = None
    launcher: Literal["local", "torchrun", "slurm"] = "local"
    rdzv_endpoint: str | None = None
    node_rank: int = 0
    rdzv_timeout: float = 600.0
    hang_timeout: float = 300.0
    threads: int = 1
    dry_run: bool = False
    data_path: str | None = None
    eval_data_path: str | None = None
    init_checkpoint: Path | None = None
    save_checkpoint: Path | None = None
    ignore_closed_rules: bool = False
    given: frozenset[str] = frozenset()  # the fields given on the command line, at their default value or not
    # the device whose memory the plan is checked against (mlbench.planner.devices); None: the local GPU for a
    # run on this machine, none for a dry run or a SLURM job
    device: str | None = None
    # the learning rate and warm-up steps, over the benchmark's (needed at a batch off an RCP table)
    lr: float | None = None
    warmup_steps: int | None = None
    # slurm launcher
    partition: str | None = None
    account: str | None = None
    time_limit: str = "02:00:00"
    sbatch_args: tuple[str, ...] = ()
    container_image: str | None = None
    container_mounts: str | None = None
    master_addr: str | None = None
    gpus_per_node: int = 0


@dataclass(frozen=True)
class PreparedRun:
    """A checked request: what the launcher takes."""

    bench: Benchmark
    layout: Layout
    opts: RunOptions
    slurm_opts: SlurmOptions | None
    dry_run: bool
    # A dry run's: why a real run of the same command would be refused, by what only it needs (the launcher that
    # reaches the nodes, the data and the checkpoint, this machine's device where it trains here). A dry run plans
    # a run from anywhere, so it checks them but is not refused for them: it says them.
    real_run_refusals: tuple[str, ...] = ()


@dataclass(frozen=True)
class DeviceFacts:
    """What the precision check needs to know of the device a run trains on."""

    name: str
    gpu: bool
    fp8: bool | None  # None: not known (a GPU nvidia-smi could not describe)
    count: int | None = None  # GPUs a rank here may take (nvidia-smi's, within CUDA_VISIBLE_DEVICES); None: unknown


def prepare(req: RunRequest, console: Console | None = None) -> PreparedRun:
    """Checks the request and resolves it into a benchmark, a layout and the launcher's options. `console`: where
    the checkpoint check reports what it found (nothing is printed without one)."""
    from mlbench import runner

    refusals: list[str] = []

    def real_run(check: Callable[[], object]) -> None:
        """CHECK, which only a real run needs: refused; for a dry run, said (`real_run_refusals`)."""
        try:
            check()
        except UserError as e:
            if not req.dry_run:
                raise
            refusals.append(str(e))

    _check_options(req)
    if req.launcher == "torchrun" and req.dry_run:
        real_run(lambda: _rendezvous_reachable(req))
    if req.launcher == "local":
        real_run(lambda: _local_launcher_here(req))
    system = req.system if req.system is not None else runner.default_system()
    results.check_name("--system" if req.system is not None else "this host's name (the default --system)", system)
    bench = _benchmark(req)
    check_lr(bench, req.lr)
    _check_data(bench, req)
    if req.dry_run:
        real_run(lambda: _check_data(bench, dataclasses.replace(req, dry_run=False)))
    real_run(lambda: _checkpoint_given(bench, req))
    _check_checkpoint_flags(bench, req)
    layout = resolve_layout(bench, req.layout)
    bench = rcp_schedule.for_run(bench, layout.global_batch_size, req.lr, req.warmup_steps)
    registry.check_budget_at(bench, layout.global_batch_size)  # (the file's checks, at this run's batch)
    check_min_lr(bench, layout.global_batch_size, req.lr)
    # This machine's device (nvidia-smi, asked once), where the run trains here; a SLURM job trains elsewhere, and
    # a dry run's plan is of the device it names (its checks here are said, not refused: `real_run`).
    # (a dry run of several nodes through the local launcher plans a cluster's run, which this machine is no node of)
    local = None if req.launcher == "slurm" or (req.dry_run and req.launcher == "local" and layout.nodes > 1) \
        else local_device()
    if local is not None:
        real_run(check_training_stack)
        real_run(lambda: _device_here(bench, layout, req, local))
    here = None if req.dry_run else local
    rdzv = req.rdzv_endpoint if req.launcher == "torchrun" else None
    cpu_here = cpu_memory(layout.nproc_per_node, runner.ranks_forked(layout, rdzv)) \
        if local is not None and not local.gpu else None
    device = memory_device(req, here, cpu_here)
    if req.device is not None:  # the GPU the run is planned for takes its precision, as `plan` checks it
        from mlbench.planner import devices

        devices.get(req.device).peak_flops(layout.precision)
    check_memory(bench, layout, device, cpu_here=cpu_here, real_run=real_run)
    if local is not None and local.gpu:
        real_run(lambda: check_gpus_free(bench, layout))
    check_path_lengths(req.results_root, system, bench, layout, req.launcher, req.runs)
    if req.save_checkpoint:
        check_save_path_length(req.save_checkpoint, layout.world_size, req.launcher)
    check_results_folder(req.results_root, system, bench.name)
    _check_target(bench)
    if req.seed is not None and req.node_rank == 0:  # (another node's folder holds its rank logs, no results)
        # (seed_claims: its results' seeds, its runs' not yet published, and those a set in progress claimed; said
        # before anything is written, and claimed as the set starts)
        real_run(lambda: seed_claims.check_free(Path(req.results_root) / system / bench.name, req.seed, req.runs,
                                                say=lambda note: console and console.print(
                                                    printable(note), highlight=False, soft_wrap=True)))
    slurm_opts = _slurm_options(req, bench, layout)
    # absolute from here on: the working folder may be removed while the run trains (its results elsewhere, `--results
    # ../r`), and the checker, run in a folder of its own, then could not find the log ('could not run: No such
    # file or directory', the run said non-compliant)
    opts = runner.RunOptions(results=absolute(req.results_root), system=system, runs=req.runs, seed=req.seed,
                             hang_timeout=req.hang_timeout, node_rank=req.node_rank,
                             rdzv_endpoint=rdzv,
                             rdzv_timeout=req.rdzv_timeout,
                             threads=req.threads,
                             init_checkpoint=str(req.init_checkpoint.resolve()) if req.init_checkpoint else "",
                             save_checkpoint=str(req.save_checkpoint.resolve()) if req.save_checkpoint else "",
                             device=device.name if device else "")
    if opts.init_checkpoint and not req.dry_run:  # the dry run checks it itself, and prints what it found
        check_checkpoint_fits(bench, layout, opts, console)
    if bench.variant != "tiny" and not req.dry_run and not req.ignore_closed_rules:
        check_closed_rules(bench, layout, system)
    return PreparedRun(bench=bench, layout=layout, opts=opts, slurm_opts=slurm_opts, dry_run=req.dry_run,
                       real_run_refusals=tuple(refusals))


def _device_here(bench: Benchmark, layout: Layout, req: RunRequest, here: DeviceFacts) -> None:
    """The layout on this machine's device, where the run trains here."""
    check_precision(layout.precision, req.layout.precision is not None, here)
    if layout.cp > 1 or layout.features.sequence_parallel:
        check_without_transformer_engine(bench, layout, _importable("transformer_engine"))
    check_gpus_here(layout.nproc_per_node, here)


def _local_launcher_here(req: RunRequest) -> None:
    if req.layout.nodes is not None and req.layout.nodes > 1:
        raise UserError(f"--launcher local runs on this machine only; for --nodes {req.layout.nodes} use --launcher "
                        f"torchrun (one invocation per node) or slurm")


# ---- the request's own values ---------------------------------------------------------------------------


MIN_HANG_TIMEOUT_S = 1.0
MAX_THREADS = 8192  # Linux's NR_CPUS at its largest (x86_64 MAXSMP): no node has more CPUs
MIN_RDZV_TIMEOUT_S, MAX_RDZV_TIMEOUT_S = 1.0, 7 * 86400.0  # a week: the longest a cluster queue plausibly holds a node


def _check_options(req: RunRequest) -> None:
    """Values wrong whatever the benchmark: refused first, each naming its flag and the range it takes."""
    if req.runs < 1:
        raise UserError(f"--runs must be at least 1, got {req.runs}")
    if req.runs > MAX_RUNS:
        raise UserError(f"--runs {req.runs} is more than a set takes: at most {MAX_RUNS} (MLPerf scores a set of 3 to "
                        f"10 runs; {MAX_RUNS} is 100 times the most, each run a result of its own)")
    if req.seed is not None and not 0 <= req.seed <= SEED_MAX - (req.runs - 1):
        last = f" (run i uses seed + i: with --runs {req.runs}, at most {SEED_MAX - req.runs + 1})" if req.runs > 1 \
            else ""
        raise UserError(f"--seed {req.seed} is out of range: seeds are 0 to {SEED_MAX}{last}")
    if not 0 < req.hang_timeout < math.inf:  # also NaN
        raise UserError(f"--hang-timeout must be a positive number of seconds, got {req.hang_timeout}")
    if req.hang_timeout < MIN_HANG_TIMEOUT_S:  # 0.001 stopped a healthy run as hung between two steps
        raise UserError(f"--hang-timeout {req.hang_timeout:g} is shorter than a step can be counted on to take; "
                        f"at least {MIN_HANG_TIMEOUT_S:g} s (it is the longest a step may take)")
    if not MIN_RDZV_TIMEOUT_S <= req.rdzv_timeout <= MAX_RDZV_TIMEOUT_S:  # also NaN
        raise UserError(f"--rdzv-timeout must be {MIN_RDZV_TIMEOUT_S:g} to {MAX_RDZV_TIMEOUT_S:g} seconds, got "
                        f"{req.rdzv_timeout}")
    if req.lr is not None and not 0 < req.lr < math.inf:
        raise UserError(f"--lr must be a positive number, got {req.lr}")
    if req.threads < 1:
        raise UserError(f"--threads must be at least 1, got {req.threads}")
    if req.threads > MAX_THREADS:  # a SLURM job's nodes are not checked below: 2**31 failed in each rank as it started
        raise UserError(f"--threads {req.threads} is more than any node has CPUs: at most {MAX_THREADS} (Linux's "
                        f"largest CPU count, NR_CPUS under MAXSMP)")
    cpus = len(os.sched_getaffinity(0))
    if req.launcher != "slurm" and req.threads > cpus:  # (a SLURM job's nodes are not this machine)
        raise UserError(f"--threads {req.threads} is more than the {cpus} CPUs this machine gives this process: at "
                        f"most {cpus} (threads beyond the CPUs only wait; far more kill the rank at its first step)")
    if req.gpus_per_node < 0:
        raise UserError(f"--gpus-per-node must be 0 or more, got {req.gpus_per_node}")
    ly = req.layout
    for flag, value in (("--nodes", ly.nodes), ("--nproc-per-node", ly.nproc_per_node)):
        if value < 1:
            raise UserError(f"{flag} must be at least 1, got {value}")
    _check_launcher_options(req)
    if not 0 <= req.node_rank < ly.nodes:
        raise UserError(f"--node-rank {req.node_rank} must be between 0 and --nodes - 1 = {ly.nodes - 1}")
    if req.launcher == "torchrun":
        if not req.rdzv_endpoint:
            raise UserError("--launcher torchrun needs --rdzv-endpoint HOST:PORT (the same on every node)")
        host, bare, port = _endpoint(req.rdzv_endpoint)
        if not bare or any(c.isspace() or c in "/@[]" for c in bare) or (":" in bare and bare == host) \
                or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
            raise UserError(f"--rdzv-endpoint {req.rdzv_endpoint!r} must be HOST:PORT with a port 1-65535 (a host "
                            f"name or address, [ADDRESS] for IPv6; no scheme, no path)")
        if not req.dry_run:  # (a dry run plans from anywhere: prepare says it, `real_run`)
            _rendezvous_reachable(req)
    if req.save_checkpoint and req.runs != 1:
        raise UserError(f"--save-checkpoint saves one run's state; got --runs {req.runs}")
    for flag, path in (("--results", req.results_root), ("--save-checkpoint", req.save_checkpoint)):
        _check_printable(flag, path)


def _endpoint(endpoint: str) -> tuple[str, str, str]:
    """HOST:PORT as (host, the host without the brackets of [IPv6]:PORT, port)."""
    host, _, port = endpoint.rpartition(":")
    return host, host[1:-1] if host.startswith("[") and host.endswith("]") else host, port


def _rendezvous_reachable(req: RunRequest) -> None:
    """--rdzv-endpoint's host resolves here, and is this host where this node is node 0 (a well-formed endpoint)."""
    _, bare, port = _endpoint(req.rdzv_endpoint)
    try:  # torchrun retried an unknown host for a minute and a half, then said only that it exited
        found = socket.getaddrinfo(bare, int(port), type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as e:
        raise UserError(f"--rdzv-endpoint {req.rdzv_endpoint!r}: the host {bare!r} does not resolve "
                        f"({getattr(e, 'strerror', None) or e}); give node 0's host name or address") from None
    here = [a for a in found if _is_here(a)]
    if req.node_rank == 0 and not here:
        # node 0's torchrun serves the rendezvous at the endpoint: elsewhere it waited --rdzv-timeout (600 s), then
        # blamed 'what answered there'
        raise UserError(f"--rdzv-endpoint {req.rdzv_endpoint!r}: node 0 (--node-rank 0) serves the rendezvous "
                        f"there, and {bare} is no address of this host; give this host's name or address, or "
                        f"start this node with its own --node-rank")
    if req.node_rank == 0 and all(_is_taken(a) for a in here):
        # (the run was started, and published as aborted, when torchrun's store could not listen there)
        raise UserError(f"--rdzv-endpoint {req.rdzv_endpoint!r}: node 0 (--node-rank 0) serves the rendezvous "
                        f"there, and port {port} of {bare} is taken by another process (a node 0 started already?); "
                        f"give a free port")


def _is_taken(addrinfo: tuple) -> bool:
    """Whether another socket listens at a getaddrinfo answer's address and port, as torchrun's store would bind it
    (SO_REUSEADDR: a port a closed connection left in TIME_WAIT is free to it)."""
    family, kind, proto, _, address = addrinfo
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(address)
        except OSError as e:
            return e.errno == errno.EADDRINUSE
    return False


def _is_here(addrinfo: tuple) -> bool:
    """Whether a getaddrinfo answer is an address of this host: a socket can be bound to it."""
    family, kind, proto, _, address = addrinfo
    try:
        with socket.socket(family, kind, proto) as s:
            s.bind((address[0], 0, *address[2:]))
        return True
    except OSError:
        return False


def _check_printable(flag: str, path: Path | None) -> None:
    """A folder mlbench makes and names in its output (the result's path on the last line, the rank logs', the
    checkpoint's): without control characters (a newline split the final line in two), as --system is."""
    import unicodedata

    bad = next((c for c in str(path) if unicodedata.category(c) in ("Cc", "Zl", "Zp") or "\udc80" <= c <= "\udc9f"),
               None) if path else None  # (an undecodable C1 byte, 0x9B say, is a control character too)
    if bad is not None:
        raise UserError(f"{flag} '{printable(path)}' holds a control character ('{printable(bad)}'), which would "
                        f"break the lines that name the folder; choose a name without one")


# The options of one launcher, by flag and field. Given with another launcher they would be dropped without a word:
# a --partition without --launcher slurm would train on the machine the command was typed on. A flag may belong to
# several (--rdzv-timeout: the nodes' wait for each other under torchrun and in a SLURM job).
LAUNCHER_OPTIONS = {
    "torchrun": {"--rdzv-endpoint": "rdzv_endpoint", "--node-rank": "node_rank", "--rdzv-timeout": "rdzv_timeout"},
    "slurm": {"--partition": "partition", "--account": "account", "--time": "time_limit", "--sbatch-arg": "sbatch_args",
              "--container-image": "container_image", "--container-mounts": "container_mounts",
              "--master-addr": "master_addr", "--gpus-per-node": "gpus_per_node", "--rdzv-timeout": "rdzv_timeout"},
}


def _check_launcher_options(req: RunRequest) -> None:
    """Options of another launcher than the one chosen (given, or set to other than their defaults) are refused, and
    the chosen launcher's text options may not be empty."""
    defaults = {f.name: f.default for f in dataclasses.fields(RunRequest)}
    owners: dict[str, list[str]] = {}
    for launcher, options in LAUNCHER_OPTIONS.items():
        for flag in options:
            owners.setdefault(flag, []).append(launcher)
    for flag, launchers in owners.items():
        name = LAUNCHER_OPTIONS[launchers[0]][flag]
        value = getattr(req, name)
        if req.launcher not in launchers and (value != defaults[name] or name in req.given):  # (--time 02:00:00)
            raise UserError(f"{flag} is an option of --launcher {' or '.join(launchers)}, and this run's launcher "
                            f"is {req.launcher}: add --launcher {launchers[0]}, or leave {flag} out")
        if req.launcher in launchers and isinstance(value, str) and not value.strip():
            raise UserError(f"{flag} is empty; give a value, or leave it out for the default")
    # a host name's letters, digits, dots and hyphens; an address's colons, [ ] and % (IPv6, its zone)
    if req.master_addr is not None and (bad := next((c for c in req.master_addr if not c.isalnum()
                                                     and c not in ".-_:%[]"), None)) is not None:
        what = "a space" if bad == " " else repr(bad)[1:-1] if not bad.isprintable() else repr(bad)
        raise UserError(f"--master-addr {req.master_addr!r} is not a host name or an address (it holds {what})")
    if req.master_addr is not None and (problem := _address_problem(req.master_addr)):
        raise UserError(f"--master-addr {req.master_addr!r} is not a host name or an address ({problem})")


def bare_address(addr: str | None) -> str | None:
    """ADDR as MASTER_ADDR takes it: an IPv6 address without the brackets it may be written in ('[::1]' is how a URL or
    a host:port writes it; torch and the driver's resolver read the brackets as part of a host name that resolves
    nowhere: the job failed as it started, '--dry-run' having shown it good)."""
    return addr[1:-1] if addr and addr.startswith("[") and addr.endswith("]") else addr


def _address_problem(addr: str) -> str | None:
    """Why ADDR (its characters allowed) is neither a host name nor an IP address, or None. The job resolves it
    only as it starts: '-h' reached torchrun as an option, '999.1.1.1' a resolver that never answers it."""
    import ipaddress

    bare = addr[1:-1] if addr.startswith("[") and addr.endswith("]") else addr
    if ":" in bare or "%" in bare or bare != addr:
        try:
            ipaddress.IPv6Address(bare)
        except ValueError:
            return "not an IPv6 address"
        return None
    labels = bare.removesuffix(".").split(".")  # (a trailing dot: a fully qualified name)
    if all(label.isdigit() for label in labels):
        try:
            ipaddress.IPv4Address(bare)
        except ValueError:
            return "not an IPv4 address: four numbers of 0 to 255"
        return None
    if any(not label or label[0] == "-" or label[-1] == "-" for label in labels):
        return ("a host name's dot-separated labels are letters, digits and hyphens, none empty and none starting or "
                "ending with a hyphen")
    return None


def check_lr(bench: Benchmark, lr: float | None) -> None:
    """--lr against what the benchmark's optimizer can take (spec.max_lr: its first step, in float32)."""
    beta1 = bench.optimizer.beta1
    if lr is not None and lr > spec.max_lr(beta1):
        raise UserError(f"--lr {lr:g} is more than {bench.name}'s optimizer can take: its first step moves each "
                        f"weight by up to lr / (1 - beta1) (optimizer.beta1 {beta1!r}) in float32, whose largest "
                        f"number is {spec.FLOAT32_MAX:.3g}; at most {spec.max_lr(beta1):.3g}")
    if lr is not None and lr >= spec.MAX_MAGNITUDE:  # as optimizer.lr in a benchmark file (1e20 passed the flag)
        raise UserError(f"--lr {lr:g} is beyond the bound of every number a benchmark file holds: below "
                        f"{spec.MAX_MAGNITUDE:.3g}")


_FLOAT32_SMALLEST = 1.401298464324817e-45  # float32's smallest positive (subnormal) number


def check_min_lr(bench: Benchmark, gbs: int, lr: float | None) -> None:
    """--lr, once the schedule at this batch is known: not 0 in float32, the precision the optimizer keeps it in
    (5e-324 and 1e-300 trained nothing, to the end of the budget), and not below the schedule's min_lr (it decays
    from lr down to min_lr: from below, it would rise)."""
    import struct

    if lr is None:
        return
    min_lr = rcp_schedule.at(bench, gbs).min_lr
    zero = struct.unpack("f", struct.pack("f", lr))[0] == 0
    if zero or lr < min_lr:
        why = " and ".join(w for w in ("is 0 in float32 (the optimizer's precision: nothing would train)" if zero
                                       else "", f"is below {bench.name}'s min_lr {min_lr!r} at global batch {gbs} "
                                       f"(the schedule decays from lr down to min_lr)" if lr < min_lr else "") if w)
        least = repr(min_lr) if min_lr >= _FLOAT32_SMALLEST else f"{_FLOAT32_SMALLEST:.3g}"
        # the values as given (repr): rounded, 0.00029999999 read 'is below min_lr 0.0003: give 0.0003 or more'
        raise UserError(f"--lr {lr!r} {why}: give --lr {least} or more ({bench.name}'s min_lr {min_lr!r}; float32's "
                        f"smallest positive number {_FLOAT32_SMALLEST:.3g})")


def check_results_folder(root: Path, system: str, benchmark: str) -> None:
    """The folder results will go to can be created and written, without creating it (a refused run leaves
    nothing behind)."""
    folder = Path(root) / system / benchmark
    existing, why = _creatable(folder)
    if why:
        raise UserError(f"results folder {folder} is not writable ({existing} {why}); pass --results DIR with a "
                        f"folder you can write")
    logs = folder / "logs"
    if os.path.lexists(logs) and not logs.is_dir():  # (the rank logs of a failed run were dropped without a word)
        raise UserError(f"results folder {folder}: {logs} is not a folder, and a run keeps its rank logs in it; move "
                        f"it, or pass --results DIR elsewhere")
    # one this user cannot write or search: the rank logs were dropped as quietly (a failed run's only account)
    if logs.is_dir() and (why := _creatable(logs)[1]):
        raise UserError(f"results folder {folder}: {logs} {why}, and a run keeps its rank logs in it; make it "
                        f"writable, or pass --results DIR elsewhere")
    if logs.is_dir() and folder.is_dir() and logs.stat().st_dev != folder.stat().st_dev:  # (dropped as quietly)
        link = f" (a link to {os.readlink(logs)})" if logs.is_symlink() else ""
        raise UserError(f"results folder {folder}: {logs}{link} is on another filesystem, and a run moves its rank "
                        f"logs into it by a rename, which cannot cross filesystems; make it a folder on the results "
                        f"folder's filesystem, or pass --results DIR elsewhere")


# What a run makes below its staging folder, the longest of each kind: rank logs (the launcher's layout: torchrun's
# <run id>_<8 random>, a SLURM job's node<k>/<job id>_<8 random>; a job id is a 32-bit number) and, for indexed
# data on one node, megatron's index cache (<md5>-BlendedDataset-<split>-dataset_sample_index.npy).
_RANK_LOGS = {"direct": "ranks/direct/attempt_0/0/stderr.log", "local": "ranks/local/attempt_0/{rank}/stderr.log",
              "torchrun": "ranks/mlbench-run{run}_XXXXXXXX/attempt_0/{rank}/stderr.log",
              "slurm": "ranks/node{node}/4294967295_XXXXXXXX/attempt_0/{rank}/stderr.log"}
_INDEX_CACHE = "data_cache/" + "0" * 32 + "-BlendedDataset-train-dataset_sample_index.npy"
# A SLURM job's staging folder is made on its first node, by its driver: the longest owner tag (mlbench.owners:
# a pid, a start time in clock ticks, a host name of up to 64 bytes and a PID namespace).
_LONGEST_TAG = f"{2**22}-{2**64}-{'h' * 64}@{2**32}"


def absolute(path: Path | str) -> Path:
    """PATH from the working folder, as the system reads it now: its leading '..' taken off the working folder
    (os.getcwd names it without links, so this is exact), the rest as given (a link in it stays a link). Not
    Path.absolute(): '/w/cwd/../r' no longer opens once /w/cwd is removed."""
    path = Path(path)
    if path.is_absolute():
        return path
    base, parts = Path(os.getcwd()), path.parts
    while parts and parts[0] == "..":
        base, parts = base.parent, parts[1:]
    return base.joinpath(*parts)


def check_path_lengths(root: Path, system: str, bench: Benchmark, layout: Layout, launcher: str, runs: int) -> None:
    """The deepest path the run will make under --results (its staging folder, then its rank logs or data index
    cache) within the filesystem's limits: NAME_MAX for each name, PATH_MAX for the whole. A path past them failed
    once the run had started ('File name too long' for its staging files: nothing published, no record)."""
    from mlbench import owners
    from mlbench.cli_paths import path_limit

    kind = "direct" if launcher == "local" and layout.world_size == 1 else launcher
    below = _RANK_LOGS[kind].format(rank=layout.nproc_per_node - 1, run=runs - 1, node=layout.nodes - 1)
    if bench.data.source == "indexed" and layout.nodes == 1:
        below = max(below, _INDEX_CACHE, key=len)
    staging = f"{results.STAGING}{_LONGEST_TAG if launcher == 'slurm' else owners.tag()}-XXXXXXXX"
    top = Path(os.path.abspath(root))
    deepest = top / system / bench.name / staging / below
    name_max = path_limit("PC_NAME_MAX", deepest, 255)
    for part in deepest.parts[1:]:
        if len(os.fsencode(part)) > name_max:
            raise UserError(f"--results {root}: File name too long (a name takes at most {name_max} bytes; give a "
                            f"shorter one): {part[:40]!r}{'...' if len(part) > 40 else ''} is "
                            f"{len(os.fsencode(part))} bytes")
    path_max, size = path_limit("PC_PATH_MAX", deepest, 4096), len(os.fsencode(str(deepest)))
    if size >= path_max:  # PATH_MAX counts the terminating NUL
        most = path_max - 1 - (size - len(os.fsencode(str(top))))
        raise UserError(f"--results {root}: too deep for a run: the deepest path it makes there, <results>/{system}/"
                        f"{bench.name}/{staging}/{below}, would be {size} bytes (a path takes at most {path_max - 1} "
                        f"bytes: PATH_MAX {path_max} with its terminating NUL); give a results folder whose absolute "
                        f"path is at most {most} bytes")


def check_save_path_length(save: Path, world_size: int, launcher: str, what: str = "--save-checkpoint") -> None:
    """The deepest file a checkpoint save makes (in its staging folder `.NAME.partial-<owner tag>` beside SAVE:
    megatron-core's `__<rank>_<thread>.distcp`, .metadata, common.pt, metadata.json) within NAME_MAX and PATH_MAX.
    Past them the run trained to its end, then 'checkpoint NOT saved: File name too long'."""
    from mlbench import owners
    from mlbench.cli_paths import path_limit
    from mlbench.train.checkpoint import folder as checkpoint_folder

    dest = Path(os.path.abspath(save))
    if launcher == "slurm":
        tag = _LONGEST_TAG
    else:  # a rank's tag: this host's, with the longest pid this host gives
        try:
            pid_max = Path("/proc/sys/kernel/pid_max").read_text().strip()
        except OSError:
            pid_max = str(2**22)
        tag = f"{pid_max}-{owners.tag().split('-', 1)[1]}"
    partial = f"{checkpoint_folder.partial_prefix(dest)}{tag}"
    file = max(f"__{world_size - 1}_1.distcp", ".metadata", "common.pt", "metadata.json", key=len)
    deepest = dest.parent / partial / file
    name_max = path_limit("PC_NAME_MAX", deepest, 255)
    if len(os.fsencode(partial)) > name_max:
        raise UserError(f"{what} {save}: File name too long: the save is made in {partial[:60]!r}... "
                        f"beside it, {len(os.fsencode(partial))} bytes (a name takes at most {name_max}); give a "
                        f"name of at most {name_max - len(os.fsencode(partial)) + len(os.fsencode(dest.name))} "
                        f"bytes")
    path_max, size = path_limit("PC_PATH_MAX", deepest, 4096), len(os.fsencode(str(deepest)))
    if size >= path_max:  # PATH_MAX counts the terminating NUL
        raise UserError(f"{what} {save}: too deep: the deepest file the save makes, "
                        f"<its folder's parent>/{partial}/{file}, would be {size} bytes (a path takes at most "
                        f"{path_max - 1} bytes: PATH_MAX {path_max} with its terminating NUL); give a path at most "
                        f"{path_max - 1 - (size - len(os.fsencode(str(dest))))} bytes long")


def _creatable(folder: Path) -> tuple[Path, str]:
    """Whether FOLDER can be made: its nearest existing ancestor, and why not ("" where it can). Tried, by making
    and removing a folder there: permissions say nothing for root, who still cannot make one in /proc or on a
    read-only mount."""
    existing = folder
    try:
        _exists(folder)
    except PermissionError:  # (Path.exists raised it: '/root/x/vm/gpt3: Permission denied', nothing else said)
        return unsearchable(folder), _UNSEARCHABLE
    while not _exists(existing) and existing != existing.parent:
        if existing.is_symlink():  # mkdir through it said "File exists"
            loop = False
            try:
                existing.resolve(strict=True)
            except RuntimeError:  # Python 3.11's word for ELOOP
                loop = True
            except OSError as e:
                loop = e.errno == errno.ELOOP
            where = "leads back to itself (a loop of links)" if loop else "does not exist"
            return existing, f"is a link to {os.readlink(existing)}, which {where}"
        existing = existing.parent
    if not existing.is_dir():
        return existing, "is not a folder"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".mlbench-probe-", dir=existing))
    except OSError as e:
        return existing, f"is not a folder this user can write: {e.strerror or e}"
    return existing, ""


def _exists(path: Path) -> bool:
    """Path.exists: PermissionError where a folder on the way cannot be searched."""
    try:
        os.stat(path)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP):
            return False
        raise
    return True


_UNSEARCHABLE = "is not a folder this user can search: Permission denied"


def unsearchable(path: Path | str) -> Path:
    """The first folder on the way to PATH that this user cannot search (no x permission), else PATH's parent."""
    path = absolute(path)
    return next((p for p in reversed(path.parents) if not os.access(p, os.X_OK)), path.parent)


# ---- benchmark, data and checkpoints --------------------------------------------------------------------


def _benchmark(req: RunRequest) -> Benchmark:
    """The benchmark, with --data-path / --eval-data-path in it (so the plan and the run record carry them)."""
    from mlbench.train.data.paths import absolute

    bench = registry.load(req.name, tiny=req.tiny)  # (the file's own paths made absolute there)
    given = {"path": ("--data-path", req.data_path), "eval_path": ("--eval-data-path", req.eval_data_path)}
    # Made absolute, so the record says which data was used; relative to the working folder, where the flag was given
    overrides = {k: absolute(bench.data.source, v, flag) for k, (flag, v) in given.items() if v is not None}
    return dataclasses.replace(bench, data=dataclasses.replace(bench.data, **overrides)) if overrides else bench


def _check_data(bench: Benchmark, req: RunRequest) -> None:
    from mlbench.train import data

    given = {key for key, flag in (("path", req.data_path), ("eval_path", req.eval_data_path)) if flag is not None}
    data.check(bench, req.layout.nodes, dry_run=req.dry_run, given=given)


def _check_target(bench: Benchmark) -> None:
    from mlbench.train import data

    data.check_target(bench)  # (seconds at a large synthetic vocabulary: after the cheap checks)


def _checkpoint_given(bench: Benchmark, req: RunRequest) -> None:
    """Where the benchmark starts from a checkpoint, one is given; where it trains from random weights, none
    (at full size: the tiny variants resume for testing)."""
    if req.init_checkpoint and not bench.train.init_checkpoint and bench.variant != "tiny" \
            and not req.ignore_closed_rules:
        # trained weights would converge in a fraction of the time, and the log (init_checkpoint_step 0) pass
        raise UserError(f"{bench.name} trains from random weights (its closed rules: no checkpoint to start from); "
                        f"--init-checkpoint would make the run another benchmark, whatever its log says: leave it "
                        f"out, or pass --ignore-closed-rules to run it anyway")
    if bench.train.init_checkpoint and not req.init_checkpoint:
        # A run from random weights would not be the MLPerf benchmark, whatever its log says.
        other = "" if req.dry_run else "; or use --dry-run for the full size, --tiny for a CPU run"
        raise UserError(f"{bench.name} starts from a checkpoint: pass --init-checkpoint DIR, the "
                        f"{bench.train.init_checkpoint.split(' (')[0]} as a megatron-core distributed checkpoint "
                        f"(docs/checkpoints.md){other}")


def _check_checkpoint_flags(bench: Benchmark, req: RunRequest) -> None:
    """The checkpoint flags on their own: readable, a new folder."""
    if req.init_checkpoint:
        from mlbench.train.checkpoint import folder  # no torch: the model-shape check is the dry run's helper

        try:
            folder.check_readable(req.init_checkpoint)
        except folder.CheckpointError as e:
            raise UserError(str(e)) from None
        for flag, path in (("--results", req.results_root), ("--save-checkpoint", req.save_checkpoint)):
            # (the run's files, or another checkpoint, written into the one it loads: accepted before)
            if path is not None and _within(Path(path), req.init_checkpoint):
                raise UserError(f"{flag} {path} is inside --init-checkpoint {req.init_checkpoint}, which a run only "
                                f"reads; give {flag} a folder outside it")
    if req.save_checkpoint:
        check_new_folder("--save-checkpoint", req.save_checkpoint)
        save, results = req.save_checkpoint.resolve(), Path(req.results_root).resolve()
        if save == results or results in save.parents or save in results.parents:
            # The results tree would be there at the end (the save refused it after the whole run), or the
            # checkpoint folder would sit among the runs (as result_0.txt, even) that score reads
            raise UserError(f"--save-checkpoint {req.save_checkpoint} and --results {req.results_root} overlap; "
                            f"save the checkpoint outside the results folder")


def _within(path: Path, folder: Path) -> bool:
    """Whether PATH is FOLDER or below it: any of its existing folders the same file as FOLDER (a link, `..` or a
    bind mount of it: the paths alone missed the mount)."""
    for p in (path.resolve(), *path.resolve().parents):
        with contextlib.suppress(OSError):
            if os.path.samefile(p, folder):
                return True
    return False


def check_new_folder(what: str, path: Path) -> None:
    """A folder about to be written (a checkpoint): new, and creatable, its name printable (it is printed), not a
    link (a dangling one was found only after a conversion, its output left aside), not through a loop of links (a
    RuntimeError out of resolve())."""
    bad = unprintable(str(path))
    if bad is not None:
        raise UserError(printable(f"{what} {path}: holds {repr(bad)[1:-1]}, a character that is not printable; name "
                                  f"the folder without one"))
    try:
        _exists(path)
    except PermissionError:  # (Path.is_symlink raised it: '/root/ck: Permission denied', the option not named)
        raise UserError(f"{what} {path}: {unsearchable(path)} {_UNSEARCHABLE}; give a path this user can reach") \
            from None
    if path.is_symlink():
        raise UserError(f"{what} {path}: is a symbolic link (to {os.readlink(path)}); a checkpoint is written to a new "
                        f"folder: give its own path")
    if path.exists():
        raise UserError(f"{what} {path}: exists; a checkpoint is never overwritten")
    try:
        resolved = path.resolve()
    except RuntimeError:  # (Python 3.11 on a loop of links; later versions raise OSError ELOOP)
        raise UserError(f"{what} {path}: its path runs through a loop of symbolic links; give another") from None
    except OSError as e:
        raise UserError(f"{what} {path}: {e.strerror or e}; give another path") from None
    parent, why = _creatable(resolved)
    if why:
        raise UserError(f"{what} {path}: {parent} {why}")


def check_checkpoint_fits(bench: Benchmark, layout: Layout, opts: RunOptions, console: Console | None) -> None:
    """The --init-checkpoint against the model this run builds (names and shapes, in a helper process that
    builds it on the meta device), before launch: a checkpoint that does not fit is bad input, not a run that
    dies after its log is published. Its files as checked go into OPTS, for the ranks (each loads those or
    refuses: a checkpoint changed between the check and the load was loaded unchecked). Its bytes are the ranks' to
    verify against its checksums, each its share (integrity.verify_share): read here, a 405B checkpoint with its
    Adam state held the launch ~30 min; the dry run reads them all."""
    from rich.console import Console as RichConsole

    from mlbench.dry_run import check_checkpoint
    from mlbench.run_plan import RunPlan

    plan = RunPlan(benchmark=bench, layout=layout.as_dict(), seed=0, run_dir="", system=opts.system, dry_run=True,
                   init_checkpoint=opts.init_checkpoint)
    opts.init_checkpoint_stamps = check_checkpoint(plan, console or RichConsole(quiet=True), checksums=False)


def check_closed_rules(bench: Benchmark, layout: Layout, system: str) -> None:
    """A full-size run whose log the closed rules would reject is refused before anything is launched: on a
    cluster that is hours of devices for a result that cannot be submitted."""
    from mlbench import compliance
    from mlbench.dry_run import closed_rule_problems

    problems = closed_rule_problems(bench, layout, system)
    if problems:
        listed = "; ".join(compliance.summary(p) for p in problems)
        raise UserError(f"the closed {bench.mlperf.benchmark} rules (training {bench.mlperf.ruleset}) reject this "
                        f"run's hyperparameters at global batch {layout.global_batch_size}, so its log would fail "
                        f"the official checker: {listed}. Choose a layout they accept (--dry-run shows the "
                        f"checker's verdict), or pass --ignore-closed-rules to run it anyway")


# ---- layout, features and device ------------------------------------------------------------------------


def resolve_layout(bench: Benchmark, req: LayoutRequest) -> Layout:
    """The layout for these options, every rule checked (mlbench.layout), and the flags the model cannot take
    refused: what `run` and `plan` share."""
    from mlbench import layout as layout_lib
    from mlbench.spec import check_expressions, check_schedule

    check_request(bench, req)
    layout = layout_lib.resolve(bench, req.nodes, req.nproc_per_node, req.tp, req.pp, req.vp, req.cp,
                                req.micro_batch_size, req.global_batch_size, ep=req.ep, features=req.features,
                                precision=req.precision, asymmetric_split=req.asymmetric_split)
    # The schedule's expressions at this batch (the file was checked at its own batches when it was loaded).
    check_expressions(bench, bench.where, [layout.global_batch_size])
    check_schedule(bench, bench.where, [layout.global_batch_size])
    check_recompute_layers(bench, layout, "recompute_layers" in req.features)
    return layout


def chunk_layers(num_layers: int, layout: Layout) -> list[int]:
    """The distinct transformer-layer counts of the layout's model chunks (a pipeline stage's, or each virtual
    stage's under vp), ascending: megatron's even split, where the embedding and the loss each take one layer's
    place in the first and the last chunk when counted (the asymmetric split). A chunk may have none."""
    embed, loss = layout.account_for_embedding_in_pipeline_split, layout.account_for_loss_in_pipeline_split
    chunks = layout.pp * layout.vp
    per = (num_layers + int(embed) + int(loss)) // chunks
    if chunks == 1:
        return [per - int(embed) - int(loss)]
    return sorted({per - int(embed), per - int(loss)} | ({per} if chunks > 2 else set()))


def check_recompute_layers(bench: Benchmark, layout: Layout, from_flag: bool) -> None:
    """Full recompute's layer count against the layers megatron-core applies it to: each model chunk's
    (TransformerBlock._checkpointed_forward, over the chunk's own layers). `uniform` recomputes the chunk in groups
    of that many layers, so it must divide every chunk's layers: a last, short group indexed past the chunk
    (IndexError once the run had started). `block` recomputes the first that many layers of each chunk: more
    than a chunk has would read as recomputing more than it does."""
    f = layout.features
    if f.recompute != "full":
        return
    n = f.recompute_layers
    sizes = [c for c in chunk_layers(bench.model.num_layers, layout) if c > 0]
    what = f"--recompute-layers {n}" if from_flag else \
        f"features.recompute_layers {n} ({Path(bench.path).name}; --recompute-layers sets it)"
    asymmetric = layout.account_for_embedding_in_pipeline_split or layout.account_for_loss_in_pipeline_split
    split = (f"{bench.name}'s {bench.model.num_layers} layers over pp {layout.pp} x vp {layout.vp} give "
             f"{' and '.join(map(str, sizes))} layer{'' if sizes == [1] else 's'} a pipeline chunk"
             + (" (the embedding and the loss take a layer's place in the first and the last)" if asymmetric else ""))
    if f.recompute_method == "uniform" and any(c % n for c in sizes):
        valid = [d for d in range(1, min(sizes) + 1) if all(c % d == 0 for c in sizes)]
        raise UserError(f"{what}: full recompute (uniform) recomputes each pipeline chunk's layers in groups of "
                        f"{n}, which must divide them, and {split}: give one of {', '.join(map(str, valid))}, or "
                        f"--recompute-method block")
    if f.recompute_method == "block" and n > max(sizes):
        raise UserError(f"{what}: full recompute (block) recomputes the first {n} layers of each pipeline chunk, "
                        f"and {split}: at most {max(sizes)}")


def check_request(bench: Benchmark, req: LayoutRequest) -> None:
    """What holds for a request whatever the layout: a bounded device count, known features, an ep the model can
    take (`plan` checks this once before searching layouts)."""
    from mlbench import layout as layout_lib
    from mlbench.spec import FeaturesSpec

    for flag, value in (("--nodes", req.nodes), ("--nproc-per-node", req.nproc_per_node), ("--tp", req.tp),
                        ("--pp", req.pp), ("--vp", req.vp), ("--cp", req.cp), ("--ep", req.ep),
                        ("--micro-batch-size", req.micro_batch_size), ("--global-batch-size", req.global_batch_size)):
        if value is not None and value < 1:  # (plan's search took a 0 for a value not given)
            raise UserError(f"{flag} must be at least 1, got {value}")
    if req.nodes * req.nproc_per_node > MAX_DEVICES:
        raise UserError(f"--nodes {req.nodes} x --nproc-per-node {req.nproc_per_node} = "
                        f"{req.nodes * req.nproc_per_node:,} devices; at most {MAX_DEVICES:,}")
    if req.global_batch_size is not None and req.global_batch_size > MAX_GLOBAL_BATCH:
        raise UserError(f"--global-batch-size {req.global_batch_size:,} is beyond any training run: at most "
                        f"{MAX_GLOBAL_BATCH:,} sequences a step")
    unknown = set(req.features) - {f.name for f in dataclasses.fields(FeaturesSpec)}
    if unknown:
        raise UserError(f"unknown feature {sorted(unknown)[0]!r}; known: "
                        f"{', '.join(f.name for f in dataclasses.fields(FeaturesSpec))}")
    layout_lib.features(bench, req.features)
    experts = bench.model.num_experts
    if req.ep is not None and req.ep > 1:
        if not experts:
            raise UserError(f"--ep {req.ep}: {bench.name} is a dense model (no experts), so there is nothing to split "
                            f"over expert-parallel ranks; expert parallelism needs a mixture-of-experts model")
        if experts % req.ep:
            valid = [d for d in range(1, experts + 1) if experts % d == 0]
            raise UserError(f"--ep {req.ep} must divide the model's {experts} experts; valid ep: "
                            f"{', '.join(map(str, valid))}")


def check_precision(precision: str, user_set: bool, device: DeviceFacts) -> None:
    """FP8 only where the device has FP8 tensor cores. On a CPU the benchmark's default FP8 is moot (CPU runs
    train in fp32), asking for it is refused; on a GPU without FP8 both are."""
    if precision != "fp8":
        return
    why = "--precision fp8" if user_set else "precision fp8 (the benchmark's default)"
    if not device.gpu:
        if user_set:
            raise UserError(f"{why} needs a GPU with FP8 tensor cores (compute capability {FP8_COMPUTE_CAPABILITY} or "
                            f"newer: Ada, Hopper, Blackwell); {device.name} has none: leave --precision out (a CPU "
                            f"run trains in fp32 whatever the layout's precision, as its record says)")
        return
    if device.fp8 is False:
        raise UserError(f"{why}: {device.name} has no FP8 tensor cores (compute capability "
                        f"{FP8_COMPUTE_CAPABILITY} or newer: Ada, Hopper, Blackwell): use --precision bf16")
    if not _importable("transformer_engine"):
        raise UserError(f"{why} runs through Transformer Engine, which is not installed here: install it "
                        f"(transformer-engine[pytorch]) or use --precision bf16")


def check_without_transformer_engine(bench: Benchmark, layout: Layout, te: bool) -> None:
    """Without Transformer Engine, context parallelism runs mlbench's attention (mlbench/train/model/
    context_parallel.py: full causal attention only, no padding masks (BERT) and no sliding windows), and
    sequence parallelism mlbench's torch norms in GPT-style models (BERT's LM head builds megatron's own norm,
    which refuses it)."""
    if te:
        return
    if layout.cp > 1 and (bench.model.family == "bert" or bench.model.window_size):
        what = "BERT's padding-masked attention" if bench.model.family == "bert" else "sliding-window attention"
        raise UserError(f"--cp > 1 without Transformer Engine runs causal full attention only, and {bench.name} has "
                        f"{what}: use --cp 1")
    if layout.features.sequence_parallel and bench.model.family == "bert":
        raise UserError(f"sequence parallel for {bench.name} (BERT) needs Transformer Engine's norms, not installed "
                        "here: use --no-sequence-parallel")


# What every rank imports, by module and the package that brings it: checked where ranks train here, before launch.
TRAINING_STACK = {"torch": "torch", "megatron.core": "megatron-core"}


def check_training_stack() -> None:
    """A rank without them failed at start, and the run was published aborted ('ModuleNotFoundError: No module
    named 'megatron'')."""
    for module, package in TRAINING_STACK.items():
        try:
            found = _importable(module)
        except ImportError:  # megatron.core's parent missing
            found = False
        if not found:
            raise IncompleteInstall(missing_package(module, f"every rank (package {package})"))


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def local_device() -> DeviceFacts:
    """This machine's first GPU as nvidia-smi describes it, without importing torch (the CLI never does);
    a CPU where no NVIDIA driver is visible."""
    cpu = DeviceFacts(name="this machine (CPU only)", gpu=False, fp8=False)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):  # torch sees no GPU either
        return cpu
    driver = Path("/proc/driver/nvidia").exists()
    rows = gpus_here.smi("--query-gpu=name,compute_cap")
    if not rows:  # no nvidia-smi, or one without a working driver: a CPU machine, unless the driver is there
        return DeviceFacts(name="this machine's GPU", gpu=True, fp8=None) if driver else cpu
    *name, cap = rows[0]
    count = len(rows)
    if visible is not None:  # a list of indices or UUIDs: torch sees those of them that exist
        count = min(count, len([v for v in visible.split(",") if v.strip()]))
    try:
        return DeviceFacts(name=", ".join(name), gpu=True, fp8=float(cap) >= FP8_COMPUTE_CAPABILITY, count=count)
    except ValueError:
        return DeviceFacts(name=", ".join(name) or cap, gpu=True, fp8=None, count=count)


def check_gpus_here(nproc_per_node: int, device: DeviceFacts) -> None:
    """On a GPU machine each of this node's ranks takes a GPU of its own (its LOCAL_RANK): more ranks than GPUs
    failed in the ranks past the last GPU ("invalid device ordinal") after the run had been started and logged.
    A CPU machine runs as many gloo ranks as its memory holds (check_memory)."""
    if device.gpu and device.count is not None and nproc_per_node > device.count:
        raise UserError(f"--nproc-per-node {nproc_per_node} starts {nproc_per_node} ranks on this machine, one per "
                        f"GPU, and it has {device.count} ({device.name}, as nvidia-smi and CUDA_VISIBLE_DEVICES say): "
                        f"give --nproc-per-node {device.count} or fewer, and more --nodes")


# ---- launcher options -----------------------------------------------------------------------------------


# SLURM's largest time limit: sbatch parses --time into a signed 32-bit int of seconds (time_str2secs in its
# src/common/parse_time.c), then rounds it up to minutes with (seconds + 59) / 60 in that int (time_str2mins).
SLURM_MAX_TIME_S = 2**31 - 1 - 59


def _slurm_options(req: RunRequest, bench: Benchmark, layout: Layout) -> SlurmOptions | None:
    """The SLURM launcher's options, checked by the rules the job script is written under (SlurmJob.validate)
    before anything is written: a bad --time or --sbatch-arg is bad input, not a half-made job folder."""
    if req.launcher != "slurm":
        return None
    from mlbench.launch import slurm

    n, gpus = layout.nproc_per_node, req.gpus_per_node
    if 0 < gpus < n:  # (0: a CPU cluster's job, which requests none)
        raise UserError(f"--nproc-per-node {n} starts {n} ranks on each node, one per GPU, and --gpus-per-node {gpus} "
                        f"requests {gpus} there: ranks past the last GPU fail ('invalid device ordinal') once the job "
                        f"has started; give --gpus-per-node {n} or more, or --nproc-per-node {gpus} or fewer")
    if not req.time_limit.isascii():  # '٣:00:00' matched \d and went into #SBATCH
        raise UserError(f"--time {req.time_limit!r}: HH:MM:SS or D-HH:MM:SS in ASCII digits (0-9), which sbatch "
                        f"reads; it holds other characters")
    opts = slurm.SlurmOptions(partition=req.partition, account=req.account, time_limit=req.time_limit,
                              sbatch_args=list(req.sbatch_args), container_image=req.container_image,
                              container_mounts=req.container_mounts.split(",") if req.container_mounts else [],
                              master_addr=bare_address(req.master_addr), gpus_per_node=req.gpus_per_node)
    try:
        slurm.job_for(layout, opts, bench.name, Path("JOB"), driver=None).validate()
    except ValueError as e:
        raise UserError(f"cannot write the SLURM job: {e}") from None
    if slurm.time_limit_seconds(req.time_limit) > SLURM_MAX_TIME_S:
        d, rest = divmod(SLURM_MAX_TIME_S, 86400)
        most = f"{d}-{rest // 3600:02}:{rest % 3600 // 60:02}:{rest % 60:02}"
        raise UserError(f"--time {req.time_limit} is more than SLURM can take: it reads a time limit as a C int of "
                        f"seconds and rounds it up to whole minutes (time_str2secs, time_str2mins), so at most "
                        f"{most}; past that the number wraps into another limit")
    return opts



# ---- memory ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryDevice:
    """The memory a run's plan must fit: a GPU's, one rank's alone (its plan counts the CUDA context), or a CPU
    machine's, shared by the node's `ranks`, each holding `process_bytes` beyond its plan."""

    name: str
    capacity: float  # bytes
    ranks: int = 1
    process_bytes: int = 0
    # the layer specs the ranks build (train.model.config.attention_backend): a GPU here without Transformer
    # Engine runs sdpa, where BERT and gpt_oss keep megatron's local attention and its s x s probabilities; None:
    # a GPU elsewhere, planned with the published stack's (te)
    attention: str | None = None


def memory_device(req: RunRequest, here: DeviceFacts | None, cpu: MemoryDevice | None) -> MemoryDevice | None:
    """The device the run's memory plan must fit: --device; else, for a run on this machine (HERE: its device),
    its GPU where the device table knows it, or for a CPU run CPU, this machine's memory (`cpu_memory`); None where
    the run trains elsewhere (a dry run, a SLURM job: HERE is None) and no --device is given."""
    from mlbench.planner import devices

    if req.device is not None:
        gpus = [n for n in devices.names() if n != "cpu"]
        # (names are case-insensitive, as devices.get takes them: --device CPU passed the refusal of cpu)
        if req.device.lower() == "cpu":
            raise UserError(f"--device {req.device}: a CPU run is checked against this machine's memory without it; "
                            f"--device names a GPU: one of {', '.join(gpus)}")
        if req.device.lower() not in gpus:  # (devices.get's message offers cpu, which a run refuses)
            raise UserError(f"unknown device {shown(req.device)}; --device names a GPU: one of {', '.join(gpus)}")
        d = devices.get(req.device)
        return MemoryDevice(d.name, d.memory_bytes, attention=gpu_attention_here() if here and here.gpu else None)
    if here is None:
        return None
    if here.gpu:
        d = devices.find(here.name)
        return MemoryDevice(d.name, d.memory_bytes, attention=gpu_attention_here()) if d else None
    return cpu


def gpu_attention_here() -> str:
    """The layer specs a rank on this machine's GPU builds (train.model.config.attention_backend), told without
    importing torch: Transformer Engine's where it is installed, else local specs with PyTorch's fused attention."""
    return "te" if _importable("transformer_engine") else "sdpa"


# What a rank process holds on a CPU beyond its model's memory plan: its private pages (Private_Clean + Private_Dirty
# of /proc/<pid>/smaps_rollup, what it adds to the machine). Measured on tiny gpt3 ranks (x86_64, torch 2.13,
# megatron-core 0.16), each with some headroom: a rank forked from mlbench's agent (the local launcher's ranks)
# shares the interpreter and the torch the agent imported, and adds 71 to 83 MiB (80 MiB here was below a rank 0
# that held its 6 MiB plan and 83 MiB); a rank that imports torch itself (torchrun's, or a run's only rank, started
# without the agent) 225 MiB. The agent's own memory, once a node, is not counted. test_tiny_gpt3 and
# test_torchrun_launcher measure them again in their runs.
CPU_RANK_BYTES = 96 * 2**20
CPU_OWN_RANK_BYTES = 240 * 2**20


def cpu_memory(nproc_per_node: int, forked: bool) -> MemoryDevice:
    """This CPU machine's memory, which a node's ranks share: all of them, not one GPU's worth, must fit (one
    rank's plan held against the whole machine passed --nproc-per-node 1000, for the OOM killer to end). FORKED:
    whether the ranks are forked from mlbench's agent (runner.ranks_forked)."""
    import psutil

    from mlbench.planner.memory import THIS_CPU

    return MemoryDevice(THIS_CPU, float(psutil.virtual_memory().total), ranks=nproc_per_node,
                        process_bytes=CPU_RANK_BYTES if forked else CPU_OWN_RANK_BYTES)


def check_memory(bench: Benchmark, layout: Layout, device: MemoryDevice | None, *, cpu_here: MemoryDevice | None = None,
                 real_run: Callable[[Callable[[], object]], None] = lambda check: check()) -> None:
    """The run's memory plan (mlbench.planner.memory) against the device it is planned for (DEVICE: refused) and
    against this CPU machine where the run trains on it (CPU_HERE: through REAL_RUN, since a dry run plans a run
    from anywhere and only says it). The device says which kernels run and whether a GPU's allowance is held,
    whatever the precision: one estimate where both are the CPU, one for each where a GPU is named."""
    if device is None and cpu_here is None:
        return
    from mlbench.planner.memory import THIS_CPU, estimate

    plans: dict[tuple[bool, str | None], MemoryPlan] = {}

    def fits(d: MemoryDevice) -> None:
        kernels = (d.name == THIS_CPU, d.attention)
        if kernels not in plans:
            plans[kernels] = estimate(bench, layout, on_cpu=kernels[0], attention=d.attention)
        _check_fits(bench, plans[kernels], d)

    if cpu_here is not None and cpu_here != device:
        real_run(lambda: fits(cpu_here))
    if device is not None:
        fits(device)


def _check_fits(bench: Benchmark, plan: MemoryPlan, device: MemoryDevice) -> None:
    """A rank that does not fit its device is refused naming the largest term and what would shrink it; ranks
    that fit one by one but not together (a CPU's), naming how many do."""
    from mlbench.planner.memory import SHRINK

    mib = 2**20
    each = plan.total_bytes + device.process_bytes
    n = device.ranks
    if each > device.capacity:
        term = plan.largest_term()
        if device.process_bytes:
            where = (f"{_size(each)} a rank (its plan, {_size(plan.total_bytes)} at pipeline stage {plan.stage}, "
                     f"and {device.process_bytes // mib} MiB for the process)")
        else:
            where = f"{_size(plan.total_bytes)} on its worst GPU (pipeline stage {plan.stage})"
        shared = f", which its {n} ranks share" if n > 1 else ""
        raise UserError(f"{bench.name} at this layout needs {where} but {device.name} has "
                        f"{_size(device.capacity)}{shared}; the largest term is {term} "
                        f"({_size(getattr(plan, term + '_bytes'))}): {SHRINK[term]} would shrink it "
                        f"(mlbench plan shows every term)")
    if n * each > device.capacity:
        raise UserError(f"--nproc-per-node {n} starts {n} ranks on this machine's CPU, which share its "
                        f"{_size(device.capacity)}: each takes about {each / mib:,.0f} MiB (its memory plan "
                        f"and {device.process_bytes // mib} MiB for the process), {_size(n * each)} in all; "
                        f"give --nproc-per-node {int(device.capacity // each)} or fewer, and more --nodes")


def check_gpus_free(bench: Benchmark, layout: Layout) -> None:
    """Each GPU this node's ranks take must have the run's memory plan free now: a GPU another job holds passed
    the datasheet's check, and the rank met CUDA's out-of-memory error after the run was started and logged."""
    from mlbench.planner.memory import estimate

    gpus = gpus_here.taken(layout.nproc_per_node)
    if not gpus:
        return
    need = estimate(bench, layout, on_cpu=False, attention=gpu_attention_here()).total_bytes
    for gpu in gpus:
        if gpu.free_bytes >= need:
            continue
        held = gpus_here.holders(gpu)
        who = f" ({', '.join(f'pid {pid}: {_size(b)}' for pid, b in held[:3])})" if held else ""
        raise UserError(f"GPU {gpu.index} has {_size(gpu.free_bytes)} free of {_size(gpu.total_bytes)}: other "
                        f"processes hold {_size(gpu.used_bytes)}{who}, and {bench.name} at this layout needs "
                        f"{_size(need)} on each GPU (its memory plan; mlbench plan shows every term): end them, "
                        f"or pick free GPUs with CUDA_VISIBLE_DEVICES")


def _size(b: float) -> str:
    """Bytes in GiB, or in MiB below one (a tiny rank's plan said 0.0 GiB)."""
    return f"{b / 2**30:,.1f} GiB" if b >= 2**30 else f"{b / 2**20:,.0f} MiB"
