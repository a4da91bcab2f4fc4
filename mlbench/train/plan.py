"""The run plan: everything a rank needs, resolved before launch and handed over as one JSON file."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from mlbench.spec import Benchmark, build


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
    save_checkpoint: str = ""  # where to save one when the run stops ("" for nowhere)

    @property
    def log_path(self) -> Path:
        return Path(self.run_dir) / "mlperf.log"

    @property
    def events_path(self) -> Path:
        return Path(self.run_dir) / "events.jsonl"

    def save(self, path: str | Path) -> None:
        data = dataclasses.asdict(self)
        Path(path).write_text(json.dumps(data, indent=1, default=str))

    @classmethod
    def load(cls, path: str | Path) -> RunPlan:
        data = json.loads(Path(path).read_text())
        return cls(benchmark=benchmark_from_dict(data.pop("benchmark")), **data)


def benchmark_from_dict(data: dict) -> Benchmark:
    """A resolved benchmark back from `dataclasses.asdict`, directly or through JSON."""
    return build(Benchmark, data, "plan.benchmark")
