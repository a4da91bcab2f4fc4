"""`mlbench run --dry-run`: the resolved layout, the commands, and the MLPerf log up to run_start; the checks of a
log up to run_start and of a checkpoint that the preflight shares."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from mlbench import compliance, helper_process, results
from mlbench.errors import UserError
from mlbench.launch.contract import Launcher
from mlbench.layout import Layout
from mlbench.mlperf_log import write_preamble
from mlbench.run_plan import RunPlan
from mlbench.runner import RunOptions, seeds
from mlbench.spec import Benchmark


def layout_table(bench: Benchmark, layout: Layout) -> Table:
    t = Table(title=f"{bench.name}: resolved layout", show_header=False)
    d = layout.as_dict()
    experts = ("ep",) if bench.model.num_experts else ()  # (a dense model has no expert parallelism to show)
    for key in ("nodes", "nproc_per_node", "world_size", "tp", "pp", "vp", "cp", "dp", *experts, "micro_batch_size",
                "global_batch_size", "num_microbatches"):
        t.add_row(key, str(d[key]))
    return t


def check_checkpoint(plan: RunPlan, console: Console, checksums: bool = True) -> dict[str, list[int]]:
    """The --init-checkpoint against the full-size model (built on the meta device in a subprocess: it needs a
    process group); a checkpoint that does not fit is bad input, reported before anything is written. CHECKSUMS:
    every byte read against the checksums saved with it here; otherwise its listing alone (the files, their
    sizes), each rank verifying its share of the bytes before it loads. Returns its files as checked
    (integrity.file_stamps), for the run plan."""
    with tempfile.TemporaryDirectory(prefix="mlbench-ckpt-check-") as tmp:
        plan_path = Path(tmp) / "plan.json"
        plan.save(plan_path)
        try:
            r = helper_process.run_json("mlbench.train.checkpoint.check", str(plan_path),
                                        *(() if checksums else ("--listing-only",)))
        except helper_process.HelperFailed as e:
            raise UserError(f"--init-checkpoint {plan.init_checkpoint}: could not be checked: {e}") from None
    names = f", {r['renamed']} through the benchmark's names (e.g. {r['example_name']})" if r["renamed"] else ""
    padding = f", vocabulary padding differs in {len(r['vocab_padding_resized'])}" if r["vocab_padding_resized"] else ""
    if r["optimizer_moments"] and r["optimizer_metadata"] and r.get("optimizer_chained"):
        moments = ("with Adam moments and megatron-core's optimizer metadata, saved by a chained optimizer (a mixture "
                   "of experts' dense and expert optimizers): a run whose optimizer is chained alike (--ep > 1) "
                   "loads them, another starts with fresh moments")
    elif r["optimizer_moments"] and r["optimizer_metadata"]:
        moments = "with Adam moments and megatron-core's optimizer metadata: the run loads them"
    elif r["optimizer_moments"]:
        moments = "Adam moments but no megatron-core optimizer metadata: the run starts with fresh moments"
    else:
        moments = "no Adam moments: the run starts with fresh moments"
    summed, deferred = r.get("checksummed_bytes"), r.get("checksums_deferred_bytes")
    said = (f"; every file's bytes match the checksums it was saved with ({summed / 1e6:,.1f} MB)"
            if summed is not None else
            f"; every file it was saved with is there, of its size ({deferred / 1e6:,.1f} MB): each rank verifies its "
            f"share of the bytes against their checksums before it loads" if deferred is not None else
            "; no checksums (not saved by mlbench): its bytes are not verified, only its structure")
    console.print(f"checkpoint {plan.init_checkpoint}: all {r['tensors']} model tensors present with the model's "
                  f"shapes{names}{padding}; {moments}{said}", highlight=False, soft_wrap=True)
    return r.get("file_stamps") or {}


def _log_to_run_start(bench: Benchmark, layout: Layout, seed: int, system: str, folder: str) -> Path:
    """Writes, in `folder`, the log a run at this layout would write up to run_start; returns its path."""
    plan = RunPlan(benchmark=bench, layout=layout.as_dict(), seed=seed, run_dir=folder, system=system, dry_run=True)
    write_preamble(plan).close()
    return plan.log_path


def closed_rule_problems(bench: Benchmark, layout: Layout, system: str) -> list[str]:
    """What the benchmark's official closed rules reject in the log a run at this layout would write up to
    run_start (written to a scratch folder, checked, removed): checked before a full-size run is launched."""
    with tempfile.TemporaryDirectory(prefix="mlbench-preflight-") as tmp:
        return compliance.before_run_start(_log_to_run_start(bench, layout, 0, system, tmp), bench.mlperf.ruleset)


class DryRun:
    """The launcher that starts nothing (mlbench.launch's contract): prepare writes the log a run would write up
    to run_start (and checks an --init-checkpoint against the model); collect shows the layout, what the chosen
    launcher would start, and the closed rules' verdict on that log. Exit code 1 when they reject a line."""

    def __init__(self, bench: Benchmark, layout: Layout, opts: RunOptions, console: Console, launcher: Launcher):
        self.bench, self.layout, self.opts, self.console, self.launcher = bench, layout, opts, console, launcher

    def prepare(self, folder: Path) -> None:
        bench, layout, opts, console = self.bench, self.layout, self.opts, self.console
        seed = seeds(opts.seed, 1)[0]
        if opts.init_checkpoint:
            check_checkpoint(RunPlan(benchmark=bench, layout=layout.as_dict(), seed=seed, run_dir="",
                                     system=opts.system, dry_run=True, init_checkpoint=opts.init_checkpoint), console)
        self.folder, self.dest = folder, folder / "dry-run.txt"  # not result_*.txt: scorers never take it for a run
        staging = None
        try:
            staging = results.stage(folder)
            with results.log_write_errors_silenced():
                log = _log_to_run_start(bench, layout, seed, opts.system, str(staging))
            if problem := results.log_problem(log, "run_start"):
                raise UserError(f"results folder {folder}: cannot write {self.dest.name}: {problem}")
            os.replace(log, self.dest)
        except OSError as e:
            raise UserError(f"results folder {folder}: cannot write {self.dest.name} ({e.strerror or e})") from None
        finally:
            if staging:
                results.discard(staging)

    def start(self) -> None:
        """Nothing: a dry run trains nothing."""

    def supervise(self) -> None:
        """Nothing started, nothing to follow."""

    def collect(self) -> int:
        bench, layout, console = self.bench, self.layout, self.console
        console.print(layout_table(bench, layout))
        console.print(f"layout from: {layout.source}", highlight=False, soft_wrap=True)
        for what, text in self.launcher.describe(self.folder):
            if "\n" in text:
                console.print(f"{what}:", highlight=False)
                console.out(text, highlight=False)
            else:
                console.print(f"{what}: {text}", highlight=False, soft_wrap=True)
        console.print(f"MLPerf log up to run_start: {self.dest}", highlight=False, soft_wrap=True)
        console.print(memory_line(bench, layout, self.opts.device), highlight=False, soft_wrap=True)
        if note := attention_note(bench, layout, self.opts.device):
            console.print(note, highlight=False, soft_wrap=True)
        if bench.variant == "tiny":  # its hyperparameters are not the benchmark's: the smoke rules check its runs
            console.print("closed rules: not applied to a tiny variant", highlight=False)
            return 0
        rules = f"closed {bench.mlperf.benchmark} rules ({bench.mlperf.ruleset})"
        console.print("RCP: " + compliance.rcp_coverage(bench.mlperf.benchmark, bench.mlperf.ruleset,
                                                         layout.global_batch_size), highlight=False, soft_wrap=True)
        problems = compliance.before_run_start(self.dest, bench.mlperf.ruleset)
        if not problems:
            console.print(Text(f"{rules} accept every hyperparameter line", style="green"), highlight=False)
            return 0
        console.print(Text.assemble((f"{rules} reject this log", "red"), " (a real run at this layout would fail "
                                    "the checker):"), highlight=False)
        for p in problems:
            console.print(f"  {p}", highlight=False, markup=False, soft_wrap=True)
        return 1


def _planned_on_cpu(layout: Layout, device: str) -> bool:
    """Whether memory_line plans the CPU's kernels: the CPU named, or none named and the precision fp32."""
    from mlbench.planner.memory import THIS_CPU

    return device == THIS_CPU if device else layout.precision == "fp32"


def attention_note(bench: Benchmark, layout: Layout, device: str) -> str | None:
    """Which attention kernels memory_line planned for a GPU, and what a GPU without Transformer Engine keeps: a dry
    run plans the published stack's (Transformer Engine's), where a real run on a GPU without it builds other layer
    specs (preflight.gpu_attention_here), which may keep the s x s probabilities. None for a CPU plan."""
    from mlbench.models import core_attention
    from mlbench.planner.memory import estimate

    if _planned_on_cpu(layout, device):
        return None
    te = estimate(bench, layout, on_cpu=False, attention="te")
    other = estimate(bench, layout, on_cpu=False, attention="sdpa")
    kernel = {"sdpa": "PyTorch's fused attention (SDPA)", "local": "megatron's local attention"}[
        core_attention(bench.model, "sdpa")]
    more = other.total_bytes - te.total_bytes
    keeps = f"keeps {_gib(more)} more per GPU ({_gib(other.total_bytes)})" if more > 0 else "plans the same memory"
    return (f"attention planned: Transformer Engine's kernels; a GPU without Transformer Engine runs {kernel} and "
            f"{keeps}")


def _gib(b: float) -> str:
    return f"{b / 2**30:.2f} GiB" if b >= 2**30 else f"{b / 2**20:.2f} MiB"


def memory_line(bench: Benchmark, layout: Layout, device: str) -> str:
    """The per-GPU memory plan in one line, with its verdict when a device was named (a plan that does not fit
    was refused before this point)."""
    from mlbench.planner.memory import estimate

    # the device named says which kernels run and whether a GPU's allowance is held; none named, the precision does
    plan = estimate(bench, layout, on_cpu=_planned_on_cpu(layout, device))
    terms = ", ".join(f"{k.removesuffix('_bytes')} {_gib(v)}" for k, v in plan.as_dict().items()
                      if k in ("params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "other_bytes"))
    verdict = f"; fits {device}" if device else "; pass --device to check it against a GPU"
    return f"memory per GPU (worst pipeline stage {plan.stage}): {terms} = {_gib(plan.total_bytes)}{verdict}"
