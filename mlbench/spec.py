"""Typed benchmark definitions, built from the declarative files in `benchmarks/`.

A benchmark file holds the full MLPerf definition; its `tiny:` section is a deep-merge override of it,
so a tiny variant is the same benchmark with smaller numbers, never a second definition.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import math
import operator
import reprlib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from mlbench.ascii_numbers import is_ascii_float
from mlbench.errors import UserError
from mlbench.quality import reached


@dataclass(frozen=True)
class ModelSpec:
    # megatron-core GPTModel (gpt; moe: with mixture-of-experts MLPs) or BertModel
    family: Literal["gpt", "bert", "moe"]
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    ffn_hidden_size: int
    vocab_size: int
    seq_length: int
    num_query_groups: int | None = None  # grouped-query attention; None means one group per head
    kv_channels: int | None = None  # per-head width; None means hidden / heads
    position_embedding: Literal["learned_absolute", "rope"] = "learned_absolute"
    rotary_base: float = 10000.0
    rope_scaling: bool = False  # Llama 3.1 frequency scaling of RoPE
    rope_scaling_factor: float = 8.0
    normalization: Literal["LayerNorm", "RMSNorm"] = "LayerNorm"
    norm_epsilon: float = 1e-5
    # gelu: the exact (erf) GeLU; gelu_tanh: its tanh approximation (what megatron's fused bias-gelu kernel and
    # the BERT TF reference compute); swiglu: gated SiLU.
    activation: Literal["gelu", "gelu_tanh", "swiglu"] = "gelu"
    add_bias_linear: bool = True
    untie_embeddings: bool = False  # separate output layer
    make_vocab_size_divisible_by: int = 128
    # Leave the padding rows of the output layer (vocab_size .. padded) out of the softmax and the argmax, so
    # loss and accuracy are over the real vocabulary: for a reference whose output is exactly vocab_size wide
    # (BERT's TF model). Megatron's own references (gpt3) and NeMo's (llama) keep the padding in the softmax.
    mask_padded_vocab: bool = False
    dropout: float = 0.0
    # BertModel only: token-type (segment) embeddings, and the pooler + next-sentence binary head
    # (MLPerf's BERT reference has both: type_vocab_size 2, loss = masked LM + next sentence).
    num_tokentypes: int = 0
    add_binary_head: bool = False
    # Where the LayerNorms sit: "pre" (megatron-core's x + f(LN(x)) and a final LN) or "post" (the original
    # BERT's LN(x + f(x)) and an embedding LN; mlbench/train/post_norm.py).
    norm_position: Literal["pre", "post"] = "pre"
    # LayerNorm1P: the weight stores gamma - 1 (initialised to 0) and the norm applies weight + 1, as the
    # Megatron GPT-3 reference and its checkpoint do; megatron-core's layernorm_zero_centered_gamma.
    zero_centered_gamma: bool = False
    init_method_std: float = 0.02  # standard deviation of the normal weight initialisation
    qk_layernorm: bool = False  # a norm (normalization's kind) over the head dimension of q and k
    # Sliding-window attention: a query sees itself and the window_size tokens before it (megatron-core's
    # window_size (window_size, 0)); 0: full causal attention. window_attn_skip_freq N > 0: every Nth layer
    # (1-indexed) keeps full attention, the others slide (2: layers 1, 3, ... slide); 0: every layer slides.
    window_size: int = 0
    window_attn_skip_freq: int = 0
    # Mixture of experts (family moe): every layer's MLP is num_experts experts of moe_ffn_hidden_size, each
    # token routed to moe_router_topk of them (mlbench/models/moe.py says the routing).
    num_experts: int = 0
    moe_router_topk: int = 0
    moe_ffn_hidden_size: int = 0


@dataclass(frozen=True)
class OptimizerSpec:
    name: Literal["adam", "adamw", "lamb"]
    # Learning rate: a number, or an arithmetic expression in `global_batch_size` (see `evaluate`); None where
    # lr_table gives it.
    lr: float | str | None = None
    min_lr: float | str = 0.0  # expressions may also name `lr`, the resolved learning rate
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    # megatron-core leaves biases and 1-D parameters (norms) out of weight decay; true decays every parameter
    # (Megatron-LM's --do-layernorm-bias-weight-decay).
    decay_norms_and_biases: bool = False
    clip_grad: float = 1.0
    # Schedule, in optimizer steps; expressions in `global_batch_size` allowed.
    warmup_steps: int | str = 0
    decay_steps: int | str = 0  # steps of cosine decay after warm-up; expressions may name `warmup_steps`
    decay_style: Literal["cosine", "linear", "poly"] = "cosine"
    decay_power: float = 1.0  # for poly (BERT's LAMB schedule)
    start_warmup_step: int = 0
    # BERT reference schedule: the poly decay runs from step 0 over warmup_steps + decay_steps steps and the
    # linear warm-up (shifted by start_warmup_step) is overlaid on it, instead of decay starting after warm-up.
    warmup_overlaps_decay: bool = False
    # Learning rate and warm-up steps by global batch, for benchmarks whose rules leave them free and whose
    # reference convergence points (RCPs) were each produced with their own (llama31_8b, gpt_oss_20b); used where
    # `lr` is not given. A global batch outside the table has no defined schedule: refused unless the user gives
    # one (mlbench/rcp_schedule.py).
    lr_table: dict[int, float] = field(default_factory=dict)
    warmup_table: dict[int, int] = field(default_factory=dict)

    def base_at(self, gbs: int) -> tuple[float, int] | None:
        """(learning rate, warm-up steps) at global batch `gbs`: from `lr` and `warmup_steps`, else from the
        tables; None where the tables have no row for `gbs` (mlbench/rcp_schedule.py refuses the batch)."""
        if self.lr is not None:
            return evaluate(self.lr, global_batch_size=gbs), int(evaluate(self.warmup_steps, global_batch_size=gbs))
        if gbs in self.lr_table and gbs in self.warmup_table:
            return self.lr_table[gbs], self.warmup_table[gbs]
        return None

    def decay_at(self, gbs: int, warmup_steps: int) -> Any:
        """`decay_steps` at global batch `gbs` after a warm-up of `warmup_steps` (its expression may name it)."""
        return evaluate(self.decay_steps, global_batch_size=gbs, warmup_steps=warmup_steps)


@dataclass(frozen=True)
class TrainSpec:
    global_batch_size: int
    micro_batch_size: int = 1
    max_steps: int | str = 0  # step budget: a run that has not converged by then is aborted
    # MLPerf: the benchmark starts from a checkpoint at this step (an expression in global_batch_size allowed:
    # GPT-3's is ceil(4000 * 1536 / global_batch_size)); the schedule resumes there.
    init_checkpoint_step: int | str = 0
    init_checkpoint: str = ""  # the checkpoint a full run starts from (weights; user supplied), "" for none
    # How that checkpoint names megatron-core's tensors where it differs: "FROM -> TO" fragment replacements,
    # applied in order to megatron-core names (mlbench/train/checkpoint.py).
    checkpoint_names: dict[str, tuple[str, ...]] = field(default_factory=dict)
    precision: Literal["bf16", "fp8", "fp32"] = "bf16"  # on CPU always fp32; fp8 through Transformer Engine


@dataclass(frozen=True)
class EvalSpec:
    interval_samples: int | str  # evaluate every this many training samples
    samples: int  # size of the eval set
    # Evaluations before this many samples are skipped (MLPerf eval offsets); expression allowed.
    start_samples: int | str = 0
    # indexed data: the eval set is the eval split packed whole, its last, partial sequence kept (padded, the
    # padding outside the loss), as megatron's whole-set evaluation (--eval-iters -1) packs it; else the
    # split's first `samples` full sequences.
    keep_partial_sequence: bool = False
    # The log's eval_samples, where the reference logs another count than `samples` (gpt3: the eval set's
    # tokens); 0: `samples`.
    logged_samples: int = 0


@dataclass(frozen=True)
class QualitySpec:
    metric: Literal["log_perplexity", "masked_lm_accuracy"]
    target: float
    direction: Literal["min", "max"]  # min: converged when metric <= target; max: when >= target
    note: str = ""  # how the target was chosen (required for tiny variants)


@dataclass(frozen=True)
class DataSpec:
    # "markov": the synthetic source with a known entropy rate (tiny runs);
    # "indexed": megatron-core's indexed dataset at `path` (the real corpus, prepared by the user).
    # "tfrecord": MLPerf BERT's pre-masked TFRecord samples at `path` / `eval_path` (mlbench/train/bert_data.py).
    source: Literal["markov", "indexed", "tfrecord"]
    path: str = ""  # indexed: training prefix, or a blend "W1 PREFIX1 W2 PREFIX2 ..." (megatron's --data-path)
    # indexed: held-out eval prefix (or blend); "" splits the last documents of a single `path` off instead
    eval_path: str = ""
    eod_id: int | None = None  # indexed: the tokenizer's end-of-document id, for megatron's dataset config
    # indexed: a sequence reads one token past its end, so all its positions predict (megatron-core's
    # add_extra_token_to_sequence); false: windows of exactly seq_length, the last position predicting nothing
    add_extra_token_to_sequence: bool = True
    branching: int = 4  # markov: successors per state
    concentration: float = 0.5  # markov: Dirichlet concentration of each state's successor weights
    mask_prob: float = 0.15  # masked LM: fraction of positions predicted
    max_predictions_per_seq: int = 0  # masked LM: cap on predicted positions per sequence (0: none)
    tokenizer: str = ""  # the tokenizer the prepared corpus was made with (full sizes)
    description: str = ""  # what the real corpus and eval set are (full sizes)
    seed: int = 1234  # the source itself is fixed; the run seed only changes sampling and init
    eod_mask_loss: bool = False  # indexed: end-of-document tokens are left out of the loss (megatron's option)


@dataclass(frozen=True)
class MLPerfSpec:
    benchmark: str  # submission_benchmark
    ruleset: str  # training ruleset version the closed rules come from
    runs_required: int
    eval_unit: Literal["tokens", "samples"]  # what the eval_accuracy metadata counts
    eval_metadata_key: Literal["epoch_num", "samples_count"]
    # What opt_learning_rate_decay_steps states: the decay's length after warm-up (llama31_405b's rules check
    # ceil(1.2M x 1152 / gbs) - warm-up) or the step where the decay ends (gpt3's rules: ceil(108600 x 1536 /
    # gbs)). The schedule itself is the same either way.
    decay_steps_logged: Literal["length", "end"] = "length"
    log_max_steps: bool = False  # the closed rules check a logged max_steps (llama31_8b, gpt_oss_20b: 1,200,000)


@dataclass(frozen=True)
class FeaturesSpec:
    """Memory- and communication-saving features, as megatron-core implements them (its
    DistributedDataParallelConfig, OptimizerConfig and TransformerConfig). A benchmark file gives its defaults,
    following the submission config its layouts come from; `mlbench run` / `mlbench plan` flags override them."""

    # fp32 master weights and Adam state sharded over data parallel; gradients reduce-scattered
    distributed_optimizer: bool = False
    sequence_parallel: bool = False  # norms, dropout and residual activations split over TP (needs tp > 1)
    recompute: Literal["none", "selective", "full"] = "none"  # selective: core attention; full: whole layers
    recompute_method: Literal["uniform", "block"] = "uniform"  # full recompute: how layers are chosen
    recompute_layers: int = 1  # full recompute: layers per group (uniform) or per stage (block)
    overlap_grad_reduce: bool = False  # gradient reduce(-scatter) overlapped with the backward pass
    overlap_param_gather: bool = False  # parameter all-gather overlapped with the forward pass (distributed optimizer)
    grad_reduce_in_fp32: bool = True  # bf16 gradient reduction where false (NVIDIA's Llama FP8 configs)
    fp8_param_gather: bool = False  # parameters gathered in FP8 (with precision fp8)


@dataclass(frozen=True)
class LayoutSpec:
    """A reference parallel layout, used when the user gives none for that device count."""

    devices: int  # total devices this layout is for (0: any)
    tp: int = 1
    pp: int = 1
    vp: int = 1
    cp: int = 1
    ep: int = 1  # expert parallel (mixture-of-experts models): divides dp x cp
    micro_batch_size: int | None = None
    global_batch_size: int | None = None
    # Megatron's asymmetric pipeline split: the embedding / the loss count as one layer of the first / last
    # stage (NVIDIA's Llama 3.1 405B configs: 126 layers over pp 8 x vp 8).
    account_for_embedding_in_pipeline_split: bool = False
    account_for_loss_in_pipeline_split: bool = False
    source: str = ""


@dataclass(frozen=True)
class Benchmark:
    name: str
    title: str
    size: str  # published size, e.g. "175B"
    published_params: float  # parameter count the size stands for, to check the built model against
    mlperf: MLPerfSpec
    model: ModelSpec
    optimizer: OptimizerSpec
    train: TrainSpec
    eval: EvalSpec
    quality: QualitySpec
    data: DataSpec
    features: FeaturesSpec = FeaturesSpec()
    layouts: tuple[LayoutSpec, ...] = ()
    sources: tuple[str, ...] = ()
    notes: str = ""
    variant: Literal["full", "tiny"] = "full"
    path: str = ""

    @property
    def where(self) -> str:
        """The file and variant, as errors about the benchmark's values name them: 'gpt3.yaml (tiny)'."""
        return Path(self.path).name + (" (tiny)" if self.variant == "tiny" else "")

    def converged(self, value: float) -> bool:
        return reached(value, self.quality.target, self.quality.direction)

    @property
    def eval_unit_size(self) -> int:
        """Samples in the unit the log counts them in (eval metadata, train_samples): gpt3's count tokens."""
        return self.model.seq_length if self.mlperf.eval_unit == "tokens" else 1


