"""The benchmark registry: one YAML file per benchmark in `benchmarks/`, loaded and validated."""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

import yaml

from mlbench import results, spec
from mlbench.errors import UserError, printable
from mlbench.spec import Benchmark, build, check_expressions, check_schedule, deep_merge

ROOT = Path(__file__).resolve().parent.parent
# Bound on every integer of a model definition: 2**24 (16.7M) is past any layer count, width, vocabulary or
# sequence a benchmark has (the largest today: Llama's 128,256-token vocabulary, 131,072-token context).
MAX_MODEL_SIZE = 2**24
# The synthetic (Markov) source's vocabulary, at most: every rank builds its dense vocabulary x vocabulary
# transition matrix in float64 and its stationary distribution by power iteration over it (mlbench/train/data/
# markov.py): at 4,096 tokens 128 MiB and 2 s, growing with the square (the tiny variants use 31 to 128 tokens).
MAX_MARKOV_VOCAB = 4096
# MLBENCH_BENCHMARKS points at another folder of definitions (a user's own, or a test's). Set but empty is unset,
# as for most variables (Path("") would be the working directory).
BENCHMARKS_DIR = Path(os.environ.get("MLBENCH_BENCHMARKS") or ROOT / "benchmarks")
# The definitions mlbench ships, whatever MLBENCH_BENCHMARKS says: what the planner measures and is calibrated on (a
# user's folder without gpt3.yaml made `plan --device cpu` fail, and an edited one moved the CPU's calibration).
SHIPPED_DIR = ROOT / "benchmarks"
# libyaml's parser where PyYAML has it (its wheels do): the pure-Python one takes 40 ms a benchmark file, and
# every command reads one or more (`mlbench list`: 0.4 s of its 0.5).
_BASE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_BASE_LOADER):  # type: ignore[misc, valid-type]
    """The safe loader, refusing a key given twice in one mapping: YAML's last-one-wins would let a second
    `global_batch_size` further down silently override the one a user edits. (Keys a `<<` merge brings in may be
    overridden, as YAML intends.)"""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[object, yaml.Mark] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node.start_mark)
            except TypeError:  # an unhashable key: the base class names it
                break
            if first is not key_node.start_mark:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} given twice (lines {first.line + 1} and {key_node.start_mark.line + 1}); "
                    "keep one", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def _dir(directory: Path | None) -> Path:
    return Path(directory) if directory is not None else BENCHMARKS_DIR


def names(directory: Path | None = None) -> list[str]:
    """The benchmarks defined in the folder; a folder that is not there is bad input, not an empty list."""
    folder = _dir(directory)
    via = " (MLBENCH_BENCHMARKS)" if directory is None and os.environ.get("MLBENCH_BENCHMARKS") else ""
    if not folder.is_dir():
        raise UserError(f"benchmark folder {str(folder)!r}{via} is not a folder; point MLBENCH_BENCHMARKS at a folder "
                        f"of benchmark files (<name>.yaml), or unset it for the built-in ones")
    try:  # (glob passes over a folder it cannot list: 'no benchmark files in it' for a folder full of them)
        listed = os.listdir(folder)
    except OSError as e:
        raise UserError(f"benchmark folder {folder}{via} cannot be listed ({e.strerror or e}); it must be readable "
                        f"by the user running mlbench") from None
    return sorted(n[:-len(".yaml")] for n in listed if n.endswith(".yaml") and not n.startswith("."))


# The most a benchmark file may hold. The built-in ones are 12 to 18 KB (gpt3.yaml, the largest: 17.7 KB): 1 MiB is
# over fifty times that, read and parsed in well under a second, while a 3 GB file (a sparse one, a log or a disk
# image named .yaml) is refused before it is read: read whole, it was a MemoryError traceback in `mlbench list`.
MAX_BENCHMARK_BYTES = 1 << 20


