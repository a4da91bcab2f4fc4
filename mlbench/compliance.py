"""Compliance verdicts from the official checker (`python -m mlperf_logging.compliance_checker`).

Run as a subprocess in a scratch folder: the checker keeps module-level state between files and appends
to `compliance_checker.log` in its working directory.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

SMOKE_RULES = Path(str(resources.files("mlbench") / "rules" / "smoke.yaml"))


@dataclass
class Verdict:
    path: Path
    ok: bool
    rules: str  # "smoke rules" or "training <ruleset> rules"
    messages: list[str]


def check(path: Path, ruleset: str, smoke: bool) -> Verdict:
    with tempfile.TemporaryDirectory() as scratch:
        cmd = [sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage", "training",
               "--ruleset", ruleset, str(Path(path).resolve()), "--log_output", f"{scratch}/checker.log"]
        if smoke:
            cmd += ["--config", str(SMOKE_RULES)]
        proc = subprocess.run(cmd, cwd=scratch, capture_output=True, text=True)
    lines = (proc.stdout + proc.stderr).splitlines()
    messages = [ln for ln in lines if ln.startswith(("ERROR", "WARNING")) and "FAILED" not in ln]
    return Verdict(path=Path(path), ok=proc.returncode == 0, messages=messages,
                   rules="smoke rules" if smoke else f"training {ruleset} rules")
