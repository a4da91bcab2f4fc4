"""A seeded fuzzer for what analysis and the benchmark registry read: mutated logs, run records, systems json and
benchmark files through the real CLI entry point, in this process.

    python perf/fuzz_inputs.py [--iterations N] [--seed S] [--score-every K] [--check-every K]
                               [--registry-every K] [--keep DIR] [--only analysis|registry|respell]

Each case copies a few real sets (the published logs under ../shared/data/mlperf-results and tests/data, and a
tiny mlbench run's log and record, tests/data/fuzz) into a temporary tree, mutates one to three of its files
(truncated at a random byte, bytes flipped or inserted, NUL bytes, invalid UTF-8, CRLF or CR line ends, a line of
10 MB; lines dropped, duplicated or reordered; in a JSON record a value's type changed to a number, string, list,
dict, null or bool, NaN, Infinity, -0, 1e400, a huge integer or a negative one; a key renamed, an event_type
changed, a time_ms going backwards), then runs `compare --no-score`, `scaling` (each with --json, --md and
--html), and every K-th case `score`, `score --json`, `compare` and `check` (the checker is a process a file).
Every K-th case also mutates a benchmark file (benchmarks/*.yaml) and runs `list`, `show [--tiny] [--json]` and
`run --dry-run` on it. One case in ten (every case with --only respell) is differential: one log's records
respelled (compact JSON, keys reordered, a letter as a \\u escape), the same log to the official tools, and
`compare --json` and `score --json` must not change. A fault is a traceback (any exception that is not the CLI's
own clean exit), an exit code other than 0, 1 or 2, a --json output that is not strict JSON, a warning printed, or
a command over 10 s. Each fault is printed with the case's seed, so `--seed S --iterations 1` replays it; --keep
DIR keeps the trees of failing cases. Exit 1 when any fault was found.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import math
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SLOW_S = 10.0  # a command past this is a fault
HANG_S = 60.0  # a command past this is stopped (SIGALRM) and called a hang

# (org folder, system, benchmark folder): sets read from the published trees; at most 3 runs of each are taken
PUBLISHED = [
    ("shared", "training_results_v4.1/Google", "cloud-tpu-trillium-1024-maxtext", "gpt3"),
    ("shared", "training_results_v4.1/NVIDIA", "eos_n32_ngc24.09_nemo", "gpt3"),
    ("shared", "training_results_v5.0/NVIDIA", "eos-dfw_n64_ngc25.01_nemo", "llama31_405b"),
    ("shared", "training_results_v5.1/Nebius", "nebius_h200_n64", "llama31_405b"),
    ("tests", "mlperf-results/training_results_v5.1/University-of-Florida", "hpg.dgxb200x8.n32", "llama31_8b"),
    ("shared", "training_results_v5.1/NVIDIA", "theia_ngpu512_ngc25.09_nemo", "llama31_405b"),
    ("shared", "training_results_v5.0/NVIDIA", "tyche_ngpu8_ngc25.04_pytorch", "bert"),
    ("tests", "mlperf-results/training_results_v5.1/AMD", "MI355X_EPYC_9575F_pytorch", "llama31_8b"),
    ("tests", "published/training_results_v6.0/CoreWeave", "CoreWeave_B200_8x8", "gpt_oss_20b"),
]
TINY = ROOT / "tests" / "data" / "fuzz" / "ci" / "gpt3"  # a tiny mlbench run: result_<i>.txt and its record


# --- values and mutations -----------------------------------------------------------------------------------------

def _odd_value(rng: random.Random, old: object) -> object:
    """A value of another type or an absurd one, in place of OLD."""
    choices = [None, True, False, 0, -1, -0.0, math.nan, math.inf, -math.inf, 1e400, 10 ** rng.choice([19, 300, 5000]),
               -(10 ** 19), 5e-324, 1.5, "", "x" * rng.choice([1, 300, 100_000]), "NaN", "1e400", "\u00b2", "\x1b[2J",
               [], [old], {}, {"value": old}, "[" * 50, str(old), rng.randint(-10 ** 6, 10 ** 6)]
    if isinstance(old, float) and math.isfinite(old) or isinstance(old, int) and not isinstance(old, bool) \
            and abs(old) < 2 ** 53:
        choices += [old * 1000, -old, old / 1000, str(old), [old, old]]
    return rng.choice(choices)


# What analysis reads from a record, a systems json and an MLLOG record: mutated more often than the rest (a run
# record's config, most of its bytes, is read by no analysis)
READ_KEYS = {"variant", "quality", "prediction", "layout", "devices", "mfu", "mfu_note", "status", "benchmark",
             "time_to_train_s", "environment", "steps", "exit_code", "number_of_nodes", "accelerators_per_node",
             "division", "submitter", "system_name", "accelerator_model_name", "value", "metadata", "time_ms",
             "scaling_factor", "compliance"}
IMPORTANT_LOG_KEYS = (b'"run_start"', b'"run_stop"', b'"eval_accuracy"', b'"submission_', b'"global_batch_size"',
                      b'"max_sequence_length"', b'"train_samples"', b'"tracked_stats"', b'"opt_base_learning_rate"',
                      b'"cache_clear"', b'"init_start"', b'"block_start"', b'"epoch_start"', b'"eval_samples"')


def _paths(obj: object, prefix: tuple = ()) -> list[tuple]:
    """Every path to a value in a JSON object, its keys and list indices."""
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:20]):
            out += _paths(v, prefix + (i,))
    return out


def _get(obj: object, path: tuple) -> object:
    for p in path:
        obj = obj[p]
    return obj


def mutate_json(rng: random.Random, obj: object) -> object:
    """OBJ with one value changed in type or size, one key renamed or removed, or an item duplicated."""
    obj = copy.deepcopy(obj)
    paths = _paths(obj)
    read = [p for p in paths if p and p[0] in READ_KEYS]
    path = rng.choice(read if read and rng.random() < 0.6 else paths)
    if not path:
        return _odd_value(rng, obj) if rng.random() < 0.2 else obj
    parent, last = _get(obj, path[:-1]), path[-1]
    how = rng.random()
    if isinstance(parent, dict) and how < 0.15:  # a key renamed (a typo, another case, an empty key)
        name = str(last)
        new = rng.choice([name.upper(), name + "_", name[:-1], "", " " + name, name.replace("_", "-")])
        parent[new] = parent.pop(last)
    elif isinstance(parent, dict) and how < 0.25:
        del parent[last]
    elif isinstance(parent, list) and how < 0.25:
        parent.insert(last, copy.deepcopy(parent[last]))
    else:
        parent[last] = _odd_value(rng, parent[last])
    return obj


@contextlib.contextmanager
def _long_ints():
    """Integers of any length written (a 5000-digit one is a mutation), the interpreter's limit put back after:
    mlbench reads under it, as it would."""
    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        yield
    finally:
        sys.set_int_max_str_digits(limit)


def _dumps(obj: object, rng: random.Random) -> str:
    """OBJ as JSON with NaN and Infinity as Python writes them (a 1e400 float is inf; written as 1e400 sometimes)."""
    with _long_ints():
        text = json.dumps(obj, allow_nan=True)
    return text.replace("Infinity", "1e400", 1) if rng.random() < 0.3 else text


MLLOG = ":::MLLOG "


def mutate_log_line(rng: random.Random, line: str) -> str:
    """One `:::MLLOG {...}` line with its record mutated: a field's type or value, the key, the event type, time_ms
    moved back."""
    head, sep, body = line.rpartition(MLLOG)
    try:
        rec = json.loads(body)
    except ValueError:
        return line
    if not isinstance(rec, dict):
        return line
    how = rng.random()
    if how < 0.15:
        rec["event_type"] = rng.choice(["INTERVAL_START", "INTERVAL_END", "POINT_IN_TIME", "", None, 7, "point"])
    elif how < 0.3 and isinstance(rec.get("time_ms"), (int, float)):
        rec["time_ms"] = rec["time_ms"] - rng.choice([1, 1000, 10 ** 6, 10 ** 12, 2 * 10 ** 12])
    elif how < 0.4:
        rec["key"] = rng.choice(["run_start", "run_stop", "eval_accuracy", "submission_benchmark", "global_batch_size",
                                 "tracked_stats", "train_samples", "init_start", "Run_Start", ""])
    elif how < 0.5:  # the same record written otherwise: what the official tools read alike
        return head + sep + _respelled(rng, rec) + ("\n" if line.endswith("\n") else "")
    else:
        rec = mutate_json(rng, rec)
    return head + sep + _dumps(rec, rng) + ("\n" if line.endswith("\n") else "")


def _respelled(rng: random.Random, rec: dict) -> str:
    """REC as JSON of the same meaning, spelled as a log-reading shortcut may not expect: compact separators,
    its keys in another order, a letter of a field's name as a \\u escape, spaces around colons."""
    items = list(rec.items())
    how = rng.randrange(4)
    if how == 0:
        return json.dumps(rec, separators=(",", ":"))
    if how == 1:
        rng.shuffle(items)
        return json.dumps(dict(items))
    if how == 2:
        text = json.dumps(rec)
        # a field's name only: the official RCP checker finds a record's key ("global_batch_size") as a substring
        # of the line, so an escape in it is another log to that checker
        word = rng.choice(['"key"', '"value"', '"metadata"', '"time_ms"', '"status"', '"samples_count"',
                           '"epoch_num"', '"event_type"'])
        if len(word) > 3 and word in text:
            k = rng.randrange(1, len(word) - 1)
            text = text.replace(word, word[:k] + f"\\u{ord(word[k]):04x}" + word[k + 1:], 1)
        return text
    return json.dumps(rec, separators=(" , ", " : "))


