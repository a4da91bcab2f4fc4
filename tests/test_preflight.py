"""The preflight without the CLI: `preflight.prepare(RunRequest)` resolves a run or refuses it with one line, and
nothing is written for a refused one. In-process and fast (no training, no helper processes)."""

from __future__ import annotations

import dataclasses
import os
import stat
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from mlbench import gpus_here, preflight, registry, results
from mlbench.cli import cli
from mlbench.cli_options import layout_options
from mlbench.errors import UserError
from mlbench.preflight import DeviceFacts, LayoutRequest, RunRequest, prepare

CPU = DeviceFacts(name="this machine (CPU only)", gpu=False, fp8=False)
A100 = DeviceFacts(name="NVIDIA A100-SXM4-80GB", gpu=True, fp8=False)
H100 = DeviceFacts(name="NVIDIA H100 80GB HBM3", gpu=True, fp8=True)


def _request(tmp_path: Path, **kw) -> RunRequest:
    layout = LayoutRequest(**kw.pop("layout", {}))
    return RunRequest(name=kw.pop("name", "gpt3"), tiny=kw.pop("tiny", True), layout=layout,
                      results_root=tmp_path / "results", system=kw.pop("system", "ci"), **kw)


def _refused(tmp_path: Path, match: str, **kw) -> None:
    with pytest.raises(UserError, match=match) as e:
        prepare(_request(tmp_path, **kw))
    assert "\n" not in str(e.value)
    assert not (tmp_path / "results").exists()  # a refused run writes nothing


def test_a_good_request_is_resolved_with_the_flags_it_set(tmp_path: Path) -> None:
    p = prepare(_request(tmp_path, layout={"nproc_per_node": 2, "tp": 2, "global_batch_size": 32,
                                           "features": {"sequence_parallel": True, "recompute": "selective"}},
                         seed=7, runs=2))
    assert (p.layout.tp, p.layout.dp, p.layout.global_batch_size) == (2, 1, 32)
    assert p.layout.features.sequence_parallel and p.layout.features.recompute == "selective"
    assert p.layout.precision == p.bench.train.precision  # unset: the benchmark's
    assert (p.opts.system, p.opts.seed, p.opts.runs, p.slurm_opts, p.dry_run) == ("ci", 7, 2, None, False)
    assert not (tmp_path / "results").exists()  # checked writable, created only at launch


