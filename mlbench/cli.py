"""`mlbench`: run MLPerf-style time-to-train benchmarks on megatron-core, check, score and compare them."""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from pathlib import Path

import click
from rich import box
from rich.table import Table
from rich.text import Text

from mlbench import registry, schema, terminal
from mlbench.cli_numbers import FLOAT, INT
from mlbench.cli_options import layout_options
from mlbench.cli_paths import PathParam, path_limit
from mlbench.errors import Stopped, SystemFailure, UserError, document_on_stdout, printable, stops_on_signals
from mlbench.preflight import LayoutRequest, check_new_folder, check_save_path_length
from mlbench.quality import operator

console = terminal.console()


def _params_vs_published(params: int, b) -> str:
    """The built model's count against the headline size, and against the definition's reference count where
    that differs (BERT-large's "340M" is a rounding; its reference checkpoint holds 336M)."""
    size = float(b.size[:-1]) * {"B": 1e9, "M": 1e6}[b.size[-1]]
    text = f"{_fmt_params(params)}: {100 * (params / size - 1):+.2f} % vs the published {b.size}"
    if abs(b.published_params / size - 1) > 0.005:
        text += (f"; {100 * (params / b.published_params - 1):+.2f} % vs the reference count "
                 f"{_fmt_params(b.published_params)} (see sources)")
    return f"{params:,} ({text})"


def _fmt_params(n: float) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return f"{n:,.0f}"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """MLPerf-style time-to-train runs for large language models."""


@cli.command("list")
def list_cmd() -> None:
    """The benchmarks, a row each. A benchmark file that does not load is named on stderr with its reason, the
    others listed, and the exit code is 2."""
    # The name is what a user types next and the metric what the logs say: neither is ever cut, so the table
    # keeps no vertical rules and wraps the model's title instead (80 columns fit).
    t = Table(title="benchmarks", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1, 0, 0))
    t.add_column("name", no_wrap=True)
    t.add_column("model")
    t.add_column("size", no_wrap=True)
    t.add_column("quality target", min_width=len("masked_lm_accuracy"))
    for col in ("ruleset", "runs", "tiny"):  # tiny: the tiny variant's target
        t.add_column(col)
    if not registry.names():
        raise UserError(f"no benchmark files (<name>.yaml) in {registry.BENCHMARKS_DIR}")
    loaded, failures = registry.load_each()
    for b, tiny in loaded:
        op = operator(b.quality.direction)
        t.add_row(b.name, b.title.split(" (")[0], b.size, f"{b.quality.metric} {op} {b.quality.target}",
                  b.mlperf.ruleset, str(b.mlperf.runs_required), f"{op} {tiny.quality.target}" if tiny else "-")
    if loaded:
        console.print(t)
    if failures:
        for why in failures:
            _error(why)
        sys.exit(UserError.exit_code)


@cli.command()
@click.argument("name")
@click.option("--tiny", is_flag=True, help="The tiny variant that converges on a CPU.")
@click.option("--json", "as_json", is_flag=True,
              help="The resolved definition as one JSON object: the benchmark file's sections with every expression "
                   "evaluated at its global batch, with params_total (params_active for mixture of experts) and "
                   "flops_per_sample (its fields: docs/output.md).")
