"""Per-step lines read in batches (`logfile._Layout`) give the RunLog that reading them one by one gives: the same
rows in the same order, faults, their lines and their order, for every layout and every odd value."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import numpy as np
import pytest

from mlbench import logfile
from mlbench.analysis import step_times
from mlbench.analysis.logs import read_log

DATA = Path(__file__).parent / "data"

# Numbers as logged, odd ones included: what a batch must read as orjson does, or leave to the one-by-one path
_NUMBERS = ["1.5", "0.40031909942626953", "174762.66666666666", "400.0", "3", "-0", "-0.0", "0", "0.0", "1e-05",
            "1.5E+3", "2e5", "1e99", "1e100", "1e999", "-1e999", "1e-400", "123456789012345678",
            "1234567890123456789", "99999999999999999999", "1" * 30, "1" * 400, "0." + "0" * 400 + "1", "01",
            "00.5", "-", "1.", ".5", "1e", "NaN", "Infinity", "-Infinity", "true", "null", '"1.5"', "[1.5]",
            "{}", "1.5.5", "--1", "+1", "1e05", "0x10"]


def _step_line(rnd: random.Random, step: int, t: int) -> str:
    """A per-step record in one of the layouts logs use (mlbench's, NVIDIA's, fields in another order), now and
    then with an odd number, a field missing or twice, or a garbled line."""
    def num(usual: str) -> str:
        return rnd.choice(_NUMBERS) if rnd.random() < 0.08 else usual
    value = {"train_step_time": num(f"{rnd.uniform(0.1, 2):.{rnd.randint(1, 17)}f}"),
             "reduced_train_loss": num(repr(rnd.uniform(1, 12))), "tokens_per_s": num(repr(rnd.uniform(1e5, 1e6))),
             "tflops_per_device": num(f"{rnd.uniform(100, 900):.1f}")}
    md = {"file": "/workspace/llm/callback_logging.py", "lineno": num("328"), "step": num(str(step)),
          "samples_count": num(str(step * 2048))}
    layout = rnd.choice(["mlbench", "nvidia", "nvidia", "perf", "order"])
    if layout == "nvidia":
        value = {k: value[k] for k in ("train_step_time", "reduced_train_loss")}
        md = {k: md[k] for k in ("file", "lineno", "step")}
    elif layout == "perf":
        value = {"train_step_time": value["train_step_time"], "train_loss": "3.1", "lr": num("0.001"),
                 "tokens_per_s": value["tokens_per_s"], "tflops_per_device": value["tflops_per_device"]}
    elif layout == "order":
        value = dict(reversed(value.items()))
        md = {"step": md["step"], "file": md["file"]}
    if rnd.random() < 0.03:  # a field missing
        (d := rnd.choice([value, md])).pop(rnd.choice(list(d)))
    def obj(d: dict) -> str:
        items = [f'"{k}": {v if k != "file" else json.dumps(v)}' for k, v in d.items()]
        if rnd.random() < 0.02:  # a key twice, with another value: the last one counts
            k = next(iter(d))
            items.append(f'"{k}": {json.dumps("/x.py") if k == "file" else num("2.5")}')
        return "{" + ", ".join(items) + "}"
    line = (f':::MLLOG {{"namespace": "", "time_ms": {num(str(t))}, "event_type": "POINT_IN_TIME", '
            f'"key": "tracked_stats", "value": {obj(value)}, "metadata": {obj(md)}}}')
    r = rnd.random()
    if r < 0.01:
        line = line[:rnd.randrange(len(line))]  # cut off
    elif r < 0.02:
        line = line.replace("train_step_time", "train_step_\\u0074ime")  # an escape: read by the per-line rule
    elif r < 0.03:
        line = "0: " + line  # a rank prefix
    return line + "\n"


def _log(path: Path, seed: int, steps: int) -> None:
    rnd = random.Random(seed)
    head = [("submission_benchmark", '"llama31_8b"'), ("submission_org", '"x"'), ("global_batch_size", "16"),
            ("max_sequence_length", "8192"), ("opt_base_learning_rate", "0.001")]
    lines = [f':::MLLOG {{"namespace": "", "time_ms": 1, "event_type": "POINT_IN_TIME", "key": "{k}", "value": {v}, '
             f'"metadata": {{"file": "a.py", "lineno": 1}}}}\n' for k, v in head]
    lines.append(':::MLLOG {"namespace": "", "time_ms": 1000, "event_type": "INTERVAL_START", "key": "run_start", '
                 '"value": null, "metadata": {"file": "a.py", "lineno": 1}}\n')
    t = 1000
    for step in range(1, steps):
        t += rnd.randint(1, 2000)
        lines.append(_step_line(rnd, step, t))
        if step % 50 == 0:
            lines.append(f':::MLLOG {{"namespace": "", "time_ms": {t}, "event_type": "POINT_IN_TIME", '
                         f'"key": "eval_accuracy", "value": {4 - step / 1e4}, "metadata": '
                         f'{{"file": "a.py", "lineno": 1, "samples_count": {step * 16}}}}}\n')
    lines.append(f':::MLLOG {{"namespace": "", "time_ms": {t + 1}, "event_type": "INTERVAL_END", "key": "run_stop", '
                 '"value": null, "metadata": {"file": "a.py", "lineno": 1, "status": "success"}}\n')
    path.write_text("".join(lines))


def _both(path: Path, monkeypatch) -> tuple[tuple, tuple, int]:
    """The RunLog read with batches and one by one (every field, the rows as bytes: NaN and -0.0 as they are),
    and how many rows came in batches."""
    batched = []
    add_rows = step_times.Tracked.add_rows
    monkeypatch.setattr(step_times.Tracked, "add_rows",
                        lambda self, rows: (batched.append(len(rows)), add_rows(self, rows)))
    runs = []
    for on in (True, False):
        monkeypatch.setattr(logfile, "_BATCHES", on)
        r = read_log(path)
        runs.append(({f.name: getattr(r, f.name) for f in dataclasses.fields(r) if f.name != "tracked"},
                     np.stack(r.tracked.columns()).tobytes()))
    return runs[0], runs[1], sum(batched)


@pytest.mark.parametrize("block", [4096, 6000, 1 << 19])
def test_batches_read_what_one_by_one_reads(tmp_path, monkeypatch, block):
    """Well-formed steps in several layouts mixed with odd numbers (NaN, Infinity, bool, string, huge, leading
    zeros), missing and repeated fields and garbled lines, blocks splitting lines: the same RunLog either way."""
    monkeypatch.setattr(logfile, "_BLOCK", block)
    f = tmp_path / "result_0.txt"
    total = 0
    for seed in range(6):
        _log(f, seed, 3000 if block < 1 << 19 else 6000)
        got, want, batched = _both(f, monkeypatch)
        assert got == want, seed
        assert want[0]["problems"], seed  # the odd values were reported
        total += batched
    assert total > 1000  # the batches were used


def test_batches_on_published_logs(monkeypatch):
    """Published logs (NVIDIA's layouts, rank prefixes), in small blocks so that their layouts are learned."""
    monkeypatch.setattr(logfile, "_BLOCK", 4096)
    for f in sorted(DATA.rglob("result_*.txt")):
        got, want, _ = _both(f, monkeypatch)
        assert got == want, f