def _text(path: Path) -> str:
    """PATH's text, refused (OSError naming the limit) where it is larger than MAX_BENCHMARK_BYTES or no regular
    file, read as `logfile.load_json` reads a JSON input: without waiting, and no more than the limit and a byte."""
    from mlbench.logfile import read_capped

    raw = read_capped(path, MAX_BENCHMARK_BYTES, "a benchmark file", "; the built-in ones are under 20 KB")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:  # (said as 'can't decode byte 0xe9 in position 1160', no line)
        utf16 = " (a UTF-16 file?)" if raw[:2] in (b"\xff\xfe", b"\xfe\xff") else ""
        line = raw.count(b"\n", 0, e.start) + 1
        raise UserError(f"{path}: not UTF-8 at line {line}{utf16}: byte "
                        f"0x{raw[e.start]:02x}; save the benchmark file as UTF-8") from None


def _read(path: Path) -> dict:
    try:
        text = _text(path)
        data = yaml.load(text, Loader=_Loader)
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: cannot read the benchmark file ({getattr(e, 'strerror', None) or e})") from None
    except yaml.reader.ReaderError as e:  # a character YAML refuses (a control character, a NUL): its line
        raise UserError(f"{path}: not valid YAML at line {text.count(chr(10), 0, e.position) + 1}: unacceptable "
                        f"character #x{ord(e.character) if isinstance(e.character, str) else e.character:04x} "
                        f"({e.reason})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark else ""
        problem = " ".join(str(getattr(e, "problem", None) or e).split())  # one line
        raise UserError(f"{path}: not valid YAML{at}: {problem}") from None
    except (ValueError, RecursionError) as e:  # a value YAML parses but Python cannot build: a 5000-digit integer
        raise UserError(f"{path}: a value the YAML loader cannot build ({str(e).partition(';')[0]})") from None
    if not isinstance(data, dict):
        got = "an empty file" if data is None else f"a {type(data).__name__}"
        raise UserError(f"{path}: expected a mapping of benchmark fields (name: ..., model: ..., ...), got {got}")
    return data


def has_tiny(name: str, directory: Path | None = None) -> bool:
    """Whether the benchmark file has a tiny section (a malformed one still fails when loaded)."""
    load(name, directory=directory)
    return "tiny" in _read(_dir(directory) / f"{name}.yaml")


def load(name: str, tiny: bool = False, directory: Path | None = None) -> Benchmark:
    """The named benchmark, full size or its tiny variant, validated."""
    path = _dir(directory) / f"{name}.yaml"
    a_name = Path(name).name == name and not name.startswith(".")  # a name, never a path
    if a_name and os.path.lexists(path) and not path.is_file():
        raise UserError(f"{path}: not a benchmark file (a folder, a device or a broken link); a benchmark is a "
                        f"YAML file <name>.yaml")
    try:
        is_file = a_name and path.is_file()
    except PermissionError:  # the folder cannot be searched ('<folder>/gpt3.yaml: Permission denied')
        names(directory)  # (says so where it cannot be listed either)
        raise UserError(f"benchmark folder {path.parent} cannot be searched (Permission denied); it must be readable "
                        f"by the user running mlbench") from None
    if not is_file:
        known = names(directory)
        # (in any case: 'GPT3' matched nothing at all, 'gtp3' was offered gpt3)
        close = [k for k in known if k.lower() == name.lower()] or \
            difflib.get_close_matches(name.lower(), known, n=3, cutoff=0.4)
        hint = f"did you mean {' or '.join(close)}?" if close else f"known: {', '.join(known) or 'none'}"
        raise UserError(f"unknown benchmark '{name}'; {hint}")  # (not !r: an undecodable byte is printable's \xNN)
    if not results.FOLDER_NAME.fullmatch(name):  # it names a results folder and a row of `list` ("x\ny": two)
        raise UserError(printable(f"{path}: a benchmark's name (the file's, less .yaml) is ASCII letters and digits, "
                                  f"'-', '_' and '.' ('-' and '.' not first), at most 100 characters; rename the file"))
    data = _read(path)
    if data.get("name") != name:
        raise UserError(f"{path}: 'name' is {data.get('name')!r}, expected {name!r} (the file's name)")
    tiny_override = data.pop("tiny", None)
    # The full definition is validated even for a tiny run: the tiny variant inherits every value it does not
    # override, so a malformed file is malformed for both.
    full = build(Benchmark, data, where=path.name, fixed={"variant": "full", "path": str(path)}, also=("tiny",))
    _validate(full)
    if not tiny:
        return _absolute_data(full, path)
    if not isinstance(tiny_override, dict):
        raise UserError(f"{path}: has no 'tiny' section, so {name} has no tiny variant")
    merged = deep_merge(data, tiny_override)
    _tiny_keeps(path, data, tiny_override)
    bench = build(Benchmark, merged, where=f"{path.name} (tiny)", fixed={"variant": "tiny", "path": str(path)})
    _validate(bench)
    return _absolute_data(bench, path)


def _absolute_data(b: Benchmark, path: Path) -> Benchmark:
    """B with its data paths absolute, a relative one read from the folder of PATH, its file (it was read from the
    working folder, and kept relative in the run record: the data a run used depended on where it was started)."""
    if not (b.data.path.strip() or b.data.eval_path.strip()):
        return b  # (the built-in files: the paths come from flags; and numpy stays unimported for `list`)
    from mlbench.train.data.paths import absolute

    base = str(path.absolute().parent)
    found = {k: absolute(b.data.source, getattr(b.data, k), f"{b.where}: data.{k}", base)
             for k in ("path", "eval_path")}
    return dataclasses.replace(b, data=dataclasses.replace(b.data, **found))


# Keys a `tiny:` section may give only with the full definition's value: a tiny variant is the same benchmark (its
# name names its results folder and record; `name: other` made the tiny runs another benchmark's) and the same
# architecture with smaller numbers. docs/benchmark-keys.md marks them `same`.
TINY_SAME = (("name", "the same benchmark (its file's name)"),
             ("model.family", "the same architecture with smaller numbers"))


def _tiny_keeps(path: Path, full: dict, tiny: dict) -> None:
    """The TINY_SAME keys of the TINY section, where it gives them, equal to the FULL definition's (built already: its
    sections are mappings; a tiny section that is none fails when built)."""
    for key, why in TINY_SAME:
        section, _, name = key.rpartition(".")
        small, big = (tiny.get(section), full[section]) if section else (tiny, full)
        if not isinstance(small, dict) or name not in small or small[name] == big[name]:
            continue
        raise UserError(f"{path.name} (tiny): {key} is {small[name]!r}, the full definition's {big[name]!r}; a tiny "
                        f"variant is {why}: leave {key} out of it")


# Dimensions below which a model predicts nothing (was listed, shown and planned as a benchmark): one token is
# always the next one, and a sequence of one token gives no position a token before it to predict from.
_LEAST = {"vocab_size": (2, " (with one token there is nothing to predict)"),
          "seq_length": (2, " (with one token a sequence has no context to predict from)")}


def _validate(b: Benchmark) -> None:
    m = b.model
    where = b.where
    _validate_text(b, where)
    for key in ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "vocab_size",
                "seq_length"):
        least, why = _LEAST.get(key, (1, ""))
        if getattr(m, key) < least:
            raise UserError(f"{where}: model.{key} is {getattr(m, key)}; it must be at least {least}{why}")
    for f in dataclasses.fields(m):  # every size at most MAX_MODEL_SIZE: what a model has, not what hangs a loop
        value = getattr(m, f.name)
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_MODEL_SIZE:
            raise UserError(f"{where}: model.{f.name} is {value}; model sizes are at most {MAX_MODEL_SIZE:,}")
    groups = m.num_query_groups or m.num_attention_heads
    if m.num_attention_heads % groups:
        raise UserError(f"{where}: model.num_attention_heads ({m.num_attention_heads}) must be a multiple "
                        f"of model.num_query_groups ({groups})")
    if m.kv_channels is None and m.hidden_size % m.num_attention_heads:
        raise UserError(f"{where}: model.hidden_size ({m.hidden_size}) must divide by num_attention_heads "
                        f"({m.num_attention_heads}), or set model.kv_channels")
    _validate_size(b, where)
    # Batches and layout sizes within the bounds the flags have (spec.MAX_GLOBAL_BATCH, MAX_DEVICES): a file's
    # batch of 8,388,608 was trained until the OOM killer took the rank, where --global-batch-size was refused.
    for key, value in (("global_batch_size", b.train.global_batch_size), ("micro_batch_size",
                                                                           b.train.micro_batch_size)):
        if not 1 <= value <= spec.MAX_GLOBAL_BATCH:
            raise UserError(f"{where}: train.{key} is {value}; it must be 1 to {spec.MAX_GLOBAL_BATCH:,} sequences")
    for i, ly in enumerate(b.layouts):
        sizes = {k: getattr(ly, k) for k in ("devices", "tp", "pp", "vp", "cp", "ep", "micro_batch_size",
                                             "global_batch_size")}
        for key, value in sizes.items():
            batch = key.endswith("batch_size")
            least, most = (0, spec.MAX_DEVICES) if key == "devices" else \
                (1, spec.MAX_GLOBAL_BATCH if batch else spec.MAX_DEVICES)
            if value is not None and not least <= value <= most:
                what = "sequences" if batch else "devices" if key == "devices" else "ranks"
                raise UserError(f"{where}: layouts[{i}].{key} is {value}; it must be {least} to {most:,} {what}"
                                + (" (0: any number of devices)" if key == "devices" else ""))
    # Every expression, where it is used and at the smallest batch: a bad one fails here, naming its key.
    batches = {1, b.train.global_batch_size} | {ly.global_batch_size for ly in b.layouts if ly.global_batch_size}
    _validate_tables(b, where)
    check_expressions(b, where, batches)
    check_schedule(b, where, batches | set(b.optimizer.lr_table))
    _validate_budget(b, where, batches - {1})
    _validate_ranges(b, where)
    from mlbench.models import family

    why = family(m.family).check(m)  # what the family needs of a definition (mlbench.models)
    if why is not None:
        raise UserError(f"{where}: {why}")
    takes = family(m.family).data_sources
    if b.data.source not in takes:  # (was found only when a full run began, naming no file)
        raise UserError(f"{where}: data.source is {b.data.source!r}, which a {m.family} model's objective "
                        f"(model.family) does not read; it reads {' or '.join(takes)}")
    if b.optimizer.lr is None and b.optimizer.base_at(b.train.global_batch_size) is None:
        raise UserError(f"{where}: optimizer.lr is not given and optimizer.lr_table has no learning rate at the "
                        f"file's global batch ({b.train.global_batch_size}); give optimizer.lr, or a table entry at "
                        f"that batch")
    _validate_quality(b, where)
    if b.variant == "tiny" and not b.quality.note:
        raise UserError(f"{where}: a tiny variant must say how its target was chosen (quality.note)")
    for naming, rules in b.train.checkpoint_names.items():
        for rule in rules:
            if rule.count(" -> ") != 1 or not all(part.strip() for part in rule.split(" -> ")):
                raise UserError(f"{where}: train.checkpoint_names.{naming} entry {rule!r} must read 'FROM -> TO' "
                                f"(a megatron-core name fragment and the checkpoint's)")
    if m.zero_centered_gamma and (m.normalization != "LayerNorm" or m.norm_position != "pre"):
        raise UserError(f"{where}: model.zero_centered_gamma (LayerNorm1P) needs normalization: LayerNorm and "
                        f"norm_position: pre")
    if b.variant == "tiny" and b.data.source != "markov":
        raise UserError(f"{where}: a tiny variant trains on the synthetic source (data.source: markov)")
    if b.data.source == "markov":
        _validate_markov(b, where)
    _validate_ruleset(b, where)


