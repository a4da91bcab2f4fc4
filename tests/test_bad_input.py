"""Bad input: one line naming what is wrong and what would be right, exit code 2, nothing written."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from conftest import mlbench


def _assert_clean_error(proc, *needles: str) -> None:
    """One line on stderr, nothing on stdout (`mlbench run X > out.txt` shows the error), exit 2."""
    out = proc.stderr
    assert proc.returncode == 2 and proc.stdout == "", (proc.stdout, out)
    assert "Traceback" not in out, out
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert len(lines) == 1, out
    for n in needles:
        assert n in out, out


def test_unknown_benchmark_suggests_close_names(tmp_path: Path) -> None:
    proc = mlbench("run", "gtp3", "--tiny", "--results", str(tmp_path))
    _assert_clean_error(proc, "unknown benchmark 'gtp3'", "did you mean gpt3")
    assert not any(tmp_path.iterdir())


def test_an_unknown_benchmark_with_an_undecodable_byte_is_named_as_its_bytes(cli) -> None:
    """'nonesuch\\udcff': the name's repr() gave Python's surrogate escape, not the \\xNN every other message gives."""
    proc = cli("run", "nonesuch\udcff")
    assert proc.returncode == 2 and proc.stderr.startswith("error: unknown benchmark 'nonesuch\\xff'; "), proc.stderr


def test_an_error_goes_to_stderr_when_stdout_is_a_file(tmp_path: Path) -> None:
    """`mlbench run nonesuch > out.txt` showed nothing on the terminal and exited 2, its error in the file (errors
    were on stdout): the error is on stderr now, the file left empty."""
    import subprocess

    from conftest import MLBENCH

    with (tmp_path / "out.txt").open("w") as out:
        proc = subprocess.run([*MLBENCH, "run", "nonesuch", "--results", str(tmp_path / "r")], stdout=out,
                              stderr=subprocess.PIPE, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith("error: unknown benchmark 'nonesuch'; "), proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and (tmp_path / "out.txt").read_text() == "", proc.stderr
    assert not (tmp_path / "r").exists()


def test_a_usage_error_goes_to_stderr(cli) -> None:
    """click's own refusals (an unknown option, a missing argument) were on stdout as mlbench's were: on stderr
    now, one line with where to read more, nothing on stdout."""
    for args, said in ((["run", "gpt3", "--bogus"], "No such option"), (["show"], "Missing argument 'NAME'")):
        proc = cli(*args)
        assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.startswith(f"error: {said}"), proc.stderr
        assert proc.stderr.endswith(f" (see 'mlbench {args[0]} -h')\n") and len(proc.stderr.splitlines()) == 1


@pytest.mark.parametrize(("name", "offered"), [("GPT3", "gpt3"), ("Llama31_8B", "llama31_8b"), ("BERT", "bert")])
def test_a_benchmark_named_in_another_case_is_offered_its_name(cli, name: str, offered: str) -> None:
    """`show GPT3` listed every benchmark ('known: bert, gpt3, ...') where 'gtp3' was offered gpt3."""
    proc = cli("show", name)
    assert proc.returncode == 2 and f"unknown benchmark {name!r}; did you mean {offered}?" in proc.stderr, \
        proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("flags", "needles"),
    [
        (["--nproc-per-node", "3", "--tp", "2"], ["world size 3", "tp x pp x cp", "must divide 3"]),
        (["--nproc-per-node", "3", "--tp", "3"], ["4 attention heads", "tp=3", "valid tp: 1, 2, 4"]),
        (["--nproc-per-node", "3", "--pp", "3"], ["2 layers", "pp x vp", "one of 1, 2"]),
        (["--nproc-per-node", "2", "--global-batch-size", "12"], ["global batch 12", "2 x 8 = 16"]),
    ],
    ids=["world-vs-tp", "heads-vs-tp", "layers-vs-pp", "batch-vs-dp"],
)
def test_layout_that_does_not_divide(tmp_path: Path, flags: list[str], needles: list[str], cli) -> None:
    proc = cli("run", "gpt3", "--tiny", "--results", str(tmp_path), *flags)
    _assert_clean_error(proc, "layout does not divide", *needles)
    assert not any(tmp_path.iterdir())


def test_pp_1_takes_no_virtual_stages_from_the_reference_layout(tmp_path: Path, cli) -> None:
    """--pp 1 at a scale with a reference layout (gpt3's: pp 8, vp 6) was refused as '--vp 6 needs pipeline
    parallelism', a flag never given: the reference's virtual stages interleave its pipeline, and there is none."""
    import json

    plan = cli("plan", "gpt3", "--device", "h100", "--nodes", "64", "--nproc-per-node", "8", "--tp", "8", "--pp", "1",
               "--json")
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert (json.loads(plan.stdout)["layout"]["pp"], json.loads(plan.stdout)["layout"]["vp"]) == (1, 1)
    run = cli("run", "gpt3", "--dry-run", "--nodes", "64", "--nproc-per-node", "8", "--launcher", "slurm", "--tp", "8",
              "--pp", "1", "--results", str(tmp_path))
    assert run.returncode == 0 and "needs pipeline parallelism" not in run.stdout, run.stdout + run.stderr
    # given, it is still refused, naming it
    _assert_clean_error(cli("run", "gpt3", "--tiny", "--pp", "1", "--vp", "2", "--results", str(tmp_path / "b")),
                        "--vp 2 needs pipeline parallelism")


def test_a_global_batch_beyond_any_run_is_refused_before_anything_is_written(tmp_path: Path, cli) -> None:
    """--gbs 2**40 launched; the rank died asking for 512 TiB and the aborted run was published."""
    proc = cli("run", "gpt3", "--tiny", "--results", str(tmp_path / "r"), "--gbs", str(2**40))
    _assert_clean_error(proc, "--global-batch-size 1,099,511,627,776 is beyond any training run: at most 1,048,576")
    assert not (tmp_path / "r").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere; uses a file in place of a folder instead")
def test_unwritable_results_folder_as_user(tmp_path: Path, cli) -> None:
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    _assert_clean_error(cli("run", "gpt3", "--tiny", "--results", str(ro)), "not writable", "--results")


def test_unwritable_results_folder(tmp_path: Path, cli) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")  # even root cannot create folders under a file
    proc = cli("run", "gpt3", "--tiny", "--results", str(blocker))
    _assert_clean_error(proc, "not writable", "--results DIR")
    assert blocker.read_text() == "not a folder"


@pytest.mark.parametrize(
    ("edit", "needles"),
    [
        (lambda s: s + "\n  oops: [unclosed\n", ["gpt3.yaml", "not valid YAML", "line"]),
        (lambda s: s.replace("num_layers: 96", "num_layerz: 96"), ["unknown key 'num_layerz'", "known:"]),
        (lambda s: s.replace("num_layers: 96", "num_layers: ninety-six"),
         ["model.num_layers", "expected an integer", "'ninety-six'"]),
        (lambda s: s.replace("direction: min", "direction: down"), ["quality.direction", "'min', 'max'"]),
    ],
    ids=["yaml-syntax", "unknown-key", "wrong-type", "bad-choice"],
)
def test_malformed_benchmark_file(tmp_path: Path, benchmarks_copy: Path, edit, needles: list[str], cli) -> None:
    f = benchmarks_copy / "gpt3.yaml"
    f.write_text(edit(f.read_text()))
    results = tmp_path / "results"
    proc = cli("run", "gpt3", "--tiny", "--results", str(results), env={"MLBENCH_BENCHMARKS": str(benchmarks_copy)})
    _assert_clean_error(proc, *needles)
    assert not results.exists()


@pytest.mark.parametrize("command", [["plan", "gpt3", "--device", "h100", "--nodes", "32", "--nproc-per-node", "8"],
                                     ["run", "gpt3", "--tiny"], ["show", "gpt3"]], ids=["plan", "run", "show"])
def test_a_ruleset_the_checker_lacks_is_refused_by_every_command(tmp_path: Path, benchmarks_copy: Path,
                                                                  command: list[str], cli) -> None:
    """`plan` raised FileNotFoundError for the ruleset's RCPs; `run --tiny` trained and published a run whose
    compliance check failed."""
    f = benchmarks_copy / "gpt3.yaml"
    f.write_text(f.read_text().replace("  ruleset: 4.1.0", "  ruleset: 99.9.9", 1))
    results = tmp_path / "results"
    extra = ["--results", str(results)] if command[0] == "run" else []
    proc = cli(*command, *extra, env={"MLBENCH_BENCHMARKS": str(benchmarks_copy)})
    _assert_clean_error(proc, "gpt3.yaml: mlperf.ruleset '99.9.9': the installed mlperf-logging has no closed rules "
                              "and RCPs for gpt3 in it; rulesets that have them: 3.0.0, 3.1.0, 4.0.0, 4.1.0")
    assert not results.exists()


def test_bad_runs_and_launcher_flags(tmp_path: Path, cli) -> None:
    _assert_clean_error(cli("run", "gpt3", "--tiny", "--runs", "0", "--results", str(tmp_path)), "--runs")
    _assert_clean_error(cli("run", "gpt3", "--tiny", "--nodes", "2", "--results", str(tmp_path)),
                        "--launcher torchrun")
    _assert_clean_error(cli("run", "gpt3", "--tiny", "--launcher", "torchrun", "--results", str(tmp_path)),
                        "--rdzv-endpoint")
    _assert_clean_error(cli("run", "gpt3", "--tiny", "--rdzv-timeout", "5", "--results", str(tmp_path)),
                        "--rdzv-timeout is an option of --launcher torchrun or slurm")
    # given at its default value, as dropped as any other (it was let through: docs/slurm.md says refused)
    _assert_clean_error(cli("run", "gpt3", "--tiny", "--time", "02:00:00", "--dry-run", "--results",
                                str(tmp_path)), "--time is an option of --launcher slurm")
    _assert_clean_error(cli("run", "gpt3", "--tiny", "--node-rank", "0", "--results", str(tmp_path)),
                        "--node-rank is an option of --launcher torchrun")
    _assert_clean_error(cli("run", "gpt3", "--tiny", "--nodes", "2", "--launcher", "torchrun", "--rdzv-endpoint",
                                "127.0.0.1:29500", "--rdzv-timeout", "0", "--results", str(tmp_path)),
                        "--rdzv-timeout must be 1 to 604800 seconds, got 0.0")
    assert not any(tmp_path.iterdir())


def test_check_on_a_folder_without_results(tmp_path: Path, cli) -> None:
    _assert_clean_error(cli("check", str(tmp_path)), "no result_*.txt")


def test_bad_slurm_time_limit(tmp_path: Path, cli) -> None:
    proc = cli("run", "gpt3", "--tiny", "--nodes", "2", "--launcher", "slurm", "--time", "2h", "--dry-run",
                   "--results", str(tmp_path))
    _assert_clean_error(proc, "--time (time_limit) must be HH:MM:SS", "'2h'")
    assert not list(tmp_path.rglob("*.sbatch"))
    # a final newline passed the pattern's `$`, and the dry run printed '#SBATCH --time=\'02:00:00' over two lines
    proc = cli("run", "gpt3", "--tiny", "--launcher", "slurm", "--time", "02:00:00\n", "--dry-run", "--results",
               str(tmp_path))
    _assert_clean_error(proc, "--time (time_limit) must be HH:MM:SS", "'02:00:00\\n'")
    assert not list(tmp_path.iterdir())


def test_an_sbatch_arg_setting_the_jobs_output_is_refused_before_anything_is_written(tmp_path: Path, cli) -> None:
    """--sbatch-arg=--output=FILE was written after the job's own #SBATCH --output and won: the run went on with no
    progress shown, and 'output .../job.out' named a file never written."""
    proc = cli("run", "gpt3", "--tiny", "--launcher", "slurm", "--sbatch-arg=--output=/tmp/elsewhere.out",
               "--dry-run", "--results", str(tmp_path))
    _assert_clean_error(proc, "'--output=/tmp/elsewhere.out' sets --output", "job.out")
    assert not list(tmp_path.iterdir())


def test_full_size_run_needing_a_checkpoint_is_refused(tmp_path: Path, benchmarks_copy: Path, cli) -> None:
    """gpt3 starts from MLPerf's reference checkpoint; a full-size run without one must not pretend."""
    f = benchmarks_copy / "gpt3.yaml"
    # data is not the obstacle here (the synthetic source, at a vocabulary it can build: at most 4,096 tokens)
    f.write_text(f.read_text().replace("  source: indexed", "  source: markov").replace("vocab_size: 51200",
                                                                                        "vocab_size: 4096", 1))
    results = tmp_path / "results"
    proc = cli("run", "gpt3", "--results", str(results), env={"MLBENCH_BENCHMARKS": str(benchmarks_copy)})
    _assert_clean_error(proc, "starts from a checkpoint", "--init-checkpoint DIR",
                        "MLPerf GPT-3 reference checkpoint ckpt4000", "--dry-run")
    assert not results.exists()


@pytest.mark.parametrize(
    ("flags", "needles"),
    [
        (["--nodes", "0"], ["--nodes must be at least 1, got 0"]),
        (["--system", "two\nlines"], ["--system 'two\\nlines' cannot name a folder"]),
        (["--sequence-parallel"], ["--sequence-parallel", "needs --tp > 1"]),
        (["--nproc-per-node", "3", "--cp", "3"], ["sequence length 64 must divide by 2 x cp = 6", "valid cp"]),
        (["--overlap-param-gather", "--no-distributed-optimizer"], ["needs --distributed-optimizer"]),
        (["--precision", "fp8"], ["--precision fp8", "leave --precision out (a CPU run trains in fp32"]),
        (["--recompute", "most"], ["Invalid value for '--recompute'", "'mlbench run -h'"]),
        # each went through --dry-run and started, died and was published as aborted
        (["--recompute", "full", "--recompute-layers", "99"], ["--recompute-layers 99: full recompute (uniform)",
                                                               "give one of 1, 2"]),
        (["--lr", "1e308"], ["--lr 1e+308 is more than gpt3's optimizer can take", "at most 1.7e+37"]),
        (["--launcher", "slurm", "--container-mounts", ":::", "--dry-run"], ["container mount ':::'"]),
        (["--launcher", "slurm", "--time", "0:00:00", "--dry-run"], ["--time (time_limit) 0:00:00 is zero"]),
    ],
    ids=["nodes-0", "system-newline", "sp-tp1", "cp", "overlap-gather", "fp8", "bad-choice", "recompute-layers",
         "huge-lr", "empty-mount", "zero-time"],
)
def test_bad_run_flags_through_the_cli(tmp_path: Path, flags: list[str], needles: list[str], cli) -> None:
    """What the preflight refuses reaches the user as one line, exit 2 (tests/test_preflight.py has every variant
    in-process: seeds, batch 0, --ep on a dense model, ...)."""
    if "fp8" in flags and (Path("/proc/driver/nvidia").exists()):
        pytest.skip("an NVIDIA driver is loaded here: FP8 may be available")
    proc = cli("run", "gpt3", "--tiny", "--results", str(tmp_path / "r"), *flags)
    _assert_clean_error(proc, *needles)
    assert not (tmp_path / "r").exists()


def test_a_working_folder_removed_under_the_shell_is_named(tmp_path: Path) -> None:
    """The default --results is relative: it said only 'error: No such file or directory'."""
    import subprocess

    from conftest import MLBENCH

    gone = tmp_path / "gone"
    gone.mkdir()
    proc = subprocess.run(["sh", "-c", 'rmdir "$PWD" && exec "$@"', "sh", *MLBENCH, "run", "gpt3", "--tiny",
                           "--dry-run", "--system", "ci"], cwd=gone, capture_output=True, text=True, timeout=120)
    _assert_clean_error(proc, "error: the working folder no longer exists (removed after the shell entered it)",
                        "cd to a folder that exists, or give absolute paths")


def test_an_init_checkpoint_that_is_a_file_is_named_so(tmp_path: Path, cli) -> None:
    """It said 'no such folder'."""
    (tmp_path / "ck").write_text("x")
    proc = cli("run", "gpt3", "--tiny", "--dry-run", "--results", str(tmp_path / "r"), "--system", "ci",
                   "--init-checkpoint", str(tmp_path / "ck"))
    _assert_clean_error(proc, f"--init-checkpoint {tmp_path / 'ck'}: not a folder (a megatron-core distributed")


@pytest.mark.parametrize("make", [lambda p: p.mkdir(), lambda p: os.mkfifo(p), lambda p: p.symlink_to("/dev/zero"),
                                  lambda p: p.symlink_to(p.parent / "gone")],
                         ids=["folder", "fifo", "device", "dangling"])
def test_an_init_checkpoints_metadata_that_is_no_file_is_named_so(tmp_path: Path, cli, make) -> None:
    """It said '(no metadata.json)' of one that is there."""
    (tmp_path / "ck").mkdir()
    make(tmp_path / "ck" / "metadata.json")
    proc = cli("run", "gpt3", "--tiny", "--dry-run", "--results", str(tmp_path / "r"), "--system", "ci",
               "--init-checkpoint", str(tmp_path / "ck"))
    _assert_clean_error(proc, f"--init-checkpoint {tmp_path / 'ck'}: metadata.json is not a regular file")
    assert not (tmp_path / "r").exists()


def test_a_results_folder_with_a_newline_is_refused(tmp_path: Path, cli) -> None:
    """It trained, and the last line, 'target reached: ... <path>/result_0.txt', came out split in two."""
    results = tmp_path / "two\nlines"
    _assert_clean_error(cli("run", "gpt3", "--tiny", "--results", str(results)),
                        f"--results '{tmp_path}/two\\nlines' holds a control character ('\\n')")
    assert not any(tmp_path.iterdir())


def test_missing_benchmark_folder(tmp_path: Path, cli) -> None:
    proc = cli("list", env={"MLBENCH_BENCHMARKS": str(tmp_path / "nope")})
    _assert_clean_error(proc, f"benchmark folder '{tmp_path / 'nope'}' (MLBENCH_BENCHMARKS) is not a folder")
    # quoted: a blank name was not seen ('benchmark folder   (MLBENCH_BENCHMARKS)')
    _assert_clean_error(cli("list", env={"MLBENCH_BENCHMARKS": " "}), "benchmark folder ' ' (MLBENCH_BENCHMARKS)")
    (tmp_path / "blank").mkdir()
    (tmp_path / "blank" / "x.yaml").write_text("")  # said 'got NoneType'
    _assert_clean_error(cli("show", "x", env={"MLBENCH_BENCHMARKS": str(tmp_path / "blank")}),
                        "x.yaml: expected a mapping of benchmark fields (name: ..., model: ..., ...), got an empty "
                        "file")
    _assert_clean_error(cli("list", env={"MLBENCH_BENCHMARKS": str(tmp_path)}), "no benchmark files")
    # set but empty is unset (it read the working directory: here an empty folder, so no benchmarks)
    empty = cli("list", env={"MLBENCH_BENCHMARKS": ""}, cwd=tmp_path)
    assert empty.returncode == 0 and "gpt3" in empty.stdout, empty.stdout + empty.stderr


@pytest.mark.parametrize("mode", [0o311, 0o000], ids=["unlistable", "unsearchable"])
def test_a_benchmark_folder_this_user_cannot_read_is_said_so(tmp_path: Path, mode: int) -> None:
    """MLBENCH_BENCHMARKS at a folder of benchmark files this user cannot list: `mlbench list` said 'no benchmark
    files (<name>.yaml) in it' (glob passes over what it cannot list), and `show gpt3` in a folder it cannot search
    '<folder>/gpt3.yaml: Permission denied'. Both say the folder cannot be read, exit 2."""
    from conftest import unprivileged

    folder = tmp_path / "b"
    folder.mkdir()
    shutil.copy(Path(__file__).resolve().parents[1] / "benchmarks" / "gpt3.yaml", folder)
    folder.chmod(mode)

    def said(*args: str) -> str:
        return unprivileged(f"import os, sys; os.environ['MLBENCH_BENCHMARKS'] = {str(folder)!r}; "
                            f"sys.argv = ['mlbench', *{args!r}]; from mlbench.cli import main; main()")

    want = (f"error: benchmark folder {folder} (MLBENCH_BENCHMARKS) cannot be listed (Permission denied); it must be "
            f"readable by the user running mlbench")
    assert said("list") == want
    assert said("show", "gpt3") == ("" if mode & 0o111 else want)  # (searchable: the file is read by its name)


@pytest.mark.parametrize("args", [
    ["run", "gpt3", "--tiny", "--results", "", "--dry-run"], ["run", "gpt3", "--tiny", "--init-checkpoint", ""],
    ["score", ""], ["check", ""], ["compare", "a", "", "--no-score"], ["scaling", ""],
    ["compare", "a", "b", "--md", ""], ["scaling", "a", "--html", ""],
], ids=["results", "init-checkpoint", "score", "check", "compare", "scaling", "md", "html"])
def test_an_empty_path_is_refused_not_read_as_the_working_directory(tmp_path: Path, monkeypatch, capsys,
                                                                    args: list[str]) -> None:
    import sys

    from mlbench import cli

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["mlbench", *args])
    with pytest.raises(SystemExit) as e:  # in-process, as the console script runs it
        cli.main()
    out = capsys.readouterr()
    assert e.value.code == 2 and "is empty; give a path" in out.err and out.out == "", out
    assert not any(tmp_path.iterdir())  # a dry run into "" wrote ./<system>/gpt3/dry-run.txt


