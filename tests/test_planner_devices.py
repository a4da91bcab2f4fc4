"""Device facts: one table for the planner and MFU, datasheet figures, bad names refused."""

from __future__ import annotations

import pytest

from mlbench import hardware
from mlbench.errors import UserError
from mlbench.planner import devices


def test_every_device_has_its_facts_and_a_source() -> None:
    for name in ("a100", "h100", "h200", "b200", "gb200", "gb300"):
        d = devices.get(name)
        assert d.source and d.memory_bytes > 0 and d.hbm_bytes_per_s > 0 and d.scaleout_bytes_per_s > 0
        assert d.peak_flops("bf16") > 0
    # datasheet figures (dense = sparse / 2)
    assert devices.get("h100").peak_flops("fp8") == 1978.9e12
    assert devices.get("H200").memory_bytes == 141e9
    assert devices.get("gb200").nvlink_domain == 72 and devices.get("h100").nvlink_domain == 8
    assert devices.get("gb300").peak_flops("nvfp4") == 15e15


def test_missing_precision_and_unknown_device_are_bad_input() -> None:
    with pytest.raises(UserError, match="a100 has no fp8.*bf16"):
        devices.get("a100").peak_flops("fp8")
    with pytest.raises(UserError, match="h100 has no nvfp4"):
        devices.get("h100").peak_flops("nvfp4")
    with pytest.raises(UserError, match="unknown device 'tpu'.*a100, h100_pcie, h100"):
        devices.get("tpu")
    with pytest.raises(UserError, match=r"^unknown device 'xxxxxxxxxxxx'\.\.\. \(5000 characters\); known"):
        devices.get("x" * 5000)  # (quoted whole, the name filled the screen)


def test_mfu_peaks_come_from_the_device_table() -> None:
    assert hardware.peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == devices.get("h100").peak_flops("bf16") / 1e12
    assert hardware.peak_tflops("NVIDIA GB200", "bf16") == 2500.0  # not B200's 2,250: the longer fragment wins
    assert hardware.peak_tflops("NVIDIA A100-SXM4-80GB", "fp8") is None