_PROSE = ("notes", "note")  # text of paragraphs, where a line break is text; every other string is one line
# The longest text of each kind, in characters: `list` and `show` print it whole (a 900,000-character title filled
# the terminal). The built-in files' longest: a title of 98, a line of 209 (a source), prose of 529 (a note).
_LONGEST = {
    "title": (200, "a title is one row of `mlbench list`"),
    "line": (1000, "a value of one line"),
    "prose": (5000, "a few paragraphs"),
    "data.description": (5000, "a few sentences"),
    # a blend names many prefixes (megatron's --data-path "W1 PREFIX1 W2 PREFIX2 ..."), each up to PATH_MAX
    "data.path": (1 << 16, "a blend of indexed prefixes"),
    "data.eval_path": (1 << 16, "a blend of indexed prefixes"),
}


def _validate_text(obj: object, where: str, key: str = "") -> None:
    """Every string of the file printable where `list`, `show` and the logs print it: no control character (a
    title's ESC [31m reached the terminal, its newline split `list`'s row), a line break only in prose."""
    if dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            if not (key == "" and f.name == "path"):  # (the benchmark's own path, where it was found: not its text)
                _validate_text(getattr(obj, f.name), where, f"{key}.{f.name}" if key else f.name)
    elif isinstance(obj, tuple | list):
        for i, v in enumerate(obj):
            _validate_text(v, where, f"{key}[{i}]")
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _validate_text(v, where, f"{key}.{k}")
    elif isinstance(obj, str):
        prose = key.rsplit(".", 1)[-1] in _PROSE
        bad = None if obj.isprintable() else \
            next((c for c in obj if not c.isprintable() and not (prose and c == "\n")), None)
        if bad is not None:
            raise UserError(f"{where}: {key} holds {repr(bad)[1:-1]}, a character that is not printable; "
                            + ("text here is one line" if bad == "\n" else "remove it"))
        most, what = _LONGEST.get(key) or (_LONGEST["prose"] if prose else _LONGEST["line"])
        if len(obj) > most:
            raise UserError(f"{where}: {key} is {len(obj):,} characters long; at most {most:,} ({what})")