def mutate_lines(rng: random.Random, data: bytes) -> bytes:
    lines = data.splitlines(keepends=True) or [b""]
    how = rng.random()
    i = rng.randrange(len(lines))
    if how < 0.5:  # a record mutated
        text = lines[i].decode("utf-8", "surrogateescape")
        mllog = [j for j, ln in enumerate(lines) if MLLOG.encode() in ln]
        key_lines = [j for j in mllog if any(k in lines[j] for k in IMPORTANT_LOG_KEYS)]
        if key_lines and rng.random() < 0.6:
            mllog = key_lines
        if mllog:
            i = rng.choice(mllog)
            text = lines[i].decode("utf-8", "surrogateescape")
        lines[i] = mutate_log_line(rng, text).encode("utf-8", "surrogateescape")
    elif how < 0.65:
        del lines[i]
    elif how < 0.8:
        lines.insert(i, lines[i] * (rng.choice([1, 2, 50]) if len(lines[i]) < 100_000 else 1))
    elif how < 0.9:
        j = rng.randrange(len(lines))
        lines[i], lines[j] = lines[j], lines[i]
    else:
        rng.shuffle(lines)
    return b"".join(lines)


def mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    n = len(data)
    at = rng.randrange(n + 1)
    how = rng.randrange(9)
    if how == 0:
        return data[:at]
    if how == 1 and n:  # bits flipped
        b = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            k = rng.randrange(n)
            b[k] ^= 1 << rng.randrange(8)
        return bytes(b)
    if how == 2:
        return data[:at] + bytes(rng.randrange(256) for _ in range(rng.randint(1, 16))) + data[at:]
    if how == 3:
        return data[:at] + b"\x00" * rng.randint(1, 64) + data[at:]
    if how == 4:
        return data[:at] + rng.choice([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xe2\x82", b"\x80\x80"]) + data[at:]
    if how == 5:
        return data.replace(b"\n", rng.choice([b"\r\n", b"\r", b"\n\n", b"\x85", "\u2028".encode()]))
    if how == 6:  # a line of 10 MB, an MLLOG one or not
        big = (MLLOG.encode() + b'{"key": "x", "value": "' + b"a" * 10_000_000 + b'"}\n') if rng.random() < 0.5 \
            else b"z" * 10_000_000 + b"\n"
        return data[:at] + big + data[at:]
    if how == 7:
        return b""
    return data[:at] + data[at:at + rng.randint(1, 4096)] + data[at:]  # a piece repeated


def mutate_json_file(rng: random.Random, data: bytes) -> bytes:
    """A JSON file (a run record, a systems json, scaling.json) mutated as JSON mostly, else as bytes."""
    if rng.random() < 0.75:
        try:
            obj = json.loads(data)
        except ValueError:
            return mutate_bytes(rng, data)
        for _ in range(rng.randint(1, 3)):
            obj = mutate_json(rng, obj)
        return _dumps(obj, rng).encode("utf-8", "surrogatepass")
    return mutate_bytes(rng, data)


def mutate_log(rng: random.Random, data: bytes) -> bytes:
    for _ in range(rng.choice([1, 1, 2, 3, 6])):
        data = mutate_lines(rng, data) if rng.random() < 0.7 else mutate_bytes(rng, data)
    return data


def mutate_file(rng: random.Random, path: Path) -> str:
    data = path.read_bytes()
    new = mutate_json_file(rng, data) if path.suffix == ".json" else mutate_log(rng, data)
    path.write_bytes(new)
    return f"{path.name} ({len(data)} -> {len(new)} bytes)"


# --- the tree a case reads ----------------------------------------------------------------------------------------

def _source(where: str, org: str) -> Path:
    base = ROOT.parent / "shared" / "data" / "mlperf-results" if where == "shared" else ROOT / "tests" / "data"
    return base / org


def build_tree(rng: random.Random, root: Path) -> list[Path]:
    """Two sets (a published one with its systems json and a tiny mlbench run, or two published ones): their
    benchmark folders."""
    available = [p for p in PUBLISHED if (_source(p[0], p[1]) / "results" / p[2] / p[3]).is_dir()]
    picks = rng.sample(available, k=min(2, len(available)))
    same = [p for p in available if p[3] == picks[0][3] and p != picks[0]]
    if same and rng.random() < 0.6:  # one benchmark at two device counts: what scaling reads
        picks = [picks[0], rng.choice(same)]
    if TINY.is_dir() and rng.random() < 0.35:
        picks = [p for p in available if p[3] == "gpt3"][:1] + [None] if rng.random() < 0.5 else picks[:1] + [None]
    folders = []
    for n, pick in enumerate(picks):
        if pick is None:
            d = root / "mine" / "ci" / "gpt3"
            shutil.copytree(TINY, d)
        else:
            where, org, system, bench = pick
            src = _source(where, org)
            d = root / f"org{n}" / "results" / system / bench
            d.mkdir(parents=True)
            runs = sorted((src / "results" / system / bench).glob("result_*.txt"))
            for f in rng.sample(runs, k=min(3, len(runs))):
                shutil.copy(f, d / f.name)
            for extra in ("scaling.json",):
                if (src / "results" / system / bench / extra).is_file():
                    shutil.copy(src / "results" / system / bench / extra, d / extra)
            (root / f"org{n}" / "systems").mkdir()
            if (src / "systems" / f"{system}.json").is_file():
                shutil.copy(src / "systems" / f"{system}.json", root / f"org{n}" / "systems" / f"{system}.json")
        folders.append(d)
    return folders


def _mutable(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def _targets(rng: random.Random, files: list[Path]) -> list[Path]:
    """One to three files to mutate (the same one again, sometimes), the JSON ones as often as the logs: a run
    record, a systems json or scaling.json is one file of a set where its logs are three."""
    jsons = [f for f in files if f.suffix == ".json"]
    logs = [f for f in files if f.suffix != ".json"]
    return [rng.choice(jsons if jsons and (rng.random() < 0.5 or not logs) else logs)
            for _ in range(rng.choice([1, 1, 2, 3]))]


# --- running the CLI ----------------------------------------------------------------------------------------------

class Hang(BaseException):
    pass


def _alarm(signum, frame):
    raise Hang()


@dataclass
class Outcome:
    args: list[str]
    code: int | None
    out: str
    err: str
    seconds: float
    exception: str | None = None
    warnings: list[str] = field(default_factory=list)


def call(*args: object, env: dict | None = None) -> Outcome:
    """`mlbench ARGS` through cli.main in this process: its exit code, stdout and stderr, and any exception that
    is not its clean exit."""
    from mlbench import cli, registry, terminal

    argv = ["mlbench", *map(str, args)]
    saved = sys.argv, sys.stdout, sys.stderr, dict(os.environ), registry.BENCHMARKS_DIR
    out, err = io.StringIO(), io.StringIO()
    code, exc = None, None
    os.environ.update({"COLUMNS": "200", **(env or {})})
    if env and "MLBENCH_BENCHMARKS" in env:
        registry.BENCHMARKS_DIR = Path(env["MLBENCH_BENCHMARKS"])
    sys.argv, sys.stdout, sys.stderr = argv, out, err
    start = time.monotonic()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, HANG_S)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            cli.main()
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except Hang:
            exc = f"hang: stopped after {HANG_S:.0f} s"
        except KeyboardInterrupt:
            raise
        except BaseException:
            exc = traceback.format_exc()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
            sys.argv, sys.stdout, sys.stderr = saved[0], saved[1], saved[2]
            os.environ.clear()
            os.environ.update(saved[3])
            registry.BENCHMARKS_DIR = saved[4]
            terminal.STDOUT.reset()
    seconds = time.monotonic() - start
    return Outcome(argv[1:], code, out.getvalue(), err.getvalue(), seconds, exc,
                   [f"{w.category.__name__}: {w.message}" for w in caught])


def _no_constant(name: str) -> object:
    raise ValueError(f"not strict JSON: {name}")


def faults(o: Outcome) -> list[str]:
    """What is wrong with an outcome: one line a fault, its class first."""
    found = []
    if o.exception:
        last = o.exception.strip().splitlines()[-1]
        where = [ln.strip() for ln in o.exception.splitlines() if ln.strip().startswith('File "')]
        found.append(f"traceback: {last[:300]} at {where[-1][:200] if where else '?'}")
    elif o.code not in (0, 1, 2):
        found.append(f"exit code {o.code}")
    if "Traceback (most recent call last)" in o.out + o.err:
        found.append("traceback printed: " + (o.out + o.err).strip().splitlines()[-1][:300])
    if "--json" in o.args and o.code in (0, 1) and not o.exception:
        try:
            json.loads(o.out, parse_constant=_no_constant)
        except ValueError as e:
            found.append(f"--json output not strict JSON: {str(e)[:200]}")
    for w in o.warnings:
        found.append(f"warning: {w[:300]}")
    if o.seconds > SLOW_S:
        found.append(f"slow: {o.seconds:.1f} s")
    return found


def _fault_class(line: str) -> str:
    """A fault's class: its line without numbers and quoted text, so variants of one fault count once."""
    return re.sub(r"\d+", "N", re.sub(r"'[^']*'|\"[^\"]*\"", "S", line))[:160]


# --- the cases ----------------------------------------------------------------------------------------------------

def respell_log(rng: random.Random, path: Path) -> str:
    """Every record of the log at PATH respelled (_respelled): the same log to the official tools."""
    lines = path.read_bytes().decode("utf-8", "surrogateescape").splitlines(keepends=True)
    out = []
    for line in lines:
        head, sep, body = line.rpartition(MLLOG)
        try:
            rec = json.loads(body) if sep else None
        except ValueError:
            rec = None
        out.append(head + sep + _respelled(rng, rec) + "\n" if isinstance(rec, dict) else line)
    path.write_bytes("".join(out).encode("utf-8", "surrogateescape"))
    return f"{path.name} respelled"


def respell_case(rng: random.Random, work: Path) -> tuple[list[str], list[Outcome]]:
    """A differential case: compare --json and score --json of a tree, then of the same tree with one log's
    records respelled; any difference is a fault (what a reading shortcut missed)."""
    folders = build_tree(rng, work)
    a, b = folders[0], folders[-1]
    commands = [("compare", "--no-score", "--json", a, b), ("score", "--json", a)]
    before = [call(*c) for c in commands]
    logs = sorted(a.glob("result_*.txt"))
    did = [respell_log(rng, rng.choice(logs))] if logs else []
    after = [call(*c) for c in commands]
    for x, y in zip(before, after, strict=True):
        if x.out != y.out:
            y.exception = f"respelled records read otherwise: mlbench {' '.join(y.args)} differs"
    return did, before + after


def analysis_case(rng: random.Random, work: Path, score: bool, check: bool) -> tuple[list[str], list[Outcome]]:
    if rng.random() < 0.1:
        return respell_case(rng, work)
    folders = build_tree(rng, work)
    with _long_ints():
        did = [mutate_file(rng, f) for f in _targets(rng, _mutable(work))]
    a, b = folders[0], folders[-1]
    reports = work / "reports"
    reports.mkdir()
    commands = [("compare", "--no-score", a, b), ("compare", "--no-score", "--json", a, b),
                ("compare", "--no-score", a, b, "--md", reports / "c.md", "--html", reports / "c.html"),
                ("scaling", a, b), ("scaling", "--json", a, b),
                ("scaling", a, b, "--md", reports / "s.md", "--html", reports / "s.html")]
    if score:
        commands += [("score", rng.choice([a, b])), ("score", "--json", a), ("compare", "--json", a, b)]
    if check:
        commands += [("check", rng.choice([a, b])), ("check", "--json", a)]
    return did, [call(*c) for c in commands]


def registry_case(rng: random.Random, work: Path) -> tuple[list[str], list[Outcome]]:
    from mlbench import registry

    bench = work / "benchmarks"
    shutil.copytree(registry.SHIPPED_DIR, bench)
    target = rng.choice(sorted(bench.glob("*.yaml")))
    with _long_ints():
        did = [mutate_yaml(rng, target)]
    name = target.stem
    env = {"MLBENCH_BENCHMARKS": str(bench)}
    commands = [("list",), ("show", name), ("show", name, "--tiny", "--json"), ("show", name, "--json"),
                ("run", name, "--tiny", "--dry-run", "--results", work / "res")]
    if rng.random() < 0.3:
        commands.append(("run", name, "--dry-run", "--nodes", "8", "--nproc-per-node", "8", "--results", work / "res"))
    return did, [call(*c, env=env) for c in commands]


def mutate_yaml(rng: random.Random, path: Path) -> str:
    """A benchmark file with a value's type changed, a key renamed or dropped (through YAML), or its bytes mutated."""
    import yaml

    data = path.read_bytes()
    try:
        obj = yaml.safe_load(data)
    except (yaml.YAMLError, RecursionError):
        obj = None
    if obj is not None and rng.random() < 0.7:
        for _ in range(rng.randint(1, 2)):
            obj = mutate_json(rng, obj)
        try:
            with _long_ints():
                new = yaml.safe_dump(obj, allow_unicode=rng.random() < 0.5, sort_keys=False).encode(
                    "utf-8", "surrogatepass")
        except (yaml.YAMLError, UnicodeError, RecursionError):
            new = mutate_bytes(rng, data)
    else:
        new = mutate_lines(rng, data) if rng.random() < 0.5 else mutate_bytes(rng, data)
    path.write_bytes(new)
    return f"{path.name} ({len(data)} -> {len(new)} bytes)"


def _report(found: dict, case_seed: int, kind: str, did: list[str], outcomes: list[Outcome], quiet: bool) -> bool:
    """Record the faults of one case's OUTCOMES in FOUND (by class), printing the first of each class; whether
    there was any."""
    if any(o.code in (128 + signal.SIGTERM, 128 + signal.SIGHUP, 130) for o in outcomes):
        raise KeyboardInterrupt  # a stop signal the command took (no input sends one): stop here
    bad = [(o, f) for o in outcomes for f in faults(o)]
    for o, f in bad:
        cls = _fault_class(f)
        first = cls not in found
        found.setdefault(cls, []).append(f"seed {case_seed} {kind}: {did} mlbench {' '.join(o.args)}")
        if first and not quiet:
            print(f"FAULT seed {case_seed} ({kind}; {', '.join(did)}): mlbench {' '.join(o.args)}\n  {f}", flush=True)
            if o.exception and not o.exception.startswith("hang"):
                print("  " + o.exception.strip().replace("\n", "\n  ")[-3000:], flush=True)
    return bool(bad)


def run(iterations: int, seed: int, score_every: int = 4, check_every: int = 8, registry_every: int = 3,
        keep: Path | None = None, only: str | None = None, quiet: bool = False) -> dict:
    """ITERATIONS cases from SEED (case i uses seed SEED + i): an analysis case each (with score and check where
    the seed is a multiple of SCORE_EVERY, CHECK_EVERY), a registry case where it is one of REGISTRY_EVERY: a
    seed's case is the same whatever run it is in; {'cases', 'commands', 'faults': {class: [where each was
    seen]}}."""
    from mlbench.train import cpu_compat  # noqa: F401  (as the tests import it: no JIT fuser compiles)

    found: dict[str, list[str]] = {}
    commands = 0
    for i in range(iterations):
        case_seed = seed + i
        rng = random.Random(case_seed)
        kinds = ["respell"] if only == "respell" else ([] if only == "registry" else ["analysis"]) + \
            (["registry"] if only != "analysis" and (only == "registry" or case_seed % registry_every == 0) else [])
        with tempfile.TemporaryDirectory(prefix="mlbench_fuzz_") as tmp:
            for kind in kinds:
                work = Path(tmp) / kind
                work.mkdir()
                did, outcomes = respell_case(rng, work) if kind == "respell" else \
                    analysis_case(rng, work, case_seed % score_every == 0, case_seed % check_every == 0) \
                    if kind == "analysis" else registry_case(rng, work)
                commands += len(outcomes)
                if _report(found, case_seed, kind, did, outcomes, quiet) and keep is not None:
                    shutil.copytree(work, keep / f"{case_seed}_{kind}", dirs_exist_ok=True)
        if not quiet and (i + 1) % 25 == 0:
            print(f"{i + 1} cases, {commands} commands, {len(found)} fault classes", flush=True)
    return {"cases": iterations, "commands": commands, "faults": found}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iterations", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--score-every", type=int, default=4)
    p.add_argument("--check-every", type=int, default=8)
    p.add_argument("--registry-every", type=int, default=3)
    p.add_argument("--only", choices=["analysis", "registry", "respell"])
    p.add_argument("--keep", type=Path)
    a = p.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        result = run(a.iterations, a.seed, a.score_every, a.check_every, a.registry_every, a.keep, a.only)
        print(f"{result['cases']} cases, {result['commands']} commands, {len(result['faults'])} fault classes")
        for cls, seen in result["faults"].items():
            print(f"  {len(seen)}x {cls}\n     first: {seen[0]}")
        sys.exit(1 if result["faults"] else 0)


if __name__ == "__main__":
    main()
