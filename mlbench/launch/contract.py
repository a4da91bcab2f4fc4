"""The contract every launcher keeps (see the package's docstring): prepare, start, supervise, collect."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol


class Launcher(Protocol):
    def describe(self, folder: Path) -> list[tuple[str, str]]:
        """What it would start, as (what, text) lines: for the dry run."""

    def prepare(self, folder: Path) -> None: ...

    def start(self) -> None: ...

    def supervise(self) -> None: ...

    def collect(self) -> int: ...