@pytest.mark.parametrize(("kw", "match"), [
    ({"seed": -1}, r"--seed -1 is out of range: seeds are 0 to 4294967295"),
    ({"seed": 2**32}, r"--seed 4294967296 is out of range"),
    ({"seed": 2**32 - 2, "runs": 3}, r"with --runs 3, at most 4294967293"),
    ({"runs": 0}, r"--runs must be at least 1"),
    ({"hang_timeout": -5.0}, r"--hang-timeout must be a positive number"),
    ({"hang_timeout": float("nan")}, r"--hang-timeout must be a positive number"),
    ({"hang_timeout": float("inf")}, r"--hang-timeout must be a positive number"),
    ({"name": "../benchmarks/gpt3"}, r"unknown benchmark '../benchmarks/gpt3'"),
    ({"threads": 0}, r"--threads must be at least 1"),
    # more threads than CPUs: accepted, the rank died at its first step ("Resource temporarily unavailable")
    ({"threads": len(os.sched_getaffinity(0)) + 1}, r"--threads \d+ is more than the \d+ CPUs this machine gives"),
    # a warm-up past the budget: accepted, the learning rate never reached its peak (1e20 steps was logged)
    ({"warmup_steps": 10**20}, r"--warmup-steps 100000000000000000000 is not below this run's budget of 300 steps"),
    ({"warmup_steps": 300}, r"--warmup-steps 300 is not below this run's budget of 300 steps"),
    ({"layout": {"nodes": 0}}, r"--nodes must be at least 1, got 0"),  # not "--node-rank"
    ({"layout": {"nproc_per_node": 0}}, r"--nproc-per-node must be at least 1"),
    ({"layout": {"nodes": 2}, "node_rank": 2, "launcher": "torchrun", "rdzv_endpoint": "h:1"}, r"--node-rank 2"),
    ({"launcher": "torchrun", "rdzv_endpoint": "host"}, r"--rdzv-endpoint 'host' must be HOST:PORT"),
    ({"launcher": "torchrun", "rdzv_endpoint": "host:\u00b2"}, r"must be HOST:PORT with a port 1-65535"),
    ({"launcher": "torchrun", "rdzv_endpoint": "host:70000"}, r"must be HOST:PORT with a port 1-65535"),
    ({"layout": {"global_batch_size": 0}}, r"--global-batch-size must be at least 1, got 0"),
    ({"layout": {"micro_batch_size": 0}}, r"--micro-batch-size must be at least 1, got 0"),
    ({"layout": {"ep": 2, "nproc_per_node": 2}}, r"--ep 2: gpt3 is a dense model"),
    ({"layout": {"features": {"sequence_parallel": True}}}, r"--sequence-parallel .* needs --tp > 1"),
    ({"layout": {"features": {"overlap_param_gather": True, "distributed_optimizer": False}}},
     r"--overlap-param-gather .* needs --distributed-optimizer"),
    ({"layout": {"features": {"recompute_layers": 2}}}, r"--recompute-layers .* needs --recompute full"),
    ({"layout": {"cp": 3, "nproc_per_node": 3}}, r"sequence length 64 must divide by 2 x cp = 6"),
    ({"layout": {"precision": "fp8"}}, r"--precision fp8 needs a GPU .* leave --precision out \(a CPU run trains"),
    ({"lr": float("nan")}, r"--lr must be a positive number, got nan"),
    # 0 in float32 (the optimizer's precision) or below min_lr: accepted, a run that trained nothing to its budget
    ({"lr": 5e-324}, r"--lr 5e-324 is 0 in float32 .* and is below gpt3's min_lr 0.0003 at global batch 16 .*"
                     r"give --lr 0.0003 or more"),
    ({"lr": 1e-300, "dry_run": True}, r"--lr 1e-300 is 0 in float32"),
    ({"lr": 1e-4}, r"--lr 0.0001 is below gpt3's min_lr 0.0003 at global batch 16"),
    # printed as given, not rounded: it said '--lr 0.0003 is below gpt3's min_lr 0.0003 ... give --lr 0.0003'
    ({"lr": 0.00029999999}, r"--lr 0.00029999999 is below gpt3's min_lr 0.0003 .*: give --lr 0.0003 or more"),
    # no upper bound: 3e9 was a traceback (the random seed's range), 2e8 a MemoryError, a dry run took 1e11
    ({"runs": 3_000_000_000}, r"--runs 3000000000 is more than a set takes: at most 1000"),
    ({"runs": 100_000_000_000, "dry_run": True}, r"--runs \d+ is more than a set takes: at most 1000"),
    ({"runs": 1001, "seed": 1}, r"--runs \d+ is more than a set takes: at most 1000"),
    # past SLURM's own largest limit (a C int of seconds): the job script took 99999999999 days
    ({"launcher": "slurm", "time_limit": "99999999999-00:00:00", "dry_run": True},
     r"--time 99999999999-00:00:00 is more than SLURM can take: .* at most 24855-03:13:08"),
    ({"launcher": "slurm", "time_limit": "24855-03:13:09", "dry_run": True}, r"at most 24855-03:13:08"),
    ({"launcher": "slurm", "layout": {"nodes": 2}, "time_limit": "2h", "dry_run": True},
     r"cannot write the SLURM job: --time \(time_limit\) must be HH:MM:SS or D-HH:MM:SS, not '2h'"),
    # digits of another script matched the job script's \d and went into #SBATCH --time, which sbatch refuses
    ({"launcher": "slurm", "time_limit": "\u0663:00:00", "dry_run": True}, r"--time '\u0663:00:00': HH:MM:SS .*ASCII"),
    # another launcher's options were dropped without a word: --partition alone trained on this machine
    ({"partition": "gpu"}, r"--partition is an option of --launcher slurm, and this run's launcher is local: "
                           r"add --launcher slurm, or leave --partition out"),
    ({"time_limit": "04:00:00", "dry_run": True}, r"--time is an option of --launcher slurm"),
    ({"sbatch_args": ("--exclusive",), "launcher": "torchrun", "rdzv_endpoint": "h:1"},
     r"--sbatch-arg is an option of --launcher slurm, and this run's launcher is torchrun"),
    ({"rdzv_endpoint": "h:1"}, r"--rdzv-endpoint is an option of --launcher torchrun"),
    ({"launcher": "slurm", "node_rank": 1, "layout": {"nodes": 2}}, r"--node-rank is an option of --launcher torchrun"),
    ({"launcher": "slurm", "partition": " "}, r"--partition is empty; give a value"),
    # as a benchmark file's optimizer.lr is bounded (1e20 passed the flag, the file refused it)
    ({"lr": 1e20, "dry_run": True}, r"--lr 1e\+20 is beyond the bound of every number a benchmark file holds: below "
                                    r"9.22e\+18"),
    # it said "(it holds a space)"
    ({"launcher": "slurm", "master_addr": "x\ny", "dry_run": True}, r"--master-addr 'x\\ny' is not a host name or an "
                                                                    r"address \(it holds \\n\)"),
    ({"launcher": "slurm", "master_addr": ""}, r"--master-addr is empty"),
    ({"launcher": "slurm", "master_addr": "a b"}, r"--master-addr 'a b' is not a host name"),
    # safely quoted in the job script, but no host is named so ($( ) and ; were let through)
    ({"launcher": "slurm", "master_addr": "$(id)", "dry_run": True},
     r"^--master-addr '\$\(id\)' is not a host name or an address \(it holds '\$'\)$"),
    ({"launcher": "slurm", "master_addr": "a;b", "dry_run": True}, r"\(it holds ';'\)$"),
    # resolved only in the job: '-h' reached torchrun as an option, 999.1.1.1 a resolver (exit 0 here)
    ({"launcher": "slurm", "master_addr": "-h", "dry_run": True}, r"^--master-addr '-h' is not a host name .*labels"),
    ({"launcher": "slurm", "master_addr": "999.1.1.1", "dry_run": True}, r"not an IPv4 address: four numbers"),
    ({"launcher": "slurm", "master_addr": "a..b", "dry_run": True}, r"none empty"),
    ({"launcher": "slurm", "master_addr": "[::zz]", "dry_run": True}, r"\(not an IPv6 address\)$"),
    ({"launcher": "torchrun", "rdzv_endpoint": "a b:29500"}, r"--rdzv-endpoint 'a b:29500' must be HOST:PORT"),
    # each launched torchrun, which failed after 3 s to 106 s saying only that it exited, with an empty log
    ({"launcher": "torchrun", "rdzv_endpoint": "http://localhost:29651"}, r"must be HOST:PORT .*no scheme, no path"),
    ({"launcher": "torchrun", "rdzv_endpoint": "127.0.0.1:29652:1"}, r"must be HOST:PORT with a port 1-65535"),
    ({"launcher": "torchrun", "rdzv_endpoint": "no-such-host.invalid:29555"},
     r"the host 'no-such-host.invalid' does not resolve"),
    # node 0 serves the rendezvous: at another host's address it waited --rdzv-timeout (600 s), then blamed "what
    # answered there" (192.0.2.1: TEST-NET-1, no host's address)
    ({"launcher": "torchrun", "rdzv_endpoint": "192.0.2.1:29513", "layout": {"nodes": 2}},
     r"--rdzv-endpoint '192.0.2.1:29513': node 0 \(--node-rank 0\) serves the rendezvous there, and 192.0.2.1 is no "
     r"address of this host"),
    ({"hang_timeout": 0.001}, r"--hang-timeout 0.001 is shorter than a step .* at least 1 s"),  # killed a healthy run
    # dropped without a word at --pp 1 (exit 0), as --sequence-parallel at --tp 1 is not
    ({"layout": {"asymmetric_split": True}}, r"^--asymmetric-pipeline-split .* it needs --pp > 1$"),
    ({"launcher": "torchrun", "rdzv_endpoint": "h:1", "layout": {"nodes": 2}, "rdzv_timeout": 0.0},
     r"--rdzv-timeout must be 1 to 604800 seconds, got 0.0"),
    ({"launcher": "torchrun", "rdzv_endpoint": "h:1", "layout": {"nodes": 2}, "rdzv_timeout": float("nan")},
     r"--rdzv-timeout must be 1 to 604800 seconds, got nan"),
    ({"rdzv_timeout": 5.0},
     r"--rdzv-timeout is an option of --launcher torchrun or slurm, and this run's launcher is local"),
    # each passed --dry-run, then the run died and was published as aborted: IndexError in megatron-core's uniform
    # recompute (the tiny model has 2 layers), and "value cannot be converted to type float without overflow"
    ({"layout": {"features": {"recompute": "full", "recompute_layers": 99}}},
     r"^--recompute-layers 99: full recompute \(uniform\) recomputes each pipeline chunk's layers in groups of 99, "
     r"which must divide them, and gpt3's 2 layers over pp 1 x vp 1 give 2 layers a pipeline chunk: give one of 1, "
     r"2, or --recompute-method block$"),
    ({"layout": {"features": {"recompute": "full", "recompute_method": "block", "recompute_layers": 2}, "pp": 2,
                 "nproc_per_node": 2}},
     r"--recompute-layers 2: full recompute \(block\) recomputes the first 2 layers of each pipeline chunk, and "
     r"gpt3's 2 layers over pp 2 x vp 1 give 1 layer a pipeline chunk: at most 1"),
    ({"lr": 1e308}, r"^--lr 1e\+308 is more than gpt3's optimizer can take: its first step moves each weight by "
                    r"up to lr / \(1 - beta1\) \(optimizer.beta1 0.9\) in float32, whose largest number is 3.4e\+38; "
                    r"at most 1.7e\+37$"),
    ({"lr": 3.4e37, "dry_run": True}, r"^--lr 3.4e\+37 is more than gpt3's optimizer can take"),
    # accepted by --dry-run: pyxis refuses an empty source, SLURM reads a zero limit as none
    ({"launcher": "slurm", "container_mounts": ":::", "dry_run": True},
     r"cannot write the SLURM job: container mount ':::': pyxis takes SRC:DST\[:FLAGS\]"),
    ({"launcher": "slurm", "container_mounts": "/data:/data,data:/x", "dry_run": True},
     r"container mount 'data:/x': the source 'data' must be a path \(starting with / or \.\), tmpfs or umount"),
    # srun was given the mounts only with an image: without one they were dropped without a word (exit 0)
    ({"launcher": "slurm", "container_mounts": "/data:/data", "dry_run": True},
     r"^cannot write the SLURM job: container mounts /data:/data go into the job's container, and no container "
     r"image is given: add --container-image IMAGE, or leave --container-mounts out$"),
    ({"launcher": "slurm", "time_limit": "0:00:00", "dry_run": True},
     r"cannot write the SLURM job: --time \(time_limit\) 0:00:00 is zero, which SLURM reads as no limit at all"),
    # device names are case-insensitive: CPU passed the refusal of cpu (a run planned against the CPU measurement),
    # and an unknown name was offered cpu among the names to give
    ({"device": "CPU", "dry_run": True}, r"^--device CPU: a CPU run is checked against this machine's memory"),
    ({"device": "tpu"}, r"^unknown device 'tpu'; --device names a GPU: one of a100, h100_pcie, h100, h200, b200, "
                        r"gb200, gb300$"),
    ({"device": "x" * 500}, r"^unknown device 'xxxxxxxxxxxx'\.\.\. \(500 characters\); --device names a GPU"),
    # a SLURM job's nodes are not this machine, but none has more CPUs than Linux runs on: 2**31 failed in each rank
    ({"launcher": "slurm", "threads": 2**31, "dry_run": True},
     r"^--threads 2147483648 is more than any node has CPUs: at most 8192 \(Linux's largest CPU count"),
    # a job of more ranks a node than the GPUs it requests there: the ranks past the last GPU failed once it ran
    ({"launcher": "slurm", "gpus_per_node": 4, "layout": {"nproc_per_node": 8, "global_batch_size": 64},
      "dry_run": True},
     r"^--nproc-per-node 8 starts 8 ranks on each node, one per GPU, and --gpus-per-node 4 requests 4 there: .* give "
     r"--gpus-per-node 8 or more, or --nproc-per-node 4 or fewer$"),
], ids=lambda v: str(v) if isinstance(v, str) else None)
def test_bad_values_are_refused_before_anything_is_written(tmp_path: Path, kw: dict, match: str) -> None:
    if kw.get("layout", {}).get("precision") == "fp8" and preflight.local_device().gpu:
        pytest.skip("this machine has a GPU: FP8 on CPU is tested through check_precision below")
    _refused(tmp_path, match, **kw)


