"""The run record's `prediction` (mlbench/planner/prediction.py), without training: which device it is made for,
that it is the planner's own figure, and that it says why where there is none. A real run's record and `mlbench
compare`'s predicted vs measured row are checked in test_tiny_gpt3 (its runs, no extra training)."""

from __future__ import annotations

import os

import pytest

from mlbench import registry
from mlbench.layout import resolve
from mlbench.planner import devices
from mlbench.planner import plan as planner
from mlbench.planner.prediction import for_run

CPU_RANK0 = {"type": "cpu", "name": "x86_64", "per_node": 1, "precision": "fp32", "attention": "local"}


@pytest.mark.parametrize("nproc", [1, 2])
def test_a_cpu_run_is_predicted_on_the_measured_cpu(nproc: int) -> None:
    bench = registry.load("gpt3", tiny=True)
    layout = resolve(bench, 1, nproc)
    expected = planner.evaluate(bench, layout, devices.get("cpu"))  # measures this CPU once where uncached
    p = for_run(bench, layout, "this machine (CPU)", {**CPU_RANK0, "per_node": nproc})  # preflight's name
    assert p["device"] == "cpu"
    assert p["step_time_s"] == pytest.approx(expected["step_time_s"]) and p["step_time_s"] > 0
    assert sum(p["step_terms_s"].values()) == pytest.approx(p["step_time_s"])
    assert p["time_to_train_min"] is None  # tiny: no RCP to converge by


def test_a_run_is_predicted_on_the_device_rank0_trained_on_else_the_one_its_plan_was_checked_against() -> None:
    """The device rank 0 found, whatever --device the memory plan was checked against: a CPU run with --device
    h100 was predicted for an H100 and compared with its CPU steps ('predicted / measured 0.00'); a GPU of a
    name no datasheet matches takes the checked device."""
    bench = registry.load("gpt3")
    layout = resolve(bench, 64, 8, 4, 8, 6, 1, 2, 2048, precision="bf16")
    checked = for_run(bench, layout, "h200", {"type": "cuda", "name": "NVIDIA H100 80GB HBM3"})
    found = for_run(bench, layout, "", {"type": "cuda", "name": "NVIDIA H100 80GB HBM3"})
    unnamed = for_run(bench, layout, "h200", {"type": "cuda", "name": "Some Unknown Accelerator"})
    assert checked["device"] == "h100" and found["device"] == "h100" and unnamed["device"] == "h200"
    tiny = registry.load("gpt3", tiny=True)
    on_cpu = for_run(tiny, resolve(tiny), "h100", CPU_RANK0)
    assert on_cpu["device"] == "cpu" or "this CPU is not measured yet" in on_cpu["reason"], on_cpu
    assert found["step_time_s"] == pytest.approx(planner.evaluate(bench, layout, devices.get("h100"))["step_time_s"])
    assert found["time_to_train_min"] > 0  # full size: the RCP's samples to converge x step time + evaluations


def test_a_gpu_step_too_short_for_its_kernels_to_set_it_says_so() -> None:
    """The tiny variants on an H200 were predicted 0.03-0.04 ms a step and measured 28-56 ms (perf/gpu_check.py,
    docs/gpu.md): the host that queues the kernels sets such a step. The record's note says so; a full-size
    prediction (seconds) and a CPU run's (whose measured costs include the host) carry no such note."""
    tiny = registry.load("gpt3", tiny=True)
    h200 = {"type": "cuda", "name": "NVIDIA H200", "attention": "sdpa"}
    p = for_run(tiny, resolve(tiny), "h200", h200)
    assert p["step_time_s"] < 0.001 and "launch-bound on a GPU" in p["note"], p
    assert "Transformer Engine stack" in p["note"]  # and the software note beside it
    bench = registry.load("gpt3")
    full = for_run(bench, resolve(bench, 64, 8, 4, 8, 6, 1, 2, 2048, precision="bf16"), "h200", h200)
    assert "launch-bound" not in full["note"]


@pytest.mark.parametrize("rank0, reason", [
    (None, "no rank started"),
    ({"type": "cuda", "name": "Some Unknown Accelerator"}, "no datasheet device matches 'Some Unknown Accelerator'"),
])
def test_no_prediction_says_why(rank0: dict | None, reason: str) -> None:
    bench = registry.load("gpt3", tiny=True)
    p = for_run(bench, resolve(bench), "", rank0)
    assert p["device"] is None and p["step_time_s"] is None and reason in p["reason"]


def test_a_planner_failure_is_recorded_not_raised() -> None:
    bench = registry.load("gpt3")
    layout = resolve(bench, 64, 8, 4, 8, 6, 1, 2, 2048, precision="fp8")
    p = for_run(bench, layout, "a100", {"type": "cuda", "name": "NVIDIA A100-SXM4-80GB"})  # no fp8 tensor cores
    assert p["step_time_s"] is None and "has no fp8" in p["reason"]