def show(name: str, tiny: bool, as_json: bool) -> None:
    """A benchmark's definition, parameter count and model FLOPs."""
    from mlbench import flops
    from mlbench.models import family
    from mlbench.spec import resolved

    b = registry.load(name, tiny=tiny)
    m, o = b.model, b.optimizer
    params = flops.param_count(m)
    if as_json:
        counts = {"params_total": params, "flops_per_sample": flops.flops_per_sample(m)}
        if m.num_experts:
            counts["params_active"] = flops.active_param_count(m)
        terminal.STDOUT.write(schema.dumps(schema.versioned(resolved(b) | counts)) + "\n")
        terminal.STDOUT.flush()
        return
    t = Table(title=f"{b.title}{' (tiny variant)' if tiny else ''}", show_header=False)
    t.add_column("key", style="bold")
    t.add_column("value")
    t.add_row("parameters", f"{params:,}" if tiny else _params_vs_published(params, b))
    if m.num_experts:
        t.add_row("active parameters", f"{flops.active_param_count(m):,} per token (top-{m.moe_router_topk} of "
                                       f"{m.num_experts} experts)")
    t.add_row("model FLOPs per sample", f"{flops.flops_per_sample(m):.4g} (training: 3 x forward)")
    t.add_row("architecture", f"{m.family}: {family(m.family).describe(m)}")  # the family says what it has
    r = resolved(b)  # every value at the benchmark's global batch; an expression follows its value

    def value(section: str, key: str) -> str:
        written, v = getattr(getattr(b, section), key), r[section][key]
        text = f"{v:,}" if isinstance(v, int) else f"{v:g}"
        if written is None and key in ("lr", "warmup_steps"):
            return f"{text} (its RCP table's, at global batch {b.train.global_batch_size})"
        return text + (f" (= {written})" if isinstance(written, str) else "")

    t.add_row("optimizer", f"{o.name}: lr {value('optimizer', 'lr')}, min lr {value('optimizer', 'min_lr')}, "
                           f"betas ({o.beta1}, {o.beta2}), eps {o.eps}, weight decay {o.weight_decay}, "
                           f"clip {o.clip_grad}")
    t.add_row("schedule", f"warm-up {value('optimizer', 'warmup_steps')} steps, {o.decay_style} decay "
                          f"{value('optimizer', 'decay_steps')} steps")
    t.add_row("batch", f"global {b.train.global_batch_size}, micro {b.train.micro_batch_size}")
    t.add_row("eval", f"every {value('eval', 'interval_samples')} samples on {b.eval.samples} samples")
    op = operator(b.quality.direction)
    t.add_row("quality target", f"{b.quality.metric} {op} {b.quality.target}")
    if b.quality.note:
        t.add_row("target chosen", b.quality.note)
    t.add_row("MLPerf", f"{b.mlperf.benchmark}, training {b.mlperf.ruleset}, {b.mlperf.runs_required} runs")
    t.add_row("data", b.data.source + (f" ({b.data.path})" if b.data.path else ""))
    if b.train.init_checkpoint:
        t.add_row("starts from", f"{b.train.init_checkpoint} (--init-checkpoint; docs/checkpoints.md)")
    for ly in b.layouts:
        t.add_row("reference layout", f"{ly.devices or 'any'} devices: tp {ly.tp} pp {ly.pp} vp {ly.vp} cp {ly.cp}"
                                      f"{f' gbs {ly.global_batch_size}' if ly.global_batch_size else ''}"
                                      f"{f' ({ly.source})' if ly.source else ''}")
    for s in b.sources:
        t.add_row("source", s)
    console.print(t)


@cli.command()
@click.argument("name")
@click.option("--tiny", is_flag=True, help="The tiny variant: converges on a CPU in seconds.")
@layout_options
@click.option("--seed", type=INT, help="Seed of the first run; run i uses seed + i (0 to 2**32 - 1). Default: random.")
@click.option("--runs", default=1, show_default=True, type=INT, help="Runs, each with its own seed (1 to 1000).")
@click.option("--results", "results_root", default="results", show_default=True, type=PathParam(),
              help="Root of the results layout: RESULTS/SYSTEM/BENCHMARK/result_I.txt")
@click.option("--system", help="System name in the results layout. Default: this host's name.")
@click.option("--launcher", type=click.Choice(["local", "torchrun", "slurm"]), default="local", show_default=True,
              help="local: the ranks on this machine; torchrun: one invocation per node; slurm: an sbatch job.")
@click.option("--rdzv-endpoint", help="torchrun launcher: HOST:PORT of the rendezvous, on node 0's host (the same "
                                      "on every node; node 0 listens on PORT).")
@click.option("--node-rank", default=0, show_default=True, type=INT,
              help="torchrun launcher: this node's rank; node 0 hosts global rank 0 and publishes the run.")
@click.option("--rdzv-timeout", default=600.0, show_default=True, type=FLOAT,
              help="torchrun and slurm launchers: seconds the nodes wait for each other at the rendezvous (node 0 "
                   "for every node to join) before the run is aborted.")
@click.option("--hang-timeout", default=300.0, show_default=True, type=FLOAT,
              help="Seconds without step progress before a run is aborted as hung.")
