"""The reader skips lines of keys it does not need without parsing them: it must never skip a needed one."""

from __future__ import annotations

import json

from test_analysis_logs import tiny_log

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