def _number_options() -> list[tuple[str, str, str, tuple[str, ...]]]:
    """(command, flag, what it takes: 'an integer' or 'a number', what else the command needs: its arguments and
    required options) of every option of every command that takes a number."""
    import click

    from mlbench.cli import cli as group

    found = []
    for name, command in sorted(group.commands.items()):
        needs = tuple(x for p in command.params if p.required
                      for x in (("x",) if isinstance(p, click.Argument) else (p.opts[0], "x")))
        for p in command.params:
            numeric = isinstance(p.type, click.types.IntParamType | click.types.FloatParamType) or p.name == "nodes"
            if isinstance(p, click.Option) and numeric:
                kind = "a number" if isinstance(p.type, click.types.FloatParamType) else "an integer"
                found.append((name, p.opts[0], kind, needs))
    return found


@pytest.mark.parametrize("digits", ["\u0663", "\uff15", "\u00b2", "1_0", "\u0661.\u0665"],
                         ids=["arabic-indic", "fullwidth", "superscript", "underscore", "arabic-indic-float"])
def test_every_number_option_takes_ascii_digits_only(digits: str, tmp_path: Path, cli) -> None:
    """`run gpt3 --tiny --nodes ٣` ran 3 nodes and `--seed ５` seed 5: click's int() and float() read any Unicode
    digit (and '1_0' as 10). Every number option of every command refuses them, naming itself and what it expects;
    nothing is written."""
    options = _number_options()
    flags = {(command, flag) for command, flag, _, _ in options}
    assert len(flags) >= 20 and {("plan", "--nodes"), ("run", "--lr"), ("scaling", "--devices")} <= flags, flags
    for command, flag, kind, needs in options:
        if "." in digits and kind == "an integer":
            continue
        results = ["--results", str(tmp_path / "r")] if command == "run" else []
        proc = cli(command, flag, digits, *needs, *results)
        _assert_clean_error(proc, f"Invalid value for '{flag}'", f"expected {kind} in ASCII", repr(digits))
    assert not (tmp_path / "r").exists()


