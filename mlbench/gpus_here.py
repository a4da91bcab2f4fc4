"""This machine's GPUs as nvidia-smi sees them now: which ones a node's ranks take, their free memory, and the
processes that hold it. Asked without importing torch (the CLI never initialises CUDA: the ranks are forked)."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuMemory:
    index: int  # nvidia-smi's
    uuid: str
    total_bytes: float
    used_bytes: float

    @property
    def free_bytes(self) -> float:
        return self.total_bytes - self.used_bytes


def smi(query: str) -> list[list[str]] | None:
    """nvidia-smi's CSV rows for QUERY (`--query-gpu=...`), each split on commas; None where it cannot say."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        proc = subprocess.run([smi, query, "--format=csv,noheader,nounits"], capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    return [[f.strip() for f in line.split(",")] for line in proc.stdout.splitlines() if line.strip()]


def taken(nproc_per_node: int) -> list[GpuMemory] | None:
    """The GPUs a node's NPROC_PER_NODE ranks take (rank i: the i-th visible GPU, CUDA_VISIBLE_DEVICES given as
    indices or UUIDs), as nvidia-smi reports their memory now; None where that cannot be told (no nvidia-smi, a
    field it does not report, MIG instances, a visible list it does not name)."""
    rows = smi("--query-gpu=index,uuid,memory.total,memory.used")
    if not rows:
        return None
    try:
        gpus = [GpuMemory(int(r[0]), r[1], float(r[2]) * 2**20, float(r[3]) * 2**20) for r in rows if len(r) == 4]
    except ValueError:  # '[N/A]' (MIG, some drivers)
        return None
    if len(gpus) != len(rows):
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return gpus[:nproc_per_node]
    chosen: list[GpuMemory] = []
    for entry in [v.strip() for v in visible.split(",") if v.strip()][:nproc_per_node]:
        match = [g for g in gpus if (str(g.index) == entry if entry.isdigit() else g.uuid.startswith(entry))]
        if len(match) != 1:  # (MIG-..., or an entry torch would resolve otherwise): not told
            return None
        chosen.append(match[0])
    return chosen


def holders(gpu: GpuMemory) -> list[tuple[str, float]]:
    """The processes that hold memory on GPU, (pid, bytes), largest first, as nvidia-smi lists them (a container
    may show none of another's)."""
    rows = smi("--query-compute-apps=pid,used_memory,gpu_uuid") or []
    found = []
    for r in rows:
        if len(r) == 3 and r[2] == gpu.uuid:
            try:
                found.append((r[0], float(r[1]) * 2**20))
            except ValueError:
                continue
    return sorted(found, key=lambda p: -p[1])