# Values with a range of their own: what torch's optimizers, megatron-core and the sources accept, refused at load
# rather than when a rank builds its model or optimizer, or takes its first step, after the run has started.
# float32's range bounds what the optimizer and the model compute with in float32: LAMB adds weight_decay x the
# weights (an alpha past float32 was "value cannot be converted to type float without overflow"); an eps or an
# init scale past it is infinity there, an eps below its smallest normal number rounds toward 0 (0 / 0 is NaN).
_F32 = f"at most {spec.FLOAT32_MAX:.4g} (float32's largest number, the optimizer's and the model's arithmetic)"
_RANGES: dict[str, tuple[Callable[[float], bool], str]] = {
    "optimizer.beta1": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "optimizer.beta2": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "optimizer.eps": (lambda v: spec.FLOAT32_TINY <= v <= spec.FLOAT32_MAX,
                      f"positive, from {spec.FLOAT32_TINY:.4g} (float32's smallest normal number) to "
                      f"{spec.FLOAT32_MAX:.4g} (its largest)"),
    "optimizer.weight_decay": (lambda v: 0 <= v <= spec.FLOAT32_MAX, f"at least 0 and {_F32}"),
    "optimizer.clip_grad": (lambda v: v >= 0, "at least 0 (0: no clipping)"),
    "optimizer.decay_power": (lambda v: v > 0, "positive"),
    "model.dropout": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "model.norm_epsilon": (lambda v: 0 < v <= spec.FLOAT32_MAX, f"positive and {_F32}"),
    "model.init_method_std": (lambda v: 0 <= v <= spec.FLOAT32_MAX, f"at least 0 (a standard deviation) and {_F32}"),
    # megatron-core's GPTModel takes it as an integer (int(0.5) is 0, and 0 ** x made every frequency infinite) and
    # torch raises it to a power as an int64 ("int too big to convert")
    "model.rotary_base": (lambda v: v == int(v) and 1 <= v < spec.MAX_MAGNITUDE,
                          f"a whole number from 1 to {spec.MAX_MAGNITUDE - 1} (megatron-core takes it as an int64)"),
    "model.rope_scaling_factor": (lambda v: v > 0, "positive (the low frequencies are divided by it)"),
    # an eval set is made whole in memory: 10^18 samples launched a run that died on "array is too big"
    "eval.samples": (lambda v: 0 < v <= spec.MAX_GLOBAL_BATCH, f"1 to {spec.MAX_GLOBAL_BATCH:,} sequences"),
    # the log's eval_samples, which the checker requires positive (-5 was published: compliance FAILED, exit 0)
    "eval.logged_samples": (lambda v: 0 <= v <= 10**12, "0 (log eval.samples) to 10^12: the count eval_samples "
                                                        "logs (gpt3's, its eval set's tokens, is 11,590,004)"),
    "data.mask_prob": (lambda v: 0 < v < 1, "in (0, 1)"),
    "data.branching": (lambda v: v >= 1, "at least 1"),
    "data.concentration": (lambda v: v > 0, "positive"),
    # numpy.random.default_rng refused a negative one ("expected non-negative integer") once the run had started
    "data.seed": (lambda v: 0 <= v <= spec.SEED_MAX, f"0 to {spec.SEED_MAX}, as a run's --seed"),
    "mlperf.runs_required": (lambda v: v >= 1, "at least 1"),
    # megatron pads the vocabulary to a multiple of it (0 was a ZeroDivisionError in show and plan)
    "model.make_vocab_size_divisible_by": (lambda v: v >= 1, "at least 1"),
    "model.num_query_groups": (lambda v: v is None or v >= 1, "at least 1 (or not given: one group a head)"),
    "model.kv_channels": (lambda v: v is None or v >= 1, "at least 1 (or not given: hidden / heads)"),
    "model.num_tokentypes": (lambda v: v >= 0, "at least 0"),
    "model.window_size": (lambda v: v >= 0, "at least 0 (0: full causal attention)"),
    "model.window_attn_skip_freq": (lambda v: v >= 0, "at least 0"),
    "model.num_experts": (lambda v: v >= 0, "at least 0"),
    "model.moe_router_topk": (lambda v: v >= 0, "at least 0"),
    "model.moe_ffn_hidden_size": (lambda v: v >= 0, "at least 0"),
    "features.recompute_layers": (lambda v: v >= 1, "at least 1"),
}