@click.option("--partition", help="slurm: partition.")
@click.option("--account", help="slurm: account.")
@click.option("--time", "time_limit", default="02:00:00", show_default=True,
              help="slurm: time limit [D-]HH:MM:SS (at most 24855-03:13:08, SLURM's largest).")
@click.option("--sbatch-arg", "sbatch_args", multiple=True, help="slurm: extra sbatch option, e.g. --exclusive.")
@click.option("--container-image", help="slurm: container image (pyxis/enroot).")
@click.option("--container-mounts", help="slurm: container mounts, src:dst[,src:dst...] (with --container-image).")
@click.option("--master-addr", help="slurm: rendezvous address (default: the first node of the allocation).")
@click.option("--gpus-per-node", default=0, show_default=True, type=INT, help="slurm: GPUs to request per node.")
@click.option("--threads", default=1, show_default=True, type=INT, help="CPU threads per rank.")
@click.option("--dry-run", is_flag=True, help="Resolve and print the layout and commands; write the MLPerf log "
                                               "up to run_start; train nothing.")
@click.option("--data-path", help="Indexed data: megatron dataset PREFIX (PREFIX.bin, PREFIX.idx) or a blend "
                                  "'W1 P1 W2 P2 ...'; overrides data.path. See docs/data.md.")
@click.option("--eval-data-path", help="Indexed data: held-out eval PREFIX or blend; overrides data.eval_path "
                                       "(default: the last documents of a single --data-path).")
@click.option("--init-checkpoint", type=PathParam(),
              help="megatron-core distributed checkpoint (torch_dist) to start from, in any parallel layout. "
                   "Required for full-size runs of benchmarks that start from one.")
@click.option("--save-checkpoint", type=PathParam(),
              help="Save model and optimizer state here when the run stops (a new folder; one run only).")
@click.option("--lr", type=FLOAT, help="Peak learning rate, over the benchmark's: needed at a global batch its "
                                      "RCP table (llama31_8b, gpt_oss_20b) has no row for. At least its min_lr.")
@click.option("--warmup-steps", type=INT, help="Warm-up steps, over the benchmark's (as --lr).")
@click.option("--device", help="The GPU (a100, h100_pcie, h100, h200, b200, gb200, gb300) the per-GPU memory plan "
                                "must fit: a run (or dry run) whose plan does not is refused. Default: this "
                                "machine's GPU or memory for a local run; none for a dry run or a SLURM job.")
@click.option("--ignore-closed-rules", is_flag=True,
              help="Launch a full-size run even if the official closed rules reject its hyperparameters (its log "
                   "then fails the checker). Without it such a run is refused before launch.")
@stops_on_signals  # from the start: a stop during the checks before launch cleans up as Ctrl-C does
def run(name: str, tiny: bool, layout: LayoutRequest, **options) -> None:
    """Run a benchmark to its quality target and report time-to-train."""
    from mlbench import preflight
    from mlbench.launch import launcher

    ctx = click.get_current_context()
    given = frozenset(n for n in options if ctx.get_parameter_source(n) is not click.core.ParameterSource.DEFAULT)
    p = preflight.prepare(preflight.RunRequest(name=name, tiny=tiny, layout=layout, given=given, **options), console)
    code = launcher.start(p.bench, p.layout, p.opts, p.slurm_opts, console, dry_run=p.dry_run)
    for why in p.real_run_refusals:  # (a dry run's: it plans the run, the real one would stop here)
        console.print(f"note: a real run of this command would be refused: {printable(why)}", highlight=False,
                      soft_wrap=True)
    sys.exit(code)


