"""MLPerf result logs (`:::MLLOG {json}` lines), ours and published, read as a stream.

One reader for the whole project: the analysis, `mlbench check`, the run finisher and the aborted-run finaliser.
It holds one line at a time, so a log of any size is read in memory of a few lines. The fields a caller reads
are checked where they are read (`number`, `text`, `BadField`): a log is input, and a garbled field is reported
with its file, line and key, never a traceback.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import functools
import json
import math
import os
import re
import stat
from array import array
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np
import orjson

TOKEN = ":::MLLOG "
TOKEN_B = TOKEN.encode()
_TOKEN_LEN = len(TOKEN_B)
# The key of a record without parsing the record: lines of keys a caller does not read are skipped unparsed
# (a 250 MB log is mostly per-step lines that scoring never reads). Only where the match cannot be wrong: the
# line holds `"key"` once (not also inside the metadata, say) and no backslash (an escape can spell a key). A
# line this does not match, whatever its spacing or field order, is parsed.
_KEY = re.compile(rb'"key"\s*:\s*"([^"\\]*)"')
_BLOCK = 1 << 19  # bytes read at a time: whole lines of it are sorted at once (a longer line is read whole)
_WIDTH = 64  # bytes of a name looked at: a longer wanted name is only found by the per-line rule
_COLUMNS = np.arange(_WIDTH)
_U64 = np.dtype("<u8")
_TOKEN_WORD = np.frombuffer(TOKEN_B[:8], _U64)[0]  # ":::MLLOG", then the space
_KEY_WORD = np.frombuffer(b'"key": "', _U64)[0]
_FIVE = np.uint64(0xFF_FF_FF_FF_FF)  # the low 5 bytes of a word: '"key"'
_MASKS = np.array([(1 << 8 * (n + 1)) - 1 for n in range(8)], _U64)  # a word's first n + 1 bytes


@functools.cache
def _names(wanted: frozenset[bytes]) -> np.ndarray:
    """The wanted names shorter than _WIDTH, each followed by its closing quote and zeros, as rows of 8-byte
    words."""
    names = [w + b'"' for w in wanted if len(w) < _WIDTH]
    width = -(-max(map(len, names), default=1) // 8) * 8
    return np.frombuffer(b"".join(w.ljust(width, b"\0") for w in names), _U64).reshape(len(names), width // 8)


@functools.cache
def _sorted_names(wanted: frozenset[bytes]) -> np.ndarray:
    """The rows of `_names`, each one value of its bytes, sorted."""
    table = _names(wanted)
    return np.sort(table.view(f"V{table.shape[1] * 8}").ravel())


def _sort_lines(data: bytes, pos: int, cut: int, wanted: frozenset[bytes]) -> tuple[int, tuple[np.ndarray, ...]]:
    """The whole lines data[pos:cut] sorted without a Python step a line: (how many, arrays (index from pos,
    start, end, direct) of the lines to read). A line left out is one the per-line rule (`LogReader._line`) skips
    unparsed: it begins with the token, holds `"key"` once, as `"key": "NAME"` with NAME not wanted, and no
    backslash. direct: a line of that form with NAME wanted (the rule parses it); the other lines listed
    (anything else: another prefix or spacing, a second "key", a backslash, a name cut off or too long) go
    through the rule itself."""
    a = np.frombuffer(data, np.uint8, cut - pos, pos)
    size = len(a)
    ends = np.flatnonzero(a == 0x0A)  # each line's newline
    n = len(ends)
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    if size < 2 * _WIDTH:  # too short to sort: every line to the rule
        return n, (np.arange(n), starts + pos, ends + pos, np.zeros(n, bool))
    # word[i]: the 8 bytes a[i:i + 8] as a number; rows[i]: a[i:i + 64]. Only i < end is read: a line where
    # more would be (the last ones of the block) goes to the rule.
    word = np.ndarray((size - 7,), _U64, data, pos, (1,))
    rows = np.lib.stride_tricks.as_strided(a, (size - _WIDTH + 1, _WIDTH), (1, 1), writeable=False)
    end = len(rows)
    ok = (ends - starts > _TOKEN_LEN) & (starts < end)
    head = np.minimum(starts, end - 1)
    ok &= (word[head] == _TOKEN_WORD) & (a[head + 8] == 0x20)  # the line begins with the token, so every
    y = np.flatnonzero(a == 0x79) - 3  # "key" in it is in the record. Where a "key" would begin, by its y
    y = y[y >= 0]
    ok[np.searchsorted(ends, y[y >= end])] = False  # a "key" there would not be seen
    y = y[y < end]
    at = y[(word[y] & _FIVE) == (_KEY_WORD & _FIVE)]  # each "key" (overlapping ones apart)
    line = np.searchsorted(ends, at)
    ok &= np.bincount(line, minlength=n) == 1  # holds "key" once
    key = np.zeros_like(ends)
    key[line] = at
    ok &= key + 8 < end
    key = np.minimum(key, end - 9)
    ok &= word[key] == _KEY_WORD  # "key": "
    table = _names(wanted)
    name = rows[key + 8, :table.shape[1] * 8]  # the name, its closing quote, what follows
    length = (name == 0x22).argmax(1)
    ok &= (name[np.arange(n), length] == 0x22) & (key + 8 + length < ends)
    first = word[key + 8] & _MASKS[np.minimum(length, 7)]  # the name's first 8 bytes (with its quote), zeros
    candidate = np.zeros(n, bool)
    for w in table[:, 0]:
        candidate |= first == w
    direct = np.zeros(n, bool)
    if (c := np.flatnonzero(candidate & ok)).size:  # the whole name compared: found among the sorted names
        full = (name[c] * (_COLUMNS[:name.shape[1]] <= length[c, None])).view(f"V{name.shape[1]}").ravel()
        names = _sorted_names(wanted)
        direct[c] = names[np.minimum(np.searchsorted(names, full), len(names) - 1)] == full
    if data.find(b"\\", pos, cut) >= 0:  # a line with a backslash: the rule reads it
        ok[np.searchsorted(ends, np.flatnonzero(a == 0x5C))] = False
    direct &= ok
    todo = np.flatnonzero(~ok | direct)
    return n, (todo, starts[todo] + pos, ends[todo] + pos, direct[todo])


# The per-step lines of a big log differ only in their digits. One such line, as `_Layout`, lets a block's lines of
# its layout be checked and their numbers found in array operations, and parsed in one orjson call: the same
# parser and so the same numbers as a line parsed alone, without a Python step a line.
_RUN = re.compile(rb"[0-9]+")
_JSON_NUMBER = re.compile(rb'"[^"]*"|-?[0-9][-+.0-9eE]*')  # a string (skipped) or a number, in a line without "\"
_NUMBER_WIDTH = 32  # the longest number read in a batch (a float's repr is at most 24): a longer one, one by one
_NO_ROWS = np.zeros((0, 5))
_NO_LINES = np.zeros(0, np.int64)


def _strings(data: bytes, width: int) -> np.ndarray:
    """DATA as the WIDTH-byte strings that begin at each of its bytes (a view: gathering some copies just those)."""
    return np.ndarray((len(data) - width + 1,), f"V{width}", data, 0, (1,))


@dataclass(frozen=True)
class _Runs:
    """The digit runs of some whole lines data[s:e] of data[pos:cut]: where runs begin and end (`edges`, found in
    a few passes over the bytes), and each line's first edge `lo` and how many edges it holds (`count`)."""

    data: bytes
    s: np.ndarray
    e: np.ndarray
    edges: np.ndarray
    lo: np.ndarray
    count: np.ndarray


