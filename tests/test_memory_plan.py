"""The per-GPU memory plan (mlbench/planner/memory.py) against reality: every published gpt3 and llama31_405b run
with a layout ran on its device, so the plan with that submission's settings must fit; the 405B at NVIDIA's
64 x 8 H100 layout without the distributed optimizer, and at TP1 x PP1 on 8 GPUs, must not. (Against megatron's
real tensors on CPU: tests/test_features_memory.py.)"""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

import pytest

from mlbench import registry
from mlbench.layout import resolve
from mlbench.planner import devices
from mlbench.planner.memory import estimate

CSV = Path(__file__).resolve().parents[2] / "shared" / "data" / "published-runs.csv"
# NVIDIA's GPT-3 and Llama 3.1 405B configs: distributed optimizer, sequence parallel and both overlaps on,
# recompute off; under FP8 parameters gathered in FP8 and gradients reduced in bf16.
NVIDIA = dict(distributed_optimizer=True, overlap_grad_reduce=True, overlap_param_gather=True,
              grad_reduce_in_fp32=False)
DEVICE = {"H100": "h100", "H200": "h200", "B200": "b200", "GB200": "gb200", "GB300": "gb300"}


def _published() -> list[dict]:
    if not CSV.exists():
        pytest.skip(f"{CSV} is not here (the shared data set)")
    rows = []
    for r in csv.DictReader(CSV.open()):
        name = next((n for n in ("gpt3", "llama31_405b") if f"MLPerf {n}" in r["model"]), None)
        if name and r["tp"] and r["pp"]:
            rows.append(r | {"bench": name})
    return rows


def _device(gpu_type: str) -> str:
    return next(v for k, v in sorted(DEVICE.items(), key=lambda kv: -len(kv[0])) if k in gpu_type)


def test_every_published_layout_fits_its_device() -> None:
    checked, unresolved = 0, []
    for r in _published():
        bench = registry.load(r["bench"])
        device = devices.get(_device(r["gpu_type"]))
        per_node = 4 if r["gpu_type"].startswith("GB") else 8
        precision = "fp8" if any(p in r["precision"] for p in ("fp8", "fp4")) else "bf16"
        tp = int(r["tp"])
        try:
            layout = resolve(bench, int(r["num_gpus"]) // per_node, per_node, tp=tp, pp=int(r["pp"]),
                             vp=int(r["vp"] or 1), cp=int(r["cp"] or 1), micro_batch_size=int(r["micro_batch"]),
                             global_batch_size=int(r["global_batch"]), precision=precision,
                             # NVIDIA's llama configs: ASYM_PP_EMBED and ASYM_PP_LOSS, at any device count
                             asymmetric_split=True if r["bench"] == "llama31_405b" else None,
                             features=NVIDIA | {"sequence_parallel": tp > 1, "fp8_param_gather": precision == "fp8"})
        except Exception as e:  # noqa: BLE001 - a layout the resolver refuses is listed, not hidden
            unresolved.append((r["gpu_type"], r["num_gpus"], str(e)[:80]))
            continue
        plan = estimate(bench, layout)
        assert plan.fits(device.memory_bytes), (r["bench"], r["gpu_type"], r["num_gpus"], plan.as_dict())
        checked += 1
    assert checked >= 20 and not unresolved, (checked, unresolved)


def _llama_64x8(**features) -> tuple:
    bench = registry.load("llama31_405b")
    layout = resolve(bench, 64, 8, precision="fp8",
                     features=NVIDIA | {"sequence_parallel": True, "fp8_param_gather": True} | features)
    return bench, layout


def test_llama_405b_fits_only_with_the_distributed_optimizer() -> None:
    h100 = devices.get("h100").memory_bytes
    bench, layout = _llama_64x8()
    assert (layout.tp, layout.pp, layout.vp, layout.cp) == (8, 8, 8, 2)
    fits = estimate(bench, layout)
    assert fits.fits(h100)
    _, plain = _llama_64x8(distributed_optimizer=False, overlap_param_gather=False)
    without = estimate(bench, plain)
    assert not without.fits(h100) and without.largest_term() in ("optimizer", "activations")
    # the distributed optimizer shards Adam's state (and fp32 master weights) over dp x cp = 8
    assert without.optimizer_bytes == pytest.approx(8 * fits.optimizer_bytes, rel=0.01)
    # FP8 parameters and bf16 gradient reduction are what bring the 405B under 80 GB
    _, wide = _llama_64x8(fp8_param_gather=False, grad_reduce_in_fp32=True)
    assert estimate(bench, wide).total_bytes - fits.total_bytes == pytest.approx(3 * fits.params_bytes, rel=0.01)


def test_llama_405b_without_model_parallelism_does_not_fit() -> None:
    bench = registry.load("llama31_405b")
    layout = resolve(bench, 1, 8, tp=1, pp=1, cp=1, vp=1, global_batch_size=8, micro_batch_size=1)
    plan = estimate(bench, layout)
    assert not plan.fits(devices.get("h100").memory_bytes)
    assert plan.params_bytes == pytest.approx(2 * 402.7e9, rel=0.01)  # every bf16 weight on every GPU


