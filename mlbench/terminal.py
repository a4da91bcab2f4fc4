"""The console every command prints through. On a terminal, rich's own width; elsewhere (CI logs, `| tee`, SLURM
output files) rich would wrap at 80 columns, cutting progress lines mid-word and squeezing tables, so lines are
printed whole and tables get room."""

from __future__ import annotations

import os

from rich.console import Console

WIDTH_WITHOUT_TERMINAL = 170


def console(**kwargs) -> Console:
    """A set COLUMNS is the user's width, terminal or not."""
    c = Console(**kwargs)
    if c.is_terminal:
        return c
    width = None if os.environ.get("COLUMNS", "").isdigit() else WIDTH_WITHOUT_TERMINAL
    return Console(width=width, soft_wrap=True, **kwargs)