@cli.command("convert-checkpoint")
@click.argument("name")
@click.argument("src", type=PathParam(exists=True, dir_okay=False))
@click.argument("dest", type=PathParam())
@click.option("--tiny", is_flag=True, help="Convert for the tiny variant's model.")
@stops_on_signals
def convert_checkpoint(name: str, src: Path, dest: Path, tiny: bool) -> None:
    """Converts a benchmark's reference checkpoint into a megatron-core checkpoint for --init-checkpoint.

    bert: SRC is the PyTorch form of the MLPerf BERT phase-1 checkpoint (model.ckpt-28252.pt as
    convert_tf_checkpoint.py writes it, or a Hugging Face BertForPreTraining state dict); DEST a new folder.
    """
    import dataclasses
    import json
    import tempfile

    from mlbench import helper_process
    from mlbench.models import family

    if not src.is_file():  # a pipe would block the converter's read forever
        raise UserError(f"SRC {src}: not a regular file; give the checkpoint file")
    bench = registry.load(name, tiny=tiny)
    converter = family(bench.model.family).converter(bench.model)  # the helper module, if the family has one
    if converter is None:
        raise UserError(f"{name}: no conversion needed or provided; its reference checkpoint loads directly with "
                        f"--init-checkpoint when it is a megatron-core torch_dist checkpoint (docs/checkpoints.md)")
    check_new_folder("DEST", dest)
    check_save_path_length(dest, 1, "local", "DEST")  # where the conversion saves, as a run's save is checked
    from mlbench.train.checkpoint import folder

    try:
        with tempfile.TemporaryDirectory(prefix="mlbench-convert-") as tmp:
            spec = Path(tmp) / "benchmark.json"
            spec.write_text(json.dumps(dataclasses.asdict(bench), default=str))
            try:
                r = helper_process.run_json(converter, str(spec), str(src), str(dest))  # (its errors name SRC or DEST)
            except helper_process.HelperFailed as e:  # a crash, not bad input: exit 1
                raise SystemFailure(f"conversion failed: {e}") from None
    finally:  # a converter stopped or killed mid-save (SIGTERM, the terminal closed) left its partial save beside DEST
        folder.remove_dead_partials(dest)
    console.print(f"converted {src} -> {dest}: {r['tensors']} tensors, {r['parameters']:,} values (vocabulary "
                  f"padding included) in {r['seconds']} s; start a run from it with --init-checkpoint {dest}",
                  highlight=False, soft_wrap=True)


@cli.command()
@click.argument("path", type=PathParam())
@click.option("--ruleset", help="Training ruleset. Default: the round a training_results_vX.Y path names, else the "
              "benchmark's own (from its definition).")
@click.option("--rules", type=click.Choice(["auto", "smoke", "closed"]), default="auto", show_default=True,
              help="auto: smoke rules for tiny runs (per their record), the benchmark's closed rules otherwise.")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON document in place of the verdicts' lines (its fields: docs/output.md); the exit "
                   "code is the same.")
@stops_on_signals
def check(path: Path, ruleset: str | None, rules: str, as_json: bool) -> None:
    """The official compliance checker's verdict on a result file or a folder of them. Exit 0: every file passed;
    1: some failed; 3: none failed, but the checker gave no verdict on some (killed from outside, twice)."""
    from mlbench import compliance

    if as_json:  # stdout carries the document alone: an error goes to stderr, with no document
        with document_on_stdout() as write:
            checked, notes = compliance.judge_paths(path, ruleset, rules)
            write(schema.dumps(compliance.checked_json(checked, notes), indent=2))
        ok = compliance.overall(checked)
    else:
        ok = compliance.check_paths(path, ruleset, rules, console)
    sys.exit(0 if ok else 1 if ok is False else 3)


# Commands of packages that may be absent from an installation (or not written yet): registered where present.
OPTIONAL_COMMANDS = {"mlbench.analysis.commands": ("score", "compare", "scaling"),
                     "mlbench.planner.commands": ("plan",)}


def _add_optional_commands() -> None:
    import importlib

    for module, names in OPTIONAL_COMMANDS.items():
        try:
            commands = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name is None or not module.startswith(e.name):  # the module is there but broken: say so
                raise
            continue
        for name in names:
            if isinstance(getattr(commands, name, None), click.Command):
                cli.add_command(getattr(commands, name))


_add_optional_commands()


def _error(message: str) -> None:
    """One line on stderr, always: 'error:' and the message, `printable` (a folder's name "e\\x1b]0;...\\nerror:
    forged" in it sent a terminal escape and forged a line), no markup read into it. Stdout is the command's
    product: `mlbench run nonesuch > out.txt` hid its error in the file, and a --json document's reader
    (`mlbench score --json X | jq`) reads the document alone. Said after what stdout holds (where both streams go
    to one terminal, the output first); a failure to write stdout is left for main to say, one to write stderr has
    nowhere left to be said."""
    line = Text.assemble(("error:", "red"), " ", printable(message))
    terminal.STDOUT.flush()
    failed_before = terminal.STDOUT.failure
    sys.stdout = sys.stderr  # the console writes to sys.stdout as it is at each write (terminal.STDOUT)
    with contextlib.suppress(OSError):
        console.print(line, highlight=False, soft_wrap=True)
    if failed_before is None:
        terminal.STDOUT.take_failure()