def check_budget_at(b: Benchmark, gbs: int) -> None:
    """`_validate_budget` at the global batch a run trains at (--gbs, --warmup-steps, --lr in B): the file's own
    batches were checked as it loaded."""
    _validate_budget(b, f"{b.name} as this run trains it", {gbs}, tables=False)


def _validate_budget(b: Benchmark, where: str, batches: set[int], tables: bool = True) -> None:
    """A warm-up at or past the step budget ends every run before its learning rate peaks: refused, as the same
    `--warmup-steps` is (rcp_schedule.for_run). At the file's own batches and its tables' (batch 1, where the
    expressions are checked to evaluate, is no batch anyone runs)."""
    for gbs in sorted(batches | (set(b.optimizer.lr_table) if tables else set())):
        base = b.optimizer.base_at(gbs)
        given = int(spec.evaluate(b.train.max_steps, global_batch_size=gbs))  # 0: the schedule's own length
        if base is not None and 0 < given <= base[1]:
            raise UserError(f"{where}: optimizer.warmup_steps is {base[1]} at global_batch_size = {gbs}, not below "
                            f"train.max_steps ({given}): the learning rate would never reach its peak; make the "
                            f"warm-up shorter than the budget (or train.max_steps 0: the whole schedule)")
        budget = spec.step_budget(b, gbs)
        if budget is None:
            continue  # no schedule at this batch, so no budget (a run there is refused: rcp_schedule.outside_table)
        # The same mistake as a warm-up past the budget: each trained the whole budget for nothing, then aborted
        # on 'quality target not reached' (no evaluation ever ran; the learning rate never rose from 0).
        if (start := int(spec.evaluate(b.eval.start_samples, global_batch_size=gbs))) >= budget * gbs:
            raise UserError(f"{where}: eval.start_samples is {start} at global_batch_size = {gbs}, not below the "
                            f"{budget} steps' {budget * gbs} samples: no evaluation would ever run")
        if b.optimizer.start_warmup_step >= budget:
            raise UserError(f"{where}: optimizer.start_warmup_step is {b.optimizer.start_warmup_step}, not below the "
                            f"{budget} steps at global_batch_size = {gbs}: the warm-up would never begin")


