"""The benchmark registry: one YAML file per benchmark in `benchmarks/`, loaded and validated."""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Callable
from pathlib import Path

import yaml

from mlbench.errors import UserError
from mlbench.spec import Benchmark, build, check_expressions, deep_merge

ROOT = Path(__file__).resolve().parent.parent
# Bound on every integer of a model definition: 2**24 (16.7M) is past any layer count, width, vocabulary or
# sequence a benchmark has (the largest today: Llama's 128,256-token vocabulary, 131,072-token context).
MAX_MODEL_SIZE = 2**24
# MLBENCH_BENCHMARKS points at another folder of definitions (a user's own, or a test's). Set but empty is unset,
# as for most variables (Path("") would be the working directory).
BENCHMARKS_DIR = Path(os.environ.get("MLBENCH_BENCHMARKS") or ROOT / "benchmarks")
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
    if not folder.is_dir():
        via = " (MLBENCH_BENCHMARKS)" if directory is None and os.environ.get("MLBENCH_BENCHMARKS") else ""
        raise UserError(f"benchmark folder {folder}{via} is not a folder; point MLBENCH_BENCHMARKS at a folder of "
                        f"benchmark files (<name>.yaml), or unset it for the built-in ones")
    return sorted(p.stem for p in folder.glob("*.yaml") if not p.name.startswith("."))


def _read(path: Path) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
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
        raise UserError(f"{path}: expected a mapping of benchmark fields, got {type(data).__name__}")
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
    if not a_name or not path.is_file():
        known = names(directory)
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.4)
        hint = f"did you mean {' or '.join(close)}?" if close else f"known: {', '.join(known) or 'none'}"
        raise UserError(f"unknown benchmark {name!r}; {hint}")
    data = _read(path)
    if data.get("name") != name:
        raise UserError(f"{path}: 'name' is {data.get('name')!r}, expected {name!r} (the file's name)")
    tiny_override = data.pop("tiny", None)
    # The full definition is validated even for a tiny run: the tiny variant inherits every value it does not
    # override, so a malformed file is malformed for both.
    full = build(Benchmark, data | {"path": str(path)}, where=path.name)
    _validate(full, path)
    if not tiny:
        return full
    if not isinstance(tiny_override, dict):
        raise UserError(f"{path}: has no 'tiny' section, so {name} has no tiny variant")
    merged = deep_merge(data, tiny_override) | {"variant": "tiny", "path": str(path)}
    bench = build(Benchmark, merged, where=f"{path.name} (tiny)")
    _validate(bench, path)
    return bench


def _validate(b: Benchmark, path: Path) -> None:
    m = b.model
    where = f"{path.name}{' (tiny)' if b.variant == 'tiny' else ''}"
    for key in ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "vocab_size",
                "seq_length"):
        if getattr(m, key) <= 0:
            raise UserError(f"{where}: model.{key} must be positive, got {getattr(m, key)}")
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
    if b.train.global_batch_size <= 0 or b.train.micro_batch_size <= 0:
        raise UserError(f"{where}: train.global_batch_size and train.micro_batch_size must be positive")
    for i, ly in enumerate(b.layouts):
        sizes = {k: getattr(ly, k) for k in ("tp", "pp", "vp", "cp", "ep", "micro_batch_size", "global_batch_size")}
        bad = next((k for k, v in sizes.items() if v is not None and v < 1), None)
        if bad or ly.devices < 0:
            key, value = (bad, sizes[bad]) if bad else ("devices", ly.devices)
            raise UserError(f"{where}: layouts[{i}].{key} is {value}; sizes are at least 1 (devices: 0 for any)")
    # Every expression, where it is used and at the smallest batch: a bad one fails here, naming its key.
    batches = {1, b.train.global_batch_size} | {ly.global_batch_size for ly in b.layouts if ly.global_batch_size}
    check_expressions(b, where, batches)
    _validate_ranges(b, where)
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


# Values with a range of their own: what torch's optimizers and the sources accept, refused at load rather than
# when a rank builds its optimizer after the run has started.
_RANGES: dict[str, tuple[Callable[[float], bool], str]] = {
    "optimizer.beta1": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "optimizer.beta2": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "optimizer.eps": (lambda v: v > 0, "positive"),
    "optimizer.weight_decay": (lambda v: v >= 0, "at least 0"),
    "optimizer.clip_grad": (lambda v: v >= 0, "at least 0 (0: no clipping)"),
    "optimizer.decay_power": (lambda v: v > 0, "positive"),
    "model.dropout": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "model.norm_epsilon": (lambda v: v > 0, "positive"),
    "eval.samples": (lambda v: v > 0, "positive"),
    "data.mask_prob": (lambda v: 0 < v < 1, "in (0, 1)"),
    "data.branching": (lambda v: v >= 1, "at least 1"),
    "data.concentration": (lambda v: v > 0, "positive"),
    "mlperf.runs_required": (lambda v: v >= 1, "at least 1"),
    "features.recompute_layers": (lambda v: v >= 1, "at least 1"),
}


def _validate_ranges(b: Benchmark, where: str) -> None:
    for key, (ok, what) in _RANGES.items():
        section, name = key.split(".")
        value = getattr(getattr(b, section), name)
        if not ok(value):
            raise UserError(f"{where}: {key} is {value}; it must be {what}")


def _validate_quality(b: Benchmark, where: str) -> None:
    """A target the metric can reach, in the direction that metric improves."""
    q = b.quality
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
