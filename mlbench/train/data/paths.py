"""Where a benchmark's data paths (data.path, data.eval_path) point: made absolute once, from the flag that gave
them or the benchmark file that holds them. Light (no torch, no megatron): the registry imports it to load a file."""

from __future__ import annotations

import os

from mlbench.train.data.indexed import absolute_blend


def absolute(source: str, value: str, named: str, base: str = "") -> str:
    """data.path or data.eval_path VALUE with every path in it absolute, so the run plan and the run record say
    which files were used: a relative one is read from folder BASE, the working folder for a flag's value and the
    benchmark file's folder for the file's (a config file's paths are relative to it, wherever mlbench is run
    from). An indexed blend keeps its weights; each of BERT's folders, globs or files may start with ~. NAMED: what
    gave the value, as an error names it. The Markov source reads no path."""
    if not value.strip() or source == "markov":
        return value
    if source == "indexed":
        return absolute_blend(value, named, base)
    # BERT's: space-separated parts (bert_records.files), each resolved (the first alone was, the rest left relative)
    return " ".join(os.path.abspath(os.path.join(base, os.path.expanduser(part))) for part in value.split())