def test_worst_stage_and_pipeline_in_flight() -> None:
    bench = registry.load("gpt3", tiny=True)
    layout = resolve(bench, 1, 2, pp=2)
    first, last = estimate(bench, layout, stage=0), estimate(bench, layout, stage=1)
    assert first.micro_batches_in_flight == 2 and last.micro_batches_in_flight == 1  # 1F1B: pp - stage
    assert first.activations_bytes == 2 * first.activations_per_micro_batch_bytes
    assert estimate(bench, layout).total_bytes == max(first.total_bytes, last.total_bytes)
    assert dataclasses.asdict(first)["stage"] == 0 and first.as_dict()["total_bytes"] == first.total_bytes


def test_dry_run_prints_the_plan_and_a_run_that_does_not_fit_is_refused(tmp_path: Path, cli) -> None:

    results = tmp_path / "results"
    args = ("run", "llama31_405b", "--dry-run", "--nodes", "64", "--nproc-per-node", "8", "--device", "h100",
            "--results", str(results))
    ok = cli(*args, "--precision", "fp8")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "memory per GPU (worst pipeline stage" in ok.stdout and "fits h100" in ok.stdout
    # plan says the same bytes in the same unit (it said GB: 80.0 GB for the H100's 74.5 GiB)
    total = ok.stdout.split("= ")[-1].split(";")[0]
    planned = cli("plan", "llama31_405b", "--device", "h100", "--nodes", "64", "--nproc-per-node", "8",
                      "--tp", "8", "--pp", "8", "--precision", "fp8")
    assert planned.returncode == 0 and "fits in 74.5 GiB" in planned.stdout, planned.stdout
    assert " GB" not in planned.stdout.replace("GB/s", "") and total.endswith("GiB"), (total, planned.stdout)
    refused = cli(*args, "--no-distributed-optimizer", "--no-overlap-param-gather")
    assert refused.returncode == 2 and refused.stdout == "", refused.stdout
    assert "the largest term is optimizer" in refused.stderr and "--distributed-optimizer" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    unknown = cli(*args[:-2], "--device", "tpu", "--results", str(tmp_path / "other"))
    assert unknown.returncode == 2 and "unknown device 'tpu'" in unknown.stderr
    assert not (tmp_path / "other").exists()


def test_a_gpus_plan_holds_its_allowance_whatever_the_precision(tmp_path: Path, cli) -> None:
    """`plan gpt3 --device h100 --precision fp32` (TF32) took fp32 for the CPU: its kernels, and none of the 3 GiB
    a GPU holds (CUDA context, NCCL buffers, fragmentation) that the bf16 plan of the same layout counted; `run
    --tiny --device h100` (fp32) was planned the same way. The device says it; a CPU run's plan holds none."""
    from mlbench.planner import plan as planner
    from mlbench.planner.memory import GPU_WORKSPACE_BYTES, THIS_CPU

    bench = registry.load("gpt3")
    layout = resolve(bench, 64, 8, 8, 8, 1, 1, 1, 1536)
    plans = {p: planner.evaluate(bench, dataclasses.replace(layout, precision=p), devices.get("h100"))["memory"]
             for p in ("bf16", "fp32")}
    assert plans["fp32"]["other_bytes"] == plans["bf16"]["other_bytes"] >= GPU_WORKSPACE_BYTES, plans
    assert plans["fp32"]["activations_bytes"] == 2 * plans["bf16"]["activations_bytes"], plans  # the same kernels
    on_cpu = estimate(bench, dataclasses.replace(layout, precision="fp32"), on_cpu=True)
    assert on_cpu.other_bytes < GPU_WORKSPACE_BYTES
    tiny = cli("run", "gpt3", "--tiny", "--device", "h100", "--dry-run", "--results", str(tmp_path / "r"))
    assert tiny.returncode == 0 and "other 3.00 GiB" in tiny.stdout, tiny.stdout + tiny.stderr
    from mlbench.preflight import MemoryDevice, check_memory

    tiny_layout = resolve(registry.load("gpt3", tiny=True), 1, 1, 1, 1, 1, 1, 1, None)
    check_memory(registry.load("gpt3", tiny=True), tiny_layout, MemoryDevice(THIS_CPU, 2**30))  # 1 GiB: it fits


