"""A benchmark file is input: every expression is evaluated, bounded, when the file is loaded (not when a run
first uses it), and values a metric cannot take are refused, each with one line naming the file and the key."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import types
import typing
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlbench import flops, registry, schema, spec
from mlbench.cli import cli
from mlbench.errors import UserError
from mlbench.preflight import LayoutRequest, resolve_layout
from mlbench.spec import evaluate, resolved


def _edit(f: Path, old: str, new: str) -> None:
    """The first OLD in benchmark file F replaced by NEW (OLD must be there: an edit that misses tests nothing)."""
    text = f.read_text()
    assert old in text, old
    f.write_text(text.replace(old, new, 1))


@pytest.mark.parametrize(("name", "old", "new", "needles"), [
    ("gpt3", "warmup_steps: ceil(265 * 1536 / global_batch_size)",
     "warmup_steps: ceil(265 * 1536 / (global_batch_size - 1536) ** 2)",
     ["gpt3.yaml: optimizer.warmup_steps", "division by zero", "global_batch_size = 1536"]),
    ("gpt3", "warmup_steps: ceil(265 * 1536 / global_batch_size)", "warmup_steps: 9 ** 9 ** 9 ** 9",
     ["gpt3.yaml: optimizer.warmup_steps", "beyond the bound"]),
    ("gpt3", "warmup_steps: ceil(265 * 1536 / global_batch_size)", "warmup_steps: 2 ** global_batch_size",
     ["optimizer.warmup_steps", "2 ** 1536 is beyond the bound"]),
    ("gpt3", "warmup_steps: ceil(265 * 1536 / global_batch_size)", "warmup_steps: 10 % (global_batch_size - 1)",
     ["optimizer.warmup_steps", "division by zero", "global_batch_size = 1"]),
    ("gpt3", "warmup_steps: ceil(265 * 1536 / global_batch_size)", "warmup_steps: ceil(gbs / 2)",
     ["optimizer.warmup_steps", "unknown name 'gbs'", "names allowed: global_batch_size"]),
    ("gpt3", "warmup_steps: ceil(265 * 1536 / global_batch_size)", "warmup_steps: 100 - global_batch_size",
     ["optimizer.warmup_steps", "is -1436 at global_batch_size = 1536", "at least 0"]),
    ("gpt3", "interval_samples: ceil(24576 / global_batch_size) * global_batch_size",
     "interval_samples: global_batch_size - global_batch_size", ["eval.interval_samples", "must be positive"]),
    ("gpt3", "lr: max(2e-5, 3e-5 * min(1, max(0, global_batch_size - 3599)))", "lr: (-1) ** 0.5",
     ["optimizer.lr", "not a real number"]),
    ("gpt3", "lr: max(2e-5, 3e-5 * min(1, max(0, global_batch_size - 3599)))", "lr: .inf",
     ["optimizer.lr", "expected a finite number"]),
    ("gpt3", "target: 2.69", "target: -2.69", ["gpt3.yaml: quality.target -2.69 is not a positive log perplexity"]),
    ("gpt3", "direction: min", "direction: max", ["quality.direction for log_perplexity is 'min'"]),
    ("bert", "target: 0.720", "target: 1.5", ["bert.yaml: quality.target 1.5 is not an accuracy in (0, 1]"]),
    ("bert", "target: 0.720", "target: -0.72", ["quality.target -0.72 is not an accuracy"]),
    ("gpt3", "num_layers: 96", "num_layers: 100000000000000000000", ["model.num_layers is 100000000000000000000",
                                                                     "at most 16,777,216"]),
    ("gpt3", "beta1: 0.9", "beta1: 1.5", ["gpt3.yaml: optimizer.beta1 is 1.5; it must be in [0, 1)"]),
    ("gpt3", "eps: 1.0e-8", "eps: -1.0e-8", ["optimizer.eps is -1e-08; it must be positive"]),
    # YAML builds the integer, Python refuses its 6000 digits (was a traceback)
    ("gpt3", "num_layers: 96", "num_layers: " + "9" * 6000, ["gpt3.yaml: a value the YAML loader cannot build",
                                                             "6000 digits"]),
    # aliases nested to 10^9 elements where a string belongs: the error shows a few (repr of it all hung)
    ("gpt3", "title: GPT-3 175B", "title: [&a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1], "
     + ", ".join(f"&a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 10)) + "]  #",
     ["gpt3.yaml.title: expected a string, got [[1, 1, 1, 1, 1, 1, ...]"]),
    # a key twice in one mapping: YAML's last-one-wins would override the value a user edits (was accepted)
    ("gpt3", "train:\n  global_batch_size: 1536", "train:\n  global_batch_size: 3072\n  global_batch_size: 1536",
     ["gpt3.yaml: not valid YAML at line", "key 'global_batch_size' given twice"]),
    # a model that predicts nothing (listed, shown and planned before)
    ("gpt3", "  vocab_size: 51200", "  vocab_size: 1",
     ["gpt3.yaml: model.vocab_size is 1; it must be at least 2 (with one token there is nothing to predict)"]),
    ("gpt3", "  seq_length: 2048", "  seq_length: 1", ["gpt3.yaml: model.seq_length is 1; it must be at least 2"]),
    ("bert", "  seq_length: 512", "  seq_length: 0", ["bert.yaml: model.seq_length is 0; it must be at least 2"]),
], ids=["div-zero-at-own-batch", "power-tower", "power-of-batch", "mod-zero-at-batch-1", "unknown-name",
        "negative-steps", "zero-interval", "complex", "infinite", "negative-perplexity", "wrong-direction",
        "accuracy-above-1", "negative-accuracy", "huge-size", "beta-above-1", "negative-eps", "6000-digits",
        "alias-bomb", "duplicate-key", "vocab-one", "seq-one", "seq-zero"])
def test_bad_benchmark_file_is_refused_on_load(benchmarks_copy: Path, name: str, old: str, new: str,
                                               needles: list[str]) -> None:
    _edit(benchmarks_copy / f"{name}.yaml", old, new)
    for tiny in (False, True):  # the tiny variant inherits the full definition, so both refuse it
        with pytest.raises(UserError) as e:
            registry.load(name, tiny=tiny, directory=benchmarks_copy)
        assert "\n" not in str(e.value)
        for n in needles:
            assert n in str(e.value), str(e.value)


def test_an_expression_is_checked_at_the_batch_a_run_uses(benchmarks_copy: Path) -> None:
    """Fine at the file's batches, a division by zero at the one the user asked for: refused before launch."""
    f = benchmarks_copy / "gpt3.yaml"
    f.write_text(f.read_text().replace("warmup_steps: ceil(265 * 1536 / global_batch_size)",
                                       "warmup_steps: ceil(265 * 1536 / (global_batch_size - 3072) ** 2)", 1))
    bench = registry.load("gpt3", directory=benchmarks_copy)
    with pytest.raises(UserError, match=r"gpt3.yaml: optimizer.warmup_steps: .* division by zero"):
        resolve_layout(bench, LayoutRequest(nodes=64, nproc_per_node=8, tp=8, pp=8, global_batch_size=3072))