def _validate_ranges(b: Benchmark, where: str) -> None:
    for key, (ok, what) in _RANGES.items():
        section, name = key.split(".")
        value = getattr(getattr(b, section), name)
        if not ok(value):
            raise UserError(f"{where}: {key} is {value}; it must be {what}")


def _validate_tables(b: Benchmark, where: str) -> None:
    """The RCP tables' learning rates and warm-ups, as `lr` and `warmup_steps` are bounded (their expressions):
    before the expressions that name them (min_lr: lr / 10) are evaluated, so the error names the table."""
    o = b.optimizer
    for batch, lr in o.lr_table.items():
        if not 0 < lr <= spec.max_lr(o.beta1):
            raise UserError(f"{where}: optimizer.lr_table.{batch} is {lr}; a learning rate must be positive and at "
                            f"most {spec.max_lr(o.beta1):.3g} (the optimizer's first step, lr / (1 - beta1) at "
                            f"optimizer.beta1 {o.beta1:g}, is computed in float32: at most {spec.FLOAT32_MAX:.3g})")
    for batch, steps in o.warmup_table.items():
        if not 0 <= steps < spec.MAX_MAGNITUDE:
            raise UserError(f"{where}: optimizer.warmup_table.{batch} is {steps}; warm-up steps are 0 to "
                            f"{spec.MAX_MAGNITUDE - 1}")


