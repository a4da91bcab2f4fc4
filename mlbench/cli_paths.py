"""The click types for path arguments and options: `click.Path`, refusing an empty string; and a file to write,
refusing a folder's path (`FileParam`).

Path("") is the working directory, so `--results ""` (an unset shell variable, say) would write there and
`score ""` would search it: never what an empty argument meant.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click

from mlbench.errors import UserError, unprintable


class PathParam(click.Path):
    def __init__(self, **kwargs: Any):
        super().__init__(path_type=Path, **kwargs)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not value:
            self.fail("is empty; give a path", param, ctx)
        if self.exists and isinstance(value, str):
            try:  # click says "does not exist" whatever stat said: a name too long, a loop of links, no permission
                os.stat(value)
            except FileNotFoundError:
                pass  # click's own message
            except OSError as e:
                raise OSError(e.errno, e.strerror, value) from None  # the CLI's one line: '<path>: <reason>', exit 2
        return super().convert(value, param, ctx)


class FileParam(PathParam):
    """The path of a file to write (a report): one that names a folder by its form, ending in '/' or '/.', is
    refused. Path() drops that ending, so `--md r7.md/` wrote the file r7.md."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        option = param.opts[0] if param is not None and param.opts else "PATH"
        bad = unprintable(value) if isinstance(value, str) else None  # (an undecodable byte past 0x9F is text)
        if bad is not None:  # "wrote a<newline>b.html" split the line it is named on
            raise UserError(f"{option} {value!r}: holds {repr(bad)[1:-1]}, a character that is not printable; name "
                            f"the report without one")
        if value == "-":  # (to most tools standard output: a report is written to a file named '-' in the cwd)
            raise UserError(f"{option} -: a report is a file (plots beside it), not standard output; give its name "
                            f"(./- for a file named '-')")
        if isinstance(value, str) and value.endswith(("/", "/.")):
            ending = "/" if value.endswith("/") else "/."
            raise UserError(f"{option} {value}: ends with '{ending}', a folder's path; give the report's file name, "
                            f"without the '{ending}'")
        return super().convert(value, param, ctx)


def path_limit(name: str, path: str | Path, default: int) -> int:
    """os.pathconf NAME ('PC_NAME_MAX', 'PC_PATH_MAX') of the nearest folder of PATH that exists (DEFAULT where
    none answers): the limit of the filesystem the path would be made on."""
    folder = Path(os.path.abspath(path)).parent
    while True:
        try:
            return os.pathconf(folder, name)
        except (OSError, ValueError):
            if folder == folder.parent:
                return default
            folder = folder.parent
