"""Rank 0's progress events as the supervisor follows them, kept in a size that does not grow with a long run.

A run of 100,000 steps writes 100,000 `step` events: held as dicts until the run was published (the record's
steps), they took the supervisor to 387 MiB (a 1.2M-step budget, llama31_8b's, would have taken 4 GB). Every other
event is kept whole (a few per evaluation); the steps as columns of numbers, 8 bytes a field, read back one row at
a time as the record is written (results.publish).

Their rows are thinned past WHOLE_ROWS (the record grew about 190 bytes a step: 230 MB at 1.2M steps, which jq or
pandas needed gigabytes to read): the first WHOLE_ROWS steps each, then one in `stride` (a power of two that doubles
whenever more than THINNED_ROWS rows past them would be kept), and the last step always: at most about 20,000 rows
(under 4 MiB) whatever the run's length. What the record sums up over the steps (the median MFU) is computed from
every step, kept whole in a column of its own (WHOLE_FIELDS)."""

from __future__ import annotations

import json
import math
from array import array
from collections.abc import Iterator, Sequence
from pathlib import Path

# A step's fields in the run record, in its order ("loss": the step event's, the log's reduced_train_loss), each
# with the step event's name for it where that differs (the record's names carry their unit: docs/output.md)
STEP_FIELDS = ("step", "loss", "step_time_s", "tokens_per_s", "tflops_per_device", "mfu", "lr", "grad_norm")
_EVENT_NAMES = {"step_time_s": "step_time"}
WHOLE_ROWS = 10_000  # the first steps, each a row of the record
THINNED_ROWS = 10_000  # the most rows kept past them (then the stride doubles)
WHOLE_FIELDS = ("mfu",)  # the fields the record sums up over every step (Steps.median), kept for every step
_NONE = -(2**63)  # a step number that is not an integer: None in the record
_CHUNK = 1 << 20  # read the events file this much at a time
# The most one poll reads (about 18,000 steps' events; a rank writes a few a second): the events it returns, as
# dicts, take ten times that, so a poll that found a long run's whole file (a supervisor stopped for minutes, then
# continued) took hundreds of MiB at once. The rest is read by the next polls (`drain`: all of it, at the end).
POLL_BYTES = 4 << 20


def _number(value: object) -> float:
    """VALUE as a float where it is a number (not a bool), else NaN: None in the record, as a NaN is (strict JSON)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return math.nan
    try:
        return float(value)
    except OverflowError:  # an integer past a float's range
        return math.nan


class Steps(Sequence):
    """The step events' record fields, a column each, for the rows kept (the module's docstring: the first
    WHOLE_ROWS steps, then one in `stride`, and the last); a row reads back as the record's dict for one step.
    `total` counts every step, `median` is over every step."""

    def __init__(self) -> None:
        self._step = array("q")
        self._columns = {k: array("d") for k in STEP_FIELDS[1:]}
        self._whole = {k: array("d") for k in WHOLE_FIELDS}
        self.total = 0  # every step added, kept or not
        self.stride = 1  # one row kept in `stride` past the first WHOLE_ROWS
        self._last: tuple[int, list[float]] | None = None  # the last step, where its row was not kept

    def add(self, event: dict) -> None:
        step = event.get("step")
        step = step if type(step) is int and -(2**63) < step < 2**63 else _NONE
        values = [_number(event.get(_EVENT_NAMES.get(k, k))) for k in self._columns]
        for k, column in self._whole.items():
            column.append(values[STEP_FIELDS.index(k) - 1])
        past = self.total - WHOLE_ROWS  # this step's place past the rows kept whole
        self.total += 1
        if past >= 0 and past % self.stride:
            self._last = (step, values)
            return
        self._last = None
        self._step.append(step)
        for column, v in zip(self._columns.values(), values, strict=True):
            column.append(v)
        if len(self._step) > WHOLE_ROWS + THINNED_ROWS:
            self._thin()

    def _thin(self) -> None:
        """Every other row past the first WHOLE_ROWS dropped, the stride doubled (the rows kept are those a stride
        twice as long keeps: the first past WHOLE_ROWS among them). The last row, dropped here, is kept apart."""
        if (len(self._step) - 1 - WHOLE_ROWS) % 2:
            self._last = (self._step[-1], [c[-1] for c in self._columns.values()])
        for column in (self._step, *self._columns.values()):
            kept = column[WHOLE_ROWS::2]
            del column[WHOLE_ROWS:]
            column.extend(kept)
        self.stride *= 2

    def __len__(self) -> int:
        return len(self._step) + (self._last is not None)

    def _row(self, i: int) -> dict:
        if i == len(self._step):  # the last step, kept apart
            step, values = self._last
        else:
            step, values = self._step[i], [column[i] for column in self._columns.values()]
        row: dict = {"step": None if step == _NONE else step}
        for k, v in zip(self._columns, values, strict=True):
            row[k] = None if math.isnan(v) else v
        return row

    def __getitem__(self, i):  # noqa: ANN001 - an index or a slice, as any Sequence
        if isinstance(i, slice):
            return [self._row(j) for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self._row(i)

    def __iter__(self) -> Iterator[dict]:
        return (self._row(i) for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    def median(self, field: str) -> float | None:
        """The median (the upper one of an even count) of FIELD (one of WHOLE_FIELDS) over every step that has it,
        kept as a row or not; None where none does."""
        values = sorted(v for v in self._whole[field] if not math.isnan(v))
        return values[len(values) // 2] if values else None


class EventTail:
    """Reads new JSON lines from the events file as rank 0 appends them: each poll reads only what was appended
    since the last one. `events` keeps every event but the steps, `steps` the steps' record fields (Steps), `seen`
    how many events there were in all."""

    def __init__(self, path: Path):
        self.path, self._pos, self._buf = path, 0, b""
        self.events: list[dict] = []
        self.steps = Steps()
        self.seen = 0

    def poll(self) -> list[dict]:
        """The events appended since the last poll, up to about POLL_BYTES of them (a line not yet ended waits for
        its end)."""
        return self._read(collect=True, limit=POLL_BYTES)

    def drain(self) -> Iterator[list[dict]]:
        """Every event not read yet, POLL_BYTES of them at a time (the run has ended: none will come after)."""
        while True:
            before = self._pos
            if new := self.poll():
                yield new
            if self._pos == before:
                return

    def read_all(self) -> None:
        """Every event there is, folded into `events` and `steps`, without a list of them (a dead run's file)."""
        self._read(collect=False)

    def _read(self, collect: bool, limit: int | None = None) -> list[dict]:
        new: list[dict] = []
        try:
            f = open(self.path, "rb")  # noqa: SIM115 - closed below
        except FileNotFoundError:
            return new
        with f:
            f.seek(self._pos)
            done = 0
            while (limit is None or done < limit) and (chunk := f.read(_CHUNK)):
                done += len(chunk)
                self._pos += len(chunk)
                *lines, self._buf = (self._buf + chunk).split(b"\n")
                for line in lines:
                    if (event := _event(line)) is not None:
                        self._fold(event)
                        if collect:
                            new.append(event)
        return new

    def _fold(self, event: dict) -> None:
        self.seen += 1
        if event.get("event") == "step":
            self.steps.add(event)
        else:
            self.events.append(event)


def _event(line: bytes) -> dict | None:
    try:
        event = json.loads(line)
    except (ValueError, RecursionError):  # not JSON (or not UTF-8), or nested past the parser's depth: no event
        return None
    return event if isinstance(event, dict) else None  # what every reader of an event takes it to be
