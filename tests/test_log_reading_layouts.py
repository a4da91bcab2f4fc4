"""Big logs, as most are: one layout of per-step line nearly throughout. Those lines are tried against the layout
before the rest of a block is sorted (`LogReader._sort`), step-less per-step lines (NVIDIA's) are read in batches
too, and the step times come from compact columns: always the RunLog and step times that reading every line one
by one gives."""

from __future__ import annotations

import dataclasses
import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
from test_log_reading_batch import _NUMBERS

from mlbench import logfile
from mlbench.analysis import step_times
from mlbench.analysis.logs import read_log


def _record(t: object, key: str, value: object, md: dict) -> str:
    return ":::MLLOG " + json.dumps({"namespace": "", "time_ms": t, "event_type": "POINT_IN_TIME", "key": key,
                                     "value": value, "metadata": md})


def _big_log(path: Path, seed: int, steps: int, step_less: bool = False) -> None:
    """A log of one per-step layout (ours, or NVIDIA's without a step), now and then another line: a block or eval
    line, a line of another key, a per-step line of another layout or with an odd number, a garbled line."""
    rnd = random.Random(seed)
    head = [("submission_benchmark", "llama31_8b"), ("submission_org", "x"), ("global_batch_size", 16),
            ("max_sequence_length", 8192), ("opt_base_learning_rate", 0.001)]
    lines = [_record(1, k, v, {"file": "a.py", "lineno": 1}) for k, v in head]
    lines.append(_record(1000, "run_start", None, {"file": "a.py", "lineno": 1}))
    t = 1000
    time_key = "train_step_timing in s" if step_less and seed % 2 else "train_step_time"
    for step in range(1, steps):
        t += rnd.randint(500, 1500)
        value = {time_key: round(rnd.uniform(0.1, 2), rnd.randint(1, 17)), "reduced_train_loss": rnd.uniform(1, 12)}
        md = {"file": "/workspace/llm/callback_logging.py", "lineno": 328}
        if step_less:
            md["samples_count"] = step * 16
        else:
            value |= {"tokens_per_s": rnd.uniform(1e5, 1e6), "tflops_per_device": round(rnd.uniform(100, 900), 1)}
            md["step"] = step
        line = _record(t, "tracked_stats", value, md)
        r = rnd.random()
        if r < 0.01:  # an odd number where a number was
            line = line.replace(str(md.get("step", step * 16)) + "}", rnd.choice(_NUMBERS) + "}")
        elif r < 0.015:
            line = line[:rnd.randrange(len(line))]  # cut off
        elif r < 0.02:
            line = _record(t, "tracked_stats", {"reduced_train_loss": 1.5}, md)  # no step time: passed over
        elif r < 0.025:
            line = _record(t, "tracked_stats", dict(reversed(value.items())), md)  # another layout
        elif r < 0.03:
            line = "0: " + line  # a rank prefix
        elif r < 0.035 and not step_less:
            line = _record(t, "tracked_stats", value, {**md, "step": -1.5})  # a step that goes back: dropped later
        lines.append(line)
        if step % 37 == 0:
            md = {"file": "a.py", "lineno": 1, "samples_count": step * 16}
            lines += [_record(t, "block_stop", None, md), _record(t, "eval_start", None, md),
                      _record(t + 1, "eval_accuracy", 4 - step / 1e4, md), _record(t + 2, "eval_stop", None, md),
                      _record(t + 3, "block_start", None, {**md, "epoch_count": 37 * 16})]
    lines.append(_record(t + 5, "run_stop", None, {"file": "a.py", "lineno": 1, "status": "success"}))
    path.write_text("\n".join(lines) + "\n")


def _both(path: Path, monkeypatch) -> tuple[tuple, tuple, int, int]:
    """The RunLog read with batches and one by one (every field, the step columns as bytes), how many rows came in
    batches, and in how many blocks every line was tried against the layout first."""
    batched, dense = [], []
    add_rows = step_times.Tracked.add_rows
    monkeypatch.setattr(step_times.Tracked, "add_rows",
                        lambda self, rows: (batched.append(len(rows)), add_rows(self, rows)))
    sort = logfile.LogReader._sort
    monkeypatch.setattr(logfile.LogReader, "_sort", lambda self, *a: (dense.append(self._dense), sort(self, *a))[1])
    runs = []
    for on in (True, False):
        monkeypatch.setattr(logfile, "_BATCHES", on)
        r = read_log(path)
        st = r.step_times
        runs.append(({f.name: getattr(r, f.name) for f in dataclasses.fields(r) if f.name != "tracked"},
                     np.stack(r.tracked.columns()).tobytes(), st.seconds.tobytes(), st.steps.tobytes(),
                     st.tflops_per_device.tobytes(), st.source, st.note))
    return runs[0], runs[1], sum(batched), sum(dense)


