"""Checkpoints with megatron-core's distributed optimizer, on real processes: a tiny gpt3 at DP2 with the
distributed optimizer saves its model and sharded Adam state (megatron's 'fully_reshardable' layout); a run with
the distributed optimizer loads both, and a run without it loads the model and starts with fresh moments, saying
why (megatron-core nests the two optimizers' common state differently). One save, two loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import mlbench, result_dir

pytestmark = pytest.mark.slow  # three trainings of 20 steps at 2 processes: about 75 s


def _run(root: Path, *flags: str, env: dict) -> dict:
    proc = mlbench("run", "gpt3", "--tiny", "--nproc-per-node", "2", "--results", str(root), "--system", "ci",
                   *flags, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads((result_dir(root, "gpt3") / "result_0.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, quick_env: dict) -> tuple[Path, dict[str, dict]]:
    root = tmp_path_factory.mktemp("distopt")
    ckpt = root / "ckpt"
    out = {"saved": _run(root / "save", "--distributed-optimizer", "--seed", "5", "--save-checkpoint", str(ckpt),
                         env=quick_env)}
    for name, flag in (("distributed", "--distributed-optimizer"), ("plain", "--no-distributed-optimizer")):
        out[name] = _run(root / name, flag, "--seed", "6", "--init-checkpoint", str(ckpt), env=quick_env)
    return ckpt, out


def test_the_distributed_optimizer_saves_a_checkpoint(runs: tuple[Path, dict[str, dict]]) -> None:
    ckpt, out = runs
    assert (ckpt / "metadata.json").is_file() and out["saved"]["saved_checkpoint"]
    assert out["saved"]["layout"]["features"]["distributed_optimizer"] is True


def test_its_optimizer_state_loads_with_the_distributed_optimizer(runs: tuple[Path, dict[str, dict]]) -> None:
    loaded = runs[1]["distributed"]["init_checkpoint"]
    assert loaded["optimizer_state"] is True and loaded["optimizer_note"] == ""
    assert loaded["saved_by"]["layout"]["features"]["distributed_optimizer"] is True


def test_without_it_the_model_loads_and_the_moments_start_fresh(runs: tuple[Path, dict[str, dict]]) -> None:
    _, out = runs
    plain = out["plain"]["init_checkpoint"]
    assert plain["optimizer_state"] is False and "distributed optimizer" in plain["optimizer_note"]
    dist_steps, plain_steps = out["distributed"]["steps"], out["plain"]["steps"]
    # the same weights and data: the first loss is the same; then the loaded moments move the weights differently
    assert dist_steps[0]["loss"] == pytest.approx(plain_steps[0]["loss"], rel=1e-6)
    assert dist_steps[-1]["loss"] != pytest.approx(plain_steps[-1]["loss"], rel=1e-4)
