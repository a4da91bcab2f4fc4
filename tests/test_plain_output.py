"""Output without a terminal (CI logs, `| tee`, SLURM output files) is plain full lines: a progress line is never
split at 80 columns, mid-word. The CLI's own console, in a process whose stdout is a pipe and no COLUMNS set."""

from __future__ import annotations

import os
import subprocess
import sys

SHOW_PROGRESS = """
import sys
from mlbench.cli import console
from mlbench.progress import Progress

with Progress("gpt3 (tiny) run 1/1, seed 3", console) as p:
    p.on_events([{"event": "start", "budget": 300, "target": 1.04, "metric": "log_perplexity", "direction": "min"},
                 {"event": "step", "step": 120, "loss": 1.0569, "tokens_per_s": 27362, "tflops_per_device": 0.01},
                 {"event": "eval", "step": 120, "value": 1.0368}])
console.print("target reached: log_perplexity 1.0368 (target <= 1.04); time-to-train 7.4 s (0.124 min); "
              "compliance (ok); /a/long/results/path/ci/gpt3/result_0.txt")
"""


def test_progress_lines_are_not_wrapped_without_a_terminal() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "FORCE_COLOR", "TTY_COMPATIBLE")}
    out = subprocess.run([sys.executable, "-c", SHOW_PROGRESS], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines == [
        "step 120/300  loss 1.0569  27,362 tokens/s  eval log_perplexity 1.0368 (target <= 1.04)",
        "target reached: log_perplexity 1.0368 (target <= 1.04); time-to-train 7.4 s (0.124 min); compliance (ok); "
        "/a/long/results/path/ci/gpt3/result_0.txt",
    ], out.stdout


def test_output_nobody_reads_is_dropped_and_the_command_goes_on() -> None:
    """stdout a pipe whose reader is gone (`| head` that has ended; a closed terminal likewise fails with EIO):
    every write fails, yet the command goes on to its end, exit 0 and no traceback (a run would publish its
    result; it died before in rich's first write)."""
    read, write = os.pipe()
    os.close(read)
    try:
        out = subprocess.run([sys.executable, "-c", SHOW_PROGRESS + "\nprint('done', file=sys.stderr)"],
                             stdout=write, stderr=subprocess.PIPE, text=True, timeout=60,
                             env=dict(os.environ, COLUMNS="100"))
    finally:
        os.close(write)
    assert out.returncode == 0 and out.stderr.strip().splitlines()[-1] == "done", out.stderr
    assert "Traceback" not in out.stderr and "BrokenPipe" not in out.stderr, out.stderr


WIDE_TABLE = """
from rich.table import Table
from mlbench.cli import console

t = Table(title="wide")
for i in range(3):
    t.add_column(f"column {i}")
t.add_row(*(f"a cell of {n} characters ".ljust(n, "x") for n in (90, 60, 70)))
console.print(t)
"""


def test_tables_without_a_terminal_take_their_natural_width_whatever_columns_says() -> None:
    """Capped at 170 columns without a terminal (a cell split over two lines), and at COLUMNS where set: COLUMNS=5
    printed a table of empty cells. A log or a file has no width to fit."""
    for columns in (None, "5", "80"):
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "FORCE_COLOR", "TTY_COMPATIBLE")}
        env.update({"COLUMNS": columns} if columns else {})
        out = subprocess.run([sys.executable, "-c", WIDE_TABLE], capture_output=True, text=True, env=env, timeout=60)
        assert out.returncode == 0, out.stderr
        row = [ln for ln in out.stdout.splitlines() if "a cell of" in ln]
        assert len(row) == 1 and all(f"a cell of {n} characters ".ljust(n, "x") in row[0] for n in (90, 60, 70)), \
            (columns, out.stdout)


def test_force_color_or_tty_compatible_without_a_terminal_still_prints_plain_full_lines() -> None:
    """CI sets FORCE_COLOR (or TTY_COMPATIBLE=1) for colour; rich took either for a terminal: tables and lines
    wrapped at 80 columns, and a run's live panel drew its redraws (cursor moves) into the log instead of lines."""
    for var in ("FORCE_COLOR", "TTY_COMPATIBLE"):
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "FORCE_COLOR", "TTY_COMPATIBLE")}
        env[var] = "1"
        out = subprocess.run([sys.executable, "-c", SHOW_PROGRESS + WIDE_TABLE], capture_output=True, text=True,
                             env=env, timeout=60)
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        assert "\x1b" not in out.stdout and lines[0].startswith("step 120/300  loss 1.0569"), (var, out.stdout)
        assert lines[1].endswith("/a/long/results/path/ci/gpt3/result_0.txt"), (var, out.stdout)
        row = [ln for ln in lines if "a cell of" in ln]
        assert len(row) == 1 and "a cell of 90 characters ".ljust(90, "x") in row[0], (var, out.stdout)


def _commands() -> list[tuple[str, ...]]:
    from mlbench.cli import cli

    return [(), *((name,) for name in sorted(cli.commands))]


def test_every_help_fits_80_columns_and_names_no_path_outside_the_project(cli) -> None:
    """Every command's --help, piped (no COLUMNS) or in a wide terminal, is lines of at most 80 columns that name
    no path outside the project (../shared, a home or /tmp folder), and the docs/ pages they point to exist. The
    Markdown options say what they write beside the report: scaling's said only 'Write a Markdown report.', while
    it writes its plots into <name>_files/ as compare's does."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    for command in _commands():
        for columns in (None, "200"):
            out = cli(*command, "--help", env={"COLUMNS": columns})
            assert out.returncode == 0, out.stderr
            assert out.stdout.startswith("Usage: mlbench"), out.stdout
            wide = [ln for ln in out.stdout.splitlines() if len(ln) > 80]
            assert not wide, (command, wide)
            for outside in ("../", "shared/", "/work", "/tmp", "/home", "~/"):
                assert outside not in out.stdout, (command, outside)
            text = " ".join(out.stdout.split())
            for page in {w.strip(".,;:()") for w in text.split() if w.startswith("docs/")}:
                assert (root / page).is_file(), (command, page)
    for command in ("compare", "scaling"):
        text = " ".join(cli(command, "--help").stdout.split())
        assert "--md PATH Write a Markdown report (plots beside it)." in text, text
