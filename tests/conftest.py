"""Shared helpers: run the real `mlbench` command as a user would, and read what it wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def _xdist_controller() -> bool:
    """Whether this is pytest-xdist's controller, which runs no test (`-n N`, N > 0, and not a worker)."""
    if "PYTEST_XDIST_WORKER" in os.environ:
        return False
    args = sys.argv[1:]
    for i, a in enumerate(args):
        n = args[i + 1] if a in ("-n", "--numprocesses") and i + 1 < len(args) else \
            a[2:] if a.startswith("-n") else a.partition("=")[2] if a.startswith("--numprocesses=") else None
        if n is not None:
            return n not in ("0", "")
    return False


# Test processes (and their spawned children, which import this module) build megatron-core models too: import it
# as the ranks do, without compiling its GPU-only fused kernels (dynamo and inductor: 2-3 s a process). Not in
# xdist's controller: it would import torch (2.6 s) before starting the workers.
if not _xdist_controller():
    from mlbench.train import cpu_compat

    cpu_compat.import_megatron_without_jit_fuser()

MLBENCH = [sys.executable, "-m", "mlbench"]  # as the `mlbench` script starts (mlbench/__main__.py)


def mlbench(*args: str, env: dict | None = None, timeout: float = 300, cwd: Path | None = None):
    """Run `mlbench ARGS` in a subprocess; returns the CompletedProcess (stdout and stderr as text)."""
    full_env = {**os.environ, "COLUMNS": "200", **(env or {})}
    return subprocess.run([*MLBENCH, *args], capture_output=True, text=True, timeout=timeout, env=full_env,
                          cwd=cwd)


def without_permission_override() -> list[str]:
    """The command prefix that runs a process of this user without what lets root pass every permission check
    (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH: setpriv drops them), [] for any other user; skips the test where root
    cannot drop them."""
    import shutil

    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("root reads and writes every file, and setpriv (util-linux) is not here to drop that capability")
    caps = "-dac_override,-dac_read_search"
    return ["setpriv", "--bounding-set", caps, "--inh-caps", caps]


