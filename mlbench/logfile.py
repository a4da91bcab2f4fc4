"""MLPerf result logs (`:::MLLOG {json}` lines), ours and published, read as a stream.

One reader for the whole project: the analysis, `mlbench check`, the run finisher and the aborted-run finaliser.
It holds one line at a time, so a log of any size is read in memory of a few lines. The fields a caller reads
are checked where they are read (`number`, `text`, `BadField`): a log is input, and a garbled field is reported
with its file, line and key, never a traceback.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import orjson

TOKEN = ":::MLLOG "
# The key of a record without parsing the record: lines of keys a caller does not read are skipped unparsed
# (a 250 MB log is mostly per-step lines that scoring never reads). Only where the match cannot be wrong: the
# line holds `"key"` once (not also inside the metadata, say) and no backslash (an escape can spell a key). A
# line this does not match, whatever its spacing or field order, is parsed.
_KEY = re.compile(rb'"key"\s*:\s*"([^"\\]*)"')


@dataclass(slots=True)
class Event:
    key: str
    value: object
    metadata: dict
    time_ms: object  # as logged: checked where read (`number(event, "time_ms", event.time_ms)`)
    line: int
    event_type: str = ""

    def as_dict(self) -> dict:
        return {"key": self.key, "value": self.value, "metadata": self.metadata, "time_ms": self.time_ms,
                "event_type": self.event_type}


class BadField(ValueError):
    """A field of a log line that is not what MLPerf logs hold: names the file, line and key."""

    def __init__(self, path: Path | str, event: Event, name: str, got: object, want: str):
        try:
            shown = json.dumps(got)  # as the log holds it: NaN, Infinity, ["a"]
        except (TypeError, ValueError):
            shown = repr(got)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        where = f"{event.key}" if name == "value" else f"{event.key} {name}"
        super().__init__(f"{path}:{event.line}: {where} is {shown}, expected {want}")


@dataclass
class LogReader:
    """The events of one log, line by line. `keys`: read only records with these keys (None: all).

    After iterating: `broken` holds the numbers of MLLOG lines that are not a JSON record (at most 20 kept,
    `n_broken` counts them all), `truncated` whether the last line is such a line cut off without a newline.
    """

    path: Path
    keys: frozenset[str] | None = None
    broken: list[int] = field(default_factory=list)
    n_broken: int = 0
    truncated: bool = False
    lines: int = 0

    def __iter__(self) -> Iterator[Event]:
        start = len(TOKEN)
        keys, wanted = None, None
        with open(self.path, "rb") as f:
            n = 0
            for raw in f:
                n += 1
                i = raw.find(b":::MLLOG ")
                if i < 0:
                    continue
                if self.keys is not keys:  # a caller may narrow the keys while reading (after the preamble)
                    keys = self.keys
                    wanted = None if keys is None else {k.encode() for k in keys}
                payload = raw[i + start:]
                if wanted is not None:
                    m = _KEY.search(payload)
                    if m is not None and m.group(1) not in wanted and b"\\" not in payload \
                            and payload.count(b'"key"') == 1:
                        continue
                event = _event(payload, n)
                if event is None:
                    self.n_broken += 1
                    if len(self.broken) < 20:
                        self.broken.append(n)
                    self.truncated = not raw.endswith(b"\n")  # only a file's last line can end without one
                    continue
                if keys is None or event.key in keys:
                    yield event
            self.lines = n

    def problems(self) -> list[str]:
        """What was wrong with the file's lines, in words (empty for a clean log)."""
        if not self.n_broken:
            return []
        last = self.broken[-1]
        if self.truncated and self.n_broken == 1:
            return [f"truncated: the last line ({last}) is cut off"]
        shown = ", ".join(map(str, self.broken[:5])) + (" ..." if self.n_broken > 5 else "")
        return [f"{self.n_broken} line(s) with broken JSON skipped (line {shown})"]


def _event(payload: bytes, line: int) -> Event | None:
    try:  # orjson: 4x the standard parser on MLLOG lines; what it refuses (NaN, Infinity, bad UTF-8) json reads
        d = orjson.loads(payload)
    except orjson.JSONDecodeError:
        d = _loads(payload)
    if type(d) is not dict or type(key := d.get("key")) is not str:
        return None
    md, kind = d.get("metadata"), d.get("event_type", "")
    return Event(key, d.get("value"), md if md is not None else {}, d.get("time_ms"), line,
                 kind if type(kind) is str else str(kind))


def _loads(payload: bytes) -> object:
    """The standard parser, as MLPerf's own tools read a log (NaN and Infinity allowed); None for broken JSON."""
    try:
        return json.loads(payload)
    except UnicodeDecodeError:
        return _loads(payload.decode("utf-8", errors="replace").encode())
    except ValueError:
        return None


def read(path: Path | str) -> list[dict]:
    """Every record of a (small) log as the dict it was logged as: for our own logs, which the run writes."""
    return [e.as_dict() for e in LogReader(Path(path))]


# --- fields, checked where read ---------------------------------------------------------------------------

def number(path: Path | str, event: Event, name: str, value: object, *, positive: bool = False,
           integer: bool = False) -> float:
    """A finite number (int or float, not bool) from a log field, or BadField naming file, line and key."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        ok = False
    else:  # finite: a float that is not inf or nan, an int that a float can hold
        ok = math.isfinite(value) if isinstance(value, float) else -(2.0**1023) < value < 2.0**1023
    if ok and positive:
        ok = value > 0
    if ok and integer:
        ok = float(value).is_integer()
    if not ok:
        want = "a finite " + ("positive " if positive else "") + ("integer" if integer else "number")
        raise BadField(path, event, name, value, want)
    return value


def text(path: Path | str, event: Event, name: str, value: object) -> str:
    """A string from a log field, or BadField."""
    if not isinstance(value, str):
        raise BadField(path, event, name, value, "a string")
    return value


def metadata(path: Path | str, event: Event) -> dict:
    """The metadata object of a record, or BadField (a list or a number where MLPerf logs an object)."""
    if not isinstance(event.metadata, dict):
        raise BadField(path, event, "metadata", event.metadata, "an object")
    return event.metadata


# --- time to train ------------------------------------------------------------------------------------------

def time_to_train_s(start_ms: float | None, stop_ms: float | None) -> float | None:
    """Seconds from the first run_start to the first run_stop, as MLPerf scores it. None when either is missing
    or run_stop comes before run_start (no time to train: such a run never counts as a success)."""
    if start_ms is None or stop_ms is None or stop_ms < start_ms:
        return None
    return (stop_ms - start_ms) / 1000


def log_time_to_train(path: Path | str) -> float | None:
    """Time to train of a log file, streamed (None for a missing file or an unusable run_start/run_stop)."""
    path = Path(path)
    if not path.exists():
        return None
    times: dict[str, float] = {}
    try:
        for e in LogReader(path, keys=frozenset({"run_start", "run_stop"})):
            if e.key not in times:
                times[e.key] = number(path, e, "time_ms", e.time_ms)
            if len(times) == 2:
                break
    except BadField:
        return None
    return time_to_train_s(times.get("run_start"), times.get("run_stop"))
