"""A layout's predicted memory, step time, throughput, MFU and time-to-train on a device; the search for the best
layout at a device count; a predicted scaling curve."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from mlbench import flops
from mlbench.errors import UserError
from mlbench.layout import Layout
from mlbench.planner import step_time, time_to_train
from mlbench.planner.devices import Device
from mlbench.spec import Benchmark

TOP = 10  # layouts printed by the search


def memory_plan(bench: Benchmark, layout: Layout, device: Device) -> dict | None:
    """The per-device memory plan (mlbench.planner.memory) as a dict, or None where that module is not there. The
    device says which kernels run and whether a GPU's allowance (CUDA context, workspaces) is held, whatever the
    precision: left to the estimate, fp32 meant the CPU, and an fp32 (TF32) plan on an H100 left the 3 GiB out."""
    try:
        from mlbench.planner import memory
    except ImportError:
        return None
    return memory.estimate(bench, layout, on_cpu=device.is_cpu).as_dict()


def evaluate(bench: Benchmark, layout: Layout, device: Device) -> dict:
    """Every prediction for one layout on one device, as one JSON-ready dict."""
    device.peak_flops(layout.precision)  # a precision the device lacks is bad input
    measured = device.is_cpu
    m = bench.model
    st = step_time.predict(m, layout, device)
    step = st["step_time_s"]
    gbs = layout.global_batch_size
    model_flops = flops.flops_per_sample(m) * gbs / step / layout.world_size
    ttt = time_to_train.predict(bench, gbs, step) if bench.variant == "full" else None
    minutes = ttt.pop("time_to_train_min") if ttt else None  # once, at the top, as every document gives it
    mem = memory_plan(bench, layout, device)
    total = mem["total_bytes"] if mem else None
    return {
        "benchmark": bench.name, "device": device.name, "layout": _layout_dict(layout),
        "step_time_s": step, "step_terms_s": st["terms_s"],
        "tokens_per_s_per_device": gbs * m.seq_length / step / layout.world_size,
        "model_tflops_per_device": model_flops / 1e12,
        # as during runs (mlbench.hardware): against the datasheet's dense peak; not defined on the CPU
        "mfu": None if measured else model_flops / device.peak_flops(layout.precision),
        "mfu_basis": "not defined on CPU (no datasheet peak)" if measured else
        f"dense {layout.precision} peak, {device.peak_flops(layout.precision) / 1e12:g} TFLOP/s",
        "time_to_train_min": minutes,
        "time_to_train": ttt,
        "memory": mem, "device_memory_bytes": device.memory_bytes,
        "fits": (total <= device.memory_bytes) if total is not None else None,
        "model": step_time.provenance() if not measured else {"cpu": device.extra["measured"]},
    }


def _layout_dict(layout: Layout) -> dict:
    d = layout.as_dict()
    d["features"] = dataclasses.asdict(layout.features)
    return d


@dataclass(frozen=True)
class Candidate:
    tp: int
    pp: int
    vp: int
    cp: int
    mbs: int
    gbs: int
    ep: int = 1  # expert parallel (mixture of experts)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidates(bench: Benchmark, world: int, device: Device, gbs: int | None,
               ep: int | None = None) -> list[Candidate]:
    """Layouts worth predicting: tp inside an NVLink domain and dividing heads and key-value groups; pp and vp
    splitting the layers; cp of 1, 2, 4, 8; micro-batches of 1, 2, 4 and the benchmark's own; the global batch given,
    else the batches the RCPs were measured at and the benchmark's own; the expert-parallel size given, else every
    one that divides the experts. layout.resolve checks each fully."""
    m = bench.model
    groups = m.num_query_groups or m.num_attention_heads
    domain = max(device.nvlink_domain, 1)
    tps = [t for t in (1, 2, 4, 8) if groups % t == 0 and t <= domain]
    pps = [p for p in _divisors(world) if p <= m.num_layers and p <= 64]
    batches = [gbs] if gbs else _batches(bench)
    # experts split over ep ranks of the data x context-parallel group: the ep given, else every ep that divides
    # the experts
    eps = [1]
    if ep:
        eps = [ep]
    elif m.num_experts:
        eps = [e for e in (1, 2, 4, 8, 16, 32, 64) if m.num_experts % e == 0 and e <= world]
    out = []
    for tp in tps:
        for pp in pps:
            # (a pp x vp that cannot split the layers, with or without the embedding and loss counted, was tried all
            # the same: at 100000 devices its 'layers must divide by pp x vp' hid the real limit, the batch)
            vps = [v for v in _VPS if (pp > 1 or v == 1) and _splits_layers(m.num_layers, pp * v)]
            for vp in vps:
                for cp in (1, 2, 4, 8):
                    if world % (tp * pp * cp):
                        continue
                    for mbs in sorted({1, 2, 4, bench.train.micro_batch_size}):
                        out += [Candidate(tp, pp, vp, cp, mbs, b, ep) for b in batches for ep in eps]
    return out


_VPS = (1, 2, 3, 4, 6, 8, 12)  # virtual stages per rank tried


def _splits_layers(layers: int, stages: int) -> bool:
    """Whether LAYERS (plus the embedding and the loss, where counted) split evenly over STAGES (pp x vp)."""
    return any((layers + extra) % stages == 0 for extra in (0, 1, 2))


def _fmt_batches(batches: set[int]) -> str:
    shown = sorted(batches)
    return ", ".join(map(str, shown[:6])) + (", ..." if len(shown) > 6 else "")


def _batches(bench: Benchmark) -> list[int]:
    if bench.variant != "full":
        return [bench.train.global_batch_size]
    return sorted({p.batch for p in time_to_train.rcp_points(bench)} | {bench.train.global_batch_size})


def search(bench: Benchmark, device: Device, nodes: int, nproc_per_node: int, gbs: int | None, resolve,
           closed_rules_ok=None, ep: int | None = None) -> tuple[list[dict], dict]:
    """Every valid candidate layout predicted (at the global batch and expert-parallel size given, where given),
    those that do not fit dropped, best time-to-train first.
    `resolve(tp, pp, vp, cp, mbs, gbs, ep) -> Layout` applies the layout rules (raising UserError);
    `closed_rules_ok(gbs) -> str | None` says why the closed rules reject a batch (None: they accept it)."""
    world = nodes * nproc_per_node
    seen: set = set()
    results, counts = [], {"candidates": 0, "invalid": 0, "closed_rules": 0, "does_not_fit": 0}
    rejected_batches: dict[int, str | None] = {}
    reasons: dict[str, int] = {}  # why candidates break the layout rules, and how many
    most_split, largest_batch = 1, 0  # the most model-parallel ranks and the largest global batch tried
    batch_divides, batches_tried = False, set()  # whether any candidate's batch divides over its data-parallel ranks
    for c in candidates(bench, world, device, gbs, ep):
        counts["candidates"] += 1
        most_split, largest_batch = max(most_split, c.tp * c.pp * c.cp), max(largest_batch, c.gbs)
        batch_divides |= c.gbs % (world // (c.tp * c.pp * c.cp) * c.mbs) == 0
        batches_tried.add(c.gbs)
        try:
            layout = resolve(c.tp, c.pp, c.vp, c.cp, c.mbs, c.gbs, c.ep)
        except UserError as e:
            counts["invalid"] += 1
            reasons[str(e)] = reasons.get(str(e), 0) + 1
            continue
        key = (layout.tp, layout.pp, layout.vp, layout.cp, layout.ep, layout.micro_batch_size,
               layout.global_batch_size)
        if key in seen:
            continue
        seen.add(key)
        if closed_rules_ok is not None:
            if c.gbs not in rejected_batches:
                rejected_batches[c.gbs] = closed_rules_ok(c.gbs)
            if rejected_batches[c.gbs]:
                counts["closed_rules"] += 1
                continue
        r = evaluate(bench, layout, device)
        if r["fits"] is False:
            counts["does_not_fit"] += 1
            continue
        results.append(r)
    if not results:
        why = next((f"; at global batch {b} the closed rules reject {w}" for b, w in rejected_batches.items() if w), "")
        if reasons and counts["invalid"] == counts["candidates"]:
            why = f"; the commonest reason: {max(reasons, key=reasons.get)}"
            fewest = -(-world // most_split)
            if fewest > largest_batch:  # no batch has a sample a data-parallel rank
                why = (f": {world} devices split at most {most_split} ways by model parallelism leave at least "
                       f"{fewest} data-parallel ranks, more than the largest global batch tried ({largest_batch}, "
                       f"a sample a rank at least): use fewer devices")
            elif not batch_divides:  # (said as the commonest reason a pp that cannot split the layers gave)
                ways = f"{most_split} way{'s' * (most_split > 1)}"
                why = (f": {world} devices split at most {ways} by model parallelism leave at least {fewest} "
                       f"data-parallel ranks, and no global batch tried ({_fmt_batches(batches_tried)}) is a multiple "
                       f"of the data-parallel size x the micro-batch of any layout: use a device count whose "
                       f"data-parallel size divides the batch, or pass --global-batch-size")
        raise UserError(f"no layout of {bench.name} on {nodes} x {nproc_per_node} {device.name} passes the layout "
                        f"rules{', the closed rules' if closed_rules_ok else ''} and fits in memory "
                        f"({counts['candidates']} tried: {counts['invalid']} break a layout rule, "
                        f"{counts['closed_rules']} break the closed rules, {counts['does_not_fit']} do not fit){why}")
    def rank(r: dict) -> tuple:
        """Predicted time-to-train (time per sample where there is none); on a tie, less memory, then fewer
        model-parallel ranks (less to go wrong)."""
        ly = r["layout"]
        time = r["time_to_train_min"]
        if time is None:
            time = r["step_time_s"] / ly["global_batch_size"]
        memory = r["memory"]["total_bytes"] if r["memory"] else 0.0
        return round(time, 9), memory, ly["tp"] * ly["pp"] * ly["cp"], ly["vp"]

    results.sort(key=rank)
    counts["rejected_batches"] = {str(b): why for b, why in rejected_batches.items() if why}
    return results, counts


def why_between(best: dict, other: dict) -> str:
    """What separates a layout from the best one: the class of step terms (per sample) that differs most."""
    if other is best:
        return "best"

    def per_sample(r: dict) -> dict:
        t = r["step_terms_s"]
        comm = t["tp_comm"] + t["cp_comm"] + t["dp_comm"]
        out = {"bubble": t["pipeline_bubble"], "communication": comm, "optimizer": t["optimizer"]}
        out["compute"] = sum(t.values()) - sum(out.values())
        return {k: v / r["layout"]["global_batch_size"] for k, v in out.items()}

    a, b = per_sample(best), per_sample(other)
    diffs = {k: b[k] - a[k] for k in a}
    k = max(diffs, key=lambda k: abs(diffs[k]))
    text = f"{k} {'more' if diffs[k] > 0 else 'less'} ({diffs[k] * 1e3:+.3g} ms/sample)"
    if best["layout"]["global_batch_size"] != other["layout"]["global_batch_size"]:
        text += f"; batch {other['layout']['global_batch_size']}"
    return text


def scaling_efficiencies(points: list[dict]) -> list[dict]:
    """Strong (time-to-train x devices, against the first point) and weak (tokens/s per device, against the first
    point) efficiency of predicted points, in the form `mlbench scaling` reports measured ones."""
    base = points[0]
    n0 = base["layout"]["world_size"]
    out = []
    for p in points:
        n = p["layout"]["world_size"]
        t0, t = base["time_to_train_min"], p["time_to_train_min"]
        strong = t0 * n0 / (t * n) if t0 and t else base["step_time_s"] * n0 / (p["step_time_s"] * n)
        weak = p["tokens_per_s_per_device"] / base["tokens_per_s_per_device"]
        out.append({"devices": n, "strong_efficiency": strong, "weak_efficiency": weak})
    return out


def fmt_bytes(b: float | None) -> str:
    """Bytes in GiB, as `run --dry-run`'s memory plan says them (the planner said GB: 80.0 GB for the H100 a dry
    run said has 74.5 GiB)."""
    return "-" if b is None else f"{b / 2**30:,.1f} GiB"
