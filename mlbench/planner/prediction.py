"""The run record's `prediction`: the planner's step time and time-to-train for the run's own layout, global batch
and device, so that `mlbench compare` can set it beside what the run measured."""

from __future__ import annotations

from mlbench.layout import Layout
from mlbench.spec import Benchmark


def _device(checked: str, rank0: dict | None):
    """The device the run trained on, as rank 0 found it: the CPU (measured once and cached, mlbench.planner.cpu)
    or the datasheet GPU its name matches, else the one the memory plan was checked against (--device, or the GPU
    found here) for a GPU of another name. A CPU run with --device h100 was predicted for an H100 and compared
    with its CPU steps ('predicted / measured 0.00'). None with the reason otherwise."""
    from mlbench.planner import devices

    if not rank0:
        return None, "no rank started, so the device is unknown"
    if rank0.get("type") == "cpu":
        from mlbench.planner import cpu

        if cpu.cached() is None:  # a run does not spend the measurement's time after its training: plan does it once
            return None, ("this CPU is not measured yet: `mlbench plan BENCH --tiny --device cpu` measures it once "
                          "(about 20 s) for the runs after it")
        return devices.get("cpu"), ""
    found = devices.find(str(rank0.get("name", "")))
    if found is None and checked in devices.names() and checked != "cpu":
        found = devices.get(checked)
    return found, "" if found else f"no datasheet device matches {rank0.get('name')!r} (planner/devices.yaml)"


def for_run(bench: Benchmark, layout: Layout, checked_device: str, rank0_device: dict | None) -> dict:
    """{device, step_time_s, time_to_train_min, step_terms_s, tokens_per_s_per_device}, or device None and the
    reason where there is no prediction. Never raises: a run's record is written whatever the planner says."""
    try:
        from mlbench.planner import plan

        device, reason = _device(checked_device, rank0_device)
        if device is None:
            return {"device": None, "step_time_s": None, "time_to_train_min": None, "reason": reason}
        r = plan.evaluate(bench, layout, device)
    except Exception as e:  # noqa: BLE001 - the record says why instead of losing the run
        return {"device": None, "step_time_s": None, "time_to_train_min": None,
                "reason": f"{type(e).__name__}: {e}"[:300]}
    out = {"device": r["device"], "step_time_s": r["step_time_s"], "time_to_train_min": r["time_to_train_min"],
           "step_terms_s": r["step_terms_s"], "tokens_per_s_per_device": r["tokens_per_s_per_device"]}
    if note := "; ".join(n for n in (software_note(rank0_device), launch_note(rank0_device, r["step_time_s"])) if n):
        out["note"] = note
    return out


def software_note(rank0: dict | None) -> str:
    """What the prediction does not model for a GPU run: the planner's efficiencies are fitted on published runs,
    all on Transformer Engine; mlbench's path without it measured slower than predicted (docs/gpu.md: 1.02B llama,
    bf16, on an H100 0.950-1.227 s against 0.602-0.798 predicted; on an H200 0.902 and 1.198 s against 0.521
    and 0.692)."""
    if not rank0 or rank0.get("type") != "cuda" or rank0.get("attention") == "te":
        return ""
    return (f"predicted for a Transformer Engine stack, as the published runs it is fitted on; this run trained "
            f"without it ({rank0.get('attention')} attention, torch norms and Adam): on one H100 that path measured "
            f"1.5-1.7x the predicted step time, on one H200 1.7x (docs/gpu.md)")


# Below this a GPU's step is set by the host that queues its kernels, not by the kernels: the tiny variants were
# predicted 0.03-0.04 ms a step and measured 28-56 ms on an H200 (22-56 ms on an H100), eager PyTorch launching
# each of a step's thousands of kernels from Python (docs/gpu.md).
LAUNCH_BOUND_S = 0.005


def launch_note(rank0: dict | None, step_time_s: float | None) -> str:
    """Where a GPU run's predicted step is too short for its kernels, not its host, to set it."""
    if not rank0 or rank0.get("type") != "cuda" or step_time_s is None or step_time_s >= LAUNCH_BOUND_S:
        return ""
    return (f"a step predicted at {step_time_s * 1e3:.2g} ms is launch-bound on a GPU: the host's queuing of "
            f"kernels, which the planner does not model, sets it (tiny variants measured 28-56 ms a step on one H200)")