def test_a_gpu_here_without_transformer_engine_is_planned_with_the_kernels_its_ranks_run(monkeypatch) -> None:
    """A run on this machine's GPU without Transformer Engine builds local specs (sdpa), where BERT and gpt_oss keep
    megatron's local attention and its s x s probabilities (measured on an H100 and an H200, docs/gpu.md); the
    check before launch planned Transformer Engine's kernels, so full BERT at --mbs 88 passed an H100 that its
    ranks' 95 GiB would not fit. Now a GPU here is planned with the specs its ranks build; a GPU elsewhere (a
    --device with no GPU here, a dry run) with the published stack's. (A stand-in for the GPU: none here.)"""
    from mlbench import preflight
    from mlbench.errors import UserError
    from mlbench.preflight import DeviceFacts, MemoryDevice, check_memory

    bench = registry.load("bert")
    layout = dataclasses.replace(resolve(bench, 1, 1, 1, 1, 1, 1, 88, 88))
    h100 = devices.get("h100")
    check_memory(bench, layout, MemoryDevice(h100.name, h100.memory_bytes))  # te: 57 GiB, it fits
    with pytest.raises(UserError, match=r"bert at this layout needs 9\d\.\d GiB .* the largest term is activations"):
        check_memory(bench, layout, MemoryDevice(h100.name, h100.memory_bytes, attention="sdpa"))
    monkeypatch.setattr(preflight, "_importable", lambda module: False)
    here = DeviceFacts(name="NVIDIA H100 80GB HBM3", gpu=True, fp8=True, count=1)
    req = preflight.RunRequest(name="bert")
    assert preflight.memory_device(req, here, None).attention == "sdpa"
    assert preflight.memory_device(dataclasses.replace(req, device="h100"), here, None).attention == "sdpa"
    assert preflight.memory_device(dataclasses.replace(req, device="h100"), None, None).attention is None
    monkeypatch.setattr(preflight, "_importable", lambda module: True)
    assert preflight.memory_device(req, here, None).attention == "te"


def test_the_asymmetric_split_at_any_layout(tmp_path: Path, cli) -> None:
    """448 GPUs at TP4 x PP8 x VP8 x CP2 (DGX B200's llama layout) has no reference layout: 126 layers do not divide
    by 64, but 126 + embedding + loss do, with --asymmetric-pipeline-split."""

    args = ("run", "llama31_405b", "--dry-run", "--nodes", "56", "--nproc-per-node", "8", "--tp", "4", "--pp", "8",
            "--vp", "8", "--cp", "2", "--gbs", "896", "--results", str(tmp_path))
    refused = cli(*args)
    assert refused.returncode == 2 and "126 layers" in refused.stderr
    ok = cli(*args, "--asymmetric-pipeline-split")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    layout = resolve(registry.load("llama31_405b"), 56, 8, tp=4, pp=8, vp=8, cp=2, global_batch_size=896,
                     asymmetric_split=True)
    assert layout.account_for_embedding_in_pipeline_split and layout.account_for_loss_in_pipeline_split
    # the first and last stages hold one transformer layer less than the others (embedding and loss in their place)
    mem = [estimate(registry.load("llama31_405b"), layout, stage=s) for s in (0, 1, 7)]
    assert mem[0].params_bytes < mem[1].params_bytes


def test_distributed_optimizer_keeps_no_state_for_padding() -> None:
    """Tiny gpt_oss (its q/k norms and biases are not multiples of 64, so megatron leaves gaps inside the buffer):
    rank 0 at DP2 with the distributed optimizer measured 757,504 optimizer bytes and 758,272 parameter bytes on
    megatron's real tensors (tests/test_features_memory.py's script, gpt_oss_20b tiny, 2 gloo processes). Adam's
    state covers the parameters in the shard, not the gaps: numel / dp would say 758,272."""
    bench = registry.load("gpt_oss_20b", tiny=True)
    for ep in (1, 2):
        plan = estimate(bench, resolve(bench, 1, 2, ep=ep, features={"distributed_optimizer": True}))
        assert plan.optimizer_bytes == 757_504, ep
    assert estimate(bench, resolve(bench, 1, 2, features={"distributed_optimizer": True})).params_bytes == 758_272


def test_moe_routing_and_dispatch_terms() -> None:
    """Tiny gpt_oss (4 experts, top-2, micro-batch 8 x 64 tokens, hidden 64, expert ffn 96, fp32): the experts
    save each routed token copy (512 tokens x 2) with its input (64) and the glu's six ffn-wide tensors; the
    all-to-all's send and receive buffers (512 x 2 x 64 fp32 each) are in `other` only where expert parallelism
    sends them (megatron bypasses the all-to-all at one rank). Measured against real runs:
    tests/test_features_memory.py."""
    bench = registry.load("gpt_oss_20b", tiny=True)
    one = estimate(bench, resolve(bench, 1, 1, precision="fp32"))
    ep2 = estimate(bench, resolve(bench, 1, 2, ep=2, precision="fp32"))
    dense = dataclasses.replace(bench, model=dataclasses.replace(bench.model, num_experts=0, moe_router_topk=0))
    dense_one = estimate(dense, resolve(dense, 1, 1, precision="fp32"))
    experts = 2 * (512 * 2 * (64 + 6 * 96) * 4 + 4 * (512 * 2 + 4 * 512 + 1024) + 8 * 2 * 512 * 2 + 4 * 512)
    dense_mlp = 2 * 512 * 5 * 96 * 4  # fc1 (2 x ffn), silu, x_linear + offset, fc2's input
    assert one.activations_per_micro_batch_bytes - dense_one.activations_per_micro_batch_bytes == experts - dense_mlp
    assert ep2.activations_per_micro_batch_bytes == one.activations_per_micro_batch_bytes  # balanced on average
    assert ep2.other_bytes - one.other_bytes == 2 * 512 * 2 * 64 * 4
