"""Parallel layout resolution: from nodes x processes and a benchmark to tp/pp/vp/cp/dp and batch split.

Every rule is checked before anything starts, and a violation names the rule, the values, and values that
would be valid.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass, field, fields

from mlbench.errors import UserError
from mlbench.spec import Benchmark, FeaturesSpec, LayoutSpec


@dataclass(frozen=True)
class Layout:
    nodes: int
    nproc_per_node: int
    tp: int
    pp: int
    vp: int
    cp: int
    dp: int
    micro_batch_size: int
    global_batch_size: int
    source: str = ""  # where tp/pp/... came from: user flags, a reference layout, or defaults
    # Megatron's asymmetric pipeline split, carried from the reference layout whose pipeline split this is:
    # the embedding / the loss count as one layer of the first / last pipeline stage.
    account_for_embedding_in_pipeline_split: bool = False
    account_for_loss_in_pipeline_split: bool = False
    ep: int = 1  # expert parallel: experts split over ep ranks of the dp x cp group
    # The benchmark file's features with the user's flags over them, checked against this layout.
    features: FeaturesSpec = field(default_factory=FeaturesSpec)
    precision: str = "bf16"  # what the matmuls run in on a GPU (the benchmark's, or --precision); CPU: fp32

    @property
    def world_size(self) -> int:
        return self.nodes * self.nproc_per_node

    @property
    def num_microbatches(self) -> int:
        """Gradient accumulation steps per optimizer step on each data-parallel rank."""
        return self.global_batch_size // (self.dp * self.micro_batch_size)

    def as_dict(self) -> dict:
        return asdict(self) | {"world_size": self.world_size, "num_microbatches": self.num_microbatches}

    @classmethod
    def from_dict(cls, d: dict) -> Layout:
        """A layout back from `as_dict` (a run plan's), the derived counts dropped. What a plan file may hold
        (another version's, a garbled one) is refused with a ValueError naming it: a layout that is not an object,
        features that are not one, a size that is not a positive count (a KeyError for the features missing)."""
        if not isinstance(d, dict):
            raise ValueError(f"a layout is an object of its sizes, not {type(d).__name__} {str(d)[:40]!r}")
        if not isinstance(d["features"], dict):
            raise ValueError(f"a layout's features are an object, not {type(d['features']).__name__}")
        names = {f.name for f in fields(cls)}
        for f in fields(cls):
            v = d.get(f.name)
            if f.type == "int" and f.name in d and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"a layout's {f.name} is a positive count, not {str(v)[:40]!r}")
        kept = {k: v for k, v in d.items() if k in names}
        return cls(**kept | {"features": FeaturesSpec(**d["features"])})


def sizes_text(ly: dict) -> str:
    """A layout's parallel sizes as a run's first and last lines name them: 'tp2 pp1 cp1 ep1 dp2 over 4
    processes' (pp2 x vp2 when interleaved), from a layout dict (`Layout.as_dict`, a plan's or a record's)."""
    pp = f"pp{ly['pp']}" + (f" x vp{ly['vp']}" if ly.get("vp", 1) > 1 else "")
    n = ly["nodes"] * ly["nproc_per_node"]
    return (f"tp{ly['tp']} {pp} cp{ly['cp']} ep{ly.get('ep', 1)} dp{ly['dp']} over {n} process"
            + ("es" if n > 1 else "") + (f" on {ly['nodes']} nodes" if ly["nodes"] > 1 else ""))


def _divisors(n: int) -> list[int]:
    """The divisors of n, ascending, by trial division up to its square root (n may come from a hostile file)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def _fmt(values: list[int], limit: int = 8) -> str:
    shown = ", ".join(map(str, values[:limit]))
    return shown + (", ..." if len(values) > limit else "")


def reference_layouts(bench: Benchmark, devices: int) -> list[tuple[LayoutSpec | None, bool]]:
    """Reference layouts to start from, in order of preference, each with whether it was made for `devices`.

    The layout for exactly `devices`; the catch-all (devices: 0); else the model-parallel shapes of the layouts
    whose tp x pp x cp divides `devices`, nearest device count first (data parallelism absorbs the rest: a 405B
    model at 4096 devices wants the tp/pp/cp used at 2048 or 8192, not tp = pp = 1); else none.
    """
    exact = [(ly, True) for ly in bench.layouts if ly.devices == devices]
    catch_all = [(ly, False) for ly in bench.layouts if ly.devices == 0]
    if exact or catch_all:
        return (exact + catch_all)[:1]
    fits = [ly for ly in bench.layouts if devices % (ly.tp * ly.pp * ly.cp) == 0]
    # Nearest on a log scale; on a tie the smaller layout (its batch is more likely an MLPerf RCP point).
    fits.sort(key=lambda ly: (abs(math.log(ly.devices / devices)), ly.devices))
    return [(ly, False) for ly in fits] or [(None, False)]


def resolve(
    bench: Benchmark,
    nodes: int = 1,
    nproc_per_node: int = 1,
    tp: int | None = None,
    pp: int | None = None,
    vp: int | None = None,
    cp: int | None = None,
    micro_batch_size: int | None = None,
    global_batch_size: int | None = None,
    ep: int | None = None,
    features: dict | None = None,
    precision: str | None = None,
    asymmetric_split: bool | None = None,
) -> Layout:
    """The first reference layout (in order of preference) that, with the user's flags, passes every rule.
    `features`: FeaturesSpec fields the user set (flags), over the benchmark file's defaults."""
    if nodes < 1 or nproc_per_node < 1:
        raise UserError(f"--nodes ({nodes}) and --nproc-per-node ({nproc_per_node}) must be at least 1")
    first_error: UserError | None = None
    for ref, exact in reference_layouts(bench, nodes * nproc_per_node):
        try:
            layout = _resolve_from(bench, ref, exact, nodes, nproc_per_node, tp, pp, vp, cp, micro_batch_size,
                                   global_batch_size, asymmetric_split)
        except UserError as e:
            first_error = first_error or e
            continue
        return _with_features(bench, layout, ref, ep, features or {}, precision)
    assert first_error is not None
    raise first_error


def _with_features(bench: Benchmark, layout: Layout, ref: LayoutSpec | None, ep: int | None, overrides: dict,
                   precision: str | None) -> Layout:
    """The layout with expert parallelism, features and precision, each checked against it."""
    if ep is None:  # the reference layout's, adapted as its other sizes are where its devices are not there
        ep, span = (ref.ep if ref else 1), layout.dp * layout.cp
        if span % ep:
            ep = max(d for d in _divisors(span) if d <= ep and bench.model.num_experts % d == 0)
    if ep < 1:
        raise UserError(f"--ep must be at least 1, got {ep}")
    if ep > 1 and (layout.dp * layout.cp) % ep:
        raise UserError(f"layout does not divide: expert parallel --ep {ep} must divide data parallel x context "
                        f"parallel = {layout.dp} x {layout.cp} = {layout.dp * layout.cp}; valid ep: "
                        f"{_fmt(_divisors(layout.dp * layout.cp))}")
    f = features(bench, overrides)
    # A feature that needs model parallelism the layout lacks is dropped when it is the benchmark's default
    # (its file follows a multi-GPU config), refused when the user asked for it.
    if f.sequence_parallel and layout.tp == 1:
        if overrides.get("sequence_parallel"):
            raise UserError("--sequence-parallel splits activations over tensor-parallel ranks: it needs --tp > 1")
        f = dataclasses.replace(f, sequence_parallel=False)
    if bench.model.num_experts and layout.tp > 1 and not f.sequence_parallel:
        # megatron-core's MoELayer refuses to train split over tensor-parallel ranks without it (moe_layer.py)
        raise UserError(f"{bench.name} is a mixture of experts: megatron-core trains its expert layers at --tp "
                        f"{layout.tp} only with sequence parallelism; add --sequence-parallel, or use --tp 1")
    return dataclasses.replace(layout, ep=ep, features=f, precision=precision or bench.train.precision)


def features(bench: Benchmark, overrides: dict) -> FeaturesSpec:
    """The benchmark's features with the user's (flags) over them, refused where no layout could take them: what
    `plan` checks once before it searches layouts (each candidate refusing them would read as 'does not
    divide')."""
    f = dataclasses.replace(bench.features, **overrides)
    if f.distributed_optimizer and bench.optimizer.name == "lamb":  # LAMB's trust ratio needs whole parameters
        raise UserError(f"{bench.name} trains with LAMB, whose trust ratio needs whole parameters on every "
                        "data-parallel rank: use --no-distributed-optimizer")
    if f.overlap_param_gather and not f.distributed_optimizer:
        if overrides.get("overlap_param_gather"):
            raise UserError("--overlap-param-gather overlaps the distributed optimizer's parameter all-gather: it "
                            "needs --distributed-optimizer")
        f = dataclasses.replace(f, overlap_param_gather=False)
    if f.recompute_layers < 1:
        raise UserError(f"--recompute-layers must be at least 1, got {f.recompute_layers}")
    if f.recompute == "full" and f.recompute_method == "block" and f.recompute_layers > bench.model.num_layers:
        raise UserError(f"--recompute-layers {f.recompute_layers}: the model has {bench.model.num_layers} layers")
    set_for_full = sorted(k for k in ("recompute_layers", "recompute_method") if k in overrides)
    if set_for_full and f.recompute != "full":
        raise UserError(f"--{set_for_full[0].replace('_', '-')} chooses the layers of full recompute; it needs "
                        f"--recompute full (this run's recompute: {f.recompute})")
    return f


def _resolve_from(bench: Benchmark, ref: LayoutSpec | None, exact: bool, nodes: int, nproc_per_node: int,
                  tp: int | None, pp: int | None, vp: int | None, cp: int | None, micro_batch_size: int | None,
                  global_batch_size: int | None, asymmetric_split: bool | None = None) -> Layout:
    world = nodes * nproc_per_node
    user = any(v is not None for v in (tp, pp, vp, cp))
    # User flags win; then the benchmark's reference layout for this scale; then no parallelism.
    tp = tp if tp is not None else (ref.tp if ref else 1)
    pp = pp if pp is not None else (ref.pp if ref else 1)
    # (a reference's virtual stages interleave its pipeline: at --pp 1 there is none, and its vp was refused as
    # '--vp 6 needs pipeline parallelism', a flag never given)
    vp = vp if vp is not None else (ref.vp if ref and pp > 1 else 1)
    cp = cp if cp is not None else (ref.cp if ref else 1)
    # `is None`, not `or`: a 0 the user typed is refused below, never replaced by a default.
    mbs = micro_batch_size if micro_batch_size is not None else (ref.micro_batch_size if ref else None)
    mbs = mbs if mbs is not None else bench.train.micro_batch_size
    gbs = global_batch_size if global_batch_size is not None else (ref.global_batch_size if ref else None)
    gbs = gbs if gbs is not None else bench.train.global_batch_size
    if user:
        source = "flags"
    elif ref and (exact or ref.devices == 0):
        source = ref.source or f"reference layout for {ref.devices or 'any number of'} devices"
    elif ref:
        source = f"adapted from the {ref.devices}-device reference layout ({ref.source})"
    else:
        source = "defaults"
    if ref and not user and (given := [f for f, v in (("--micro-batch-size", micro_batch_size),
                                                       ("--global-batch-size", global_batch_size)) if v is not None]):
        source += f"; {' and '.join(given)} from the flags"  # (it said the reference's alone)
    m = bench.model
    for name, v in (("--tp", tp), ("--pp", pp), ("--vp", vp), ("--cp", cp), ("--micro-batch-size", mbs),
                    ("--global-batch-size", gbs)):
        if v < 1:
            raise UserError(f"{name} must be at least 1, got {v}")

    # world = tp x pp x cp x dp
    model_parallel = tp * pp * cp
    if world % model_parallel:
        fits = _divisors(world)
        raise UserError(
            f"layout does not divide: world size {world} (nodes {nodes} x {nproc_per_node} per node) is not "
            f"a multiple of tp x pp x cp = {tp} x {pp} x {cp} = {model_parallel}; tp x pp x cp must divide "
            f"{world}: one of {_fmt(fits)}")
    dp = world // model_parallel
    # attention heads and key-value groups split across tensor-parallel ranks
    groups = m.num_query_groups or m.num_attention_heads
    if m.num_attention_heads % tp or groups % tp:
        ok = [d for d in _divisors(groups) if m.num_attention_heads % d == 0]
        raise UserError(
            f"layout does not divide: {m.num_attention_heads} attention heads and {groups} key-value groups "
            f"must both divide by tp={tp}; valid tp: {_fmt(ok)}")
    if m.ffn_hidden_size % tp:
        raise UserError(f"layout does not divide: ffn_hidden_size {m.ffn_hidden_size} must divide by tp={tp}; "
                        f"valid tp: {_fmt(_divisors(m.ffn_hidden_size))}")
    # The asymmetric split belongs to the reference layout's pipeline (pp, vp): kept when those are the ones used.
    asym = ref is not None and pp == ref.pp and vp == ref.vp
    embed_split = asym and ref.account_for_embedding_in_pipeline_split
    loss_split = asym and ref.account_for_loss_in_pipeline_split
    if asymmetric_split and pp == 1:  # (it was dropped without a word, as --sequence-parallel at --tp 1 is not)
        raise UserError("--asymmetric-pipeline-split counts the embedding and the loss as pipeline layers: it needs "
                        "--pp > 1")
    if asymmetric_split is not None:  # the user's choice, for any layout
        embed_split = loss_split = asymmetric_split and pp > 1
    # layers split evenly across pipeline stages and virtual stages (with the embedding and loss when counted)
    split_layers = m.num_layers + int(embed_split) + int(loss_split)
    if split_layers % (pp * vp):
        ok = _divisors(split_layers)
        counted = f"{m.num_layers} layers" + (" + embedding" if embed_split else "") + (" + loss" if loss_split else "")
        raise UserError(
            f"layout does not divide: {counted} = {split_layers} must divide by pp x vp = {pp} x {vp} = {pp * vp}; "
            f"pp x vp must be one of {_fmt(ok)}")
    if vp > 1 and pp == 1:
        raise UserError(f"--vp {vp} needs pipeline parallelism (--pp > 1); virtual stages interleave stages")
    # context parallelism splits each sequence into 2 x cp chunks (load-balanced causal attention)
    if cp > 1 and m.seq_length % (2 * cp):
        raise UserError(f"layout does not divide: sequence length {m.seq_length} must divide by 2 x cp = "
                        f"{2 * cp}; valid cp: {_fmt(_divisors(m.seq_length // 2))}")
    # global batch = dp x micro batch x micro batches
    if gbs % (dp * mbs):
        ok = list(range(dp * mbs, 8 * dp * mbs + 1, dp * mbs))
        raise UserError(
            f"layout does not divide: global batch {gbs} must be a multiple of data-parallel size x micro "
            f"batch = {dp} x {mbs} = {dp * mbs}; valid global batches: {_fmt(ok, 4)}")
    if vp > 1 and (gbs // (dp * mbs)) % pp:
        raise UserError(f"interleaved pipeline (--vp {vp}) needs the number of micro-batches "
                        f"({gbs // (dp * mbs)}) to be a multiple of pp={pp}")
    return Layout(nodes=nodes, nproc_per_node=nproc_per_node, tp=tp, pp=pp, vp=vp, cp=cp, dp=dp,
                  micro_batch_size=mbs, global_batch_size=gbs, source=source,
                  account_for_embedding_in_pipeline_split=embed_split,
                  account_for_loss_in_pipeline_split=loss_split)
