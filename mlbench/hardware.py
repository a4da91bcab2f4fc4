"""Peak dense FLOP/s per device and precision, for model FLOPs utilisation (MFU).

MFU = achieved model FLOP/s per device / the device's peak *dense* FLOP/s at the precision the matmuls run
in (not the 2:4-sparse figure datasheets headline). The figures are the planner's device data
(`mlbench/planner/devices.yaml`, each cited): one source of device facts. A device or precision not there gets
no MFU rather than a guessed one; on CPU, MFU is not defined.
"""

from __future__ import annotations

from mlbench.planner import devices


def peak_tflops(device_name: str, precision: str) -> float | None:
    """The peak for a torch device name (the most specific known fragment wins); None if unknown."""
    device = devices.find(device_name)
    if device is None or precision not in device.peaks:
        return None
    return device.peaks[precision] / 1e12


def mfu_note(device_type: str, device_name: str, precision: str) -> str:
    if device_type != "cuda":
        return "MFU is not defined on CPU (no peak FLOP/s to compare against)"
    peak = peak_tflops(device_name, precision)
    if peak is None:
        return f"no peak FLOP/s known for {device_name!r} at {precision}: MFU not reported"
    return f"MFU against {peak:g} dense {precision} TFLOP/s per device ({device_name})"
