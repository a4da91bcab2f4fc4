"""The interleaved pipeline schedule (virtual stages, the layout the reference Llama 3.1 405B runs use) on a
4-layer tiny gpt3: it learns at pp 2 x vp 2 (to the midway target, step 60), and the checkpoint it saves (one
chunk per virtual stage) starts a single-process run from the trained weights. Before gloo's point-to-point
was made unbatched, pp 2 x vp 2 swapped activations and gradients and never learned (grad norm 33 at step 1
against 1.6)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import MIDWAY_TARGETS, assert_tiny_converges, mlbench, quicken, result_dir

pytestmark = pytest.mark.slow


def test_interleaved_pipeline_converges_and_its_checkpoint_loads(tmp_path: Path, benchmarks_copy: Path) -> None:
    f = benchmarks_copy / "gpt3.yaml"
    f.write_text(f.read_text().replace("  model: {num_layers: 2,", "  model: {num_layers: 4,"))
    env = {"MLBENCH_BENCHMARKS": str(quicken(benchmarks_copy, MIDWAY_TARGETS))}
    ckpt = tmp_path / "ckpt"
    assert_tiny_converges("gpt3", ["--nproc-per-node", "2", "--pp", "2", "--vp", "2", "--save-checkpoint", str(ckpt)],
                          tmp_path / "a", env=env)
    saved = json.loads((result_dir(tmp_path / "a", "gpt3") / "result_0.json").read_text())
    assert saved["layout"]["vp"] == 2 and saved["steps"][0]["grad_norm"] < 5

    quicken(benchmarks_copy)  # loading is the point now, not the target: 20 steps

    proc = mlbench("run", "gpt3", "--tiny", "--results", str(tmp_path / "b"), "--system", "ci", "--seed", "4",
                   "--init-checkpoint", str(ckpt), env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    loaded = json.loads((result_dir(tmp_path / "b", "gpt3") / "result_0.json").read_text())
    assert loaded["init_checkpoint"]["optimizer_state"] is True
    assert loaded["steps"][0]["loss"] < saved["steps"][-1]["loss"] + 0.1