def main() -> None:
    """The CLI; output that could not be written (stdout on a full disk: ENOSPC, EIO; not a reader that left) is
    said on stderr at the end, exit 1 where the command had succeeded (`mlbench list > /dev/full` exited 0)."""
    terminal.hold_standard_streams()
    terminal.STDOUT.reset()
    exited: SystemExit | None = None
    try:
        _main()
    except SystemExit as e:
        exited = e
    terminal.STDOUT.flush()
    if (why := terminal.STDOUT.take_failure()) is not None:
        _error(f"could not write to standard output: {why}")
        sys.exit((exited and exited.code) or 1)
    if exited is not None:  # as the command ended it (a run's sys.exit(0) too: callers in-process see it)
        raise exited


def _main() -> None:
    try:
        cli.main(prog_name="mlbench", standalone_mode=False)
    except UserError as e:
        _error(str(e))
        sys.exit(e.exit_code)
    except click.exceptions.Abort as e:  # Ctrl-C (KeyboardInterrupt), or SIGTERM or SIGHUP in an analysis command
        stopped = e.__cause__ if isinstance(e.__cause__, Stopped) else None
        console.print(f"aborted ({stopped})" if stopped else "aborted", highlight=False)
        sys.exit(stopped.exit_code if stopped else 130)
    except click.UsageError as e:  # an unknown option, a bad choice: one line, and where to read more
        if type(e).__name__ == "NoArgsIsHelpError":  # `mlbench` alone (click >= 8.2): the help, as click gives it
            terminal.STDOUT.write((e.ctx.get_help() if e.ctx else e.format_message()) + "\n")
            sys.exit(2)
        _error(f"{e.format_message()} (see '{e.ctx.command_path if e.ctx else 'mlbench'} -h')")
        sys.exit(2)
    except click.ClickException as e:
        _error(e.format_message())
        sys.exit(2)
    except SystemExit:
        raise
    except OSError as e:  # a path that cannot be used as given (a name too long, a loop of links): one line
        _error(_os_error(e))
        sys.exit(2 if e.errno in _PATH_ERRNOS else 1)


# What the system says of a path that is unusable as written: bad input, exit 2 as a UserError. Any other failure of
# the system (a full disk, an I/O error) is one line too, with exit code 1.
_PATH_ERRNOS = frozenset({errno.ENAMETOOLONG, errno.ELOOP, errno.ENOTDIR, errno.EISDIR, errno.ENOENT, errno.EACCES,
                          errno.EPERM, errno.EEXIST, errno.EROFS, errno.ENXIO, errno.ENODEV})


def _os_error(e: OSError) -> str:
    """An OSError as '<path>: <what the system says>', with the limit where a name or path is too long."""
    why = e.strerror or str(e)
    if e.filename is None:
        if e.errno == errno.ENOENT and not _working_folder_exists():  # os.getcwd() said only "No such file..."
            return ("the working folder no longer exists (removed after the shell entered it), and a relative path "
                    "is read from it; cd to a folder that exists, or give absolute paths")
        return why
    path = os.fsdecode(e.filename)
    if e.errno == errno.ENAMETOOLONG:
        name_max = max((len(os.fsencode(n)) for n in Path(path).parts), default=0)
        why += (f" (a name takes at most {path_limit('PC_NAME_MAX', path, 255)} bytes; give a shorter one)"
                if name_max > path_limit("PC_NAME_MAX", path, 255)
                else f" (a path takes at most {path_limit('PC_PATH_MAX', path, 4096) - 1} bytes; give a shorter one)")
    return f"{path}: {why}"


def _working_folder_exists() -> bool:
    try:
        os.getcwd()
    except FileNotFoundError:
        return False
    return True


if __name__ == "__main__":
    main()