def test_a_rendezvous_port_another_process_listens_on_is_refused_on_node_0(tmp_path: Path) -> None:
    """Node 0's torchrun serves the rendezvous store at the endpoint: with the port taken the run was started, and
    published as aborted (exit 1), once the store could not listen there."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        endpoint = f"127.0.0.1:{taken.getsockname()[1]}"
        _refused(tmp_path, rf"--rdzv-endpoint '{endpoint}': node 0 \(--node-rank 0\) serves the rendezvous there, "
                           rf"and port \d+ of 127.0.0.1 is taken by another process", launcher="torchrun",
                 rdzv_endpoint=endpoint, layout={"nodes": 2})
        # node 1 joins the store there: the port is meant to be taken
        preflight._rendezvous_reachable(_request(tmp_path, launcher="torchrun", rdzv_endpoint=endpoint,
                                                 layout={"nodes": 2}, node_rank=1))


@pytest.mark.parametrize("name", [" ", "", "a b", "two\nlines", "tab\there", "bell\x07", ".hidden", "a/b", "..",
                                  "x" * 101, "-", "--help", "é"])
def test_system_names_that_cannot_be_folders(tmp_path: Path, name: str) -> None:
    _refused(tmp_path, r"--system .* cannot name a folder: use ASCII letters and digits", system=name)


@pytest.mark.parametrize("flag", ["results_root", "save_checkpoint"])
@pytest.mark.parametrize("name", ["two\nlines", "bell\x07", "esc\x1b[31m", "next\x85line", "line\u2028sep"])
def test_folders_named_in_the_output_have_no_control_characters(tmp_path: Path, flag: str, name: str) -> None:
    """A --results with a newline split the final 'target reached ... <path>' line in two."""
    option = "--" + {"results_root": "results", "save_checkpoint": "save-checkpoint"}[flag]
    req = dataclasses.replace(_request(tmp_path), **{flag: tmp_path / "out" / name})
    with pytest.raises(UserError, match=rf"^{option} .* holds a control character .*; choose a name without one$"):
        prepare(req)
    assert not (tmp_path / "out").exists()


def test_a_results_link_to_nothing_is_named_so(tmp_path: Path) -> None:
    """It said '(File exists)', the mkdir's error through the link."""
    (tmp_path / "out").symlink_to(tmp_path / "gone" / "x")
    req = dataclasses.replace(_request(tmp_path), results_root=tmp_path / "out")
    with pytest.raises(UserError, match=rf"^results folder {tmp_path}/out/\S+/gpt3 is not writable \({tmp_path}/out "
                                        rf"is a link to {tmp_path}/gone/x, which does not exist\)"):
        prepare(req)