def test_every_integer_option_refuses_a_huge_value_in_a_short_line(tmp_path: Path, cli) -> None:
    """`run --seed` or `plan --nodes 8,N` with N of 4,000 digits: the refusal (out of range, the device bound, a
    layout that does not divide) quoted every digit, some twice, in a line of 8,000 characters. An integer past
    64 bits is past any option's values: refused as the option reads it, the value cut."""
    huge = "9" * 4000
    for command, flag, kind, needs in _number_options():
        if kind != "an integer":
            continue
        results = ["--results", str(tmp_path / "r")] if command == "run" else []
        for value in (huge, "-" + huge, "8," + huge):
            if "," in value and flag != "--nodes":
                continue
            proc = cli(command, flag, value, *needs, *results)
            _assert_clean_error(proc, f"Invalid value for '{flag}'")
            assert len(proc.stdout + proc.stderr) < 300, (command, flag, proc.stdout + proc.stderr)
    assert not (tmp_path / "r").exists()


def test_a_number_option_says_what_the_unicode_digits_read_as(cli) -> None:
    proc = cli("run", "gpt3", "--tiny", "--seed", "\uff15", "--dry-run")
    _assert_clean_error(proc, "'--seed': expected an integer in ASCII digits (0-9), got '\uff15' (write 5)")
    proc = cli("run", "gpt3", "--tiny", "--lr", "\uff10.1", "--dry-run")
    _assert_clean_error(proc, "'--lr': expected a number in ASCII", "(write 0.1)")


