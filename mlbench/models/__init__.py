"""The model families: one table, one entry per family, everything a family decides in its module.

A family decides its megatron-core layer spec and model class, its objective and loss, which data sources it
takes, its parameter count and model FLOPs per sample, what `mlbench show` says of its architecture, which
reference-checkpoint conversion applies, and what a definition of it must hold beyond the common checks.
Nothing outside the table and a family's own module compares family names: adding a family is one module and
one line here.

Family modules import nothing heavy at the top (the CLI and the analysis read counts and descriptions); the
parts that build torch modules import megatron-core when called.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mlbench.errors import UserError

if TYPE_CHECKING:
    from mlbench.spec import Benchmark, ModelSpec


@dataclass(frozen=True)
class Family:
    name: str
    data_sources: tuple[str, ...]  # the `data.source` values whose samples its objective reads
    # The Markov source's vocabulary for tiny runs (masked LM keeps one id for [MASK]).
    markov_vocab: Callable[[ModelSpec], int]
    param_count: Callable[[ModelSpec, int], int]  # (model, tp) -> parameters megatron-core builds
    flops_per_sample: Callable[[ModelSpec, int], float]  # (model, tp) -> training model FLOPs per sample
    describe: Callable[[ModelSpec], str]  # the architecture in one line, for `mlbench show`
    # The megatron-core chunk for one pipeline stage: (model, TransformerConfig, layer spec, common kwargs).
    build_model: Callable[..., Any]
    # megatron-core's layer spec for an attention backend ("te", "sdpa", "local"), before mlbench's norm changes.
    layer_spec: Callable[[ModelSpec, str], Any]
    objective: Callable[[Benchmark], Any]  # the training objective: batches, forward, loss, eval metric
    # The metric its objective evaluates (the objective's `metric`), which a file's quality.metric must name: the
    # run compares that value with quality.target.
    metric: str
    # `mlbench convert-checkpoint`: the helper module converting the family's reference checkpoint, or None.
    converter: Callable[[ModelSpec], str | None] = lambda m: None
    # Parameters active per token where that differs from the total (mixture of experts); None otherwise.
    active_param_count: Callable[[ModelSpec, int], int] | None = None
    # TransformerConfig fields the family adds (mixture of experts: the router and dispatcher settings).
    config: Callable[[ModelSpec], dict] = lambda m: {}
    # (model, tp) -> the parameters of its heads beyond the decoder's on one tensor-parallel rank (BERT's LM head,
    # pooler, token types; the planner's memory plan of the last stage)
    head_params: Callable[[ModelSpec, int], int] = lambda m, tp: 0
    # Activations one micro-batch saves outside the transformer layers, in units of s x b x h elements, on the first
    # and the last pipeline stage, where they differ from a pre-norm decoder's (nothing before the layers; the final
    # norm's input and output after them): (first, last); None for a pre-norm decoder.
    edge_activation_units: Callable[[ModelSpec], tuple[float, float]] | None = None
    # Whether its "sdpa" layer spec puts PyTorch's scaled_dot_product_attention in megatron's place; where not, a
    # GPU without Transformer Engine runs megatron's local attention, which keeps the s x s probabilities.
    sdpa_attention: bool = False
    # What the family needs of a definition beyond the common checks, checked when the file is loaded: the reason
    # it is not met (naming the key), or None.
    check: Callable[[ModelSpec], str | None] = lambda m: None


def _families() -> dict[str, Family]:
    from mlbench.models import bert, gpt, moe

    return {f.name: f for f in (gpt.FAMILY, bert.FAMILY, moe.FAMILY)}


def family(name: str) -> Family:
    table = _families()
    if name not in table:
        raise UserError(f"unknown model family {name!r}; known: {', '.join(sorted(table))}")
    return table[name]


def core_attention(m: ModelSpec, backend: str) -> str:
    """The attention kernel that runs for a layer-spec backend (mlbench.train.model.attention_backend: "te",
    "sdpa", "local"): "sdpa" falls back to "local" for a family without PyTorch's fused attention."""
    return "local" if backend == "sdpa" and not family(m.family).sdpa_attention else backend


def names() -> list[str]:
    return sorted(_families())