def unprivileged(code: str) -> str:
    """Run the Python CODE (this checkout's mlbench importable) as without_permission_override() runs it: the last
    line it wrote on stderr (a traceback's, or the CLI's `error:` line) where it fails, else ''."""
    proc = subprocess.run([*without_permission_override(), sys.executable, "-c", code], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    return (proc.stderr.strip().splitlines() or [""])[-1] if proc.returncode else ""


def mlbench_in_process(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, *args: object,
                       stdout: object = None) -> tuple[int, str, str]:
    """`mlbench ARGS` through its entry point (cli.main) in this process: (exit code, stdout, stderr), and never a
    traceback. STDOUT: what sys.stdout is meanwhile (capsys's by default); put back after, since a failing --json
    command points it at stderr."""
    from mlbench import cli

    monkeypatch.setattr(sys, "argv", ["mlbench", *map(str, args)])
    saved = sys.stdout
    sys.stdout = saved if stdout is None else stdout
    try:
        cli.main()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    finally:
        sys.stdout = saved
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err, out + err
    return code, out, err


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture):
    """`mlbench(ARGS, env=..., cwd=...)` run in this process through the entry point (mlbench_in_process): for
    the refusals and analysis commands whose process adds nothing to what a test asserts (an interpreter and its
    imports cost about 0.3 s of CPU a call). ENV's None unsets a variable. Returns a CompletedProcess, as
    mlbench() does."""

    def run(*args: object, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
        # imported before the environment is set: a first import under a test's MLBENCH_BENCHMARKS kept its folder
        # as the registry's default for every later test of the process (tests/test_list_show.py alone failed)
        from mlbench import registry

        with monkeypatch.context() as m:
            for key, value in {"COLUMNS": "200", **(env or {})}.items():
                m.setenv(key, value) if value is not None else m.delenv(key, raising=False)
            if env and "MLBENCH_BENCHMARKS" in env:  # read as the registry is imported, so set as it would be
                m.setattr(registry, "BENCHMARKS_DIR", Path(env["MLBENCH_BENCHMARKS"] or registry.SHIPPED_DIR))
            if cwd is not None:
                m.chdir(cwd)
            code, out, err = mlbench_in_process(m, capsys, *args)
        return subprocess.CompletedProcess(["mlbench", *map(str, args)], code, out, err)

    return run


def launch_ranks(script: Path, nproc: int, *args: str, env: dict | None = None, rank: int = 0) -> str:
    """Run SCRIPT ARGS as NPROC gloo ranks under mlbench's local agent (what `mlbench run` starts on one node:
    torchrun's environment and log layout, each rank forked from the agent); returns RANK's output. A failure shows
    the agent's message and RANK's errors (megatron's import warnings left out)."""
    logs = script.parent / f"{script.stem}_ranks"
    proc = subprocess.run([sys.executable, "-m", "mlbench.launch.local_ranks", f"--nproc-per-node={nproc}",
                           f"--log-dir={logs}", str(script), *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})
    own = logs / "local" / "attempt_0" / str(rank)
    err = (own / "stderr.log").read_text() if (own / "stderr.log").exists() else ""
    errors = "\n".join(ln for ln in err.splitlines() if "warn" not in ln.lower())
    assert proc.returncode == 0, proc.stdout + errors[-3000:]
    return (own / "stdout.log").read_text()


_AT_RANK_START = """import os, sys

MAIN = os.path.join("mlbench", "train", "__main__.py")


def _hook(event, args):
    if event == "exec" and getattr(args[0], "co_filename", "").endswith(MAIN):
{code}


sys.addaudithook(_hook)
"""


def at_rank_start(folder: Path, code: str) -> dict[str, str]:
    """The environment in which CODE (Python, its lines indented 8 spaces) runs in every rank of `mlbench run` as it
    starts its main module: a sitecustomize in FOLDER whose audit hook runs it. A rank forked by mlbench's agent
    runs no sitecustomize of its own (the agent's ran once), an exec'd one (torchrun's) does; both start there."""
    folder.mkdir(exist_ok=True)
    (folder / "sitecustomize.py").write_text(_AT_RANK_START.format(code=code))
    return {"PYTHONPATH": str(folder)}


_SAMPLE_PRIVATE = """\
        import json, threading, time

        def _private(path=os.path.join({folder!r}, "rank_%s_%d.json" % (os.environ.get("RANK"), os.getpid()))):
            peak = 0
            while True:
                with open("/proc/self/smaps_rollup") as f:
                    kb = dict(ln.split(":", 1) for ln in f if ln.rstrip().endswith("kB"))
                now = (int(kb["Private_Clean"].split()[0]) + int(kb["Private_Dirty"].split()[0])) * 1024
                if now > peak:
                    peak = now
                    with open(path + ".tmp", "w") as f:
                        json.dump({{"rank": int(os.environ.get("RANK", 0)), "private_bytes": peak}}, f)
                    os.replace(path + ".tmp", path)
                time.sleep(0.2)

        threading.Thread(target=_private, daemon=True).start()"""


def sample_private_memory(folder: Path) -> dict[str, str]:
    """The environment in which every rank of `mlbench run` samples its private memory five times a second and
    keeps its peak in FOLDER (`private_memory_peaks`): Private_Clean + Private_Dirty of /proc/self/smaps_rollup, the
    pages no other process shares, what the rank adds to the machine. A read costs the rank about 4 ms of CPU."""
    folder.mkdir(exist_ok=True)
    return at_rank_start(folder / "site", _SAMPLE_PRIVATE.format(folder=str(folder)))


def private_memory_peaks(folder: Path) -> dict[int, int]:
    """{rank: its peak private bytes} that `sample_private_memory` sampled in FOLDER (the highest where one rank
    number had several processes)."""
    peaks: dict[int, int] = {}
    for path in folder.glob("rank_*.json"):
        doc = json.loads(path.read_text())
        peaks[doc["rank"]] = max(peaks.get(doc["rank"], 0), doc["private_bytes"])
    return peaks


def assert_cpu_rank_bytes(folder: Path, record: dict, constant: int) -> dict[int, int]:
    """Each rank of the run RECORD sampled its private memory in FOLDER: what it held beyond its own pipeline
    stage's memory plan is within CONSTANT (preflight's charge for the process, so that the plan and the constant
    are not below what a rank took) and at least half of it (the constant not a gross overcharge). Returns
    {rank: bytes beyond the plan}."""
    from mlbench import registry
    from mlbench.layout import Layout
    from mlbench.planner.memory import estimate

    layout = Layout.from_dict(record["layout"])
    bench = registry.load(record["benchmark"], tiny=True)
    peaks = private_memory_peaks(folder)
    assert len(peaks) == layout.world_size, peaks
    beyond = {rank: private - estimate(bench, layout, stage=rank // (layout.world_size // layout.pp)).total_bytes
              for rank, private in peaks.items()}
    mib = {rank: round(b / 2**20, 1) for rank, b in beyond.items()}
    assert all(constant / 2 <= b <= constant for b in beyond.values()), (mib, constant // 2**20)
    return beyond


def assert_no_markup(text: str) -> None:
    """mlbench's consoles print without rich markup (a log value may hold `[/red]`); its own styled words are
    rich Text: a tag in the output is one that was left as markup."""
    import re

    tags = re.findall(r"\[/?(?:red|green|yellow|cyan|bold|dim)\]", text)
    assert not tags, f"markup printed as text: {tags}"


def mllog(path: Path) -> list[dict]:
    out = []
    for line in Path(path).read_text().splitlines():
        if line.startswith(":::MLLOG "):
            out.append(json.loads(line[len(":::MLLOG "):]))
    return out


def result_dir(root: Path, benchmark: str) -> Path:
    systems = [p for p in root.iterdir() if p.is_dir()]
    assert len(systems) == 1, systems
    return systems[0] / benchmark


@pytest.fixture
def benchmarks_copy(tmp_path: Path) -> Path:
    """A private copy of benchmarks/ that a test may edit (pointed at by MLBENCH_BENCHMARKS)."""
    src = Path(__file__).resolve().parents[1] / "benchmarks"
    dst = tmp_path / "benchmarks"
    dst.mkdir()
    for f in src.glob("*.yaml"):
        (dst / f.name).write_text(f.read_text())
    return dst


# A tiny target that the first evaluation (step 20) meets: for the tests whose point is not convergence
# (checkpoints, launchers, faults, results), so that they train 20 steps, not 80-120. Convergence to the real
# tiny targets is what tests/test_tiny_*.py, test_features.py and the other convergence tests hold.
QUICK_TARGETS = {"min": 3.9, "max": 0.1}  # log perplexity from ln(128) = 4.85; masked-LM accuracy from 0
# Met by the tiny gpt3's third evaluation (step 60; 2 and 4 layers at seed 3: 1.26 and 1.28; the real target
# 1.04 at step 120-140): for tests whose point is that a layout learns, at half the steps
MIDWAY_TARGETS = {"min": 1.3, "max": 0.5}


def quicken(directory: Path, targets: dict[str, float] = QUICK_TARGETS) -> Path:
    """Loosen the tiny targets of the benchmark files in `directory` in place to `targets` (by the quality's
    direction; a text edit, so that a test may still edit the rest of the file by text); returns the directory."""
    for f in directory.glob("*.yaml"):
        lines = f.read_text().splitlines(keepends=True)
        tiny = next(i for i, line in enumerate(lines) if line.startswith("tiny:"))
        direction = "max" if any(line.strip() == "direction: max" for line in lines) else "min"
        at = next(i for i in range(tiny, len(lines)) if lines[i].lstrip().startswith("target:"))
        indent = lines[at][: len(lines[at]) - len(lines[at].lstrip())]
        lines[at] = f"{indent}target: {targets[direction]}\n"
        f.write_text("".join(lines))
    return directory


@pytest.fixture
def quick_benchmarks(benchmarks_copy: Path) -> Path:
    """benchmarks_copy with the tiny targets met at the first evaluation (see QUICK_TARGETS)."""
    return quicken(benchmarks_copy)


def quick_env_at(tmp_path_factory: pytest.TempPathFactory, targets: dict[str, float] = QUICK_TARGETS) -> dict:
    """The environment that points mlbench at a copy of benchmarks/ quickened to `targets`."""
    src = Path(__file__).resolve().parents[1] / "benchmarks"
    dst = tmp_path_factory.mktemp("quick_benchmarks")
    for f in src.glob("*.yaml"):
        (dst / f.name).write_text(f.read_text())
    return {"MLBENCH_BENCHMARKS": str(quicken(dst, targets))}


@pytest.fixture(scope="module")
def quick_env(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The environment that points mlbench at a quickened copy of benchmarks/, for a whole module."""
    return quick_env_at(tmp_path_factory)



def assert_tiny_converges(benchmark: str, flags: list[str], root: Path, seed: int = 3,
                          env: dict | None = None) -> None:
    """Run a tiny variant through the CLI: exit 0, run_stop success, last eval meets the target, checker passes.
    `env` may point MLBENCH_BENCHMARKS at an edited copy of benchmarks/."""
    from mlbench import registry

    directory = (env or {}).get("MLBENCH_BENCHMARKS")
    bench = registry.load(benchmark, tiny=True, directory=Path(directory) if directory else None)
    proc = mlbench("run", benchmark, "--tiny", "--results", str(root), "--system", "ci", "--seed", str(seed), *flags,
                   env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = root / "ci" / benchmark / "result_0.txt"
    events = mllog(result)
    stops = [e for e in events if e["key"] == "run_stop"]
    assert len(stops) == 1 and stops[0]["metadata"]["status"] == "success"
    evals = [e["value"] for e in events if e["key"] == "eval_accuracy"]
    assert evals and bench.converged(evals[-1]), evals
    from click.testing import CliRunner

    from mlbench.cli import cli

    check = CliRunner().invoke(cli, ["check", str(result)])  # in this process: a subprocess adds nothing here
    assert check.exit_code == 0 and "PASS" in check.output, check.output


# The slowest modules first (seconds of wall time each took in `make test` on 2 cores, 2026-11-27: 84 down to
# 9; the hostile-input and rank-failure files, 17-20 s each, placed 2026-11-28). `make test` hands whole files to
# its workers in collection order (--dist loadfile --no-loadscope-reorder): the long ones start first, and the many
# short files fill in at the end, so the workers finish together (the longest-first rule). Left to itself xdist
# starts the files with the most tests, which leaves the long single-training files for last; a file left off this
# list goes last (three of 17-20 s made one worker finish 15-19 s after the others).
SLOWEST_FIRST = [
    "test_checkpoints", "test_features", "test_bert_reference", "test_failures", "test_slurm_run", "test_tiny_gpt3",
    "test_checkpoint_names", "test_torchrun_launcher", "test_current_suite_moe", "test_interleaved_pipeline",
    "test_analysis_score", "test_indexed_data", "test_hostile_analysis_side", "test_hostile_run_side",
    "test_rank_failures", "test_planner", "test_bert_data", "test_reports_hostile_inputs", "test_launch",
    "test_current_suite", "test_tiny_llama", "test_dry_run", "test_features_memory", "test_results",
    "test_benchmarks_full", "test_bad_input", "test_tiny_bert", "test_gpu_config", "test_analysis_garbled",
    "test_slurm_cluster", "test_verdicts",
]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))  # stable: a file keeps its own order
