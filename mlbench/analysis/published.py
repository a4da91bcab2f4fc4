"""The cited table of headline MLPerf results in results/published/, to set our runs beside."""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path

from mlbench.errors import UserError
from mlbench.logfile import shown
from mlbench.registry import ROOT

TABLE = ROOT / "results" / "published" / "headline_results.csv"
PREFIX = "published:"


@dataclass
class PublishedRow:
    id: str
    round: str
    submitter: str
    system: str
    benchmark: str
    accelerator: str
    devices: int | None
    time_to_train_min: float | None
    step_time_s: float | None
    verified: str
    source: str
    note: str

    @property
    def label(self) -> str:
        return f"{self.submitter} {self.system} ({self.round}, published)"


def _num(s: str, kind: type, where: str) -> float | int | None:
    s = (s or "").strip().replace(",", "")
    if not s:
        return None
    try:
        v = kind(s)
    except ValueError:
        v = None
    if v is None or not math.isfinite(v) or v <= 0:
        raise UserError(f"{where}: {s!r} is not a positive {'whole number' if kind is int else 'number'}")
    return v


# The most the table may hold: it is a few KB of cited rows; a FIFO or /dev/zero put in its place hung `compare`
# or filled the memory.
MAX_TABLE_BYTES = 4 << 20


def load(table: Path = TABLE) -> list[PublishedRow]:
    from mlbench.logfile import read_capped

    try:
        text = read_capped(table, MAX_TABLE_BYTES, "the published results table").decode()
        rows = list(csv.DictReader(io.StringIO(text, newline="")))
    except OSError as e:
        raise UserError(f"{table}: cannot read the published results table ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        line = _line_of(e.object, e.start)
        raise UserError(f"{table}:{line}: not UTF-8 text (byte {e.object[e.start]:#04x}); the table is UTF-8 CSV") \
            from None
    except csv.Error as e:  # a field past csv's limit (128 KiB), a NUL byte
        raise UserError(f"{table}: not a CSV table the reader takes ({e})") from None
    out = []
    for n, r in enumerate(rows, 2):  # line 1 is the header
        try:
            out.append(PublishedRow(
                id=r["id"], round=r["round"], submitter=r["submitter"], system=r["system"],
                benchmark=r["benchmark"], accelerator=r["accelerator"],
                devices=_num(r["devices"], int, f"{table}:{n}: devices"),
                time_to_train_min=_num(r["time_to_train_min"], float, f"{table}:{n}: time_to_train_min"),
                step_time_s=_num(r["step_time_s"], float, f"{table}:{n}: step_time_s"),
                verified=r.get("verified") or "", source=r["source"], note=r.get("note") or "",
            ))
        except KeyError as e:
            raise UserError(f"{table}: no column {e} (line {n})") from None
    return out


def _line_of(data: bytes, at: int) -> int:
    """The line number of byte AT of DATA."""
    return data.count(b"\n", 0, at) + 1


def get(ref: str, table: Path = TABLE) -> PublishedRow:
    """A row by id, given as 'published:<id>' or '<id>'."""
    rid = ref[len(PREFIX):] if ref.startswith(PREFIX) else ref
    rows = load(table)
    for r in rows:
        if r.id == rid:
            return r
    # the id as given cut to one line's worth (one of 3,000 characters was printed whole), the known ones listed
    known = ", ".join(r.id for r in rows[:20]) + (f", ... ({len(rows)} in all)" if len(rows) > 20 else "")
    raise UserError(f"no published row {shown(rid)} in {table}; known: {known}")