def test_plan_names_the_file_at_a_batch_its_expressions_fail(benchmarks_copy: Path, cli) -> None:
    """plan --gbs at a batch where the file divides by zero names the file and key, as run does; it said no layout
    passed the layout rules, the file's error only as "the commonest reason"."""
    f = benchmarks_copy / "gpt3.yaml"
    f.write_text(f.read_text().replace("max_steps: 300,", "max_steps: floor(300 / (global_batch_size - 32)) + 400,", 1))
    proc = cli("plan", "gpt3", "--tiny", "--device", "cpu", "--gbs", "32",
               env={"MLBENCH_BENCHMARKS": str(benchmarks_copy)})
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    assert proc.stderr.startswith("error: gpt3.yaml (tiny): train.max_steps: cannot evaluate"), proc.stderr
    assert "division by zero" in proc.stderr and "no layout" not in proc.stderr, proc.stderr


def test_min_lr_above_lr_at_the_batch_a_run_uses_is_refused(benchmarks_copy: Path) -> None:
    """min_lr scaling faster with the batch than lr: below it at the file's batch, above it at --gbs 64."""
    f = benchmarks_copy / "gpt3.yaml"
    f.write_text(f.read_text().replace("min_lr: 3.0e-4,", "min_lr: 3.0e-3 * global_batch_size / 32,", 1))
    bench = registry.load("gpt3", tiny=True, directory=benchmarks_copy)
    resolve_layout(bench, LayoutRequest(global_batch_size=32))  # equal: a flat schedule
    with pytest.raises(UserError, match=r"^gpt3.yaml \(tiny\): optimizer.min_lr is 0.006 at global_batch_size = 64, "
                                        r"above optimizer.lr 0.003"):
        resolve_layout(bench, LayoutRequest(global_batch_size=64))


def test_a_benchmark_name_that_cannot_name_a_folder_is_refused(benchmarks_copy: Path, cli) -> None:
    """A file named 'x<newline>y.yaml' (its name: key the same) was listed as two rows by `list`."""
    name = "x\ny"
    text = (benchmarks_copy / "gpt3.yaml").read_text().replace("name: gpt3\n", 'name: "x\\ny"\n', 1)
    (benchmarks_copy / f"{name}.yaml").write_text(text)
    with pytest.raises(UserError) as e:
        registry.load(name, directory=benchmarks_copy)
    assert str(e.value) == (f"{benchmarks_copy}/x\\ny.yaml: a benchmark's name (the file's, less .yaml) is ASCII "
                            "letters and digits, '-', '_' and '.' ('-' and '.' not first), at most 100 characters; "
                            "rename the file")
    proc = cli("list", env={"MLBENCH_BENCHMARKS": str(benchmarks_copy)})  # the others listed, this one named
    assert proc.returncode == 2 and proc.stderr.splitlines() == [f"error: {e.value}"], proc.stdout + proc.stderr
    assert " gpt3 " in proc.stdout and "x\ny" not in proc.stdout, proc.stdout


@pytest.mark.parametrize("flags", [["--gbs", "0"], ["--mbs", "0"], ["--ep", "0"], ["--ep", "-3"], ["--tp", "0"],
                                   ["--nproc-per-node", "0"], ["--nproc-per-node", "-1"]])
def test_plan_refuses_sizes_below_1_whether_it_searches_or_not(flags: list[str]) -> None:
    """Searching (no --tp/--pp given), --gbs 0 and --ep 0 were taken as not given (exit 0, ten layouts), and
    --nproc-per-node 0 said no layout passed, as if the model did not fit."""
    res = CliRunner().invoke(cli, ["plan", "gpt3", "--device", "h100", "--nodes", "64", "--nproc-per-node", "8",
                                   *flags])
    flag = {"--gbs": "--global-batch-size", "--mbs": "--micro-batch-size"}.get(flags[0], flags[0])
    # (in-process the UserError is the result; mlbench.cli.main prints it in one line, exit 2)
    assert isinstance(res.exception, UserError) and not res.output, res.output
    assert str(res.exception) == f"{flag} must be at least 1, got {flags[1]}"


def test_layout_errors_at_the_largest_sizes_answer_at_once(benchmarks_copy: Path) -> None:
    """A layout error lists valid values: the divisor search is bounded by the sizes' bounds, not a long loop."""
    f = benchmarks_copy / "gpt3.yaml"
    f.write_text(f.read_text().replace("num_layers: 96", "num_layers: 16777213", 1))  # a prime
    bench = registry.load("gpt3", directory=benchmarks_copy)
    with pytest.raises(UserError, match=r"16777213 layers .* one of 1, 16777213"):
        resolve_layout(bench, LayoutRequest(nodes=1024, nproc_per_node=1024, tp=8, pp=2))
    with pytest.raises(UserError, match=r"1,048,577 devices; at most 1,048,576"):
        resolve_layout(bench, LayoutRequest(nodes=1048577))


def test_the_evaluator_is_bounded_and_exact() -> None:
    assert evaluate("2 ** 62", global_batch_size=1) == 2**62
    assert evaluate("1152 * 8e-5 / 1152", global_batch_size=1) == 1152 * 8e-5 / 1152
    assert evaluate("-global_batch_size % 7 + +1", global_batch_size=3) == -3 % 7 + 1
    assert evaluate("2 ** -100", global_batch_size=1) == 2**-100  # a negative exponent shrinks: no bound hit
    for bad, reason in (("2 ** 63", "beyond the bound"), ("0 ** -1", "division by zero"),
                        ("min()", "unsupported"), ("max(1, key=2)", "unsupported"), ("1e400", "the result is inf"),
                        ("9" * 30, "beyond the bound"), ("(" * 5000 + "1" + ")" * 5000, "longer than"),
                        ("lambda: 1", "unsupported"), ("global_batch_size.real", "unsupported"),
                        ("0.5 ** -10000", "overflows"), ("(-2) ** 0.5", r"\(-2\) \*\* 0.5 is not a real number"),
                        ("min(global_batch_size)", "not iterable"), ("1 < 2", "unsupported"),
                        ("True + 1", "unsupported"), ("'a' * 3", "unsupported")):
        with pytest.raises(UserError, match=reason):
            evaluate(bad, global_batch_size=1)


@pytest.mark.parametrize("name", registry.names())
def test_show_json_is_the_resolved_definition(name: str) -> None:
    result = CliRunner().invoke(cli, ["show", name, "--json"])  # in-process; the subprocess path is tested below
    assert result.exit_code == 0, result.output
    data = json.loads(result.output, parse_constant=lambda c: pytest.fail(f"not strict JSON: {c}"))
    bench = registry.load(name)
    gbs = bench.train.global_batch_size
    assert data["params_total"] == flops.param_count(bench.model)
    assert data["flops_per_sample"] == flops.flops_per_sample(bench.model)
    if bench.model.num_experts:  # mixture of experts: the parameters a token passes through
        assert data["params_active"] == flops.active_param_count(bench.model) < data["params_total"]
    else:
        assert "params_active" not in data
    lr, warmup = bench.optimizer.base_at(gbs)
    assert (data["optimizer"]["lr"], data["optimizer"]["warmup_steps"]) == (lr, warmup)
    for section in ("model", "optimizer", "train", "eval", "quality", "data", "mlperf", "features"):
        for key, value in data[section].items():  # no expression is left unevaluated
            assert not isinstance(value, str) or key not in ("lr", "min_lr", "warmup_steps", "decay_steps",
                                                            "max_steps", "interval_samples", "start_samples"), key
    assert data == json.loads(json.dumps({"schema_version": schema.SCHEMA_VERSION} | resolved(bench) | {
        k: data[k] for k in data if k.startswith(("params_", "flops_"))}))


