"""The console every command prints through. On a terminal, rich's own width; elsewhere (CI logs, `| tee`, SLURM
output files) rich would wrap at 80 columns, cutting progress lines mid-word and squeezing tables, so lines are
printed whole and tables get room."""

from __future__ import annotations

import os
import shutil

from rich.console import Console

WIDTH_WITHOUT_TERMINAL = 170


def console(**kwargs) -> Console:
    """A set COLUMNS is the user's width, terminal or not; COLUMNS=0 is no width (rich would print every line at
    width 0: nothing at all), so the terminal's, or 170 without one."""
    columns = os.environ.get("COLUMNS", "")
    width = int(columns) if columns.isdigit() and int(columns) > 0 else None
    c = Console(**kwargs)
    if c.is_terminal:
        return c if c.width > 0 else Console(width=shutil.get_terminal_size().columns, **kwargs)
    return Console(width=width or WIDTH_WITHOUT_TERMINAL, soft_wrap=True, **kwargs)
