"""A checkpoint written by another framework under the MLPerf GPT-3 reference checkpoint's names (NVIDIA's
v4.1 layout: `model.` prefix, layernorm_qkv / proj / layernorm_mlp.fc1_weight, no optimizer metadata) starts a
tiny gpt3 run through the benchmark's train.checkpoint_names; and a save that fails after run_stop keeps the
run's result and fails the command."""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import MLBENCH, mlbench, result_dir

from mlbench import registry

pytestmark = pytest.mark.slow


def _record(root: Path, i: int = 0) -> dict:
    return json.loads((result_dir(root, "gpt3") / f"result_{i}.json").read_text())


@contextlib.contextmanager
def _one_rank(tmp: Path) -> Iterator[None]:
    """A gloo process group of this process alone (a file store: no port to pick), for the converters."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_reference_checkpoint_names_load_through_the_benchmark_definition(tmp_path: Path,
                                                                          quick_benchmarks: Path) -> None:
    quick = {"MLBENCH_BENCHMARKS": str(quick_benchmarks)}  # 20 steps a run: loading is the point, not the target
    saved = tmp_path / "saved"
    proc = mlbench("run", "gpt3", "--tiny", "--results", str(tmp_path / "a"), "--system", "ci", "--seed", "1",
                   "--save-checkpoint", str(saved), env=quick, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rules = registry.load("gpt3", tiny=True).train.checkpoint_names
    assert set(rules) == {"megatron", "nemo"}, "gpt3 names both reference checkpoints' tensors"

    # The reference's Megatron checkpoint layout: zarr arrays under legacy Megatron-LM names, and a common.pt
    # whose one param group carries step 4000 and no megatron-core ids. It is read as it is, with its optimizer
    # state, under a definition with a third of the learning rate: the moments come from the checkpoint, the
    # learning rates from the definition (what the MLPerf log states), not the saving run's.
    f = quick_benchmarks / "gpt3.yaml"
    f.write_text(f.read_text().replace("optimizer: {lr: 3.0e-3, min_lr: 3.0e-4,", "optimizer: {lr: 1.0e-3, "
                                                                                  "min_lr: 1.0e-4,"))
    import rename_checkpoint  # here, not at collection: they turn on the CPU layer for the worker
    import zarr_reference

    zarr, foreign = tmp_path / "reference_zarr", tmp_path / "nvidia_v41_names"
    with _one_rank(tmp_path):  # both conversions in this process: a script each would import megatron again
        zarr_reference.convert(str(saved), str(zarr))
        rename_checkpoint.convert(str(saved), str(foreign), "model.", rules["nemo"])
    # mlbench's save (which the converter uses) starts no process: megatron's default writer started a Manager
    # by spawn for its results queue, a fresh interpreter importing torch and megatron again at every save.
    assert not multiprocessing.active_children(), multiprocessing.active_children()
    proc = mlbench("run", "gpt3", "--tiny", "--results", str(tmp_path / "z"), "--system", "ci", "--seed", "2",
                   "--init-checkpoint", str(zarr), env=quick, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rec, before = _record(tmp_path / "z"), _record(tmp_path / "a")
    loaded = rec["init_checkpoint"]
    assert loaded["renamed"] == loaded["tensors"] == 16 and loaded["optimizer_state"] is True
    assert loaded["example_name"].startswith("language_model.") and "step from the checkpoint" in loaded[
        "optimizer_note"]
    assert rec["steps"][0]["loss"] < before["steps"][-1]["loss"] + 0.1 < before["steps"][0]["loss"]
    for a, b in zip(rec["steps"][:5], before["steps"][:5], strict=True):
        assert a["lr"] == pytest.approx(b["lr"] / 3, rel=1e-6), (a, b)

    from megatron.core.dist_checkpointing.serialization import load_sharded_metadata

    stored = load_sharded_metadata(str(foreign))
    assert "model.decoder.layers.layernorm_mlp.fc1_weight" in stored
    assert "decoder.layers.mlp.linear_fc1.weight" not in stored

    proc = mlbench("run", "gpt3", "--tiny", "--results", str(tmp_path / "b"), "--system", "ci", "--seed", "2",
                   "--init-checkpoint", str(foreign), env=quick, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "fresh optimizer state: the checkpoint has no megatron-core optimizer metadata" in " ".join(
        proc.stdout.split())
    rec, before = _record(tmp_path / "b"), _record(tmp_path / "a")
    loaded = rec["init_checkpoint"]
    assert loaded["renamed"] == loaded["tensors"] == 16 and loaded["optimizer_state"] is False
    assert loaded["example_name"].startswith("model.")
    assert rec["steps"][0]["loss"] < before["steps"][-1]["loss"] + 0.1 < before["steps"][0]["loss"]


def test_failed_save_after_run_stop_keeps_the_run_and_fails_the_command(tmp_path: Path,
                                                                        quick_benchmarks: Path) -> None:
    """The destination appears while the run trains: the save refuses to replace it, after run_stop."""
    dest = tmp_path / "ckpt"
    proc = subprocess.Popen([*MLBENCH, "run", "gpt3", "--tiny", "--results", str(tmp_path / "results"), "--system",
                             "ci", "--seed", "3", "--save-checkpoint", str(dest)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "MLBENCH_BENCHMARKS": str(quick_benchmarks)})
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob("results/ci/gpt3/.staging-*/events.jsonl")) and time.monotonic() < deadline:
        time.sleep(0.2)
    dest.mkdir()
    (dest / "keep.txt").write_text("mine")
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 1, out
    record = _record(tmp_path / "results")
    assert record["status"] == "success"
    assert "exists" in record["checkpoint_error"] and record["saved_checkpoint"] is None
    assert (dest / "keep.txt").read_text() == "mine"
    assert "checkpoint not saved" in out