def test_a_benchmark_files_number_in_unicode_digits_is_no_number(tmp_path: Path, benchmarks_copy: Path, cli) -> None:
    """A float field given as a string is read with float() (YAML 1.1 reads 175.0e9 as one): '٠.٩' was 0.9."""
    f = benchmarks_copy / "gpt3.yaml"
    f.write_text(f.read_text().replace("  beta1: 0.9 ", '  beta1: "\u0660.\u0669" ', 1))
    proc = cli("show", "gpt3", env={"MLBENCH_BENCHMARKS": str(benchmarks_copy)})
    _assert_clean_error(proc, "optimizer.beta1: expected a number, got '\u0660.\u0669'")


def test_a_second_set_with_the_seeds_of_the_first_is_refused(tmp_path: Path, cli, monkeypatch) -> None:
    """`run --seed 5 --runs 3` twice into one folder: the second set ran seeds 5, 6, 7 again (result_3 to result_5
    the first three run again, step for step), and the folder became a set MLPerf's package checker rejects. It is
    refused now, the first free seed offered; a random first seed keeps clear of the folder's seeds."""
    from mlbench import runner

    folder = tmp_path / "ci" / "gpt3"
    folder.mkdir(parents=True)
    for i, seed in enumerate((5, 6, 7)):
        (folder / f"result_{i}.txt").write_text(
            ':::MLLOG {"namespace": "", "time_ms": 1, "event_type": "POINT_IN_TIME", "key": "seed", "value": '
            f'{seed}, "metadata": {{"file": "x.py", "lineno": 1}}}}\n')
    before = sorted(folder.iterdir())
    proc = cli("run", "gpt3", "--tiny", "--seed", "6", "--runs", "3", "--results", str(tmp_path), "--system", "ci")
    _assert_clean_error(proc, "--seed 6: this set's seeds 6 to 8 would repeat seed 6 of result_1.txt",
                        "(and 1 more)", "give --seed 8 (past every seed the folder holds)")
    assert sorted(folder.iterdir()) == before
    draws = iter([4, 7, 100])  # random first seeds: 4 and 5, 7 and 8 would repeat one; 100 and 101 are free
    monkeypatch.setattr(runner.secrets, "randbelow", lambda n: next(draws))
    assert runner.seeds(None, 2, {5, 6, 7}) == [100, 101]


@pytest.mark.parametrize("devices", ["-4", "0"])
def test_scaling_refuses_a_device_count_below_one(tmp_path: Path, cli, devices: str) -> None:
    """`scaling --devices -4` was taken as a device count (issue 18, item 9); a count below 1 is refused in one
    line naming the option and the range, before any set is read."""
    _assert_clean_error(cli("scaling", str(tmp_path), str(tmp_path), "--devices", devices, "--devices", "8"),
                        f"Invalid value for '--devices': {devices} is not a device count",
                        "a whole number from 1 to 10,000,000")