# `size`: a number and M or B, as the papers state it ("175B", "340M"): `show` compares the model's count to it.
_SIZE = re.compile(r"(\d+(?:\.\d+)?)([MB])")


def _validate_size(b: Benchmark, where: str) -> None:
    """The published size and parameter count `show` compares the built model with (a size '175X' was a KeyError
    there, '0B' or a published_params of 0 a ZeroDivisionError)."""
    m = _SIZE.fullmatch(b.size)
    if not m or float(m[1]) <= 0 or not math.isfinite(float(m[1])):
        raise UserError(f"{where}: size {b.size!r} is not a parameter count as published: a positive number and M "
                        f"or B, such as '175B' or '340M'")
    if not b.published_params > 0:
        raise UserError(f"{where}: published_params is {b.published_params}; it must be a positive parameter count")


def _validate_markov(b: Benchmark, where: str) -> None:
    """The synthetic source's settings against what it does with them (mlbench/train/data/markov.py): each of its
    tokens gets `branching` distinct successors drawn from the vocabulary (numpy's choice without replacement
    refused more: "Cannot take a larger sample than population"), weighted by a Dirichlet(concentration) draw."""
    from mlbench.models import family

    m, d = b.model, b.data
    tokens = family(m.family).markov_vocab(m)
    masked = tokens != m.vocab_size
    kept = f" (model.vocab_size {m.vocab_size} less the one kept for [MASK])" if masked else " (model.vocab_size)"
    if tokens < 2:
        raise UserError(f"{where}: model.vocab_size is {m.vocab_size}: the Markov source (data.source: markov) needs "
                        f"at least 2 tokens{kept if masked else ''}: with one there is nothing to "
                        f"predict")
    if tokens > MAX_MARKOV_VOCAB:
        raise UserError(f"{where}: model.vocab_size is {m.vocab_size}: the Markov source (data.source: markov) "
                        f"builds a {tokens:,} x {tokens:,} transition matrix on every rank; at most "
                        f"{MAX_MARKOV_VOCAB:,} tokens{kept if masked else ''}")
    if d.branching > tokens:
        raise UserError(f"{where}: data.branching is {d.branching}: the Markov source picks that many distinct "
                        f"successors for each of its {tokens} tokens{kept}; at most {tokens}")
    # numpy draws each weight as a gamma variate about `concentration` in size and divides by their sum: past
    # float64's range every weight came out 0, and the source emitted one token forever (a target reached at once).
    if d.concentration * d.branching >= sys.float_info.max / 2:
        raise UserError(f"{where}: data.concentration is {d.concentration:g}: the Dirichlet weights of "
                        f"{d.branching} successors sum {d.branching} draws of about that size, past float64's range "
                        f"(every weight comes out 0); at most {sys.float_info.max / 2 / d.branching:.3g}")