@pytest.mark.parametrize("block", [3000, 9000, 60000])
def test_a_log_mostly_of_one_layout_reads_as_line_by_line(tmp_path, monkeypatch, block):
    """Blocks of one per-step layout with other lines among them: once the layout is learned every line is tried
    against it first, the others sorted apart; the same RunLog and step times as one line at a time."""
    monkeypatch.setattr(logfile, "_BLOCK", block)
    f = tmp_path / "result_0.txt"
    for seed in range(3):
        _big_log(f, seed, 3000)
        got, want, batched, dense = _both(f, monkeypatch)
        assert got == want, seed
        assert batched > 2400 and dense, (seed, batched, dense)


def test_step_less_per_step_lines_are_read_in_batches(tmp_path, monkeypatch):
    """NVIDIA's per-step lines count samples, not steps, and some name the time "train_step_timing in s": each
    was read one by one (a 100 MB log of them took 7 times as long as one with steps); in batches, the same
    RunLog."""
    monkeypatch.setattr(logfile, "_BLOCK", 20000)
    f = tmp_path / "result_0.txt"
    for seed in range(2):
        _big_log(f, seed, 2000, step_less=True)
        got, want, batched, _ = _both(f, monkeypatch)
        assert got == want, seed
        assert batched > 1500, (seed, batched)
        assert want[5] == "tracked_stats" and len(np.frombuffer(want[2])) > 1900


def _reference(t: step_times.Tracked, start_ms: float | None, stop_ms: float | None, gbs: int | None,
               seq: int | None) -> step_times.StepTimes | None:
    """from_tracked as it was before its arrays were made one at a time (every array at once, by index)."""
    step, secs, times, tfl = t.columns()
    keep = np.ones(len(secs), dtype=bool)
    if start_ms is not None:
        keep &= times >= start_ms
    if stop_ms is not None:
        keep &= times <= stop_ms
    at = np.flatnonzero(keep)
    s = step[at]
    finite = np.isfinite(s)
    before = np.maximum.accumulate(np.where(finite, s, -np.inf))
    behind = at[1:][finite[1:] & (s[1:] <= before[:-1])]
    keep[behind] = False
    if np.isfinite(step[keep]).any():
        keep &= np.isfinite(step)
    if not keep.any():
        return None
    steps, secs, times = step[keep], secs[keep].copy(), times[keep]
    unit, per = "steps", 1.0
    seq = seq or 1
    if len(steps) > 1 and np.all(np.isfinite(steps)):
        inc = np.diff(steps)
        inc = inc[inc > 0]
        if len(inc) and gbs and gbs > 1:
            d = float(np.median(inc))
            if np.allclose(inc % (gbs * seq), 0) and d >= gbs * seq and seq > 1:
                unit, per = "tokens", float(gbs * seq)
            elif np.allclose(inc % gbs, 0) and d >= gbs:
                unit, per = "samples", float(gbs)
    idx = steps / per
    note = f"tracked_stats; metadata step counts {unit}"
    if len(behind):
        note += (f"; {len(behind)} of {len(at)} records in the timed region left out, their metadata step not above "
                 f"the steps before it (as NVIDIA's block summaries)")
    if len(idx) > 2:
        k = np.diff(idx)
        gap = np.diff(times) / 1000
        multi = k > 1.5
        if multi.any():
            ratio = np.median(gap[multi] / secs[1:][multi])
            kk = np.median(k[multi])
            covers = abs(ratio - 1) < abs(ratio - kk)
            if covers and (secs[1:][multi] / k[multi] < step_times.MIN_STEP_S).any():
                note += (f"; metadata step rises {kk:g} a record, more steps than a record's time can hold (at "
                         f"least {step_times.MIN_STEP_S:g} s a step): times are per record, as logged")
            elif covers:
                secs[1:][multi] = secs[1:][multi] / k[multi]
                note += f"; each record covers {kk:g} steps, divided"
            else:
                note += f"; logged every {kk:g} steps, times are per step"
    tfl = tfl[keep]
    return step_times.StepTimes(secs, "tracked_stats", note, idx, tfl[np.isfinite(tfl)])