def test_cpu_step_is_the_measured_real_step_composed_by_layout() -> None:
    """Fixed CPU figures, no measuring: at one process the prediction for tiny gpt3 is the real step the probe
    timed (two micro-batches of 8); at data parallel 2 each rank does one micro-batch, the real one-micro-batch
    step, plus the gradient all-reduce and the loss statistics' all-reduce."""
    import dataclasses

    from mlbench.planner import step_time

    measured = {"gemm_flops": 1e11, "megatron_layer_s": 0.005, "megatron_head_s": 0.004, "optimizer_s_per_tensor": 1e-4,
                "megatron_probe_layer_flops": 1.8e8, "megatron_probe_head_flops": 1e8, "collective_latency_s": 3e-4,
                "step_1_micro_s": 0.030, "step_2_micro_s": 0.050, "step_fb_s": 2 * 0.005 + 0.004}
    cpu = dataclasses.replace(devices.get("h100"), name="cpu", peaks={"fp32": 1e11}, collective_latency_s=3e-4,
                              scaleout_bytes_per_s=1e12, extra={"measured": measured})
    bench = registry.load("gpt3", tiny=True)
    one = step_time.predict(bench.model, resolve(bench, 1, 1, precision="fp32"), cpu)
    dp2 = step_time.predict(bench.model, resolve(bench, 1, 2, 1, precision="fp32"), cpu)
    assert one["step_time_s"] == pytest.approx(0.050)
    assert dp2["step_time_s"] == pytest.approx(0.030 + dp2["terms_s"]["dp_comm"] + 3e-4)
    assert dp2["terms_s"]["dp_comm"] == pytest.approx(3e-4, rel=0.01)  # tiny gradients: the latency


def test_a_run_on_a_cpu_not_yet_measured_says_how_to_measure_it(monkeypatch) -> None:
    from mlbench.planner import cpu

    monkeypatch.setattr(cpu, "cached", lambda: None)
    bench = registry.load("gpt3", tiny=True)
    p = for_run(bench, resolve(bench, 1, 1), "this machine (CPU)", CPU_RANK0)
    assert p["device"] is None and p["step_time_s"] is None and "--device cpu" in p["reason"]


def test_a_garbled_or_unwritable_cpu_cache_is_measured_again_not_a_traceback(monkeypatch, tmp_path, capsys) -> None:
    """The CPU measurement's cache is a cache: garbled JSON, another shape, a missing or non-finite figure are
    measured again and replaced (they were tracebacks in `plan --device cpu`); a cache path that cannot be written
    costs a note. (`measure` is this machine's real figures, not measured again here: 17 s.)"""
    import json

    from mlbench.planner import cpu

    real = cpu.cached() or cpu.measured()
    monkeypatch.setattr(cpu, "measure", lambda: dict(real))
    cache = tmp_path / "cpu-device.json"
    monkeypatch.setattr(cpu, "CACHE", cache)
    lacking = {k: v for k, v in real.items() if k != "step_fb_s"}
    for garbled in (b'{"bad": 1', b"[1, 2]", json.dumps({**real, "gemm_flops": "fast"}).encode(),
                    json.dumps({**real, "bytes_per_s": 0}).encode(), json.dumps(lacking).encode(), b"\xff"):
        cache.write_bytes(garbled)
        assert cpu.cached() is None, garbled
        assert cpu.measured() == real
        assert json.loads(cache.read_text()) == real  # replaced
    assert cpu.cached() == real
    cache.unlink()
    os.mkfifo(cache)  # read as a file, it blocked plan --device cpu for ever
    assert cpu.cached() is None
    assert cpu.measured() == real and json.loads(cache.read_text()) == real  # replaced
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setattr(cpu, "CACHE", blocker / "cpu-device.json")
    assert cpu.measured() == real and blocker.read_text() == ""
    assert "note: the CPU measurement is not cached" in capsys.readouterr().err


def test_the_cpu_cache_lives_where_the_user_says_and_somewhere_without_a_home(monkeypatch, tmp_path) -> None:
    """MLBENCH_CACHE, then XDG_CACHE_HOME, then ~/.cache; with no home directory at all (a container's user without
    a passwd entry or HOME: Path.home() raises) the temp folder, not a RuntimeError at import of the planner."""
    from pathlib import Path

    from mlbench.planner import cpu

    monkeypatch.setenv("MLBENCH_CACHE", str(tmp_path / "m"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert cpu._cache_file() == tmp_path / "m" / "cpu-device.json"
    monkeypatch.setenv("MLBENCH_CACHE", "")
    assert cpu._cache_file() == tmp_path / "x" / "mlbench" / "cpu-device.json"
    monkeypatch.delenv("XDG_CACHE_HOME")

    def no_home() -> Path:
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    assert cpu._cache_file().parent.name.startswith("mlbench-")


_MEASURE_SLOWLY = """
import json, sys, time
from mlbench.planner import cpu
real = json.loads(sys.argv[1])
def measure():
    with open(sys.argv[2], "a") as f:
        f.write("x")
    time.sleep(1.5)
    return real
cpu.measure = measure
print(cpu.measured() == real)
"""


def test_processes_starting_together_measure_the_cpu_once(tmp_path) -> None:
    """Test workers (or runs) starting side by side on a fresh machine each measured the CPU: 17 s of two cores
    each, slower for one another. The second waits for the first and reads its measurement."""
    import json
    import subprocess
    import sys

    from mlbench.planner import cpu

    real = cpu.cached() or cpu.measured()
    env = {**os.environ, "MLBENCH_CACHE": str(tmp_path / "cache")}
    procs = [subprocess.Popen([sys.executable, "-c", _MEASURE_SLOWLY, json.dumps(real), str(tmp_path / "count")],
                              env=env, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    assert [p.communicate(timeout=60)[0].strip() for p in procs] == ["True", "True"]
    assert (tmp_path / "count").read_text() == "x"