def _runs(data: bytes, pos: int, cut: int, s: np.ndarray, e: np.ndarray) -> _Runs:
    digit = (np.frombuffer(data, np.uint8, cut - pos, pos) - np.uint8(48)) < 10
    edges = np.flatnonzero(digit[1:] != digit[:-1]) + (pos + 1)  # (cut - 1 is a newline: every run ends before)
    if digit[0]:
        edges = np.r_[pos, edges]
    lo = np.searchsorted(edges, s)
    return _Runs(data, s, e, edges.astype(np.int32), lo, np.searchsorted(edges, e) - lo)


@dataclass(frozen=True)
class _Layout:
    """The lines that are one line (`_layout`) with other digits: k digit runs, the pieces of text between them
    and the runs `low` to `low + span` long (a piece: as long as in the line; a run: 1 to the most digits a number
    may have), the pieces (index, length) one after another equal to `text` (zero-padded 8-byte words, laid out
    by `pieces_dtype`), and the numbers (by their first and last run, minus sign) that make a row."""

    k: int
    low: np.ndarray
    span: np.ndarray
    pieces: tuple[tuple[int, int], ...]
    pieces_dtype: np.dtype
    text: np.ndarray
    lead: np.ndarray  # runs that begin a number: "0" or no leading zero (JSON)
    first: np.ndarray
    last: np.ndarray
    neg: np.ndarray
    ints: np.ndarray  # which numbers are ints without a sign (one run)
    columns: np.ndarray  # the row's fields these numbers fill (the rest: NaN, not logged)

    def rows(self, runs: _Runs, which: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Which of the lines WHICH (ascending indices into RUNS' lines) are of this layout, and their rows. The
        lines are narrowed down to those that can still be (by their count of runs, then their lengths, then
        their text): a line of another kind costs a comparison or two."""
        k2, data = 2 * self.k, runs.data
        i = which[runs.count[which] == k2]
        if not len(i):
            return _NO_LINES, _NO_ROWS
        # Each line (a row) as: its start, where each run begins and ends, its end; so where each piece of text begins
        # (the edges of these lines, in order: those of the other lines left out)
        at = np.empty((len(i), k2 + 2), np.int32)
        at[:, 0], at[:, -1] = runs.s[i], runs.e[i]
        mine = np.zeros(2 * len(i) + 1, bool)
        mine[1::2] = True
        lo = runs.lo[i]
        bounds = np.column_stack((lo, lo + k2)).ravel()
        at[:, 1:-1] = runs.edges[np.repeat(mine, np.diff(bounds, prepend=0, append=len(runs.edges)))].reshape(-1, k2)
        size = np.diff(at, axis=1)  # the pieces of text and the runs, in turn: within their bounds
        lead = 2 * self.lead + 1
        fit = ((size - self.low).view(np.uint32) <= self.span).all(1)
        fit &= ((np.frombuffer(data, np.uint8)[at[:, lead]] != 48) | (size[:, lead] == 1)).all(1)
        if not fit.all():
            i, at = i[fit], at[fit]
        text = np.zeros(len(i), self.pieces_dtype)  # each line's pieces of text, one after another
        for j, g in self.pieces:
            text[f"p{j}"] = _strings(data, g)[at[:, 2 * j]]
        fit = (text.view(_U64).reshape(len(i), len(self.text)) == self.text).all(1)
        if not fit.all():
            i, at = i[fit], at[fit]
        if not len(self.columns):
            return i, np.full((len(i), 5), math.nan)
        end = at[:, 2 * self.last + 2]
        length = end - at[:, 2 * self.first + 1] + self.neg
        width = length.max(0, initial=0)
        # a number too long for a batch, or too near the start of DATA to take WIDTH bytes up to its end: one by one
        fit = (length <= _NUMBER_WIDTH).all(1) & (end >= width).all(1)
        if not fit.all():
            i, end, length = i[fit], end[fit], length[fit]
            width = length.max(0, initial=0)
        if not len(i):
            return _NO_LINES, _NO_ROWS
        # The numbers as one JSON array, field after field: each in WIDTH bytes (spaces before it) and a comma; an
        # int (one run, no sign: as orjson reads it alone, a float of the same value) read as a float, ".0" after it
        ints = self.ints.tolist()
        sizes = [w + 1 + 2 * n for w, n in zip(width.tolist(), ints, strict=True)]
        numbers = np.empty(len(i) * sum(sizes) + 1, np.uint8)
        numbers[0] = 0x5B
        to = 1
        for c, (w, size) in enumerate(zip(width.tolist(), sizes, strict=True)):
            part = numbers[to:to + len(i) * size].reshape(-1, size)
            part[:, :w] = _strings(data, w)[end[:, c] - w].view(np.uint8).reshape(-1, w)
            if (length[:, c] < w).any():  # (mostly none: a column's numbers are of one length in a block)
                part[:, :w][np.arange(w) < w - length[:, c, None]] = 0x20
            if ints[c]:
                part[:, w:w + 2] = (0x2E, 0x30)
            part[:, -1] = 0x2C
            to += part.size
        numbers[-1] = 0x5D
        try:
            values = np.frombuffer(array("d", orjson.loads(memoryview(numbers))), np.float64).reshape(-1, len(i)).T
        except orjson.JSONDecodeError:  # not expected of checked lines; if so, they are read one by one
            return _NO_LINES, _NO_ROWS
        if len(self.columns) == 5:  # (the columns in order: every field logged)
            return i, values
        rows = np.full((len(i), 5), math.nan, order="F")  # (a field's numbers together, as VALUES holds them)
        rows[:, self.columns] = values
        return i, rows


def _layout(line: bytes, key: str, fields: Callable[[dict], tuple]) -> _Layout | None:
    """The layout of LINE, a record of KEY that was taken (in the standard form: no backslash). Which numbers make
    its row: FIELDS of the record parsed with each number replaced by its place (1, 2, ...); None where the row is
    not made of numbers of its own."""
    runs = [m.span() for m in _RUN.finditer(line)]
    if not runs:
        return None
    numbers = [m.span() for m in _JSON_NUMBER.finditer(line) if line[m.start()] != 0x22]
    probe, end = [], 0
    for i, (s, e) in enumerate(numbers, 1):
        probe += (line[end:s], b"%d" % i)
        end = e
    try:
        record = orjson.loads((b"".join(probe) + line[end:])[_TOKEN_LEN:])
    except orjson.JSONDecodeError:
        return None
    if type(record) is not dict or record.get("key") != key:
        return None
    row = fields(record)
    if not row or not all(type(x) is int and 0 < x <= len(numbers) or type(x) is float and x != x for x in row):
        return None  # (a record FIELDS has no row of: one that RECORD stores nothing of, or reads field by field)
    used = [x - 1 for x in row if type(x) is int]
    first = [next(j for j, r in enumerate(runs) if r[0] >= s) for s, _ in numbers]  # each number's runs
    last = [max(j for j, r in enumerate(runs) if r[1] <= e) for _, e in numbers]
    longest = np.full(len(runs), 1 << 62)  # in a string or a fraction: any number of digits
    longest[first] = 18  # an int part of 18 digits and an exponent of 2: a finite float, that orjson reads alone
    longest[[j for i, k in zip(first, last, strict=True) for j in range(i + 1, k + 1)
             if line[runs[j][0] - 1] in b"eE+-"]] = 2
    gaps = np.diff([0, *(x for r in runs for x in r), len(line)])[::2]  # each piece of text's length
    low, span = np.ones(2 * len(runs) + 1, np.int32), np.zeros(2 * len(runs) + 1, np.uint32)
    low[::2], span[1::2] = gaps, np.minimum(longest - 1, (1 << 31) - 1)  # (lines are shorter)
    begins = [0, *(e for _, e in runs)]
    pieces = tuple((j, int(g)) for j, g in enumerate(gaps) if g)
    text = b"".join(line[begins[j]:begins[j] + g] for j, g in pieces)
    size = -(-len(text) // 8) * 8
    offsets = np.cumsum([0, *(g for _, g in pieces)])[:-1].tolist()
    return _Layout(
        k=len(runs), low=low, span=span, pieces=pieces,
        pieces_dtype=np.dtype({"names": [f"p{j}" for j, _ in pieces], "formats": [f"V{g}" for _, g in pieces],
                               "offsets": offsets, "itemsize": size}),
        text=np.frombuffer(text.ljust(size, b"\0"), _U64), lead=np.array(first, int),
        first=np.array([first[i] for i in used], int), last=np.array([last[i] for i in used], int),
        neg=np.array([line[numbers[i][0]] == 0x2D for i in used], int),
        ints=np.array([first[i] == last[i] and line[numbers[i][0]] != 0x2D for i in used], bool),
        columns=np.array([c for c, x in enumerate(row) if type(x) is int], int))


@dataclass(frozen=True)
class Take:
    """Records of KEY in the standard form, read after `LogReader.keys` is set, taken without an Event: each goes
    to RECORD(record as parsed, line), and is not yielded where that returns True (False: yielded as usual).

    Lines of the layout of a record RECORD took (`_Layout`: the per-step lines of a big log) are read in batches
    instead, where ROWS is given: it gets their rows, 5 float64s a record, FIELDS(record) as numbers (a field not
    logged: NaN). So RECORD must take a record whose FIELDS are finite numbers (or not logged) and store just
    that row; where RECORD refuses some such rows too (an implausible value), KEEP(rows) says which it takes (a
    mask), and the others are read one by one, as RECORD would have them."""

    key: str
    record: Callable[[dict, int], bool]
    fields: Callable[[dict], tuple] | None = None
    rows: Callable[[np.ndarray], None] | None = None
    keep: Callable[[np.ndarray], np.ndarray] | None = None


_BATCHES = True  # whether lines of a layout are read in batches (a test compares with reading them one by one)


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
        where = f"{event.key}" if name == "value" else f"{event.key} {name}"
        super().__init__(f"{path}:{event.line}: {where} is {shown(got)}, expected {want}")


def shown(value: object, width: int = 60) -> str:
    """An input value as its file holds it (NaN, Infinity, ["a"]), cut to WIDTH characters: a reason stays one
    line whatever the value (a string of 5000 digits)."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        try:
            text = repr(value)
        except RecursionError:  # (a list nested a thousand deep)
            text = f"({type(value).__name__} nested too deep to show)"
    return text if len(text) <= width else text[:width - 3] + "..."


# The most a JSON input file (a run record, a systems json, scaling.json) may hold: each is a few KiB, so this is
# room to spare, while /dev/zero or a log renamed .json is refused rather than read into memory.
MAX_JSON_BYTES = 64 << 20
_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def file_kind(mode: int) -> str:
    """What a file of st_mode MODE that is not a regular one is, in words: the one wording every message that refuses
    such a file uses ("a named pipe, not a regular file")."""
    return next((name for test, name in _KINDS if test(mode)), "something else")


def _not_input_file(path: Path | str, st: os.stat_result, limit: int | None = None,
                    what: str = "a JSON input file", note: str = "") -> OSError | None:
    """Why a file with stat ST cannot be read as WHAT of at most LIMIT bytes (MAX_JSON_BYTES where None: an
    OSError whose strerror says it), or None."""
    limit = MAX_JSON_BYTES if limit is None else limit
    if not stat.S_ISREG(st.st_mode):
        return OSError(errno.EINVAL, f"{file_kind(st.st_mode)}, not a regular file", str(path))
    if st.st_size > limit:
        return OSError(errno.EFBIG, f"{st.st_size:,} bytes, over the {limit >> 20} MiB {what} may hold{note}",
                       str(path))
    return None


def why_not_a_file(path: Path | str) -> str | None:
    """Why PATH, an input named by its place (a result log found in a folder), cannot be read as a file: not a
    regular file where it leads ("a named pipe, not a regular file"), a link to nothing or a loop of links; None
    for a regular file. Asks the file system only."""
    try:
        st = os.stat(path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            return "a loop of links"
        return "a link to nothing" if os.path.islink(path) else (e.strerror or str(e)).lower()
    why = _not_input_file(path, st, limit=math.inf)
    return why.strerror if why is not None else None


def why_unreadable(path: Path | str) -> str | None:
    """Why this user cannot open the file PATH for reading ('Permission denied'), or None. Opened without waiting
    (a pipe is no file to read, said by why_not_a_file) and closed at once."""
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY))
    except OSError as e:
        return e.strerror or str(e)
    return None


def tree_glob(path: Path, pattern: str, unlisted: list[tuple[Path, str]] | None = None) -> list[Path]:
    """Everything under the folder PATH whose name matches PATTERN (`result_*.txt`, a staging folder's), sorted,
    named as under PATH. A linked folder is searched as a folder (Path.rglob passes it over: a benchmark folder
    linked to a bigger disk, where `mlbench run` had published, held no results for `score results/`); a folder
    reached twice (a loop of links) is searched once. UNLISTED: where given, each folder that could not be listed is
    added to it, with why ('Permission denied')."""
    found: list[Path] = []
    seen: set[tuple[int, int]] = set()

    def said(e: OSError) -> None:
        if unlisted is not None and e.filename is not None:
            unlisted.append((Path(e.filename), e.strerror or str(e)))

    for top, dirs, files in os.walk(path, onerror=said, followlinks=True):
        try:
            st = os.stat(top)
        except OSError:
            dirs.clear()
            continue
        if (st.st_dev, st.st_ino) in seen:
            dirs.clear()
            continue
        seen.add((st.st_dev, st.st_ino))
        found += [Path(top, n) for n in (*dirs, *files) if fnmatch.fnmatchcase(n, pattern)]
    return sorted(found)


def given_path_problem(path: Path | str) -> str | None:
    """What is wrong with PATH, given on the command line as a result log or a folder of them (`score`, `compare`,
    `scaling`, `check`): '<path>: no such file or folder', or what it is where it is no regular file (a pipe would
    block the reader, /dev/zero never end); None for a folder or a regular file. A path the system refuses (a
    name too long) raises its OSError, which the CLI says with the limit."""
    if Path(path).is_dir():
        return None
    try:
        os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return f"{path}: no such file or folder"
    why = why_not_a_file(path)
    if why is None and (why := why_unreadable(path)) is not None:
        return f"{path}: cannot be read ({why}); a result log must be readable by the user running mlbench"
    return f"{path}: {why} (a result log is a regular file; or give a folder of them)" if why else None


def check_json_file(path: Path | str) -> None:
    """OSError naming why PATH cannot be read as a JSON input file: not a regular file where it leads (a pipe
    would block the read forever, /dev/zero fill the memory) or larger than MAX_JSON_BYTES. Asks the file system
    only; opens nothing."""
    if (why := _not_input_file(path, os.stat(path))) is not None:
        raise why


def read_capped(path: Path | str, limit: int | None = None, what: str = "a JSON input file",
                note: str = "") -> bytes:
    """PATH's bytes, where it is a regular file of at most LIMIT bytes (else an OSError naming why: WHAT may hold
    LIMIT, NOTE after it). Never blocks, never reads more than LIMIT and a byte: the file is opened without waiting
    (a pipe put in its place is refused) and checked as opened. LIMIT: MAX_JSON_BYTES where None."""
    limit = MAX_JSON_BYTES if limit is None else limit
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        if (why := _not_input_file(path, os.fstat(fd), limit, what, note)) is not None:
            raise why
        data = f.read(limit + 1)
    if len(data) > limit:  # it grew since
        raise OSError(errno.EFBIG, f"over the {limit >> 20} MiB {what} may hold", str(path))
    return data


def load_json(path: Path | str) -> object:
    """A JSON input file (a run record, a systems json) parsed: OSError where it cannot be read (not a regular
    file or larger than MAX_JSON_BYTES included: `check_json_file`), ValueError where it is not JSON, nesting too
    deep for the parser included (RecursionError, which no caller expects of a file). Never blocks: the file is
    checked before it is opened, and opened without waiting (a pipe put in its place meanwhile is refused too)."""
    check_json_file(path)
    data = read_capped(path)
    try:
        return json.loads(data)  # UTF-8 (a BOM allowed), -16 or -32, as the standard says
    except RecursionError:
        raise ValueError("JSON nested too deeply to parse") from None


@dataclass
class LogReader:
    """The events of one log, line by line. `keys`: read only records with these keys (None: all).

    After iterating: `broken` holds the numbers of MLLOG lines that are not a JSON record (at most 20 kept,
    `n_broken` counts them all), `truncated` whether the last line is such a line cut off without a newline.

    The file is read in blocks of whole lines (`_BLOCK`, one line where a line is longer). With `keys` set, a
    block's lines are sorted in a few array operations (`_sort_lines`) into those the per-line rule (`_line`)
    would skip unparsed, which are only counted, those holding a wanted key in the standard form, which are
    parsed, and the rest, which go through `_line`: the same records, line numbers and broken lines as reading
    every line with `_line`, in time close to a plain read of the file. Lines for `take` of a layout it learned
    are read in a batch a block (`Take`, `_Layout`); where they were most of the last block, before the others
    are sorted (`_sort`).
    """

    path: Path
    keys: frozenset[str] | None = None
    broken: list[int] = field(default_factory=list)
    n_broken: int = 0
    truncated: bool = False
    lines: int = 0
    take: Take | None = None  # records taken without an Event (the analysis: a big log's per-step records)
    _learned: tuple[Take, _Layout | None] | None = field(default=None, init=False, repr=False, compare=False)
    _dense: bool = field(default=False, init=False, repr=False, compare=False)  # the last block mostly batch rows
    _keys: frozenset[str] | None = field(default=None, init=False, repr=False, compare=False)
    _wanted_b: frozenset[bytes] = field(default=frozenset(), init=False, repr=False, compare=False)

    def __iter__(self) -> Iterator[Event]:
        # Lines end as Python's universal newlines end them, as the official tools read a log (text mode): at \n,
        # \r\n or a lone \r (old Mac line ends, whose records mlbench read as one broken line).
        with open(self.path, "rb") as f:
            n = 0  # lines before the block
            while True:
                data = f.read(_BLOCK)
                cut = _last_line_end(data, whole=len(data) < _BLOCK)
                if not cut:  # the file's last line, cut off without a newline, or a line longer than a block
                    if len(data) < _BLOCK:
                        if data:
                            n += 1
                            if (event := self._line(data, n, complete=False)) is not None:
                                yield event
                        break
                    f.seek(-len(data), 1)
                    raw, complete = _long_line(f)
                    n += 1
                    if (event := self._line(raw, n, complete)) is not None:
                        yield event
                    continue
                if cut < len(data):
                    f.seek(cut - len(data), 1)  # the next block starts with the line cut here
                if data.find(b"\r", 0, cut) >= 0:  # (CRLF or lone CR line ends: as \n, one line each)
                    data = data[:cut].replace(b"\r\n", b"\n").replace(b"\r", b"\n")
                    cut = len(data)
                n = yield from self._block(data, cut, n)
            self.lines = n

    def _block(self, data: bytes, cut: int, n: int) -> Generator[Event, None, int]:
        """The events of the whole lines data[:cut], whose first line is line n + 1; returns the last line's
        number."""
        pos = 0
        while pos < cut:
            keys = self.keys
            if keys is None:  # every record: each line parsed (a caller may narrow the keys as it reads)
                end = data.index(b"\n", pos)
                n += 1
                event = self._line(data[pos:end], n)
                pos = end + 1
                if event is not None:
                    yield event
                continue
            count, src, todo, rows = self._sort(data, pos, cut, keys)
            take = self.take
            done, learn, one_by_one = 0, None, 0  # rows handed over; the first record taken one by one, how many
            # The rows of the lines before a line read one by one are handed over before a record of the taker's
            # key, so in order; not before every other line (an eval line every few steps made thousands of calls)
            for i, s, e, d, k, stop in zip(*(x.tolist() for x in todo), strict=True):
                if d:  # a wanted record in the standard form: parsed here, so a taker sees it without an Event
                    record = _parse(src[s + _TOKEN_LEN:e])
                    if take is not None and type(record) is dict and record.get("key") == take.key:
                        done = _hand(take, rows, done, k)
                        if take.record(record, n + i + 1):
                            learn, one_by_one = learn or (s, e), one_by_one + 1
                            continue
                    event = _as_event(record, n + i + 1)
                    if event is None:  # the rule reads it: broken, or a record cut off by another after a second
                        event = self._line(src[s:e], n + i + 1)  # token (the rule takes the last, as the checker)
                else:
                    event = self._line(src[s:e], n + i + 1)
                if event is None:
                    continue
                if event.key in keys:
                    if take is not None and event.key == take.key:
                        done = _hand(take, rows, done, k)
                    yield event
                if self.keys is not keys:  # narrowed: the rest of the block sorted again
                    _hand(take, rows, done, k)
                    n, pos = n + i + 1, stop + 1
                    break
            else:
                _hand(take, rows, done, len(rows))
                n, pos = n + count, cut
            self._dense = 2 * len(rows) > count
            if learn is not None and take.fields and take.rows and one_by_one > len(rows):  # (another) layout
                self._learned = take, _layout(src[learn[0]:learn[1]], take.key, take.fields)
        return n

    def _sort(self, data: bytes, pos: int, cut: int, keys: frozenset[str]) \
            -> tuple[int, bytes, tuple[np.ndarray, ...], np.ndarray]:
        """The whole lines data[pos:cut] sorted: (how many, SRC, the lines to read one by one, the rows of those
        read in a batch). The lines to read: arrays (index from pos, start and end in SRC, direct (`_sort_lines`),
        how many batch rows come before it, its newline in DATA).

        Where the last block's lines were mostly of the layout learned (`_Layout`), every line is tried against it
        first, and the others, copied into a SRC of their own, are sorted: the sorting's passes over the bytes then
        cover just them. Otherwise the block is sorted (SRC: DATA) and its direct lines tried."""
        wanted, take, known = self._wanted(keys), self.take, self._learned
        layout = known[1] if _BATCHES and take is not None and take.key in keys and known is not None \
            and known[0] is take else None
        if layout is not None and self._dense:
            stops = np.flatnonzero(np.frombuffer(data, np.uint8, cut - pos, pos) == 0x0A) + pos
            starts = np.empty_like(stops)
            starts[0] = pos
            starts[1:] = stops[:-1] + 1
            fast, rows = self._batch(_runs(data, pos, cut, starts, stops), np.arange(len(stops)), layout, take)
            rest = np.ones(len(stops), bool)
            rest[fast] = False
            rest = np.flatnonzero(rest)
            if not len(rest):
                return len(stops), data, (rest,) * 6, rows
            src = b"\n".join([data[s:e] for s, e in zip(starts[rest].tolist(), stops[rest].tolist(), strict=True)])
            src += b"\n"
            _, (index, s, e, direct) = _sort_lines(src, 0, len(src), wanted)
            index = rest[index]
            return len(stops), src, (index, s, e, direct, np.searchsorted(fast, index), stops[index]), rows
        count, (index, s, e, direct) = _sort_lines(data, pos, cut, wanted)
        if layout is None or not direct.any():
            return count, data, (index, s, e, direct, np.zeros_like(index), e), _NO_ROWS
        fast, rows = self._batch(_runs(data, pos, cut, s, e), np.flatnonzero(direct), layout, take)
        slow = np.ones(len(index), bool)
        slow[fast] = False
        return count, data, (index[slow], s[slow], e[slow], direct[slow], np.searchsorted(fast, np.flatnonzero(slow)),
                             e[slow]), rows

    @staticmethod
    def _batch(runs: _Runs, which: np.ndarray, layout: _Layout, take: Take) -> tuple[np.ndarray, np.ndarray]:
        """Of the lines WHICH of RUNS, those of LAYOUT that TAKE takes (read in a batch), and their rows."""
        fast, rows = layout.rows(runs, which)
        if take.keep is not None and len(rows) and not (kept := take.keep(rows)).all():
            fast, rows = fast[kept], rows[kept]  # the others read one by one, so RECORD refuses them with their line
        return fast, rows

    def _wanted(self, keys: frozenset[str]) -> frozenset[bytes]:
        if keys is not self._keys:
            self._keys, self._wanted_b = keys, frozenset(k.encode() for k in keys)
        return self._wanted_b

    def _line(self, raw: bytes, n: int, complete: bool = True) -> Event | None:
        """The per-line rule: line N (without its newline) as an event, None where it holds no wanted record.

        A line of a key the caller does not read is skipped unparsed only where its key cannot be misread:
        it holds `"key"` once (not also inside the metadata, say) and no backslash (an escape can spell a key).
        A line this does not match, whatever its spacing or field order, is parsed."""
        i = raw.rfind(TOKEN_B)  # the record after the last token, as the official tools read a line (re.sub(".*"
        if i < 0:  # + TOKEN, TOKEN, line)): a rank's record cut off by another's on the same line is not read
            return None
        payload = raw[i + _TOKEN_LEN:]
        keys = self.keys
        if keys is not None:
            m = _KEY.search(payload)
            if m is not None and m.group(1) not in self._wanted(keys) and b"\\" not in payload \
                    and payload.count(b'"key"') == 1:
                return None
        event = _event(payload, n)
        if event is None:
            self._broken(n, complete)
            return None
        return event if keys is None or event.key in keys else None

    def _broken(self, n: int, complete: bool) -> None:
        self.n_broken += 1
        if len(self.broken) < 20:
            self.broken.append(n)
        self.truncated = not complete  # only a file's last line can end without a newline

    def problems(self) -> list[str]:
        """What was wrong with the file's lines, in words (empty for a clean log)."""
        if not self.n_broken:
            return []
        last = self.broken[-1]
        if self.truncated and self.n_broken == 1:
            return [f"truncated: the last line ({last}) is cut off"]
        shown = ", ".join(map(str, self.broken[:5])) + (" ..." if self.n_broken > 5 else "")
        return [f"{self.n_broken} line(s) with broken JSON skipped (line {shown})"]


def _hand(take: Take | None, rows: np.ndarray, done: int, upto: int) -> int:
    """Hands TAKE the batch rows done..UPTO not handed yet; returns UPTO."""
    if upto > done:
        take.rows(rows[done:upto])
    return max(done, upto)


def _last_line_end(data: bytes, whole: bool) -> int:
    """Where DATA's last whole line ends (after its \\n, or a lone \\r); 0 where none does. Unless DATA is WHOLE
    (the file's end), a \\r that is its last byte may be the first half of a \\r\\n the next read begins with: the
    line before it is the last whole one."""
    lf, cr = data.rfind(b"\n"), data.rfind(b"\r")
    if cr == len(data) - 1 and not whole:
        cr = data.rfind(b"\r", 0, cr)
    return max(lf, cr) + 1


def _long_line(f: BinaryIO) -> tuple[bytes, bool]:
    """The line at F's position, longer than a block, without its line end (\\n, \\r\\n or a lone \\r), F left at
    the next one; and whether it ended (False: the file's last line, without one)."""
    raw = f.readline()  # (through \n: a \r before it, but that of its \r\n, is a lone one, the line's end)
    cr = raw.find(b"\r")
    if cr >= 0 and not (cr == len(raw) - 2 and raw.endswith(b"\r\n")):
        f.seek(cr + 1 - len(raw), 1)
        return raw[:cr], True
    if raw.endswith(b"\n"):
        return raw[:-1], True
    return raw, False


# What the official tools strip from a line (they read it as Latin-1 and call str.strip()): ASCII whitespace and
# the Latin-1 bytes Python counts as whitespace. A run_stop line ending in a no-break space (0xA0) was broken JSON
# here, 'no run_stop', while both official tools counted the run.
_SPACE = b" \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f\x85\xa0"


def _event(payload: bytes, line: int) -> Event | None:
    event = _as_event(_parse(payload), line)
    if event is None and payload[-1:] and payload[-1] in _SPACE:
        event = _as_event(_parse(payload.rstrip(_SPACE)), line)
    return event


def whole_record(raw: bytes, line: int) -> Event | None:
    """Line LINE (without its newline) as an event if it is exactly one record, as mlbench writes them: the token
    at its start, then one JSON object with a key and nothing after it. None otherwise (a line a full disk cut
    short and the next one ran into: the JSON does not parse, whatever strings it holds)."""
    if not raw.startswith(TOKEN_B):
        return None
    return _event(raw[_TOKEN_LEN:], line)


# 20 digits in a row: maybe an integer beyond 64 bits, which orjson reads as a float (10^29 as
# 99999999999999991433150857216) where the official tools' json keeps it exact. Found as 20 zeros once every digit
# is a zero: a tenth of the time of the regular expression [0-9]{20}, which tried every place of the line
_ZEROS = bytes.maketrans(b"123456789", b"000000000")
_LONG_DIGITS = b"0" * 20


def _parse(payload: bytes) -> object:
    if _LONG_DIGITS not in payload.translate(_ZEROS):
        try:  # orjson: 4x the standard parser on MLLOG lines; what it refuses (NaN, Infinity, bad UTF-8) json reads
            return orjson.loads(payload)
        except orjson.JSONDecodeError:
            pass
    return _loads(payload)


def _as_event(d: object, line: int) -> Event | None:
    """A parsed line as an event; None where it is not a record (broken JSON, no string key)."""
    if type(d) is not dict or type(key := d.get("key")) is not str:
        return None
    md, kind = d.get("metadata"), d.get("event_type", "")
    return Event(key, d.get("value"), md if md is not None else {}, d.get("time_ms"), line,
                 kind if type(kind) is str else str(kind))


def _loads(payload: bytes) -> object:
    """The standard parser, as MLPerf's own tools read a log (NaN and Infinity allowed), on the line decoded as
    UTF-8 with bad bytes replaced (given bytes, json guesses UTF-16 from a NUL); None for broken JSON, nesting too
    deep to parse included."""
    try:
        return json.loads(payload.decode("utf-8", errors="replace"))
    except (ValueError, RecursionError):
        return None


def holds_token(path: Path | str) -> bool:
    """Whether PATH holds a `:::MLLOG ` token anywhere (read until the first one): a file with none is no MLPerf
    result log, whatever its verdict would be."""
    with open(path, "rb") as f:
        tail = b""
        while block := f.read(_BLOCK):
            if TOKEN_B in (seen := tail + block):
                return True
            tail = seen[1 - _TOKEN_LEN:]
    return False


def read(path: Path | str) -> list[dict]:
    """Every record of a (small) log as the dict it was logged as: for our own logs, which the run writes."""
    return [e.as_dict() for e in LogReader(Path(path))]


_STEPS_OPEN = b' "steps": [\n'  # a record's per-step rows as results.record_text writes them: a row a line


# While records_read_once: each run record read, by its path and file (identity, size, time): what it parsed to, or
# what reading it raised.
_read_once: dict[tuple, object] | None = None


@contextlib.contextmanager
def records_read_once() -> Iterator[None]:
    """Within it, each run record is read once while its file stays the same: compare read a run's record for its
    variant, devices, quality target, rules, MFU, prediction and features, parsing it each time (0.2 s each for an
    18 MiB record). A command's span, not longer: a record changed meanwhile is read again."""
    global _read_once
    outer = _read_once
    _read_once = {} if outer is None else outer
    try:
        yield
    finally:
        _read_once = outer


def load_record(path: Path | str) -> object:
    """A run record as `_load_record` reads it; within records_read_once, read once (the same object each time:
    its readers do not change it), its step rows left out as `_load_record` leaves out a long run's (no reader uses
    them: memory for a set of long runs' records held at once)."""
    key = None
    if _read_once is not None:
        with contextlib.suppress(OSError):  # none there: read as it is, raising what reading it raises
            st = os.stat(path)
            key = (os.path.abspath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if key is None:
        return _load_record(path)
    if key not in _read_once:
        try:
            record = _load_record(path)
            if isinstance(record, dict) and isinstance(record.get("steps"), list):
                record["steps"] = []
            _read_once[key] = record
        except (OSError, ValueError) as e:
            _read_once[key] = e
    got = _read_once[key]
    if isinstance(got, OSError | ValueError):
        raise got
    return got


def _load_record(path: Path | str) -> object:
    """A run record parsed as `load_json` parses it; one over MAX_JSON_BYTES (a long run's: its per-step rows, about
    190 bytes each, passed 64 MiB at about 345,000 steps, and its own run was then read as one without a record:
    judged by the closed rules, its devices unknown) is read without those rows, "steps" as [], where mlbench wrote
    them a row a line (results.record_text) and the rest holds no more than MAX_JSON_BYTES. No reader of a record
    uses its steps."""
    try:
        return load_json(path)
    except OSError as e:
        if e.errno != errno.EFBIG:
            raise
        over = e
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    kept, size, skipping = [], 0, False
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise over
        for line in f:
            if skipping and line.startswith(b"  {"):
                continue
            if skipping:  # the rows end: ' ]' and what followed them on the line
                if not line.startswith(b" ]"):
                    raise over
                line, skipping = b' "steps": []' + line[2:], False
            elif line == _STEPS_OPEN:
                skipping = True
                continue
            size += len(line)
            if size > MAX_JSON_BYTES:
                raise over
            kept.append(line)
    try:
        return json.loads(b"".join(kept))
    except RecursionError:
        raise ValueError("JSON nested too deeply to parse") from None


# --- fields, checked where read ---------------------------------------------------------------------------

def is_number(value: object) -> bool:
    """Whether a parsed JSON value is a finite number: an int or float (not bool), not inf or nan, an int a float
    can hold (so arithmetic on it never overflows: math.isfinite(10**400) raises)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return math.isfinite(value) if isinstance(value, float) else -(2.0**1023) < value < 2.0**1023


def number(path: Path | str, event: Event, name: str, value: object, *, positive: bool = False,
           integer: bool = False) -> float:
    """A finite number (int or float, not bool) from a log field, or BadField naming file, line and key."""
    ok = is_number(value)
    if ok and positive:
        ok = value > 0
    if ok and integer:
        ok = float(value).is_integer()
    if not ok:
        want = "a finite " + ("positive " if positive else "") + ("integer" if integer else "number")
        raise BadField(path, event, name, value, want)
    return value


# The longest text a log field that analysis shows may hold (a status, an organisation, a benchmark): a status of
# 10 million characters was printed whole (91 MB of output, 932 MB of memory).
MAX_TEXT = 256


def text(path: Path | str, event: Event, name: str, value: object) -> str:
    """A string from a log field, at most MAX_TEXT characters, or BadField."""
    if not isinstance(value, str):
        raise BadField(path, event, name, value, "a string")
    if len(value) > MAX_TEXT:
        raise BadField(path, event, name, value, f"a string of at most {MAX_TEXT} characters (it has {len(value):,})")
    return value


def metadata(path: Path | str, event: Event) -> dict:
    """The metadata object of a record, or BadField (a list or a number where MLPerf logs an object)."""
    if not isinstance(event.metadata, dict):
        raise BadField(path, event, "metadata", event.metadata, "an object")
    return event.metadata


# --- time to train ------------------------------------------------------------------------------------------

def time_to_train_s(start_ms: float | None, stop_ms: float | None) -> float | None:
    """Seconds from run_start to run_stop, as MLPerf scores it. None when either is missing
    or run_stop is not after run_start (no time to train: a run of no length, or one that stopped before it
    started, never counts as a success)."""
    if start_ms is None or stop_ms is None or stop_ms <= start_ms:
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
            times[e.key] = number(path, e, "time_ms", e.time_ms)  # as the official summarizer: each replaces the
            if len(times) == 2:  # one before until both are there
                break
    except BadField:
        return None
    return time_to_train_s(times.get("run_start"), times.get("run_stop"))