def test_step_times_from_columns_are_those_of_the_reference(monkeypatch):
    """from_tracked makes its arrays one or two at a time (a big log's are tens of MB each): the same step times as
    making them all at once, for steps that go back, are not logged, count samples or tokens, cover several steps,
    and records outside the timed region."""
    rnd = random.Random(7)
    divides = step_times._divides
    monkeypatch.setattr(step_times, "_divides", lambda v, by: divides(v, by, chunk=7))  # (across its chunks' seams)
    for case in range(300):
        t = step_times.Tracked()
        n = rnd.choice([0, 1, 2, 3, 5, 40, 400])
        gbs, seq = rnd.choice([(None, None), (1, 1), (16, 1), (16, 8192), (32, 2048)])
        unit = rnd.choice([1, gbs or 1, (gbs or 1) * (seq or 1)])
        every = rnd.choice([1, 1, 4])
        clock, step = 1_000_000.0, 0
        for _ in range(n):
            step += every
            secs = rnd.choice([0.5, 0.25, 1.0 * every, rnd.uniform(0.1, 2)])
            clock += secs * 1000 * (every if rnd.random() < 0.5 else 1)
            logged = step * unit if rnd.random() < 0.9 else rnd.choice([math.nan, 0, step * unit - every * unit])
            t.add(float(logged), secs, clock, 1.0, rnd.choice([400.0, math.nan]))
        start = rnd.choice([None, 1_000_000.0, 1_000_000.0 + 5000])
        stop = rnd.choice([None, clock, clock - 3000])
        got, want = step_times.from_tracked(t, start, stop, gbs, seq), _reference(t, start, stop, gbs, seq)
        assert (got is None) == (want is None), case
        if got is not None:
            assert (got.seconds.tobytes(), got.steps.tobytes(), got.tflops_per_device.tobytes(), got.note) == (
                want.seconds.tobytes(), want.steps.tobytes(), want.tflops_per_device.tobytes(), want.note), case


def test_twenty_digits_in_a_row_are_read_exactly():
    """An integer of 20 digits or more (beyond 64 bits, which orjson reads as a float) is read by the standard
    parser, exactly; 19, or digits apart, by orjson."""
    assert logfile._parse(b'{"v": 100000000000000000001}')["v"] == 100000000000000000001
    assert logfile._parse(b'{"v": -1234567890123456789012345}')["v"] == -1234567890123456789012345
    assert logfile._parse(b'{"v": 1234567890123456789, "w": "0123456789 0123456789"}') == {
        "v": 1234567890123456789, "w": "0123456789 0123456789"}


def test_batch_rows_are_handed_over_once_a_block_between_other_lines(tmp_path, monkeypatch):
    """A log with every kind of line among its per-step lines (block and eval lines every 3 steps, per-step lines of
    another layout, garbled, cut off, escaped, rank-prefixed, with odd numbers): the same RunLog and step times as
    reading every line one by one, and the rows of a block handed over in one call unless a per-step record read
    one by one comes between them (a call before every eval or block line made thousands of calls)."""
    monkeypatch.setattr(logfile, "_BLOCK", 60000)
    f = tmp_path / "result_0.txt"
    rnd = random.Random(7)
    lines = [_record(1, k, v, {"file": "a.py", "lineno": 1}) for k, v in
             [("submission_benchmark", "llama31_8b"), ("global_batch_size", 16), ("max_sequence_length", 8192)]]
    lines.append(_record(1000, "run_start", None, {"file": "a.py", "lineno": 1}))
    t, odd = 1000, 0
    for step in range(1, 3000):
        t += rnd.randint(500, 1500)
        value = {"train_step_time": round(rnd.uniform(0.1, 2), rnd.randint(1, 3)), "tokens_per_s": 1e5,
                 "tflops_per_device": 400.0}
        line = _record(t, "tracked_stats", value, {"file": "/workspace/x.py", "step": step})
        if step % 97 == 0:  # read one by one: another layout, an odd number, garbled, escaped, prefixed
            odd += 1
            line = rnd.choice([_record(t, "tracked_stats", dict(reversed(value.items())), {"step": step}),
                               line.replace(f'"step": {step}', f'"step": {rnd.choice(_NUMBERS)}'),
                               line[:rnd.randrange(len(line))], "0: " + line,
                               line.replace("train_step_time", "train_\\u0073tep_time")])
        lines.append(line)
        if step % 3 == 0:
            md = {"file": "a.py", "lineno": 1, "samples_count": step * 16}
            lines += [_record(t, "block_stop", None, md), _record(t + 1, "eval_accuracy", 4 - step / 1e4, md),
                      _record(t + 3, "block_start", None, {**md, "epoch_count": 48})]
    lines.append(_record(t + 5, "run_stop", None, {"file": "a.py", "lineno": 1, "status": "success"}))
    f.write_text("\n".join(lines) + "\n")
    calls = []
    add_rows = step_times.Tracked.add_rows
    monkeypatch.setattr(step_times.Tracked, "add_rows", lambda self, rows: (calls.append(len(rows)),
                                                                           add_rows(self, rows)))
    got, want, batched, _ = _both(f, monkeypatch)
    assert got == want
    assert batched > 2500 and want[0]["problems"]
    blocks = -(-f.stat().st_size // 60000)
    assert len(calls) <= blocks + odd, (len(calls), blocks, odd)  # (before: one a block or eval line, ~1000)