# ---- expressions ----------------------------------------------------------------------------------------
# Learning-rate and schedule rules scale with the global batch (Llama 3.1 405B: lr = gbs * 8e-5 / 1152).
# They are written in the benchmark file as arithmetic, evaluated left to right exactly as written,
# because the MLPerf checker compares the learning rate as an exact float. The file is input: arithmetic is
# bounded (every intermediate a finite number below MAX_MAGNITUDE, so `9 ** 9 ** 9` fails at once instead of
# computing a 370-million-digit integer) and every failure is one line naming what went wrong.

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Pow: operator.pow, ast.Mod: operator.mod}
_FUNCS = {"ceil": math.ceil, "floor": math.floor, "min": min, "max": max, "int": int}
MAX_MAGNITUDE = 2**63  # an int64; far above any step count, sample count or learning rate
# float32's largest number and its smallest normal one (numpy.finfo(numpy.float32).max and .tiny): the range of a
# value the optimizer or the model computes with in float32 (an epsilon, a weight decay, an init scale).
FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_TINY = 1.1754943508222875e-38
# Seeds, of a run (--seed) or of the data (data.seed): 0 .. 2**32 - 1, what numpy's legacy seeding and every
# library a run seeds accept.
SEED_MAX = 2**32 - 1
MAX_EXPRESSION_CHARS = 1000  # bounds the parser's recursion too
# Devices in one run: 2**20, ten times the largest training clusters built so far (and a bound on the layout's
# divisor searches). Sequences a step: 128 times the largest MLPerf LLM batch (gpt3's 8,192), and a bound on what a
# step's data may hold (2**40 asked a tiny run for 512 TiB). Flags and benchmark files alike.
MAX_DEVICES = 2**20
MAX_GLOBAL_BATCH = 2**20