def test_system_names_that_can(tmp_path: Path) -> None:
    for name in ("dgx-h100_8x8", "node.01", "A", "_x"):
        results.check_name("--system", name)


def test_results_folder_under_a_file_is_refused_and_left_alone(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(UserError, match="is not writable.*--results DIR"):
        preflight.check_results_folder(blocker / "deeper", "ci", "gpt3")
    assert blocker.read_text() == "x"


def test_a_logs_file_where_the_rank_logs_go_is_refused(tmp_path: Path) -> None:
    """A file named logs in the results folder: a run that failed said 'see the rank logs', which were deleted
    with its staging folder (they could not be moved there)."""
    folder = tmp_path / "ci" / "gpt3"
    folder.mkdir(parents=True)
    (folder / "logs").write_text("x")
    with pytest.raises(UserError, match=f"results folder {folder}: {folder}/logs is not a folder, and a run keeps its "
                                        "rank logs in it"):
        preflight.check_results_folder(tmp_path, "ci", "gpt3")
    (folder / "logs").unlink()
    (folder / "logs").mkdir()
    preflight.check_results_folder(tmp_path, "ci", "gpt3")


def test_a_logs_folder_this_user_cannot_write_is_refused(tmp_path: Path) -> None:
    """A logs folder of the results folder this user cannot write (or search): the run trained and was published,
    and its rank logs were deleted with its staging folder without a word (a failed run's only account of why)."""
    from conftest import unprivileged

    logs = tmp_path / "ci" / "gpt3" / "logs"
    logs.mkdir(parents=True)
    code = ("from pathlib import Path; from mlbench import preflight; "
            f"preflight.check_results_folder(Path({str(tmp_path)!r}), 'ci', 'gpt3')")
    for mode in (0o555, 0o600):
        logs.chmod(mode)
        assert unprivileged(code).startswith(f"mlbench.errors.UserError: results folder {logs.parent}: {logs} is not a "
                                             "folder this user can write: Permission denied, and a run keeps its rank "
                                             "logs in it; make it writable"), oct(mode)
    logs.chmod(0o755)
    assert unprivileged(code) == ""
    assert os.listdir(logs) == []


def test_a_logs_folder_on_another_filesystem_is_refused(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """logs linked to another filesystem (/dev/shm, a bigger disk): the rank logs are moved there by a rename, which
    failed (EXDEV), and they were deleted with the staging folder without a word."""
    import tempfile

    shm = Path("/dev/shm")
    if not shm.is_dir() or not os.access(shm, os.W_OK) or shm.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("no writable /dev/shm on another filesystem than the test's folder")
    other = Path(tempfile.mkdtemp(dir=shm))
    request.addfinalizer(lambda: other.rmdir())
    logs = tmp_path / "ci" / "gpt3" / "logs"
    logs.parent.mkdir(parents=True)
    logs.symlink_to(other)
    with pytest.raises(UserError, match=f"results folder {logs.parent}: {logs} \\(a link to {other}\\) is on another "
                                        "filesystem, and a run moves its rank logs into it by a rename"):
        preflight.check_results_folder(tmp_path, "ci", "gpt3")
    logs.unlink()
    (tmp_path / "elsewhere").mkdir()
    logs.symlink_to(tmp_path / "elsewhere")  # the same filesystem: a rename reaches it
    preflight.check_results_folder(tmp_path, "ci", "gpt3")


def test_a_folder_nobody_can_make_is_refused_for_root_too(tmp_path: Path) -> None:
    """Permissions say nothing for root, yet not even root can make a folder in /proc: the check makes one (and
    removes it). It was a permission check, so a root run's checkpoint save failed after the run."""
    # one pair of parentheses: it said "(/proc is not a folder this user can write (No such file or directory))"
    with pytest.raises(UserError, match=r"results folder /proc/mlbench/ci/gpt3 is not writable \(/proc is not a "
                                        r"folder this user can write: [^()]+\); pass --results"):
        preflight.check_results_folder(Path("/proc/mlbench"), "ci", "gpt3")
    _refused(tmp_path, r"--save-checkpoint /proc/mlbench-ck: /proc is not a folder this user can write",
             save_checkpoint=Path("/proc/mlbench-ck"))
    assert not list(tmp_path.glob(".mlbench-probe-*"))


def test_a_folder_behind_one_this_user_cannot_search_is_refused_naming_that_folder(tmp_path: Path) -> None:
    """--results /root/x as a user who cannot search /root said 'error: /root/x/vm/gpt3: Permission denied' (a
    PermissionError out of Path.exists), and --save-checkpoint /root/ck (or convert-checkpoint's DEST) '/root/ck:
    Permission denied': neither the option nor the folder at fault named. Both now name the folder this user cannot
    search, as a folder it cannot write is named."""
    from conftest import unprivileged

    closed = tmp_path / "closed"
    closed.mkdir(mode=0o600)  # read and write, no search
    code = ("from pathlib import Path; from mlbench import preflight; "
            f"preflight.check_results_folder(Path({str(closed / 'r')!r}), 'ci', 'gpt3') if {{}} else "
            f"preflight.check_new_folder('--save-checkpoint', Path({str(closed / 'ck')!r}))")
    assert unprivileged(code.format(1)) == (
        f"mlbench.errors.UserError: results folder {closed}/r/ci/gpt3 is not writable ({closed} is not a folder this "
        f"user can search: Permission denied); pass --results DIR with a folder you can write")
    assert unprivileged(code.format(0)) == (
        f"mlbench.errors.UserError: --save-checkpoint {closed}/ck: {closed} is not a folder this user can search: "
        f"Permission denied; give a path this user can reach")
    assert os.listdir(closed) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_read_only_results_folder_is_refused(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(stat.S_IRUSR | stat.S_IXUSR)
    with pytest.raises(UserError, match="not writable"):
        preflight.check_results_folder(ro, "ci", "gpt3")


def test_fp8_needs_a_gpu_with_fp8() -> None:
    # (it advised --precision bf16, which changes nothing on a CPU)
    with pytest.raises(UserError, match=r"--precision fp8 needs a GPU .* leave --precision out \(a CPU run trains in "
                                        r"fp32 whatever the layout's precision"):
        preflight.check_precision("fp8", True, CPU)
    preflight.check_precision("fp8", False, CPU)  # the benchmark's default on a CPU: CPU runs train in fp32
    for user_set, why in ((True, "--precision fp8"), (False, r"precision fp8 \(the benchmark's default\)")):
        with pytest.raises(UserError, match=f"{why}: NVIDIA A100-SXM4-80GB has no FP8 .* use --precision bf16"):
            preflight.check_precision("fp8", user_set, A100)
    preflight.check_precision("bf16", True, A100)
    if not preflight._importable("transformer_engine"):
        with pytest.raises(UserError, match="Transformer Engine, which is not installed.*--precision bf16"):
            preflight.check_precision("fp8", True, H100)


def _fake_nvidia_smi(tmp_path: Path, line: str) -> str:
    """No GPU here: a stand-in nvidia-smi that prints what the real one prints for --query-gpu=name,compute_cap."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\necho '{line}'\n")
    smi.chmod(0o755)
    return f"{bin_dir}{os.pathsep}{os.environ['PATH']}"


@pytest.mark.parametrize(("line", "fp8"), [("NVIDIA A100-SXM4-80GB, 8.0", False),
                                           ("NVIDIA H100 80GB HBM3, 9.0", True), ("NVIDIA L4, 8.9", True),
                                           ("NVIDIA B200, 10.0", True), ("NVIDIA Mystery, [N/A]", None)])
def test_local_device_from_nvidia_smi(tmp_path: Path, monkeypatch, line: str, fp8: bool | None) -> None:
    monkeypatch.setenv("PATH", _fake_nvidia_smi(tmp_path, line))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    d = preflight.local_device()
    assert d.gpu and d.fp8 is fp8 and d.name == line.split(",")[0]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # torch would see no GPU either
    assert not preflight.local_device().gpu


def test_cpu_machine_without_nvidia_smi(monkeypatch, tmp_path: Path) -> None:
    if Path("/proc/driver/nvidia").exists():
        pytest.skip("an NVIDIA driver is loaded here")
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    assert preflight.local_device() == CPU


def test_layout_options_are_one_declaration_for_every_command() -> None:
    """`plan` takes exactly run's layout options: a command built with the decorator gets the same request."""
    seen = {}

    @click.command()
    @layout_options
    def probe(layout: LayoutRequest) -> None:
        seen["layout"] = layout

    args = ["--nodes", "2", "--nproc-per-node", "4", "--tp", "2", "--ep", "2", "--mbs", "1", "--gbs", "64",
            "--precision", "bf16", "--no-distributed-optimizer", "--sequence-parallel", "--recompute", "full",
            "--recompute-layers", "2", "--recompute-method", "block", "--overlap-grad-reduce",
            "--no-overlap-param-gather"]
    result = CliRunner().invoke(probe, args)
    assert result.exit_code == 0, result.output
    assert seen["layout"] == LayoutRequest(
        nodes=2, nproc_per_node=4, tp=2, ep=2, micro_batch_size=1, global_batch_size=64, precision="bf16",
        features={"distributed_optimizer": False, "sequence_parallel": True, "recompute": "full",
                  "recompute_layers": 2, "recompute_method": "block", "overlap_grad_reduce": True,
                  "overlap_param_gather": False})
    CliRunner().invoke(probe, [])
    assert seen["layout"] == LayoutRequest()  # unset flags: nothing overrides the benchmark file
    names = [o.name for o in cli.commands["run"].params]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)  # one option each
    run_options = set(names)
    probe_options = {o.name for o in probe.params}
    assert probe_options <= run_options
    if "plan" in cli.commands:
        assert probe_options <= {o.name for o in cli.commands["plan"].params}


def test_optional_commands_are_registered() -> None:
    for name in ("score", "compare", "scaling"):
        assert name in cli.commands
    try:
        import mlbench.planner.commands  # noqa: F401
    except ModuleNotFoundError:
        return
    assert "plan" in cli.commands


def test_benchmark_folder_that_is_not_there(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=f"benchmark folder '{tmp_path / 'nope'}' is not a folder"):
        registry.names(tmp_path / "nope")


def test_expert_parallel_on_a_mixture_of_experts_model() -> None:
    moe = [n for n in registry.names() if registry.load(n, tiny=True).model.num_experts]
    if not moe:
        pytest.skip("no mixture-of-experts benchmark defined")
    bench = registry.load(moe[0], tiny=True)
    experts = bench.model.num_experts
    assert preflight.resolve_layout(bench, LayoutRequest(nproc_per_node=2, ep=2)).ep == 2
    bad = next(e for e in range(3, 2 * experts + 2) if experts % e)
    with pytest.raises(UserError, match=f"--ep {bad} must divide the model's {experts} experts; valid ep: 1"):
        preflight.resolve_layout(bench, LayoutRequest(nproc_per_node=bad, ep=bad))


def test_lr_and_warmup_flags_give_a_schedule_off_the_rcp_table(tmp_path: Path) -> None:
    """llama31_8b's learning rate is a table by RCP batch: between its rows the flags state the schedule."""
    if "llama31_8b" not in registry.names():
        pytest.skip("llama31_8b not defined")
    at_48 = {"name": "llama31_8b", "tiny": False, "dry_run": True,
             "layout": {"nproc_per_node": 8, "global_batch_size": 48}}
    _refused(tmp_path, r"only at its RCP global batches .* --lr and --warmup-steps", **at_48)
    p = prepare(_request(tmp_path, lr=6e-4, warmup_steps=100, **at_48))
    assert (p.bench.optimizer.lr, p.bench.optimizer.warmup_steps) == (6e-4, 100)
    assert {"lr", "warmup_steps"} <= {o.name for o in cli.commands["run"].params}


def test_bert_data_paths_are_recorded_absolute(tmp_path: Path, monkeypatch) -> None:
    """A relative --data-path was stored as typed: the run record did not say which data the run read."""
    monkeypatch.chdir(tmp_path)
    p = prepare(_request(tmp_path, name="bert", tiny=False, dry_run=True, data_path="data/part-*",
                         eval_data_path="data/eval_10k"))
    assert p.bench.data.path == str(tmp_path / "data" / "part-*")
    assert p.bench.data.eval_path == str(tmp_path / "data" / "eval_10k")


def test_more_ranks_than_this_machines_gpus_are_refused_before_launch(tmp_path: Path, monkeypatch) -> None:
    """A rank takes the GPU of its LOCAL_RANK: on a machine with one, --nproc-per-node 2 started a run whose second
    rank failed ('invalid device ordinal') after the run was logged. Now one line and exit 2 before anything is
    written (a stand-in nvidia-smi listing GPUs: none here). The count is nvidia-smi's, within
    CUDA_VISIBLE_DEVICES; a CPU machine runs any number of ranks."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA H100 80GB HBM3, 9.0'\necho 'NVIDIA H100 80GB HBM3, 9.0'\n")
    smi.chmod(0o755)
    path = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    monkeypatch.setenv("PATH", path)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert preflight.local_device().count == 2
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    one = preflight.local_device()
    assert one.count == 1 and one.gpu
    preflight.check_gpus_here(1, one)
    with pytest.raises(UserError, match=r"--nproc-per-node 2 starts 2 ranks on this machine, one per GPU, and it has "
                                        r"1 \(NVIDIA H100 80GB HBM3, .*\): give --nproc-per-node 1 or fewer"):
        preflight.check_gpus_here(2, one)
    preflight.check_gpus_here(64, CPU)
    results = tmp_path / "results"
    proc = subprocess.run([sys.executable, "-m", "mlbench.cli", "run", "gpt3", "--tiny", "--nproc-per-node", "2",
                           "--results", str(results)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PATH": path, "CUDA_VISIBLE_DEVICES": "0"})
    out = proc.stderr
    assert proc.returncode == 2 and len(out.strip().splitlines()) == 1 and proc.stdout == "", (proc.stdout, out)
    assert "--nproc-per-node 2 starts 2 ranks on this machine" in out and not results.exists()


def _at(tmp_path: Path, root: Path) -> RunRequest:
    return dataclasses.replace(_request(tmp_path), results_root=root)


def _path_of(tmp_path: Path, size: int) -> Path:
    """A folder under TMP_PATH whose absolute path is SIZE bytes, in names of at most 200."""
    path = str(tmp_path.resolve())
    while len(path) < size:
        path += "/" + "d" * min(200, size - len(path) - 1)
    assert len(path) == size
    return Path(path)


def test_a_results_folder_too_deep_for_the_runs_files_is_refused_at_the_exact_bound(tmp_path: Path) -> None:
    """--results of 4030 bytes passed the preflight (the folder itself fit PATH_MAX), then the run failed 'File name
    too long' for its staging files: nothing published, no record. The deepest path the run makes (staging folder,
    rank logs) is checked; one byte less fits, and the filesystem takes that path."""
    from mlbench import owners

    with pytest.raises(UserError, match=r"too deep for a run: the deepest path it makes there, <results>/ci/gpt3/"
                                        r"\.staging-.*/ranks/direct/attempt_0/0/stderr\.log, would be \d+ bytes "
                                        r"\(a path takes at most 4095 bytes.*at most (\d+) bytes") as e:
        prepare(_at(tmp_path, _path_of(tmp_path, 4030)))
    most = int(str(e.value).rsplit("at most ", 1)[1].split()[0])
    with pytest.raises(UserError, match="too deep for a run"):
        prepare(_at(tmp_path, _path_of(tmp_path, most + 1)))
    root = _path_of(tmp_path, most)
    prepare(_at(tmp_path, root))
    deepest = root / "ci" / "gpt3" / f".staging-{owners.tag()}-abcdefgh" / "ranks" / "direct" / "attempt_0" / "0"
    deepest.mkdir(parents=True)
    (deepest / "stderr.log").write_text("the filesystem takes it")


def test_a_name_past_name_max_in_results_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"--results .*: File name too long \(a name takes at most 255 bytes; give a "
                                        r"shorter one\): 'x{40}'\.\.\. is 300 bytes"):
        prepare(_at(tmp_path, tmp_path / ("x" * 300) / "r"))


def test_a_save_checkpoint_path_too_deep_for_the_saves_files_is_refused_up_front(tmp_path: Path) -> None:
    """--save-checkpoint of 4060 bytes (its folder fit PATH_MAX) passed the dry run; the run trained, then
    'checkpoint NOT saved: File name too long' (the save's staging folder `.NAME.partial-<tag>` and megatron's file
    names inside it). One byte less fits, and the filesystem takes the deepest file there."""
    from mlbench import owners
    from mlbench.train.checkpoint import folder

    def at(save: Path) -> RunRequest:
        return dataclasses.replace(_request(tmp_path), save_checkpoint=save)

    with pytest.raises(UserError, match=r"--save-checkpoint .*: too deep: .*\.partial-.*/metadata\.json, would be "
                                        r"\d+ bytes .*give a path at most (\d+) bytes long") as e:
        prepare(at(_path_of(tmp_path, 4060)))
    most = int(str(e.value).rsplit("at most ", 1)[1].split()[0])
    with pytest.raises(UserError, match="too deep"):
        prepare(at(_path_of(tmp_path, most + 1)))
    save = _path_of(tmp_path, most)
    prepare(at(save))
    save.parent.mkdir(parents=True, exist_ok=True)
    partial = save.parent / f"{folder.partial_prefix(save)}{owners.tag()}"
    partial.mkdir()
    (partial / "metadata.json").write_text("the filesystem takes it")
    with pytest.raises(UserError, match=r"--save-checkpoint .*: File name too long: the save is made in"):
        prepare(at(tmp_path / ("c" * 240)))


def test_a_precision_the_named_device_lacks_is_refused_as_plan_refuses_it(tmp_path: Path) -> None:
    """`run --device a100 --precision fp8` (a SLURM job aimed at A100s) passed, `fits a100`, while `plan` refused
    it: the precision was checked against this machine's device only."""
    full = {"name": "llama31_8b", "tiny": False, "dry_run": True, "launcher": "slurm", "gpus_per_node": 8}
    _refused(tmp_path, r"^device a100 has no fp8 tensor cores \(NVIDIA A100 SXM4 80GB\); its precisions: bf16, fp32$",
             layout={"nproc_per_node": 8, "precision": "fp8"}, device="a100", **full)
    assert prepare(_request(tmp_path, layout={"nproc_per_node": 8, "tp": 2, "micro_batch_size": 1, "precision": "fp8",
                                              "features": {"distributed_optimizer": True}},
                            device="h100", **full)).layout.precision == "fp8"


def test_a_checkpoint_for_a_benchmark_that_trains_from_random_weights_is_refused_at_full_size(tmp_path: Path) -> None:
    """`run llama31_8b --init-checkpoint CK` (trained weights) was accepted: it logs init_checkpoint_step 0, passes
    the checker, and reached the target in a ninth of the time (the tiny runs, which may resume, showed it)."""
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "metadata.json").write_text('{"sharded_backend": "torch_dist"}')
    (ck / "common.pt").write_bytes(b"")
    (ck / ".metadata").write_bytes(b"")
    full = {"name": "llama31_8b", "tiny": False, "launcher": "slurm", "gpus_per_node": 8, "init_checkpoint": ck,
            "layout": {"nproc_per_node": 8, "tp": 2, "micro_batch_size": 1,
                       "features": {"distributed_optimizer": True}}, "data_path": str(tmp_path / "data")}
    dry = prepare(_request(tmp_path, dry_run=True, **full))  # a dry run says it; a real run is refused for it
    said = [r for r in dry.real_run_refusals if "random weights" in r]
    assert said == ["llama31_8b trains from random weights (its closed rules: no checkpoint to start from); "
                    "--init-checkpoint would make the run another benchmark, whatever its log says: leave it out, or "
                    "pass --ignore-closed-rules to run it anyway"], dry.real_run_refusals
    assert not any("random weights" in r for r in prepare(_request(
        tmp_path, dry_run=True, ignore_closed_rules=True, **full)).real_run_refusals)
    tiny = prepare(_request(tmp_path, name="llama31_8b", dry_run=True, init_checkpoint=ck))  # tiny runs may resume
    assert not any("random weights" in r for r in tiny.real_run_refusals), tiny.real_run_refusals


