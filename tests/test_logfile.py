"""The one MLPerf log reader: streaming, key filtering, broken lines, fields checked where read, time to train."""

from __future__ import annotations

import json
import tracemalloc

import pytest
from test_analysis_logs import _line, tiny_log

from mlbench import mlperf_log
from mlbench.analysis.logs import read_log
from mlbench.logfile import BadField, Event, LogReader, log_time_to_train, number, read, time_to_train_s


def test_events_with_line_numbers_and_key_filter(tmp_path):
    f = tmp_path / "result_0.txt"
    f.write_text("banner, not a record\n" + tiny_log(steps=3) + "[rank 3] :::MLLOG not json\n")
    events = list(LogReader(f))
    assert events[0].key == "submission_benchmark" and events[0].line == 2
    assert [e.key for e in events].count("tracked_stats") == 3
    r = LogReader(f, keys=frozenset({"run_start", "run_stop"}))
    assert [(e.key, e.line) for e in r] == [("run_start", 8), ("run_stop", 13)]
    assert r.n_broken == 1 and r.broken == [14] and not r.truncated
    assert read(f) == mlperf_log.read(f) and read(f)[0]["value"] == "llama31_8b"  # the training side's view


def test_a_cut_last_line_is_reported_as_truncated(tmp_path):
    f = tmp_path / "result_0.txt"
    f.write_text(tiny_log() + ':::MLLOG {"key": "run_st')
    r = LogReader(f)
    list(r)
    assert r.problems() == [f"truncated: the last line ({tiny_log().count(chr(10)) + 1}) is cut off"]


def test_fields_are_checked_where_read(tmp_path):
    e = Event("global_batch_size", float("nan"), {}, 1.0, 7)
    with pytest.raises(BadField, match=r"^f.txt:7: global_batch_size is NaN, expected a finite positive integer$"):
        number("f.txt", e, "value", e.value, positive=True, integer=True)
    for bad in (True, "8", [8], 10**400, float("inf"), None):
        with pytest.raises(BadField):
            number("f.txt", e, "value", bad)
    assert number("f.txt", e, "value", 8, positive=True, integer=True) == 8


def test_time_to_train_from_the_first_run_start_and_run_stop(tmp_path):
    f = tmp_path / "result_0.txt"
    f.write_text(tiny_log(steps=5, step_s=0.5) + _line("run_stop", 1_800_000_000_000, None, status="success"))
    assert log_time_to_train(f) == pytest.approx(2.51)  # the first run_stop counts
    assert time_to_train_s(None, 5.0) is None and time_to_train_s(5.0, 4.0) is None
    assert log_time_to_train(tmp_path / "missing.txt") is None


def test_reading_holds_a_few_lines_not_the_file(tmp_path):
    """A 20 MB log is scored in well under 2 MB of Python memory: the reader streams (per-step records aside)."""
    f = tmp_path / "result_0.txt"
    with open(f, "w") as out:
        out.write(tiny_log(steps=1, stop=False))
        step = _line("tracked_stats", 1_700_000_002_000, {"train_step_time": 0.5, "pad": "x" * 150}, step=1)
        while out.tell() < 20e6:
            out.write(step)
        out.write(_line("eval_accuracy", 1_700_000_003_000, 3.5, samples_count=80))
        out.write(_line("run_stop", 1_700_000_003_010, None, status="success"))
    tracemalloc.start()
    log = read_log(f, steps=False)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert log.status == "success" and log.samples_to_converge == 80 and log.problems == []
    assert peak < 2e6, f"reading a 20 MB log took {peak / 1e6:.1f} MB"
    assert json.loads(step[len(":::MLLOG "):])["key"] == "tracked_stats"


def test_integers_beyond_64_bits_are_read_exactly(tmp_path):
    """orjson reads them as floats: a global_batch_size of 10^29 was shown as 99999999999999991433150857216."""
    path = tmp_path / "big.txt"
    big = 10**29
    path.write_text(f':::MLLOG {{"key": "global_batch_size", "value": {big}, "metadata": {{}}}}\n'
                    f':::MLLOG {{"key": "seed", "value": 18446744073709551615, "metadata": {{}}}}\n')
    values = [e.value for e in LogReader(path)]
    assert values == [big, 2**64 - 1] and type(values[0]) is int
