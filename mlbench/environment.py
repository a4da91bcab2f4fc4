"""What a run was launched with: package versions, commit, host. Recorded with every result; the device is
what rank 0 reports (the launching host may be a login node without one)."""

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


def collect(repo: Path) -> dict:
    return {
        "packages": {p: v for p in PACKAGES if (v := _version(p))},
        "python": platform.python_version(),
        "commit": git_commit(repo),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
    }