def test_a_results_link_in_a_loop_is_named_so(tmp_path: Path) -> None:
    """Two links to each other: it said 'a link to b, which does not exist'."""
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    req = dataclasses.replace(_request(tmp_path), results_root=tmp_path / "a" / "r")
    with pytest.raises(UserError, match=rf"\({tmp_path}/a is a link to b, which leads back to itself \(a loop of "
                                        rf"links\)\)"):
        prepare(req)


def test_more_cpu_ranks_than_this_machines_memory_holds_are_refused_before_launch(tmp_path: Path,
                                                                                 monkeypatch) -> None:
    """On a CPU machine a node's ranks share its memory: the check held one rank's plan against the whole machine,
    so --nproc-per-node 1000 (80 MB a tiny rank's process: 80 GB) was launched for the OOM killer. Refused now,
    naming how many fit; a dry run says a real run would be."""
    import types

    import psutil

    monkeypatch.setattr(psutil, "virtual_memory", lambda: types.SimpleNamespace(total=4 * 2**30))
    monkeypatch.setattr(preflight, "local_device", lambda: CPU)
    layout = {"nproc_per_node": 64, "global_batch_size": 512, "micro_batch_size": 8}
    _refused(tmp_path, r"--nproc-per-node 64 starts 64 ranks on this machine's CPU, which share its 4.0 GiB: .* "
                       r"give --nproc-per-node 3\d or fewer", layout=layout)
    dry = prepare(_request(tmp_path, layout=layout, dry_run=True))
    assert any("--nproc-per-node 64 starts 64 ranks" in why for why in dry.real_run_refusals)
    prepare(_request(tmp_path, layout={**layout, "nproc_per_node": 32, "global_batch_size": 256}))