def _show_json(*args: str) -> dict:
    result = CliRunner().invoke(cli, ["show", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_show_json_values_match_the_sources(cli) -> None:
    """Values the MLPerf rules state at the reference batch (gpt3 at 1536, llama31_405b at 1152)."""
    gpt3 = json.loads(cli("show", "gpt3", "--json").stdout)  # as a script runs it: stdout is the JSON alone
    assert (gpt3["optimizer"]["warmup_steps"], gpt3["train"]["init_checkpoint_step"]) == (265, 4000)
    assert gpt3["eval"]["interval_samples"] == 24576
    llama = _show_json("llama31_405b")
    assert llama["optimizer"]["lr"] == 8e-5 and llama["optimizer"]["warmup_steps"] == 8000
    assert llama["eval"]["start_samples"] == (math.floor(0.0026 * 1152 + 12) + 1) * 18432
    tiny = _show_json("gpt3", "--tiny")
    assert tiny["variant"] == "tiny" and tiny["train"]["global_batch_size"] == 16
    if "gpt_oss_20b" in registry.names():
        # OpenAI's gpt-oss-20b: 21B parameters, 3.6B active; MLPerf's model is not the released one (its file).
        moe = _show_json("gpt_oss_20b")
        assert 19e9 < moe["params_total"] < 22e9 and 3e9 < moe["params_active"] < 4e9


def test_unreadable_benchmark_file(benchmarks_copy: Path) -> None:
    (benchmarks_copy / "gpt3.yaml").write_bytes(b"name: gpt3\ntitle: \xff\xfe\n")
    with pytest.raises(UserError, match=r"gpt3.yaml: not UTF-8 at line 2: byte 0xff; save the benchmark file as UTF-8"):
        registry.load("gpt3", directory=benchmarks_copy)


def test_a_benchmark_file_that_is_not_a_file(benchmarks_copy: Path) -> None:
    """A folder or a broken link in place of gpt3.yaml is named as such (it was 'unknown benchmark 'gpt3'; did you
    mean gpt3?')."""
    (benchmarks_copy / "gpt3.yaml").unlink()
    (benchmarks_copy / "gpt3.yaml").mkdir()
    (benchmarks_copy / "bert.yaml").unlink()
    (benchmarks_copy / "bert.yaml").symlink_to(benchmarks_copy / "gone.yaml")
    for name in ("gpt3", "bert"):
        with pytest.raises(UserError, match=rf"{name}.yaml: not a benchmark file \(a folder, a device or a broken"):
            registry.load(name, directory=benchmarks_copy)


def test_a_malformed_tiny_section_is_reported_not_hidden(benchmarks_copy: Path, cli) -> None:
    """`list` shows a benchmark's tiny target: a broken tiny section is an error there, not a silent '-'."""
    f = benchmarks_copy / "gpt3.yaml"
    f.write_text(f.read_text().replace("vocab_size: 128,", "vocab_size: lots,", 1))
    assert registry.load("gpt3", directory=benchmarks_copy)  # the full definition is fine
    assert registry.has_tiny("gpt3", directory=benchmarks_copy)
    with pytest.raises(UserError, match=r"gpt3.yaml \(tiny\).model.vocab_size"):
        registry.load("gpt3", tiny=True, directory=benchmarks_copy)
    proc = cli("list", env={"MLBENCH_BENCHMARKS": str(benchmarks_copy)})
    assert proc.returncode == 2 and "model.vocab_size" in proc.stdout + proc.stderr
    (benchmarks_copy / "bert.yaml").write_text("\n".join(ln for ln in (benchmarks_copy / "bert.yaml").read_text()
                                                         .split("\ntiny:")[0].splitlines()))
    assert not registry.has_tiny("bert", directory=benchmarks_copy)


@pytest.mark.parametrize(("old", "new", "needle"), [
    ("max_steps: floor(20000000 / global_batch_size) - ceil(4000 * 1536 / global_batch_size)",
     "max_steps: 1.5 * 3", "train.max_steps = '1.5 * 3' is 4.5 at global_batch_size = 1 (the smallest batch: "
                           "every expression is checked there too); it counts steps or samples: a whole number"),
    # batch 1, which the file does not name, is said to be the probe (it read as a batch of the file's)
    ("lr: max(2e-5, 3e-5 * min(1, max(0, global_batch_size - 3599)))", "lr: 0 * global_batch_size",
     "optimizer.lr = '0 * global_batch_size' is 0 at global_batch_size = 1 (the smallest batch: every expression "
     "is checked there too); it must be positive"),
], ids=["fractional-steps", "zero-lr"])
def test_values_an_expression_cannot_take_are_refused(benchmarks_copy: Path, old: str, new: str,
                                                      needle: str) -> None:
    """A budget of 4.5 steps and a learning rate of 0 loaded (the tiny variant overrides both, so the full one)."""
    f = benchmarks_copy / "gpt3.yaml"
    f.write_text(f.read_text().replace(old, new, 1))
    with pytest.raises(UserError, match=re.escape(needle)):
        registry.load("gpt3", directory=benchmarks_copy)


@pytest.mark.parametrize(("edit", "said"), [
    (lambda t: t + 'x: "\x1b"\n', "not valid YAML at line {n}: unacceptable character #x001b (control characters "
                                  "are not allowed)"),
    (lambda t: t.replace("lr_table: {16: 4.0e-4,", 'lr_table: {"\u00b2": 1.0, 16: 4.0e-4,'),
     "optimizer.lr_table key: expected an integer, got '\u00b2'"),
    (lambda t: t.replace("lr_table: {16: 4.0e-4,", 'lr_table: {"\u0661\u0666": 1.0, 16: 4.0e-4,'),
     "optimizer.lr_table key: expected an integer, got '\u0661\u0666'"),
], ids=["control-character", "superscript-digit-key", "arabic-indic-digits-key"])
def test_characters_that_are_not_what_they_look_like(benchmarks_copy: Path, edit, said: str) -> None:
    """A control character was a two-line error without its line; a table key '²' (str.isdigit, which int()
    refuses) a traceback; '١٦' was read as 16, one of two values for 16 silently dropped."""
    f = benchmarks_copy / "llama31_8b.yaml"
    text = edit(f.read_text())
    f.write_text(text)
    with pytest.raises(UserError) as e:
        registry.load("llama31_8b", directory=benchmarks_copy)
    assert "\n" not in str(e.value) and said.format(n=text.count("\n")) in str(e.value), str(e.value)


_TITLE = "title: GPT-3 175B (MLPerf Training LLM pretraining, C4, from the 4000-step reference checkpoint)"



# Values a run took and then died of (or ran on broken), each after its log was published as aborted; the full
# definition's, so the tiny variant refuses them too.
@pytest.mark.parametrize(("name", "old", "new", "said"), [
    # the compliance check failed every run, and `plan` raised FileNotFoundError for the RCPs
    ("gpt3", "ruleset: 4.1.0", "ruleset: 99.9.9",
     "gpt3.yaml: mlperf.ruleset '99.9.9': the installed mlperf-logging has no closed rules and RCPs for gpt3 in "
     "it; rulesets that have them: 3.0.0, 3.1.0, 4.0.0, 4.1.0 (all it knows: 0.6.0,"),
    ("gpt3", "ruleset: 4.1.0", "ruleset: 5.0.0", "mlperf.ruleset '5.0.0': the installed mlperf-logging has no "
                                                 "closed rules and RCPs for gpt3 in it"),
    ("gpt3", "  benchmark: gpt3", "  benchmark: gpt4", "gpt3.yaml: mlperf.benchmark 'gpt4' is in no training "
                                                       "ruleset of the installed mlperf-logging"),
    # LAMB's weight-decay term past float32: "value cannot be converted to type float without overflow"
    ("bert", "weight_decay: 0.0166629", "weight_decay: 1.0e+308",
     "bert.yaml: optimizer.weight_decay is 1e+308; it must be at least 0 and at most 3.403e+38 (float32's largest"),
    ("gpt3", "eps: 1.0e-8", "eps: 1.0e+308", "optimizer.eps is 1e+308; it must be positive, from 1.175e-38 "
                                             "(float32's smallest normal number) to 3.403e+38 (its largest)"),
    # NaN at step 2: 1e-320 is 0 in float32
    ("gpt3", "eps: 1.0e-8", "eps: 1.0e-320", "optimizer.eps is 1e-320; it must be positive, from 1.175e-38"),
    ("llama31_8b", "rotary_base: 500000.0", "rotary_base: 1.0e+308",  # "int too big to convert"
     "llama31_8b.yaml: model.rotary_base is 1e+308; it must be a whole number from 1 to 9223372036854775807"),
    ("llama31_8b", "rotary_base: 500000.0", "rotary_base: 0.5", "model.rotary_base is 0.5; it must be a whole"),
    ("llama31_8b", "init_method_std: 0.02", "init_method_std: -1.0",  # "normal expects std >= 0.0"
     "model.init_method_std is -1.0; it must be at least 0 (a standard deviation)"),
    ("llama31_8b", "lr_table: {16: 4.0e-4,", "lr_table: {16: 1.0e+308,",  # addcdiv_'s overflow, as --lr 1e308
     "llama31_8b.yaml: optimizer.lr_table.16 is 1e+308; a learning rate must be positive and at most 1.7e+37 (the "
     "optimizer's first step, lr / (1 - beta1) at optimizer.beta1 0.9, is computed in float32: at most 3.4e+38)"),
    ("llama31_8b", "warmup_table: {16: 16,", "warmup_table: {16: -16,",  # loaded
     "llama31_8b.yaml: optimizer.warmup_table.16 is -16; warm-up steps are 0 to 9223372036854775807"),
    ("gpt3", "size: 175B", "size: 175X", "gpt3.yaml: size '175X' is not a parameter count as published"),  # KeyError
    ("gpt3", "published_params: 1.75e+11", "published_params: 0",  # show's ZeroDivisionError
     "gpt3.yaml: published_params is 0.0; it must be a positive parameter count"),
    # a file's batch past the flags' bound: --global-batch-size 8388608 is refused, the same batch from the file was
    # trained until the OOM killer took the rank; a layout's 1e20 died in the rank ("Maximum allowed dimension")
    ("gpt3", "global_batch_size: 1536  #", "global_batch_size: 8388608  #",
     "gpt3.yaml: train.global_batch_size is 8388608; it must be 1 to 1,048,576 sequences"),
    ("gpt3", "    global_batch_size: 2048\n", "    global_batch_size: 99999999999999999999\n",
     "gpt3.yaml: layouts[0].global_batch_size is 99999999999999999999; it must be 1 to 1,048,576 sequences"),
    ("gpt3", "  - devices: 256\n    tp: 4", "  - devices: 256\n    tp: 2097152",
     "gpt3.yaml: layouts[0].tp is 2097152; it must be 1 to 1,048,576 ranks"),
    ("gpt3", "  - devices: 256", "  - devices: -1",
     "gpt3.yaml: layouts[0].devices is -1; it must be 0 to 1,048,576 devices (0: any number of devices)"),
    # min_lr above lr: the schedule would rise to min_lr (--lr below min_lr was refused, the file's was not)
    ("gpt3", "min_lr: max(2e-6, 3e-6 * min(1, max(0, global_batch_size - 3599)))", "min_lr: 1.0",
     "gpt3.yaml: optimizer.min_lr is 1.0 at global_batch_size = 1536, above optimizer.lr 2e-05: the schedule "
     "decays from lr down to min_lr"),
    # data.path was skipped with the file's own path (field `path`): list and the run record printed the ESC raw
    ("gpt3", '  path: ""  # user supplied', '  path: "/data/a\\eb"  # user supplied',
     "gpt3.yaml: data.path holds \\x1b, a character that is not printable; remove it"),
    ("gpt3", '  path: ""  # user supplied', '  path: "/data/c4\\n"  # user supplied',
     "gpt3.yaml: data.path holds \\n, a character that is not printable; text here is one line"),
    # `list` printed these raw: ESC reached the terminal, a newline split the row in two
    ("gpt3", _TITLE, 'title: "GPT-3 \\e[31m175B"', "gpt3.yaml: title holds \\x1b, a character that is "
                                                           "not printable; remove it"),
    ("gpt3", _TITLE, 'title: "GPT-3\\n175B"', "gpt3.yaml: title holds \\n, a character that is not "
                                                          "printable; text here is one line"),
    # `list` and `show` printed them whole: a 900,000-character title filled the terminal
    ("gpt3", _TITLE, "title: " + "x" * 900_000, "gpt3.yaml: title is 900,000 characters long; at most 200 (a title "
                                                "is one row of `mlbench list`)"),
    ("gpt3", "notes: >-\n", "notes: >-\n  " + "y" * 900_000 + "\n",
     "gpt3.yaml: notes is 900,"),
    ("gpt3", "sources:\n", "sources:\n  - " + "z" * 5000 + "\n", "gpt3.yaml: sources[0] is 5,000 characters long; "
                                                                 "at most 1,000 (a value of one line)"),
], ids=["unknown-ruleset", "ruleset-without-gpt3", "unknown-benchmark", "lamb-weight-decay-overflow", "huge-eps",
        "eps-below-float32", "huge-rotary-base", "fractional-rotary-base", "negative-init-std", "huge-lr-in-table",
        "negative-warmup-in-table", "size-unit", "zero-published-params", "file-batch-past-the-bound",
        "layout-batch-past-the-bound", "layout-tp-past-the-bound", "negative-devices", "min-lr-above-lr",
        "escape-in-data-path", "newline-in-data-path", "escape-in-title", "newline-in-title", "huge-title",
        "huge-notes", "huge-source"])
def test_values_a_run_died_of_are_refused_on_load(benchmarks_copy: Path, name: str, old: str, new: str,
                                                  said: str) -> None:
    _edit(benchmarks_copy / f"{name}.yaml", old, new)
    for tiny in (False, True):
        with pytest.raises(UserError) as e:
            registry.load(name, tiny=tiny, directory=benchmarks_copy)
        assert "\n" not in str(e.value) and said in str(e.value), str(e.value)


@pytest.mark.parametrize(("old", "new", "tiny", "said"), [
    ("  warmup_steps: 287", "  warmup_steps: 600", False,
     "bert.yaml: optimizer.warmup_steps is 600 at global_batch_size = 8192, not below train.max_steps (600)"),
    ("lr: 2.0e-2, warmup_steps: 20,", "lr: 2.0e-2, warmup_steps: 900,", True,
     "bert.yaml (tiny): optimizer.warmup_steps is 900 at global_batch_size = 32, not below train.max_steps (600)"),
], ids=["full", "tiny"])
def test_a_warmup_at_or_past_the_step_budget_is_refused_on_load(benchmarks_copy: Path, old: str, new: str,
                                                                 tiny: bool, said: str) -> None:
    """Every run of such a file ended in its warm-up, the learning rate never at its peak, and was published as
    aborted at the budget; the same value as --warmup-steps was refused before launch."""
    _edit(benchmarks_copy / "bert.yaml", old, new)
    with pytest.raises(UserError) as e:
        registry.load("bert", tiny=tiny, directory=benchmarks_copy)
    assert "\n" not in str(e.value) and said in str(e.value), str(e.value)


@pytest.mark.parametrize(("name", "old", "new", "said"), [
    # megatron-core's scheduler asserted warm-up < warm-up + decay: the run died on a bare 'AssertionError: '
    ("gpt3", "decay_steps: 290,", "decay_steps: 0,",
     "gpt3.yaml (tiny): optimizer.decay_steps is 0 at global_batch_size = 16; the schedule decays over at least 1 "
     "step after its warm-up"),
    # published with eval_samples -5, which the checker fails: 'compliance (FAILED)', exit 0
    ("gpt3", "logged_samples: 0}", "logged_samples: -5}",
     "gpt3.yaml (tiny): eval.logged_samples is -5; it must be 0 (log eval.samples) to 10^12"),
    # each trained the whole budget for nothing, then aborted: no evaluation ran / the warm-up never began
    ("gpt3", "start_samples: 0, logged", "start_samples: 100000, logged",
     "gpt3.yaml (tiny): eval.start_samples is 100000 at global_batch_size = 16, not below the 300 steps' 4800 "
     "samples: no evaluation would ever run"),
    ("bert", "start_warmup_step: -5}", "start_warmup_step: 100000}",
     "bert.yaml (tiny): optimizer.start_warmup_step is 100000, not below the 600 steps at global_batch_size = 32: "
     "the warm-up would never begin"),
], ids=["decay-0", "logged-samples-negative", "eval-start-past-budget", "warmup-start-past-budget"])
def test_a_schedule_that_cannot_run_as_written_is_refused_on_load(benchmarks_copy: Path, name: str, old: str,
                                                                  new: str, said: str) -> None:
    _edit(benchmarks_copy / f"{name}.yaml", old, new)
    with pytest.raises(UserError) as e:
        registry.load(name, tiny=True, directory=benchmarks_copy)
    assert "\n" not in str(e.value) and said in str(e.value), str(e.value)


# The synthetic source's settings (mlbench/train/data/markov.py): each was accepted by list, show and --dry-run, and
# the run died in numpy once started (or, for the concentration, trained on a source that emits one token).
@pytest.mark.parametrize(("name", "old", "new", "said"), [
    ("gpt3", "seed: 1234}", "seed: -1}",  # numpy: "expected non-negative integer"
     "gpt3.yaml (tiny): data.seed is -1; it must be 0 to 4294967295, as a run's --seed"),
    ("gpt3", "seed: 1234}", "seed: 4294967296}", "data.seed is 4294967296; it must be 0 to 4294967295"),
    ("gpt3", "branching: 4,", "branching: 100000,",  # numpy: "Cannot take a larger sample than population"
     "gpt3.yaml (tiny): data.branching is 100000: the Markov source picks that many distinct successors for each of "
     "its 128 tokens (model.vocab_size); at most 128"),
    ("gpt3", "vocab_size: 128, seq", "vocab_size: 1, seq",
     "gpt3.yaml (tiny): model.vocab_size is 1; it must be at least 2 (with one token there is nothing to predict)"),
    ("bert", "vocab_size: 32,", "vocab_size: 2,", "bert.yaml (tiny): model.vocab_size is 2: the Markov source "
                                                  "(data.source: markov) needs at least 2 tokens (model.vocab_size 2 "
                                                  "less the one kept for [MASK])"),
    ("gpt3", "vocab_size: 128, seq", "vocab_size: 100000, seq",  # a 100,000 x 100,000 float64 matrix on every rank
     "model.vocab_size is 100000: the Markov source (data.source: markov) builds a 100,000 x 100,000 transition "
     "matrix on every rank; at most 4,096 tokens"),
    ("gpt3", "concentration: 0.5,", "concentration: 1.0e+308,",
     "data.concentration is 1e+308: the Dirichlet weights of 4 successors sum 4 draws of about that size, past "
     "float64's range (every weight comes out 0); at most 2.25e+307"),
], ids=["negative-seed", "seed-past-32-bits", "branching-past-vocabulary", "one-token", "bert-one-token",
        "vocabulary-too-large", "concentration-overflow"])
def test_synthetic_data_settings_are_checked_on_load(benchmarks_copy: Path, name: str, old: str, new: str,
                                                     said: str) -> None:
    f = benchmarks_copy / f"{name}.yaml"
    tiny_at = f.read_text().index("\ntiny:")
    head, tiny = f.read_text()[:tiny_at], f.read_text()[tiny_at:]
    assert old in tiny
    f.write_text(head + tiny.replace(old, new, 1))
    assert registry.load(name, directory=benchmarks_copy)  # the full definition trains on its real data
    with pytest.raises(UserError) as e:
        registry.load(name, tiny=True, directory=benchmarks_copy)
    assert "\n" not in str(e.value) and said in str(e.value), str(e.value)


def test_a_yaml_merge_key_is_checked_like_any_key(benchmarks_copy: Path) -> None:
    """Keys a `<<` merge brings in are known or refused as written ones are (reported as a bypass; it held)."""
    f = benchmarks_copy / "gpt3.yaml"
    f.write_text(f.read_text().replace("\ntiny:\n", "\ntiny:\n  <<: {bogus: 1}\n", 1))
    with pytest.raises(UserError, match=r"gpt3.yaml \(tiny\): unknown key 'bogus'"):
        registry.load("gpt3", tiny=True, directory=benchmarks_copy)


def test_full_recompute_layers_from_the_file_are_checked_against_the_pipeline_chunks(benchmarks_copy: Path) -> None:
    """A file's recompute_layers that does not divide a chunk's layers: IndexError in megatron-core's uniform
    recompute once the run had started; named by its key, with the flag that overrides it."""
    f = benchmarks_copy / "gpt3.yaml"
    f.write_text(f.read_text().replace("  recompute: none\n", "  recompute: full\n  recompute_layers: 5\n", 1))
    bench = registry.load("gpt3", directory=benchmarks_copy)
    with pytest.raises(UserError) as e:
        resolve_layout(bench, LayoutRequest(nodes=32, nproc_per_node=8))  # tp4 pp8 vp6: 2 layers a chunk
    assert str(e.value) == (
        "features.recompute_layers 5 (gpt3.yaml; --recompute-layers sets it): full recompute (uniform) recomputes "
        "each pipeline chunk's layers in groups of 5, which must divide them, and gpt3's 96 layers over pp 8 x vp 6 "
        "give 2 layers a pipeline chunk: give one of 1, 2, or --recompute-method block")


# Values that were a traceback out of list, show or plan (an OverflowError, a ZeroDivisionError, an IndexError, a
# TypeError) or launched a run that died: each refused at load, naming the key.
@pytest.mark.parametrize(("name", "old", "new", "said"), [
    ("gpt3", "published_params: 1.75e+11", "published_params: 1" + "0" * 400,
     "gpt3.yaml.published_params: a number of about 401 digits is beyond the bound 9.22e+18"),
    ("gpt3", "beta1: 0.9", "beta1: 1" + "0" * 400, "optimizer.beta1: a number of about 401 digits is beyond"),
    ("gpt3", "make_vocab_size_divisible_by: 128", "make_vocab_size_divisible_by: 0",
     "gpt3.yaml: model.make_vocab_size_divisible_by is 0; it must be at least 1"),
    ("gpt_oss_20b", "moe_ffn_hidden_size: 2880", "moe_ffn_hidden_size: -1",
     "gpt_oss_20b.yaml: model.moe_ffn_hidden_size is -1; it must be at least 0"),
    ("gpt_oss_20b", "moe_ffn_hidden_size: 2880", "moe_ffn_hidden_size: 0",
     "model.moe_ffn_hidden_size is 0; a mixture-of-experts model (family moe) needs it at least 1"),
    ("gpt3", "lr: max(2e-5, 3e-5 * min(1, max(0, global_batch_size - 3599)))", "lr: null",
     "gpt3.yaml: optimizer.lr is not given and optimizer.lr_table has no learning rate at the file's global batch "
     "(1536)"),
    ("gpt_oss_20b", "  samples: 1024", "  samples: 1000000000000000000",
     "gpt_oss_20b.yaml: eval.samples is 1000000000000000000; it must be 1 to 1,048,576 sequences"),
], ids=["huge-int-as-float", "huge-int-beta1", "vocab-multiple-0", "negative-expert-width", "moe-without-width",
        "no-lr-at-the-files-batch", "eval-samples-past-memory"])
def test_values_that_were_tracebacks_are_refused_on_load(benchmarks_copy: Path, name: str, old: str, new: str,
                                                         said: str) -> None:
    _edit(benchmarks_copy / f"{name}.yaml", old, new)
    with pytest.raises(UserError) as e:
        registry.load(name, directory=benchmarks_copy)
    assert "\n" not in str(e.value) and said in str(e.value), str(e.value)


def test_a_schedule_is_checked_at_the_batch_and_warm_up_a_run_gives(benchmarks_copy: Path, cli) -> None:
    """The load-time checks ran at the file's own values only: --warmup-steps 290 with decay_steps written as
    '290 - warmup_steps' (as llama31_8b's is) launched a run that died on megatron's bare assert, and a first
    evaluation at 4,799 samples passed at batch 16 (300 steps, 4,800) and trained all 300 steps of batch 8 for
    nothing."""

    _edit(benchmarks_copy / "gpt3.yaml", "warmup_steps: 10, decay_steps: 290, weight_decay: 0.0}",
          "warmup_steps: 10, decay_steps: 290 - warmup_steps, weight_decay: 0.0}")
    _edit(benchmarks_copy / "gpt3.yaml", "start_samples: 0, logged_samples: 0",
          "start_samples: 4799, logged_samples: 0")
    env = {"MLBENCH_BENCHMARKS": str(benchmarks_copy)}
    registry.load("gpt3", tiny=True, directory=benchmarks_copy)  # the file itself is sound at its own batch
    for flags, said in ((["--warmup-steps", "290"], "gpt3 with --warmup-steps 290: optimizer.decay_steps is 0 at "
                                                     "global_batch_size = 16; the schedule decays over at least 1"),
                        (["--gbs", "8", "--mbs", "8"], "gpt3 as this run trains it: eval.start_samples is 4799 at "
                                                       "global_batch_size = 8, not below the 300 steps' 2400 samples")):
        proc = cli("run", "gpt3", "--tiny", "--dry-run", *flags, "--results", str(benchmarks_copy / "r"), env=env)
        assert proc.returncode == 2 and said in proc.stderr, proc.stdout + proc.stderr
    assert not (benchmarks_copy / "r").exists()


# A metric the model's objective does not evaluate: the run compared the objective's value with the target (a gpt
# model's log perplexity of about 4 met 'masked_lm_accuracy >= 0.5' at the first evaluation: a success published).
@pytest.mark.parametrize(("name", "old", "new", "tiny", "said"), [
    ("gpt3", "  quality:\n    target: 1.04", "  quality:\n    metric: masked_lm_accuracy\n    direction: max\n"
                                              "    target: 0.5", True,
     "gpt3.yaml (tiny): quality.metric is 'masked_lm_accuracy', but a gpt model (model.family) is evaluated in "
     "log_perplexity (its objective's metric), which the run compares with quality.target; give quality.metric: "
     "log_perplexity"),
    ("bert", "  metric: masked_lm_accuracy\n  target: 0.720", "  metric: log_perplexity\n  target: 2.0", False,
     "bert.yaml: quality.metric is 'log_perplexity', but a bert model (model.family) is evaluated in "
     "masked_lm_accuracy"),
], ids=["gpt-scored-as-accuracy", "bert-scored-as-perplexity"])
def test_a_quality_metric_the_model_does_not_evaluate_is_refused(benchmarks_copy: Path, name: str, old: str, new: str,
                                                                 tiny: bool, said: str) -> None:
    text = (benchmarks_copy / f"{name}.yaml").read_text()
    if not tiny:  # (the edit is the full definition's quality, its direction too)
        new = new.replace("target: 2.0", "target: 2.0\n  direction: min").replace("\n  direction: max", "", 1)
        text = text.replace("  direction: max\ndata:", "data:", 1)
    (benchmarks_copy / f"{name}.yaml").write_text(text)
    _edit(benchmarks_copy / f"{name}.yaml", old, new)
    with pytest.raises(UserError) as e:
        registry.load(name, tiny=tiny, directory=benchmarks_copy)
    assert "\n" not in str(e.value) and said in str(e.value), str(e.value)


@pytest.mark.parametrize("tiny", [False, True])
@pytest.mark.parametrize("name", registry.names(registry.SHIPPED_DIR))
def test_each_family_says_the_metric_its_objective_evaluates(name: str, tiny: bool) -> None:
    from mlbench.models import family

    if tiny and not registry.has_tiny(name, registry.SHIPPED_DIR):
        pytest.skip(f"{name} has no tiny variant")
    b = registry.load(name, tiny=tiny, directory=registry.SHIPPED_DIR)
    assert family(b.model.family).objective(b).metric == family(b.model.family).metric == b.quality.metric


@pytest.mark.parametrize(("old", "new", "tiny", "said"), [
    ("  num_layers: 96", "  num_layer: 96", False,
     "gpt3.yaml.model: unknown key 'num_layer'; did you mean 'num_layers'? (known: family, num_layers,"),
    ("\nquality:\n", "\nQuality:\n", False, "gpt3.yaml: unknown key 'Quality'; did you mean 'quality'? (known: name,"),
    ("\ntiny:\n", "\ntiny:\n  optimiser: {lr: 1.0e-3}\n", True,
     "gpt3.yaml (tiny): unknown key 'optimiser'; did you mean 'optimizer'? (known: name,"),
    ("  num_layers: 96", "  num_layers: 96\n  flux_capacitor: 1", False,
     "gpt3.yaml.model: unknown key 'flux_capacitor' (known: family, num_layers,"),
    # where the file was found and which section was read are mlbench's to say, not keys of the file: `variant:
    # tiny` made the full definition a tiny one (refused as 'a tiny variant must say how its target was chosen'),
    # and `path:` was listed as a known key and silently replaced
    ("\nmodel:\n", "\nvariant: tiny\nmodel:\n", False, "gpt3.yaml: unknown key 'variant' (known: name, title, size,"),
    ("\nmodel:\n", "\npath: /elsewhere/gpt3.yaml\nmodel:\n", False, "gpt3.yaml: unknown key 'path' (known: name,"),
    ("\ntiny:\n", "\ntiny:\n  variant: full\n", True, "gpt3.yaml (tiny): unknown key 'variant' (known: name,"),
    # the tiny section's own key, mistyped: the full definition read it as a stranger, offering nothing
    ("\ntiny:\n", "\ntinyy:\n", False, "gpt3.yaml: unknown key 'tinyy'; did you mean 'tiny'? (known: name,"),
], ids=["typo", "case", "tiny-typo", "nothing-close", "variant", "path", "tiny-variant", "tiny-itself"])
def test_an_unknown_key_is_refused_naming_the_close_known_one(benchmarks_copy: Path, old: str, new: str, tiny: bool,
                                                               said: str) -> None:
    _edit(benchmarks_copy / "gpt3.yaml", old, new)
    with pytest.raises(UserError) as e:
        registry.load("gpt3", tiny=tiny, directory=benchmarks_copy)
    message = str(e.value)
    assert "\n" not in message and said in message, message
    assert "variant" not in message.partition("(known:")[2] and "path" not in message.partition("(known:")[2]


@pytest.mark.parametrize(("old", "new", "tiny", "said"), [
    # list and show accepted it, --dry-run and a tiny run too; only a full run was refused, naming no file
    ("  source: indexed", "  source: tfrecord", False,
     "gpt3.yaml: data.source is 'tfrecord', which a gpt model's objective (model.family) does not read; it reads "
     "markov or indexed"),
    # a tiny variant of another architecture: `run --tiny` tested a model the benchmark is not
    ("  model: {num_layers: 2,", "  model: {family: moe, num_experts: 4, moe_router_topk: 2, moe_ffn_hidden_size: 64, "
                                 "num_layers: 2,", True,
     "gpt3.yaml (tiny): model.family is 'moe', the full definition's 'gpt'; a tiny variant is the same architecture "
     "with smaller numbers: leave model.family out of it"),
    # a tiny section naming another benchmark: its runs were published as that one's ('other' folder and record)
    ("\ntiny:\n", "\ntiny:\n  name: other\n", True,
     "gpt3.yaml (tiny): name is 'other', the full definition's 'gpt3'; a tiny variant is the same benchmark (its "
     "file's name): leave name out of it"),
], ids=["source-the-family-does-not-read", "tiny-of-another-family", "tiny-of-another-name"])
def test_a_definition_that_contradicts_itself_is_refused_on_load(benchmarks_copy: Path, old: str, new: str,
                                                                 tiny: bool, said: str) -> None:
    _edit(benchmarks_copy / "gpt3.yaml", old, new)
    with pytest.raises(UserError) as e:
        registry.load("gpt3", tiny=tiny, directory=benchmarks_copy)
    assert "\n" not in str(e.value) and said in str(e.value), str(e.value)


@pytest.mark.parametrize(("encode", "said"), [
    (lambda t: t.replace("title: GPT-3", "title: GPT-3 \xe9", 1).encode("latin-1"),
     "gpt3.yaml: not UTF-8 at line {line}: byte 0xe9; save the benchmark file as UTF-8"),
    (lambda t: t.encode("utf-16"), "gpt3.yaml: not UTF-8 at line 1 (a UTF-16 file?): byte 0xff; save the benchmark "
                                   "file as UTF-8"),
], ids=["latin-1", "utf-16"])
def test_a_benchmark_file_not_in_utf8_is_named_by_its_line(benchmarks_copy: Path, encode, said: str) -> None:
    """Said before as 'cannot read the benchmark file ('utf-8' codec can't decode byte 0xe9 in position 1160:
    invalid continuation byte)': a byte offset, no line."""
    f = benchmarks_copy / "gpt3.yaml"
    text = f.read_text()
    f.write_bytes(encode(text))
    with pytest.raises(UserError) as e:
        registry.load("gpt3", directory=benchmarks_copy)
    line = text[:text.index("title: GPT-3")].count("\n") + 1
    assert "\n" not in str(e.value) and str(e.value).endswith(said.format(line=line)), str(e.value)


# ---- docs/benchmark-keys.md: the keys a file may hold, as the code reads them ---------------------------------

KEYS_DOC = Path(__file__).resolve().parents[1] / "docs" / "benchmark-keys.md"
_KEY_ROW = re.compile(r"^\| `(\w+)` \| ([^|]+) \| ([^|]+) \| ([^|]+) \| ([^|]+) \| ([^|]+) \| ([^|]+) \|$")
_NAMES = {int: "integer", float: "number", str: "string", bool: "true or false", type(None): "null"}


def _documented_keys() -> dict[str, dict[str, dict[str, str]]]:
    """docs/benchmark-keys.md's rows by section ('' the top level, 'layouts' a list element) and key: each row's
    type, default, bounds and tiny cells."""
    out: dict[str, dict[str, dict[str, str]]] = {}
    section = None
    for line in KEYS_DOC.read_text().splitlines():
        if line.startswith("## "):
            m = re.fullmatch(r"## (?:Top level|`(\w+)`)", line)
            assert m, f"a heading that names no section: {line!r}"
            section = m[1] or ""
            out[section] = {}
        elif m := _KEY_ROW.match(line):
            assert section is not None, f"a key row before any section: {line!r}"
            assert m[1] not in out[section], f"{section}.{m[1]} documented twice"
            out[section][m[1]] = dict(zip(("type", "unit", "default", "bounds", "tiny", "meaning"),
                                          (c.strip() for c in m.groups()[1:]), strict=True))
        else:
            assert not line.startswith("| `"), f"a row the test cannot read: {line!r}"
    return out


def _file_sections() -> dict[str, type]:
    """Each section of a benchmark file and the dataclass that reads it: the top level (Benchmark), each field of it
    that is a dataclass, and a list of dataclasses (layouts) by its element."""
    from mlbench.spec import Benchmark

    hints = typing.get_type_hints(Benchmark)
    out: dict[str, type] = {"": Benchmark}
    for f in dataclasses.fields(Benchmark):
        tp = hints[f.name]
        item = typing.get_args(tp)[0] if typing.get_origin(tp) is tuple else tp
        if dataclasses.is_dataclass(item):
            out[f.name] = item
    return out


def _file_keys(cls: type) -> list[dataclasses.Field]:
    """The keys a file gives of CLS: its fields, less the two registry.load sets (`variant`, `path`)."""
    return [f for f in dataclasses.fields(cls) if not (cls.__name__ == "Benchmark" and f.name in ("variant", "path"))]


def _type_text(tp: object) -> str:
    """A field's type as docs/benchmark-keys.md writes it (a str beside a number: an expression)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        return "one of " + ", ".join(args)
    if origin in (typing.Union, types.UnionType):
        number = any(a in (int, float) for a in args)
        arms = ["expression" if a is str and number else _type_text(a) for a in args]
        return ", ".join(arms[:-1]) + " or " + arms[-1]
    if origin is tuple:
        return "list of " + ("strings" if args[0] is str else "mappings")
    if origin is dict:
        return f"mapping of {_type_text(args[0])} to {_type_text(args[1])}"
    return "mapping" if dataclasses.is_dataclass(tp) else _NAMES[tp]


def test_the_key_reference_lists_exactly_the_keys_a_file_may_hold() -> None:
    """Every key the loader reads is in docs/benchmark-keys.md, in its section, with its type and default; and every
    key there is one the loader reads: a new field without its row (or a row left after its field went) fails."""
    doc, sections = _documented_keys(), _file_sections()
    assert set(doc) == set(sections), f"sections: documented {sorted(doc)}, read {sorted(sections)}"
    for section, cls in sections.items():
        hints = typing.get_type_hints(cls)
        keys = {f.name: f for f in _file_keys(cls)}
        expected = set(keys) | ({"tiny"} if section == "" else set())
        assert set(doc[section]) == expected, \
            f"{section or 'top level'}: undocumented {sorted(expected - set(doc[section]))}, documented but not " \
            f"read {sorted(set(doc[section]) - expected)}"
        for name, f in keys.items():
            row, where = doc[section][name], f"{section}.{name}".lstrip(".")
            assert row["type"] == _type_text(hints[name]), f"{where}: type {row['type']!r}"
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                assert row["default"] == "required", f"{where}: required, documented {row['default']!r}"
                continue
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            cell = re.fullmatch(r"`(.*)`", row["default"])
            assert cell, f"{where}: default {row['default']!r} is not a value in backticks"
            written = registry.yaml.load(cell[1], Loader=registry._Loader)
            if dataclasses.is_dataclass(default):  # a section left out: every key of it its default
                assert written == {}, f"{where}: default {row['default']!r}"
            else:
                assert spec._check_value(where, written, hints[name]) == default, f"{where}: default {row['default']!r}"


def test_the_key_reference_states_the_bounds_the_loader_checks() -> None:
    """A key with a range of its own (registry._RANGES) or an expression's (spec: positive, whole) says so."""
    doc = _documented_keys()
    checked = set(registry._RANGES) | spec._POSITIVE | spec._WHOLE
    for key in checked:
        section, name = key.split(".")
        assert doc[section][name]["bounds"] != "-", f"{key}: the loader bounds it; docs/benchmark-keys.md says '-'"


def test_the_key_reference_says_which_keys_a_tiny_section_may_give(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each key's tiny column as the loader has it: 'yes' loads from the tiny section (the tiny variant's own value
    given again), 'same' loads with the full definition's value and is refused with another, 'no' is refused."""
    import copy

    doc, sections = _documented_keys(), _file_sections()
    same = {f"{section}.{name}".lstrip(".") for section, rows in doc.items() for name, row in rows.items()
            if row["tiny"] == "same"}
    assert same == {key for key, _ in registry.TINY_SAME}, f"documented 'same': {sorted(same)}"
    full = registry._read(registry.SHIPPED_DIR / "gpt3.yaml")
    tiny = dataclasses.asdict(registry.load("gpt3", tiny=True))
    layout = {"devices": 1}  # a layouts element: the key given beside the one key it needs

    def loads(override: dict) -> bool:
        data = copy.deepcopy(full) | {"tiny": copy.deepcopy(full["tiny"])}
        data["tiny"] = spec.deep_merge(data["tiny"], override)
        monkeypatch.setattr(registry, "_read", lambda path: copy.deepcopy(data))
        try:
            registry.load("gpt3", tiny=True)
        except UserError:
            return False
        return True

    def given(section: str, name: str, value: object) -> dict:
        if section == "":
            return {name: value}
        if section == "layouts":
            return {"layouts": [layout | {name: value}]}
        return {section: {name: value}}

    for section, rows in doc.items():
        for name, row in rows.items():
            where = f"{section}.{name}".lstrip(".")
            if section == "layouts":
                own = dataclasses.asdict(spec.LayoutSpec(devices=1))[name]
            else:  # (`tiny` itself: an empty one)
                own = tiny.get(name, {}) if section == "" else tiny[section][name]
            assert row["tiny"] in ("yes", "same", "no"), f"{where}: tiny {row['tiny']!r}"
            if row["tiny"] == "no":
                assert not loads(given(section, name, own)), f"{where}: documented 'no', but a tiny section takes it"
                continue
            assert loads(given(section, name, own)), f"{where}: documented {row['tiny']!r}, but refused in tiny"
            hints = typing.get_type_hints(sections[section])
            if row["tiny"] == "same":
                other = next(c for c in typing.get_args(hints[name]) if c != own) \
                    if typing.get_origin(hints[name]) is typing.Literal else f"{own}x"
                assert not loads(given(section, name, other)), f"{where}: documented 'same', but {other!r} loads"


_BOUND = re.compile(r"(at least (?P<least>[-0-9^, ]+?)|(?P<positive>positive)|in (?P<open>[\[(])(?P<lo>[-0-9.]+), "
                    r"(?P<hi>[-0-9.]+)(?P<close>[\])])|(?P<a>[-0-9^, ]+?) to (?P<b>[0-9^, -]+?))(?: \(|;|,|$)")


def _amount(text: str) -> int:
    """A bound as the reference writes it (`2^20`, `2^63 - 1`, `1,000`) as a number."""
    text = text.replace(",", "").replace(" ", "")
    assert re.fullmatch(r"-?[0-9]+(\^[0-9]+)?(-[0-9]+)?", text), text
    base, _, rest = text.partition("^")
    power, _, less = rest.partition("-")
    return int(base) ** int(power or 1) - int(less or 0)


def _bound_cases(bounds: str, integer: bool) -> tuple[list[object], list[object]]:
    """Values just past the bound a cell states first (a range, `at least N`, `positive`), and values at it (just
    inside an open end):
    ([], []) for a cell of another kind (a rule between keys, a length)."""
    m = _BOUND.match(bounds)
    if not m:
        return [], []
    step = 1 if integer else 0.5
    if m["least"]:
        least = _amount(m["least"])
        return [least - step], [least]
    if m["positive"]:
        return [0], [1 if integer else 1e-6]
    if m["open"]:
        lo, hi = float(m["lo"]), float(m["hi"])
        past = [lo - 1e-9 if m["open"] == "[" else lo, hi if m["close"] == ")" else hi + 1e-9]
        return past, [lo if m["open"] == "[" else lo + 1e-9, hi if m["close"] == "]" else hi - 1e-9]
    a, b = _amount(m["a"]), _amount(m["b"])
    return [a - 1, b + 1], [a, b]


def test_each_bound_the_key_reference_states_is_the_loader_s(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bounds column was checked only to say something where the loader bounds a key: a bound changed in the
    code (or in the reference) without the other went unseen. Each numeric bound a row states first (`at least N`,
    `positive`, `in [a, b)`, `A to B`) is tried on gpt3's file: a value just past it is refused naming the key, the
    value at it is not."""
    import copy

    doc, sections = _documented_keys(), _file_sections()
    full = registry._read(registry.SHIPPED_DIR / "gpt3.yaml")

    def refusal(section: str, name: str, value: object) -> str:
        data = copy.deepcopy(full)
        data.pop("tiny", None)
        if section == "":
            data[name] = value
        elif section == "layouts":
            data["layouts"] = [{"devices": 0, name: value}]
        else:
            data.setdefault(section, {})[name] = value
        monkeypatch.setattr(registry, "_read", lambda path: copy.deepcopy(data))
        try:
            registry.load("gpt3")
        except UserError as e:
            return str(e)
        return ""

    tried = 0
    for section, rows in doc.items():
        hints = typing.get_type_hints(sections[section])
        for name, row in rows.items():
            if name not in hints or "expression" in row["type"]:  # an expression's bounds: spec's own test
                continue
            integer = int in typing.get_args(hints[name]) or hints[name] is int
            past, at = _bound_cases(row["bounds"], integer)
            said = f"{'layouts[0]' if section == 'layouts' else section}.{name} is ".lstrip(".")
            for value in past:
                assert said in refusal(section, name, value), f"{section}.{name} {value} loads: {row['bounds']!r}"
            for value in at:
                assert f"{said}{value};" not in refusal(section, name, value), \
                    f"{section}.{name} {value} is refused: {row['bounds']!r}"
            tried += len(past) + len(at)
    assert tried > 100  # every numeric bound the reference states
