"""Peak dense FLOP/s per device and precision, for model FLOPs utilisation (MFU).

MFU = achieved model FLOP/s per device / the device's peak *dense* FLOP/s at the precision the matmuls run
in (not the 2:4-sparse figure datasheets headline). A device or precision not in the table gets no MFU rather
than a guessed one; on CPU, MFU is not defined.
"""

from __future__ import annotations

# (name fragment as torch.cuda.get_device_name reports it, precision) -> dense TFLOP/s. Sources: NVIDIA H100
# datasheet (SXM: 989.4 bf16 dense, PCIe: 756.5), H200 datasheet (989.4, same compute as H100 SXM), A100
# datasheet (312 bf16 dense), B200/GB200 DGX/HGX datasheets (2,250 / 2,500 bf16 dense per GPU). TF32 for fp32.
PEAK_TFLOPS: dict[tuple[str, str], float] = {
    ("H100 PCIe", "bf16"): 756.5,
    ("H100 PCIe", "fp32"): 378.0,
    ("H100", "bf16"): 989.4,
    ("H100", "fp32"): 494.7,
    ("H200", "bf16"): 989.4,
    ("H200", "fp32"): 494.7,
    ("A100", "bf16"): 312.0,
    ("A100", "fp32"): 156.0,
    ("GB200", "bf16"): 2500.0,
    ("B200", "bf16"): 2250.0,
}


def peak_tflops(device_name: str, precision: str) -> float | None:
    """The peak for this device, matching the most specific name fragment first; None if unknown."""
    for (fragment, prec), peak in sorted(PEAK_TFLOPS.items(), key=lambda kv: -len(kv[0][0])):
        if fragment in device_name and prec == precision:
            return peak
    return None


def mfu_note(device_type: str, device_name: str, precision: str) -> str:
    if device_type != "cuda":
        return "MFU is not defined on CPU (no peak FLOP/s to compare against)"
    peak = peak_tflops(device_name, precision)
    if peak is None:
        return f"no peak FLOP/s known for {device_name!r} at {precision}: MFU not reported"
    return f"MFU against {peak} dense {precision} TFLOP/s per device ({device_name})"
