"""The run plan: everything a rank needs, resolved before launch and handed over as one JSON file, and the
schedule every reader of a run shares (step budget, evaluation points). The launcher writes it, the training
loop follows it, the MLPerf log writer states it; none of them computes it again."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mlbench import rcp_schedule
from mlbench.spec import Benchmark, build, evaluate, step_budget


@dataclass
class RunPlan:
    benchmark: Benchmark
    layout: dict  # Layout.as_dict()
    seed: int
    run_dir: str  # staging folder: the MLPerf log, events and per-rank logs are written here
    system: str
    org: str = "mlbench"
    division: str = "closed"
    dry_run: bool = False  # log up to run_start with every hyperparameter, build nothing heavy
    env: dict = field(default_factory=dict)
    init_checkpoint: str = ""  # a megatron-core distributed checkpoint to start from
    # each file of it as the check before launch read it, {name: [size, mtime_ns, inode]}: a rank loads those files
    init_checkpoint_stamps: dict = field(default_factory=dict)
    save_checkpoint: str = ""  # where to save one when the run stops ("" for nowhere)
    # Each node's first rank writes this node's progress events too: where every node has a plan and a supervisor
    # of its own (the torchrun launcher). Nodes that share one plan (SLURM's, one supervisor) leave them to rank 0.
    events_every_node: bool = False

    @property
    def log_path(self) -> Path:
        return Path(self.run_dir) / "mlperf.log"

    @property
    def events_path(self) -> Path:
        return Path(self.run_dir) / "events.jsonl"

    @property
    def global_batch_size(self) -> int:
        return self.layout["global_batch_size"]

    def save(self, path: str | Path) -> None:
        data = dataclasses.asdict(self)
        Path(path).write_text(json.dumps(data, indent=1, default=str))

    @classmethod
    def load(cls, path: str | Path) -> RunPlan:
        """The plan at PATH: OSError where it cannot be read (over logfile.MAX_JSON_BYTES included: a dead run's
        plan may be anything), ValueError where it is not a plan's JSON."""
        from mlbench.logfile import load_json  # numpy and orjson: not for the CLI's start-up

        data = load_json(path)
        if not isinstance(data, dict) or not isinstance(data.get("benchmark"), dict):
            raise ValueError("not a run plan (a JSON object with its benchmark)")
        return cls(benchmark=benchmark_from_dict(data.pop("benchmark")), **data)


def benchmark_from_dict(data: dict) -> Benchmark:
    """A resolved benchmark back from `dataclasses.asdict`, directly or through JSON."""
    return build(Benchmark, data, "plan.benchmark")


def max_steps(bench: Benchmark, gbs: int) -> int:
    """The step budget: train.max_steps, or the whole learning-rate schedule where none is given."""
    steps = step_budget(bench, gbs)
    if steps is None:
        raise rcp_schedule.undefined(bench, gbs)
    return steps


def eval_schedule(bench: Benchmark, gbs: int) -> Callable[[int], int]:
    """The step after which the next evaluation falls, given the current step: the first step at or past the
    next multiple of the interval. The rules give BERT's interval in samples, which the batch need not divide
    (225,000 at 8192): evaluating every ceil(interval / gbs) steps would fall a step later each time (9 steps
    late by 4.1M samples), as the NVIDIA reference does not. Where the batch divides the interval (gpt3 and
    llama write theirs rounded up to whole batches) this is every interval / gbs steps."""
    samples = int(evaluate(bench.eval.interval_samples, global_batch_size=gbs))
    if samples <= 0:
        raise ValueError(f"{bench.name}: eval.interval_samples is {samples}; it must be positive")

    def next_eval(step: int) -> int:
        k = step * gbs // samples + 1  # the next multiple of the interval past this step's samples
        return max(step + 1, -(-k * samples // gbs))

    return next_eval


def first_eval_samples(bench: Benchmark, gbs: int) -> int:
    """Evaluations before this many training samples are skipped (MLPerf's eval offsets)."""
    return int(evaluate(bench.eval.start_samples, global_batch_size=gbs))


def stop_reason_path(events_path: Path) -> Path:
    """Where the supervisor says why it stops the ranks (a hang, a signal), before it sends them SIGTERM: beside
    the run's events, which it and rank 0 both know."""
    return Path(events_path).with_name("stop_reason")