def test_a_cpu_rank_that_does_not_fit_alone_names_what_would_shrink_it_and_the_plan_is_estimated_once(
        tmp_path: Path, monkeypatch) -> None:
    """A CPU run's plan was estimated twice (the ranks' check, then the device's), and where one rank did not fit
    the ranks' check came first: --nproc-per-node 1 was told 'give --nproc-per-node 1 or fewer', 64 ranks of which
    none fits 'give --nproc-per-node 1 or fewer' too. One check now: a rank that does not fit alone names its
    plan's largest term and what would shrink it, as a GPU's does; a dry run says it."""
    import types

    import psutil

    from mlbench.planner import memory

    monkeypatch.setattr(psutil, "virtual_memory", lambda: types.SimpleNamespace(total=2**30))
    monkeypatch.setattr(preflight, "local_device", lambda: CPU)
    big = {"nproc_per_node": 1, "global_batch_size": 4096, "micro_batch_size": 4096}
    _refused(tmp_path, r"^gpt3 at this layout needs 3\.1 GiB a rank \(its plan, 2\.9 GiB at pipeline stage 0, and 240 "
                       r"MiB for the process\) but this machine \(CPU\) has 1\.0 GiB; the largest term is activations "
                       r"\(2\.6 GiB\): --recompute selective or full, .* would shrink it", layout=big)
    monkeypatch.setattr(psutil, "virtual_memory", lambda: types.SimpleNamespace(total=50 * 2**20))
    _refused(tmp_path, r"needs 103 MiB a rank .* but this machine \(CPU\) has 50 MiB, which its 64 ranks share; the "
                       r"largest term", layout={"nproc_per_node": 64, "global_batch_size": 512, "micro_batch_size": 8})
    dry = prepare(_request(tmp_path, layout=big, dry_run=True))
    assert [why for why in dry.real_run_refusals if "a rank" in why][0].startswith("gpt3 at this layout needs 3.1 GiB")
    calls = []
    monkeypatch.setattr(memory, "estimate", lambda *a, _real=memory.estimate, **kw: calls.append(a) or _real(*a, **kw))
    monkeypatch.setattr(psutil, "virtual_memory", lambda: types.SimpleNamespace(total=64 * 2**30))
    prepare(_request(tmp_path, layout={"nproc_per_node": 2}))
    assert len(calls) == 1, calls


