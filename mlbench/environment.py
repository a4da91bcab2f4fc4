"""What a run ran on: package versions, commit, host, device. Recorded with every result."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
from importlib import metadata
from pathlib import Path

PACKAGES = ("mlbench-ttt", "torch", "megatron-core", "mlperf-logging", "numpy", "transformer-engine")


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def git_commit(path: Path) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    dirty = subprocess.run(["git", "-C", str(path), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, timeout=5).stdout.strip()
    return out.stdout.strip() + ("-dirty" if dirty else "")


def device() -> dict:
    import torch

    if torch.cuda.is_available():
        return {"type": "cuda", "name": torch.cuda.get_device_name(0), "count": torch.cuda.device_count()}
    return {"type": "cpu", "name": platform.processor() or platform.machine(), "count": os.cpu_count()}


def collect(repo: Path) -> dict:
    return {
        "packages": {p: v for p in PACKAGES if (v := _version(p))},
        "python": platform.python_version(),
        "commit": git_commit(repo),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "device": device(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
    }
