"""mlbench's machine-readable output: `show --json`, `plan --json`, `score --json` and the run record
(result_<i>.json). One version for all of them, raised when a field of any is renamed, removed or changes its unit
or meaning, so a script can tell which fields it reads (docs/output.md lists them, with what each version changed);
and one way to write them, as JSON any parser reads."""

from __future__ import annotations

import json
import math

from mlbench.errors import undecodable_escaped

SCHEMA_VERSION = 3


def versioned(doc: dict) -> dict:
    """DOC with `schema_version` first, where a reader looks for it."""
    return {"schema_version": SCHEMA_VERSION} | doc


def strict(value: object) -> object:
    """VALUE as JSON any parser reads: a float that is not finite (json.dumps writes NaN and Infinity, which jq,
    JavaScript's JSON.parse and Go refuse: a diverged run's loss) becomes null, and a name's undecodable byte (a
    lone surrogate, which json.dumps writes as \\udcff and orjson refuses: 'invalid high surrogate') is written as
    the terminal shows it, \\xNN; keys become strings."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return undecodable_escaped(value)
    if isinstance(value, dict):
        return {undecodable_escaped(str(k)): strict(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [strict(v) for v in value]
    return value


def dumps(doc: object, indent: int | None = 1) -> str:
    """DOC as strict JSON text (`strict`); what json cannot write (a path) as its str."""
    return json.dumps(strict(doc), indent=indent, default=lambda v: strict(str(v)), allow_nan=False)
