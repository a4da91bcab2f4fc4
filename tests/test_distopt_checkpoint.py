"""Checkpoints with megatron-core's distributed optimizer, on real processes: a tiny gpt3 at DP2 with the
distributed optimizer saves its model and sharded Adam state (megatron's 'fully_reshardable' layout) and a run
with it resumes from them with the numbers of the same save and resume without the distributed optimizer (fp32:
the distributed optimizer is exact). Two saves, two resumes, 20 steps each.
(A run with the other optimizer loads the model and starts with fresh moments: docs/checkpoints.md.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import mlbench, result_dir

pytestmark = pytest.mark.slow  # four trainings of 20 steps at 2 processes: about 100 s unloaded


def _run(root: Path, *flags: str, env: dict) -> dict:
    proc = mlbench("run", "gpt3", "--tiny", "--nproc-per-node", "2", "--results", str(root), "--system", "ci",
                   *flags, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads((result_dir(root, "gpt3") / "result_0.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, quick_env: dict) -> tuple[Path, dict[str, dict]]:
    root = tmp_path_factory.mktemp("distopt")
    out = {}
    for name, flag in (("distributed", "--distributed-optimizer"), ("plain", "--no-distributed-optimizer")):
        ckpt = root / f"ckpt_{name}"
        out[f"saved_{name}"] = _run(root / f"save_{name}", flag, "--seed", "5", "--save-checkpoint", str(ckpt),
                                    env=quick_env)
        out[name] = _run(root / name, flag, "--seed", "6", "--init-checkpoint", str(ckpt), env=quick_env)
    return root / "ckpt_distributed", out


def _losses(record: dict) -> list[float]:
    return [s["loss"] for s in record["steps"]]


def test_the_distributed_optimizer_saves_a_checkpoint(runs: tuple[Path, dict[str, dict]]) -> None:
    ckpt, out = runs
    assert (ckpt / "metadata.json").is_file() and out["saved_distributed"]["saved_checkpoint"]
    assert out["saved_distributed"]["layout"]["features"]["distributed_optimizer"] is True
    assert _losses(out["saved_distributed"]) == pytest.approx(_losses(out["saved_plain"]), rel=1e-5)


def test_its_optimizer_state_loads_with_the_distributed_optimizer(runs: tuple[Path, dict[str, dict]]) -> None:
    loaded = runs[1]["distributed"]["init_checkpoint"]
    assert loaded["optimizer_state"] is True and loaded["optimizer_note"] == ""
    assert loaded["saved_by"]["layout"]["features"]["distributed_optimizer"] is True


def test_the_resumed_run_trains_as_without_the_distributed_optimizer(runs: tuple[Path, dict[str, dict]]) -> None:
    _, out = runs
    assert out["plain"]["init_checkpoint"]["optimizer_state"] is True
    # moments and step as saved: a step shared by all parameters (megatron's load) would drift from step 2 on
    assert _losses(out["distributed"]) == pytest.approx(_losses(out["plain"]), rel=1e-5)