def max_lr(beta1: float) -> float:
    """The largest learning rate the optimizer can take, wherever it comes from (--lr, optimizer.lr_table; an
    `optimizer.lr` number or expression is below it already, bounded by MAX_MAGNITUDE). Adam's first step moves
    each weight by up to lr / (1 - beta1) (its bias correction; later steps by less), computed in float32 by
    torch: past float32's largest number it refused the step ("value cannot be converted to type float without
    overflow") after the run had started. Half that number leaves room for the schedule's rounding."""
    return FLOAT32_MAX / 2 * (1 - beta1)


def _bounded(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{value!r} is not a number")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"the result is {value}")
    if abs(value) >= MAX_MAGNITUDE:
        raise ValueError(f"a value reaches {_magnitude(value)}, beyond the bound {MAX_MAGNITUDE:.3g}")
    return value


def _paren(x: Any) -> str:
    return f"({x})" if x < 0 else str(x)


def _power(base: Any, exp: Any) -> Any:
    # Bound the result before computing it: an int power's digits grow with the exponent (a float power overflows
    # at once, and a negative exponent shrinks it).
    if exp > 0 and abs(base) > 1 and exp * math.log2(abs(base)) >= math.log2(MAX_MAGNITUDE):
        raise ValueError(f"{_paren(base)} ** {exp} is beyond the bound {MAX_MAGNITUDE:.3g}")
    if base == 0 and exp < 0:
        raise ZeroDivisionError("0 to a negative power")
    result = base**exp
    if isinstance(result, complex):
        raise ValueError(f"{_paren(base)} ** {exp} is not a real number")
    return result


def evaluate(expr: int | float | str, **names: float) -> Any:
    """Evaluate a number or an arithmetic expression over `names` (and ceil/floor/min/max/int): + - * / // % **,
    bounded as above. Anything else, a division by zero or an unbounded value is a UserError."""
    if not isinstance(expr, str):
        return expr

    def ev(node: ast.AST) -> Any:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value,
                                                                                                        bool):
            return _bounded(node.value)
        if isinstance(node, ast.Name) and node.id in names:
            return _bounded(names[node.id])
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow):
                return _bounded(_power(left, right))
            return _bounded(_BINOPS[type(node.op)](left, right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            value = ev(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCS
                and not node.keywords and node.args):
            return _bounded(_FUNCS[node.func.id](*(ev(a) for a in node.args)))
        if isinstance(node, ast.Name):
            raise ValueError(f"unknown name {node.id!r}")
        raise ValueError(f"unsupported element {ast.unparse(node)[:40]!r}")

    allowed = ", ".join(sorted(names)) or "none"
    if len(expr) > MAX_EXPRESSION_CHARS:
        raise UserError(f"cannot evaluate {expr[:40]!r}...: longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        return ev(_parsed(expr))
    except SyntaxError as e:
        raise UserError(f"cannot evaluate {expr!r}: not an arithmetic expression ({e.msg}; names allowed: "
                        f"{allowed})") from None
    except ZeroDivisionError:
        raise UserError(f"cannot evaluate {expr!r} at {_at(names)}: division by zero") from None
    except OverflowError:
        raise UserError(f"cannot evaluate {expr!r} at {_at(names)}: a value overflows (beyond the bound "
                        f"{MAX_MAGNITUDE:.3g})") from None
    except (ValueError, TypeError, ArithmeticError, RecursionError, MemoryError) as e:
        raise UserError(f"cannot evaluate {expr!r} at {_at(names)}: {e} (names allowed: {allowed}; functions: "
                        f"{', '.join(_FUNCS)})") from None


@functools.lru_cache(maxsize=4096)
def _parsed(expr: str) -> ast.Expression:
    """An expression's tree (read, never changed): the planner evaluates a file's expressions at every layout it
    searches."""
    return ast.parse(expr.strip(), mode="eval")


def _at(names: dict[str, float]) -> str:
    text = ", ".join(f"{k} = {v}" for k, v in names.items()) or "no names"
    return text + _PROBE if names.get("global_batch_size") == 1 else text


# Said of batch 1, which no file names: every expression is evaluated there too, so a file fails when it is loaded
_PROBE = " (the smallest batch: every expression is checked there too)"


# What an expression's value must be: at least 0 (warm-up 0 and max_steps 0 mean "none" / "the schedule"), above 0
# for these, and a whole number for counts of steps or samples (4.5 steps is a typo, not a budget).
_POSITIVE = frozenset({"eval.interval_samples", "optimizer.lr"})
_WHOLE = frozenset({"optimizer.warmup_steps", "optimizer.decay_steps", "train.max_steps", "train.init_checkpoint_step",
                    "eval.interval_samples", "eval.start_samples"})


def expressions(b: Benchmark) -> dict[str, int | float | str]:
    """Every value of `b` that may be written as an expression (a number or arithmetic), by its 'section.key'."""
    found = {}
    for section in dataclasses.fields(b):
        value = getattr(b, section.name)
        if dataclasses.is_dataclass(value):
            found |= {f"{section.name}.{name}": getattr(value, name) for name in _numeric_fields(type(value))}
    return found


@functools.cache
def _numeric_fields(cls: type) -> tuple[str, ...]:
    hints = typing.get_type_hints(cls)
    return tuple(f.name for f in dataclasses.fields(cls) if _is_numeric(hints[f.name]))


def _is_numeric(tp: Any) -> bool:
    """A field typed as a number or an expression (`int | str`, `float | str`)."""
    arms = typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else ()
    return str in arms and any(a in (int, float) for a in arms)


def check_expressions(b: Benchmark, where: str, batches: typing.Iterable[int]) -> None:
    """Evaluates every expression of `b` at each global batch: a file that divides by zero, overflows or gives a
    negative step count fails when it is loaded, naming the key, not in the middle of a run."""
    batches = set(batches) | set(b.optimizer.lr_table)
    for key, expr in expressions(b).items():
        if expr is None:  # optimizer.lr, where lr_table gives it
            continue
        for gbs in sorted(batches):
            names = {}
            if key in ("optimizer.min_lr", "optimizer.decay_steps"):  # they may name the resolved lr and warm-up
                try:
                    base = b.optimizer.base_at(gbs)
                except UserError:  # lr or warmup_steps itself fails: reported under its own key
                    continue
                if base is None:  # a batch the lr table does not cover: nothing is resolved there
                    continue
                names = {"lr": base[0], "warmup_steps": base[1]}
            try:
                value = _bounded(evaluate(expr, global_batch_size=gbs, **names))
            except (UserError, ValueError) as e:
                raise UserError(f"{where}: {key}: {e}") from None
            positive = key in _POSITIVE
            if value < 0 or positive and value <= 0:
                at = _at({"global_batch_size": gbs})
                raise UserError(f"{where}: {key} = {expr!r} is {value} at {at}; it must be "
                                f"{'positive' if positive else 'at least 0'}")
            if key in _WHOLE and value != int(value):
                at = _at({"global_batch_size": gbs})
                raise UserError(f"{where}: {key} = {expr!r} is {value} at {at}; it counts "
                                f"steps or samples: a whole number (ceil() or floor() of it, say)")


def check_schedule(b: Benchmark, where: str, batches: typing.Iterable[int]) -> None:
    """At each global batch the file defines a learning rate at, min_lr at most lr: the schedule decays from lr
    down to min_lr (as --lr below min_lr is refused). Not at batch 1, where the expressions are only probed: an lr
    that scales with the batch is below any floor there."""
    for gbs in sorted(set(batches) - {1}):
        try:
            base = b.optimizer.base_at(gbs)
        except UserError:  # check_expressions names it, under its own key
            continue
        if base is not None and (low := evaluate(b.optimizer.min_lr, global_batch_size=gbs, lr=base[0])) > base[0]:
            raise UserError(f"{where}: optimizer.min_lr is {low!r} at global_batch_size = {gbs}, above "
                            f"optimizer.lr {base[0]!r}: the schedule decays from lr down to min_lr; make min_lr at "
                            f"most lr")
        if base is not None:
            check_decay(where, b.optimizer.decay_at(gbs, base[1]), gbs)


def step_budget(b: Benchmark, gbs: int) -> int | None:
    """The step budget at global batch GBS: train.max_steps, or where that is 0 the whole learning-rate schedule
    (warm-up and decay); None where nothing defines the schedule at GBS (off its tables). The one computation of
    it, for the run plan (run_plan.max_steps) and the file's checks (registry)."""
    steps = int(evaluate(b.train.max_steps, global_batch_size=gbs))
    if steps <= 0:
        if (base := b.optimizer.base_at(gbs)) is None:
            return None
        steps = base[1] + int(b.optimizer.decay_at(gbs, base[1]))
    return max(steps, 1)


def check_decay(where: str, decay_steps: object, gbs: int) -> None:
    """megatron-core's scheduler asserts warm-up < warm-up + decay: 0 launched a run that died on a bare
    AssertionError. The one check of it, for a file's batches (check_schedule) and a run's flags
    (rcp_schedule.for_run)."""
    if decay_steps < 1:  # type: ignore[operator]
        raise UserError(f"{where}: optimizer.decay_steps is {decay_steps!r} at global_batch_size = {gbs}; the "
                        f"schedule decays over at least 1 step after its warm-up")


def resolved(b: Benchmark, global_batch_size: int | None = None) -> dict:
    """`b` as plain data with every expression evaluated, at `global_batch_size` (default: the benchmark's)."""
    gbs = global_batch_size or b.train.global_batch_size
    data = dataclasses.asdict(b)
    base = b.optimizer.base_at(gbs)  # (lr, warm-up): from expressions or the RCP tables; None off the tables
    names = {"lr": base[0], "warmup_steps": base[1]} if base else {}
    for key, expr in expressions(b).items():
        section, name = key.split(".")
        if expr is not None and (base or key not in ("optimizer.min_lr", "optimizer.decay_steps")):
            data[section][name] = evaluate(expr, global_batch_size=gbs, **names)
    if base:
        data["optimizer"]["lr"], data["optimizer"]["warmup_steps"] = base
    return data


# ---- building from plain data --------------------------------------------------------------------------


def deep_merge(base: dict, override: dict) -> dict:
    out = dict(base)
    for k, v in override.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


# A value shown in an error, cut short: a file's value may be huge, or YAML aliases nested to a billion elements.
_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxstring, _SHOWN.maxother, _SHOWN.maxlong = 2, 80, 80, 40


def _shown(value: Any) -> str:
    return _SHOWN.repr(value)


_FLOAT_LIMIT = 2**1023  # an integer from here on cannot become a float


def _not_huge(where: str, value: int, bound: int) -> None:
    """An integer below BOUND: a 400-digit one was an OverflowError where it met a float (a traceback out of list,
    show and plan)."""
    if abs(value) >= bound:
        raise UserError(f"{where}: {_magnitude(value)} is beyond the bound {bound:.3g}")


def _magnitude(value: Any) -> str:
    """A number for a message, however large (float() of a 400-digit integer overflows)."""
    try:
        return f"{float(value):.3g}"
    except OverflowError:
        return f"a number of about {int(value.bit_length() * math.log10(2)) + 1} digits"


def _check_value(where: str, value: Any, tp: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin is Literal:
        if value not in typing.get_args(tp):
            choices = ", ".join(repr(a) for a in typing.get_args(tp))
            raise UserError(f"{where}: {_shown(value)} is not one of {choices}")
        return value
    if origin in (typing.Union, types.UnionType):
        errors = []
        for arm in typing.get_args(tp):
            try:
                return _check_value(where, value, arm)
            except UserError as e:
                errors.append(str(e).split(": ", 1)[-1])
        raise UserError(f"{where}: {_shown(value)} is not valid ({'; '.join(errors)})")
    if tp is type(None):
        if value is not None:
            raise UserError(f"{where}: expected nothing, got {_shown(value)}")
        return None
    if tp is bool:
        if not isinstance(value, bool):
            raise UserError(f"{where}: expected true or false, got {_shown(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise UserError(f"{where}: expected an integer, got {_shown(value)}")
        _not_huge(where, value, _FLOAT_LIMIT)  # (the key's own range, checked later, says more below that)
        return value
    if tp is float:
        if isinstance(value, str) and is_ascii_float(value):  # YAML 1.1 reads 175.0e9 (no exponent sign) as a
            value = float(value)  # string; float() would read '٠.٩' (Arabic-Indic digits) as 0.9 too: not a number
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise UserError(f"{where}: expected a number, got {_shown(value)}")
        if isinstance(value, int):
            _not_huge(where, value, MAX_MAGNITUDE)
        if not math.isfinite(value):
            raise UserError(f"{where}: expected a finite number, got {_shown(value)}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise UserError(f"{where}: expected a string, got {_shown(value)}")
        return value
    if origin is tuple:
        if not isinstance(value, list | tuple):  # a list from YAML or JSON, a tuple from dataclasses.asdict
            raise UserError(f"{where}: expected a list, got {_shown(value)}")
        (item_tp, _) = typing.get_args(tp)
        return tuple(_check_value(f"{where}[{i}]", v, item_tp) for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise UserError(f"{where}: expected a mapping, got {_shown(value)}")
        (key_tp, item_tp) = typing.get_args(tp)
        if key_tp is int:  # JSON (a run plan) writes every mapping key as a string
            # ASCII digits only: str.isdigit() takes '²' (which int() refuses) and '١٦' (read as 16)
            value = {int(k) if isinstance(k, str) and k.isascii() and k.isdigit() else k: v
                     for k, v in value.items()}
        return {_check_value(f"{where} key", k, key_tp): _check_value(f"{where}.{k}", v, item_tp)
                for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return build(tp, value, where)
    raise TypeError(f"unhandled type {tp!r}")


def build(cls: type, data: Any, where: str, fixed: dict[str, Any] | None = None, also: tuple[str, ...] = ()) -> Any:
    """Build dataclass `cls` from a mapping, naming any unknown, missing or ill-typed key. FIXED: fields the caller
    sets, which the mapping may not give (a benchmark file's `path` and `variant`, where it was found and which of
    its sections was read: a file's `variant: tiny` made its full definition a tiny one). ALSO: keys the caller
    took out of the mapping itself (a benchmark file's `tiny`), known to the hint for a mistyped one ('tinyy')."""
    if not isinstance(data, dict):
        raise UserError(f"{where}: expected a mapping, got {_shown(data)}")
    fixed = fixed or {}
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name not in fixed}
    unknown = sorted(set(data) - set(fields), key=str)
    if unknown:
        known = [*fields, *also]
        raise UserError(f"{where}: unknown key {_shown(unknown[0])}{_close_key(unknown[0], known)} "
                        f"(known: {', '.join(known)})")
    kwargs = dict(fixed)
    for name, f in fields.items():
        if name in data:
            kwargs[name] = _check_value(f"{where}.{name}", data[name], hints[name])
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise UserError(f"{where}: missing required key {name!r}")
    return cls(**kwargs)


def _close_key(key: object, known: typing.Iterable[str]) -> str:
    """'; did you mean K?' for the known key K a mistyped KEY is closest to ('num_layer', 'Num_Layers'), else ''."""
    if not isinstance(key, str):
        return ""
    lower = {k.lower(): k for k in known}
    close = difflib.get_close_matches(key.lower().replace("-", "_"), lower, n=1, cutoff=0.75)
    return f"; did you mean {lower[close[0]]!r}?" if close else ""


__all__ = ["Benchmark", "build", "check_decay", "check_expressions", "check_schedule", "deep_merge", "evaluate",
           "expressions", "field", "resolved", "step_budget"]