def test_cpu_ranks_that_import_torch_themselves_are_charged_for_it(tmp_path: Path, monkeypatch) -> None:
    """Every CPU rank was charged 80 MiB beyond its plan, what a rank forked from mlbench's agent adds; torchrun's
    ranks (and a run's only rank) are processes of their own, 225 MiB each (measured again by test_torchrun_launcher),
    so --launcher torchrun --nproc-per-node 24 passed a 4 GiB machine that 24 ranks of about 230 MiB overflow."""
    import types

    import psutil

    monkeypatch.setattr(psutil, "virtual_memory", lambda: types.SimpleNamespace(total=4 * 2**30))
    monkeypatch.setattr(preflight, "local_device", lambda: CPU)
    layout = {"nodes": 2, "nproc_per_node": 24, "global_batch_size": 384, "micro_batch_size": 8}
    _refused(tmp_path, r"--nproc-per-node 24 starts 24 ranks on this machine's CPU, which share its 4\.0 GiB: each "
                       r"takes about 247 MiB \(its memory plan and 240 MiB for the process\), .* give --nproc-per-node "
                       r"16 or fewer", layout=layout, launcher="torchrun", rdzv_endpoint="127.0.0.1:29500")
    prepare(_request(tmp_path, layout={**layout, "nodes": 1}))  # the local launcher's, forked: 103 MiB each


