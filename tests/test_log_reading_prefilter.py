"""The reader skips lines of keys it does not need without parsing them: it must never skip a needed one."""

from __future__ import annotations

import json
import random

import pytest
from test_analysis_logs import tiny_log

from mlbench import logfile
from mlbench.analysis.logs import read_log
from mlbench.logfile import LogReader

KEYS = frozenset({"run_start", "run_stop"})


def _write(tmp_path, extra: str):
    f = tmp_path / "result_0.txt"
    f.write_text(tiny_log(steps=2, stop=False) + extra)
    return f


def test_a_needed_key_in_unusual_form_is_never_skipped(tmp_path):
    """Other spacing, the key last, an unwanted "key" inside the metadata before the real one, an escaped name:
    each is the run_stop record, and each is read."""
    body = {"time_ms": 1_700_000_009_000, "event_type": "INTERVAL_END", "value": None}
    forms = [
        ':::MLLOG {"key" :"run_stop", ' + json.dumps(body)[1:-1] + ', "metadata": {"status": "success"}}',
        ":::MLLOG " + json.dumps({**body, "metadata": {"key": "tracked_stats", "status": "success"},
                                  "key": "run_stop"}),
        ':::MLLOG {"key": "run\\u005fstop", ' + json.dumps(body)[1:-1] + ', "metadata": {"status": "success"}}',
        ':::MLLOG {"metadata": {"status": "success"}, ' + json.dumps(body)[1:-1] + ',"key":"run_stop"}',
    ]
    for form in forms:
        f = _write(tmp_path, form + "\n")
        assert [e.key for e in LogReader(f, keys=KEYS)] == ["run_start", "run_stop"], form
        log = read_log(f)
        assert log.run_stop_ms == 1_700_000_009_000 and log.logged_status == "success", form


def test_a_garbled_needed_field_in_unusual_form_is_named(tmp_path):
    """The fast path does not hide a bad value: the file, line and key are named."""
    f = _write(tmp_path, ':::MLLOG {"metadata": {"key": "tracked_stats", "status": "success"}, '
                         '"time_ms": NaN, "key" : "run_stop"}\n')
    n = f.read_text().count("\n")
    log = read_log(f)
    assert log.invalid
    assert any(p.startswith(f"{f}:{n}: run_stop time_ms is NaN, expected a finite number") for p in log.problems)


def test_unwanted_keys_are_still_skipped_and_broken_lines_found(tmp_path):
    f = _write(tmp_path, ":::MLLOG {broken\n")
    r = LogReader(f, keys=KEYS)
    assert [e.key for e in r] == ["run_start"]
    assert r.n_broken == 1 and r.broken == [f.read_text().count("\n")]


# --- the block reader against the per-line rule ---------------------------------------------------------------

def _variants(rnd: random.Random) -> bytes:
    """One line: mostly a standard record, else one of the forms the block sorter must hand to the per-line rule."""
    key = rnd.choice(["run_start", "run_stop", "tracked_stats", "eval_accuracy", "block_start", "x" * 70, "run"])
    rec = json.dumps({"namespace": "", "time_ms": rnd.randint(0, 10**13), "event_type": "POINT_IN_TIME",
                      "key": key, "value": rnd.choice([None, 1.5, "s", {"a": 1}]), "metadata": {"lineno": 3}})
    forms = [
        lambda r: r,
        lambda r: r.replace('"key": ', '"key" :'),  # other spacing
        lambda r: json.dumps({"metadata": {"key": "tracked_stats"}, "key": key, "time_ms": 1}),  # a second "key"
        lambda r: r.replace(key, key.replace("_", "\\u005f"), 1),  # an escaped name
        lambda r: r[:rnd.randint(0, len(r))],  # cut off
        lambda r: r.replace('"key": "', '"key": "key"key": "'),  # overlapping "key"s
        lambda r: r.replace("1.5", "NaN"),
        lambda r: r.replace('"key"', '"kez"'),
        lambda r: '{"key": "' + key,  # a name without its closing quote
        lambda r: r.replace('"s"', '"\xff"'),  # bad UTF-8 below
        lambda r: r.replace('"key": "' + key + '"', '"key": 5'),
        lambda r: r.replace('"lineno"', '"' + "y" * rnd.randint(0, 300) + '"'),
        lambda r: r[:rnd.randint(0, len(r))] + ":::MLLOG " + r,  # another rank's record cut off by this one
    ]
    line = rnd.choice(forms)(rec) if rnd.random() < 0.3 else rec
    prefix = rnd.choice(["", "", "", "", "0: ", "x:::MLLOG ", "\\"])
    token = rnd.choice([":::MLLOG "] * 8 + ["", ":::MLLOG"])
    text = prefix + token + line + rnd.choice(["\n"] * 8 + ["\r\n", "\n\n"])
    return text.encode("latin-1", "replace") if "\xff" in text else text.encode()


def _per_line(path, keys):
    """What reading each line with the per-line rule gives: events, broken lines, truncated, lines."""
    r = LogReader(path, keys=keys)
    data = path.read_bytes()
    lines = data.split(b"\n")
    complete = [True] * (len(lines) - 1) + [False]
    if lines[-1] == b"":
        lines, complete = lines[:-1], complete[:-1]
    events = [e for n, (raw, c) in enumerate(zip(lines, complete, strict=True), 1)
              if (e := r._line(raw, n, c)) is not None]
    return [e.as_dict() | {"line": e.line} for e in events], r.broken, r.n_broken, r.truncated, len(lines)


@pytest.mark.parametrize("block", [128, 200, 1000, 1 << 19])
def test_block_reader_reads_what_the_per_line_rule_reads(tmp_path, monkeypatch, block):
    """Blocks of whole lines sorted by array operations: the same events, line numbers, broken lines and
    truncation as the per-line rule on every line, for standard lines, odd ones and lines across blocks."""
    monkeypatch.setattr(logfile, "_BLOCK", block)
    f = tmp_path / "result_0.txt"
    for seed in range(25):
        rnd = random.Random(seed)
        data = b"".join(_variants(rnd) for _ in range(rnd.randint(1, 200)))
        f.write_bytes(data if seed % 3 else data.rstrip(b"\n"))
        for keys in (frozenset({"run_start", "run_stop"}), frozenset({"tracked_stats", "x" * 70}), frozenset()):
            r = LogReader(f, keys=keys)
            got = [e.as_dict() | {"line": e.line} for e in r]
            assert (got, r.broken, r.n_broken, r.truncated, r.lines) == _per_line(f, keys), (seed, keys)
