"""Where a benchmark's data paths (data.path, data.eval_path) point: made absolute once, from the flag that gave
them or the benchmark file that holds them. Light (no torch, no megatron): the registry imports it to load a file."""

from __future__ import annotations

import os

from mlbench.errors import UserError, unprintable
from mlbench.train.data.indexed import absolute_blend


def absolute(source: str, value: str, named: str, base: str = "") -> str:
    """data.path or data.eval_path VALUE with every path in it absolute, so the run plan and the run record say
    which files were used: a relative one is read from folder BASE, the working folder for a flag's value and the
    benchmark file's folder for the file's (a config file's paths are relative to it, wherever mlbench is run
    from). An indexed blend keeps its weights; each of BERT's folders, globs or files may start with ~. NAMED: what
    gave the value, as an error names it. The Markov source reads no path."""
    _check_printable(value, named)
    if not value.strip() or source == "markov":
        return value
    if source == "indexed":
        return absolute_blend(value, named, base)
    # BERT's: space-separated parts (bert_records.files), each resolved (the first alone was, the rest left relative)
    return " ".join(os.path.abspath(os.path.join(base, os.path.expanduser(part))) for part in value.split())


def _check_printable(value: str, named: str) -> None:
    """A data path without control characters, from a flag as from a benchmark file (whose text check refuses
    them): --data-path 'a<newline>b' or an ESC sequence was taken, and printed raw by the run's lines and record."""
    if (bad := unprintable(value)) is not None:
        raise UserError(f"{named} {value!r}: holds {repr(bad)[1:-1]}, a character that is not printable; a data "
                        f"path is one line of printable text: link or move the data to a path without it")
