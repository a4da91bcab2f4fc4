"""The console every command prints through. On a terminal, rich's own width; elsewhere (CI logs, `| tee`, SLURM
output files) rich would wrap at 80 columns, cutting progress lines mid-word and squeezing tables, so lines are
printed whole and tables get room."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys

from rich.console import Console

WIDTH_WITHOUT_TERMINAL = 170


class _Stdout:
    """sys.stdout (whichever it is at the time of each write) that outlives its reader: a terminal that closed
    (an SSH session that dropped: EIO) or a pipe whose reader left (`| head`: EPIPE). Output is what a run
    matters least for: it goes on to its end, its log and result published, and what it would have printed is
    dropped (stdout pointed at /dev/null, so the interpreter's last flush cannot fail either)."""

    lost = False

    def write(self, text: str) -> int:
        if not _Stdout.lost:
            try:
                return sys.stdout.write(text)
            except OSError:
                self._lose()
        return len(text)

    def flush(self) -> None:
        if not _Stdout.lost:
            try:
                sys.stdout.flush()
            except OSError:
                self._lose()

    @staticmethod
    def _lose() -> None:
        _Stdout.lost = True
        with contextlib.suppress(OSError, ValueError, AttributeError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())

    def __getattr__(self, name: str) -> object:  # isatty, fileno, encoding: the stream's own
        return getattr(sys.stdout, name)


STDOUT = _Stdout()


def console(**kwargs) -> Console:
    """A set COLUMNS is the user's width, terminal or not; COLUMNS=0 is no width (rich would print every line at
    width 0: nothing at all), so the terminal's, or 170 without one. No markup: what is printed holds paths and
    log values, and a `[/red]` in one was read as a closing tag (a MarkupError traceback); styled words are
    `Text` (`Text.assemble(("error:", "red"), " ", message)`)."""
    columns = os.environ.get("COLUMNS", "")
    width = int(columns) if columns.isdigit() and int(columns) > 0 else None
    kwargs.setdefault("file", STDOUT)
    kwargs.setdefault("markup", False)
    c = Console(**kwargs)
    if c.is_terminal:
        return c if c.width > 0 else Console(width=shutil.get_terminal_size().columns, **kwargs)
    return Console(width=width or WIDTH_WITHOUT_TERMINAL, soft_wrap=True, **kwargs)
