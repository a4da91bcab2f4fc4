"""Helper processes: tools that need a process group of their own (megatron-core builds a model only inside one),
run as `python -m MODULE ARGS`, answering with one JSON line on stdout, or exit 2 and a one-line reason on
stderr for bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from mlbench.errors import UserError
from mlbench.launch import lifeline


class HelperFailed(Exception):
    """The helper crashed (not bad input); the message is its last stderr line."""


def run_json(module: str, *args: str, prefix: str = "") -> dict:
    """The helper's JSON answer. Exit 2: UserError with its reason (after `prefix`); other failures: HelperFailed."""
    proc = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONWARNINGS="ignore"), preexec_fn=lifeline.die_with_parent)
    last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    if proc.returncode == 2:
        raise UserError(f"{prefix}{last}")
    if proc.returncode != 0:
        raise HelperFailed(last)
    return json.loads(proc.stdout.strip().splitlines()[-1])
