"""`mlbench check`: which rules a result file is judged by, and the official checker's verdict on each."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from rich.console import Console

from mlbench import compliance, registry
from mlbench.errors import UserError
from mlbench.mlperf_log import read


def _result_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    files = sorted(path.rglob("result_*.txt"))
    if not files:
        raise UserError(f"{path}: no result_*.txt files here (a result file, or a folder of them)")
    return files


def rules_for(path: Path, events: list[dict], ruleset: str | None, rules: str) -> tuple[str, bool]:
    """(ruleset, smoke) for a result file: smoke rules for tiny runs, as their run record says."""
    benchmark = next((e.get("value") for e in events if e.get("key") == "submission_benchmark"), None)
    record = path.with_suffix(".json")
    tiny = False
    if record.exists():
        with contextlib.suppress(json.JSONDecodeError):
            tiny = json.loads(record.read_text()).get("variant") == "tiny"
    smoke = rules == "smoke" or (rules == "auto" and tiny)
    if ruleset is None:
        if benchmark not in registry.names():
            raise UserError(f"{path}: cannot tell the ruleset (benchmark {benchmark!r} is not one of "
                            f"{', '.join(registry.names())}); pass --ruleset")
        ruleset = registry.load(benchmark).mlperf.ruleset
    return ruleset, smoke


def check_paths(path: Path, ruleset: str | None, rules: str, console: Console) -> bool:
    all_ok = True
    for f in _result_files(path):
        events = read(f)
        rs, smoke = rules_for(f, events, ruleset, rules)
        v = compliance.check(f, rs, smoke)
        all_ok &= v.ok
        mark = "[green]PASS[/green]" if v.ok else "[red]FAIL[/red]"
        console.print(f"{mark} {f} ({v.rules})", highlight=False)
        for m in v.messages[:20]:
            console.print(f"    {m}", highlight=False)
        if events and events[-1].get("key") == "run_start":
            hp = [m for m in v.messages if "CHECK for" in m]
            console.print(f"    note: a dry-run log (it ends at run_start), so the run's own events are missing; "
                          f"{'no hyperparameter line failed' if not hp else f'{len(hp)} lines failed their rules'}",
                          highlight=False)
    return all_ok
