"""Compliance verdicts from the official checker (`python -m mlperf_logging.compliance_checker`).

Run as a subprocess in a scratch folder: the checker keeps module-level state between files and appends
to `compliance_checker.log` in its working directory.
"""

from __future__ import annotations

import re
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


def _run_checker(path: Path, ruleset: str, *extra: str) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as scratch:
        cmd = [sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage", "training",
               "--ruleset", ruleset, str(Path(path).resolve()), "--log_output", f"{scratch}/checker.log", *extra]
        return subprocess.run(cmd, cwd=scratch, capture_output=True, text=True)


def check(path: Path, ruleset: str, smoke: bool) -> Verdict:
    proc = _run_checker(path, ruleset, *(["--config", str(SMOKE_RULES)] if smoke else []))
    lines = (proc.stdout + proc.stderr).splitlines()
    messages = [ln for ln in lines if ln.startswith(("ERROR", "WARNING")) and "FAILED" not in ln]
    return Verdict(path=Path(path), ok=proc.returncode == 0, messages=messages,
                   rules="smoke rules" if smoke else f"training {ruleset} rules")


# Events a log that stops at run_start (a dry run's) cannot have: what the checker must miss in it.
AFTER_RUN_START = {"run_stop", "train_samples", "eval_accuracy", "eval_start", "eval_stop", "block_start", "block_stop",
                   "epoch_start", "epoch_stop"}
_SEPARATOR = "-" * 30  # between the checker's messages, some of which span lines


def before_run_start(path: Path, ruleset: str) -> list[str]:
    """What the official closed rules of `ruleset` reject in a log that stops at run_start, leaving out the
    events such a log cannot have: every hyperparameter line is checked, exact float comparisons included."""
    proc = _run_checker(path, ruleset)
    lines = (proc.stdout + proc.stderr).splitlines()
    body = [ln for ln in lines if not ln.startswith(("INFO", "** Logging output", "ERROR - FAILED"))]
    messages = [m.strip() for m in "\n".join(body).replace("WARNING - ", "", 1).split(_SEPARATOR) if m.strip()]
    problems = []
    for m in messages:
        names = set(re.findall(r"'([a-z0-9_]+)'", m.splitlines()[0]))
        if not (m.startswith("Required") and names and names <= AFTER_RUN_START):
            problems.append(m)
    if proc.returncode != 0 and not messages:  # the checker itself failed: not a verdict
        problems.append(f"the compliance checker failed: {(proc.stderr or proc.stdout).strip()[-500:]}")
    return problems


def rcp_coverage(benchmark: str, ruleset: str, global_batch_size: int) -> str:
    """How the official RCP checker (mlperf_logging.rcp_checker) will judge a set of runs at this batch: against
    the RCP at this batch, one interpolated between two, the smallest (only a slower set passes), or none."""
    from mlperf_logging.rcp_checker import rcp_checker

    try:
        checker = rcp_checker.RCP_Checker("training", ruleset, benchmark, False)
    except Exception as e:  # a ruleset without RCPs for this benchmark
        return f"no RCPs for {benchmark} in training {ruleset} ({type(e).__name__})"
    # The checker's default pass drops RCPs that converge in more samples than a larger batch's ("pruned").
    used = sorted(r["BS"] for r in checker.pruned_rcp_data.values())
    if checker._find_rcp(global_batch_size, "pruned_rcps") is not None:
        return f"RCP at global batch {global_batch_size} (the checker's RCPs: {used})"
    pruned = (f" (its RCP at {global_batch_size} is pruned by the checker)"
              if any(r["BS"] == global_batch_size for r in checker.rcp_data.values()) else "")
    lo = checker._find_top_min_rcp(global_batch_size, "pruned_rcps")
    hi = checker._find_bottom_max_rcp(global_batch_size, "pruned_rcps")
    if lo is not None and hi is not None:
        return (f"scored against an RCP interpolated between global batch {lo['BS']} and {hi['BS']}{pruned}")
    if lo is not None:
        return (f"no RCP at or above global batch {global_batch_size} (largest {lo['BS']}){pruned}: the official RCP "
                f"check fails this set ('Missing RCP') until an RCP at this batch is submitted")
    return (f"below the smallest RCP, at global batch {hi['BS']}{pruned}: the official RCP check passes this set only "
            f"if it converges in no fewer samples than that RCP")


def summary(problem: str) -> str:
    """A checker message in one phrase: the key and the failed test, without the log line and context dumps."""
    lines = problem.splitlines()
    test = next((ln.strip().removeprefix("failed test:").strip() for ln in lines
                 if ln.strip().startswith("failed test:")), "")
    key = re.match(r"CHECK for '([^']+)' failed", lines[0])
    if key and test:
        return f"{key.group(1)} (needs {test})"
    return lines[0].rstrip(":")