def test_a_relative_results_folder_is_fixed_before_the_working_folder_can_go(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """`cd work; mlbench run ... --results ../r`, then `rm -rf work` while it trained: the run went on, but the
    checker (run in a scratch folder of its own) could not find the log ('the compliance checker could not run: No
    such file or directory'), and the run was published non-compliant. The run's results folder is absolute from
    preflight on, its leading '..' taken off the working folder (not '/.../work/../r', which no longer opens)."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    p = prepare(dataclasses.replace(_request(tmp_path), results_root=Path("../r")))
    assert p.opts.results == tmp_path / "r"
    work.rmdir()
    with results.result_folder(p.opts.results, p.opts.system, p.bench.name) as folder:
        assert folder == tmp_path / "r" / "ci" / "gpt3" and folder.is_dir()


def _fake_busy_gpus(tmp_path: Path, used_mib: tuple[int, ...]) -> str:
    """No GPU here: a stand-in nvidia-smi answering the three queries mlbench makes as the real one does (H200s, 143771
    MiB each, USED_MIB taken on each by pid 4242). The real case ran on an H200 (docs/gpu.md, fourth lease)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    gpus = "\n".join(f"echo '{i}, GPU-{i}aaa, 143771, {u}'" for i, u in enumerate(used_mib))
    apps = "\n".join(f"echo '4242, {u}, GPU-{i}aaa'" for i, u in enumerate(used_mib) if u)
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\ncase \"$1\" in\n--query-gpu=name,compute_cap) "
                   + " ; ".join(["echo 'NVIDIA H200, 9.0'"] * len(used_mib)) + " ;;\n"
                   f"--query-gpu=index,uuid,memory.total,memory.used)\n{gpus}\n;;\n"
                   f"--query-compute-apps=pid,used_memory,gpu_uuid)\n{apps or 'true'}\n;;\nesac\n")
    smi.chmod(0o755)
    return f"{bin_dir}{os.pathsep}{os.environ['PATH']}"


def test_a_gpu_that_another_process_holds_is_refused_before_launch(cli, tmp_path: Path, monkeypatch) -> None:
    """On an H200 that another process held (all but 6 GB), the run passed the datasheet's memory check, started,
    and its rank died of CUDA's out-of-memory error after the run was logged. Now each GPU the node's ranks take
    must have the memory plan free, as nvidia-smi says now: exit 2 naming the GPU, the holder and what the run
    needs, nothing written; a dry run says it. (A stand-in nvidia-smi, no GPU here; its busy GPU leaves 1.7 GiB,
    less than a tiny run's plan with the GPU's 3 GiB allowance.)"""
    monkeypatch.setenv("PATH", _fake_busy_gpus(tmp_path, (0, 142000)))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    results = tmp_path / "results"
    ok = cli("run", "gpt3", "--tiny", "--results", str(results), "--dry-run")  # GPU 0 is free
    assert ok.returncode == 0 and "would be refused" not in ok.stdout, ok.stdout + ok.stderr
    refused = tmp_path / "refused"
    r = cli("run", "gpt3", "--tiny", "--nproc-per-node", "2", "--results", str(refused))
    assert r.returncode == 2, r.stdout + r.stderr
    line = " ".join((r.stdout + r.stderr).split())
    assert "GPU 1 has 1.7 GiB free of 140.4 GiB: other processes hold 138.7 GiB (pid 4242: 138.7 GiB)" in line
    assert "on each GPU" in line and "CUDA_VISIBLE_DEVICES" in line and not refused.exists()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-1")  # the busy one, by UUID
    d = cli("run", "gpt3", "--tiny", "--results", str(results), "--dry-run")
    assert d.returncode == 0 and "would be refused: GPU 1 has" in " ".join(d.stdout.split()), d.stdout
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert [g.index for g in gpus_here.taken(1)] == [0]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-abc")  # a MIG instance: its memory is not told, not checked
    assert gpus_here.taken(1) is None


def test_a_missing_training_package_is_refused_before_launch(cli, tmp_path: Path, monkeypatch) -> None:
    """With megatron-core removed from the environment (or half installed), `make run` launched the rank, which died
    at its import, and published an aborted result ('ModuleNotFoundError: No module named 'megatron''). Now: one
    line naming the package and how to install again, exit 1 (the system's fault), nothing written; a dry run
    says it."""
    real = preflight._importable
    monkeypatch.setattr(preflight, "_importable", lambda m: m != "megatron.core" and real(m))
    refused = tmp_path / "refused"
    r = cli("run", "gpt3", "--tiny", "--results", str(refused))
    line = " ".join((r.stdout + r.stderr).split())
    assert r.returncode == 1 and "lacks the module 'megatron.core'" in line and "make clean install" in line, line
    assert not refused.exists()
    d = cli("run", "gpt3", "--tiny", "--results", str(tmp_path / "dry"), "--dry-run")
    assert d.returncode == 0 and "would be refused: this Python environment lacks" in " ".join(d.stdout.split())


def test_a_missing_dependency_of_the_cli_is_one_line_not_a_traceback(monkeypatch, capsys) -> None:
    """`mlbench list` with pyyaml removed ended in a traceback ('ModuleNotFoundError: No module named 'yaml''),
    as did any command importing a package that was gone. The entry point says it in one line, exit 1; a module of
    mlbench's own that is missing is a bug, and stays a traceback."""
    import mlbench.__main__ as entry
    import mlbench.cli

    def missing(name: str):
        def fail() -> None:
            raise ModuleNotFoundError(f"No module named '{name}'", name=name)
        return fail

    monkeypatch.setattr(mlbench.cli, "main", missing("yaml"))
    with pytest.raises(SystemExit) as e:
        entry.main()
    err = capsys.readouterr().err
    assert e.value.code == 1 and err.count("\n") == 1
    assert err.startswith("mlbench: this Python environment lacks the module 'yaml'") and "make clean install" in err
    monkeypatch.setattr(mlbench.cli, "main", missing("mlbench.nothing"))
    with pytest.raises(ModuleNotFoundError):
        entry.main()