def _validate_ruleset(b: Benchmark, where: str) -> None:
    """The training ruleset whose closed rules judge the run's log and whose RCPs `plan` and `score` use: one the
    installed mlperf-logging has for this benchmark (another failed every run's compliance check, and `plan` with
    a FileNotFoundError)."""
    from mlbench import mlperf_tools  # the one place that knows the package's files

    ruleset, benchmark = b.mlperf.ruleset, b.mlperf.benchmark
    if mlperf_tools.has_rules(ruleset, benchmark):
        return
    having = [r for r in mlperf_tools.rulesets() if mlperf_tools.has_rules(r, benchmark)]
    known = ", ".join(mlperf_tools.rulesets())
    if not having:
        raise UserError(f"{where}: mlperf.benchmark {benchmark!r} is in no training ruleset of the installed "
                        f"mlperf-logging (its rulesets: {known}); use the checker's name for the benchmark")
    raise UserError(f"{where}: mlperf.ruleset {ruleset!r}: the installed mlperf-logging has no closed rules and RCPs "
                    f"for {benchmark} in it; rulesets that have them: {', '.join(having)} (all it knows: {known})")


def _validate_quality(b: Benchmark, where: str) -> None:
    """A target the metric can reach, in the direction that metric improves, of the metric the model's objective
    evaluates: a gpt model's log perplexity (about 4) met a masked_lm_accuracy target (>= 0.5) at the first
    evaluation, and the run was published as a success."""
    from mlbench.models import family

    q = b.quality
    evaluated = family(b.model.family).metric
    if q.metric != evaluated:
        raise UserError(f"{where}: quality.metric is {q.metric!r}, but a {b.model.family} model (model.family) is "
                        f"evaluated in {evaluated} (its objective's metric), which the run compares with "
                        f"quality.target; give quality.metric: {evaluated} and a target of it")
    if q.metric == "log_perplexity":
        right, direction = 0 < q.target < 1e3, "min"  # a log: positive, and e**1000 is past any vocabulary
        what = "a positive log perplexity"
    else:
        right, direction = 0 < q.target <= 1, "max"
        what = "an accuracy in (0, 1]"
    if not right:
        raise UserError(f"{where}: quality.target {q.target} is not {what} ({q.metric})")
    if q.direction != direction:
        raise UserError(f"{where}: quality.direction for {q.metric} is {direction!r} (it "
                        f"{'falls' if direction == 'min' else 'rises'} as the model learns), got {q.direction!r}")


def load_all(tiny: bool = False, directory: Path | None = None) -> list[Benchmark]:
    return [load(n, tiny=tiny, directory=directory) for n in names(directory)]


def load_each(directory: Path | None = None) -> tuple[list[tuple[Benchmark, Benchmark | None]], list[str]]:
    """Every benchmark of the folder that loads, full size with its tiny variant (None where it has none), and why
    each of the others does not (its message names its file): one malformed file is not the end of the rest
    (`mlbench list` stopped at the first one, the good benchmarks unlisted)."""
    loaded, failures = [], []
    for name in names(directory):
        try:
            full = load(name, directory=directory)
            loaded.append((full, load(name, tiny=True, directory=directory) if has_tiny(name, directory) else None))
        except UserError as e:
            failures.append(str(e))
    return loaded, failures
