"""Device facts (peak dense FLOP/s per precision, HBM, NVLink, scale-out), one source for the planner and MFU.

The figures live in `devices.yaml`, each with the datasheet and section it comes from. The CPU is a device too:
its figures are measured on this machine once and cached (`mlbench.planner.cpu`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from mlbench.cli_numbers import shown
from mlbench.errors import UserError

DATA = Path(__file__).with_name("devices.yaml")


@dataclass(frozen=True)
class Device:
    name: str  # the key in devices.yaml: a100, h100, ...
    title: str
    peaks: dict[str, float]  # precision -> dense FLOP/s per device
    memory_bytes: float
    hbm_bytes_per_s: float
    nvlink_bytes_per_s: float  # both directions together, per GPU
    nvlink_domain: int  # GPUs in one NVLink domain
    scaleout_bytes_per_s: float  # one way, per GPU
    source: str
    match: tuple[str, ...] = ()
    # CPU only: measured seconds per inter-process collective call (gloo on one host); 0 on GPUs
    collective_latency_s: float = 0.0
    extra: dict = field(default_factory=dict)

    @property
    def is_cpu(self) -> bool:
        """This machine's CPU, measured (planner.cpu): its own kernels, and no GPU's allowance in its memory plan."""
        return "measured" in self.extra

    @property
    def precisions(self) -> list[str]:
        return [p for p in ("bf16", "fp8", "nvfp4", "fp32") if p in self.peaks]

    def peak_flops(self, precision: str) -> float:
        """Dense FLOP/s at `precision`; a precision the device lacks is bad input."""
        if precision not in self.peaks:
            raise UserError(f"device {self.name} has no {precision} tensor cores ({self.title}); its precisions: "
                            f"{', '.join(self.precisions)}")
        return self.peaks[precision]


@functools.cache
def _table() -> dict[str, dict]:
    return yaml.safe_load(DATA.read_text())


def names() -> list[str]:
    return list(_table())


def _from_entry(name: str, e: dict) -> Device:
    return Device(name=name, title=e["title"], peaks={k: float(v) for k, v in e["peak_flops"].items()},
                  memory_bytes=float(e["memory_bytes"]), hbm_bytes_per_s=float(e["hbm_bytes_per_s"]),
                  nvlink_bytes_per_s=float(e["nvlink_bytes_per_s"]), nvlink_domain=int(e["nvlink_domain"]),
                  scaleout_bytes_per_s=float(e["scaleout_bits_per_s"]) / 8, source=e["source"],
                  match=tuple(e.get("match", ())))


def get(name: str) -> Device:
    """The device called `name` (case-insensitive); an unknown name is bad input naming the known ones."""
    key = name.lower()
    table = _table()
    if key not in table:
        raise UserError(f"unknown device {shown(name)}; known devices: {', '.join(table)}")
    if table[key].get("measured"):
        from mlbench.planner import cpu

        return cpu.device(_from_entry(key, table[key]))
    return _from_entry(key, table[key])


def find(device_name: str) -> Device | None:
    """The datasheet device whose `match` fragment is in a torch device name, the most specific first."""
    hits = [(len(frag), key) for key, e in _table().items() for frag in e.get("match", ()) if frag in device_name]
    return _from_entry(max(hits)[1], _table()[max(hits)[1]]) if hits else None
