"""The one click type for path arguments and options: `click.Path`, refusing an empty string.

Path("") is the working directory, so `--results ""` (an unset shell variable, say) would write there and
`score ""` would search it: never what an empty argument meant.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click


class PathParam(click.Path):
    def __init__(self, **kwargs: Any):
        super().__init__(path_type=Path, **kwargs)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not value:
            self.fail("is empty; give a path", param, ctx)
        return super().convert(value, param, ctx)
