"""`mlbench plan`: predictions for a layout on a device, the best layouts at a device count, a scaling curve."""

from __future__ import annotations

import dataclasses

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from mlbench import schema, terminal
from mlbench.cli_numbers import MAX_INT, misread, not_ascii, past_any_value, shown
from mlbench.cli_options import layout_options
from mlbench.errors import ProductStream, UserError, document_on_stdout, stops_on_signals
from mlbench.preflight import LayoutRequest
from mlbench.schema import versioned

_LAYOUT_KEYS = ("tp", "pp", "vp", "cp", "micro_batch_size")


MAX_CURVE_POINTS = 64


class _NodeCounts(click.ParamType):
    """--nodes N, or N1,N2,... for a predicted scaling curve."""

    name = "N[,N...]"

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        parts = str(value).split(",")
        if odd := next((v for v in parts if misread(v, integer=True)), None):
            self.fail(not_ascii(odd, integer=True), param, ctx)  # '٣' or '1_0': what int() reads, not ASCII
        try:
            counts = tuple(int(v) for v in parts)
        except ValueError:
            self.fail(f"{shown(value)}: give a node count or a comma-separated list of them (8,16,32)", param, ctx)
        if huge := next((v for v, n in zip(parts, counts, strict=True) if n > MAX_INT), None):
            self.fail(past_any_value(huge), param, ctx)  # (the device bound quoted all its digits, twice)
        if any(n < 1 for n in counts):
            self.fail(f"{shown(value)}: node counts must be at least 1", param, ctx)
        if len(counts) > MAX_CURVE_POINTS:  # each is a layout search of its own
            self.fail(f"{len(counts)} node counts: a curve of at most {MAX_CURVE_POINTS} points", param, ctx)
        twice = next((n for i, n in enumerate(counts) if n in counts[:i]), None)
        if twice is not None:  # the same point of the curve twice over
            self.fail(f"{shown(value)}: {twice} is given twice; give each node count once", param, ctx)
        # a curve runs from the fewest devices up: its base (efficiency 1) is the smallest count, as in `mlbench
        # scaling` (given 64,32, the base was 64 and halving the nodes read as 1.007 strong efficiency)
        return tuple(sorted(counts))


@click.command()
@click.argument("name")
@click.option("--device", "device_name", required=True,
              help="a100, h100_pcie, h100, h200, b200, gb200, gb300 (datasheet figures) or cpu (measured here).")
@click.option("--tiny", is_flag=True, help="The tiny variant (with --device cpu: what `mlbench run --tiny` trains).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object on stdout (its fields: docs/output.md).")
@layout_options
@stops_on_signals  # the CPU's measurement runs a probe: a stop ends it, and its scratch folder goes
def plan(name: str, device_name: str, tiny: bool, as_json: bool, layout: LayoutRequest) -> None:
    """Predicted memory, step time, throughput, MFU and time-to-train of benchmark NAME on a device: for the layout
    given, or, with no --tp/--pp/--vp/--cp/--mbs, the best layouts for --nodes x --nproc-per-node; --nodes 8,16,32
    predicts a scaling curve."""
    if as_json:  # stdout carries the document alone: an error goes to stderr
        with document_on_stdout() as write:
            write(schema.dumps(versioned(_kind(_plan(name, device_name, tiny, layout))), indent=None))
        return
    out = _plan(name, device_name, tiny, layout)
    console = terminal.console(highlight=False, file=ProductStream())
    if "scaling" in out:
        _print_scaling(console, out)
    elif "layouts" in out:
        _print_search(console, out)
    else:
        _print_one(console, out)


def _kind(out: dict) -> dict:
    """OUT with `kind` saying which of plan's three documents it is (docs/output.md), so a script need not tell
    them apart by the keys they hold."""
    return {"kind": "scaling" if "scaling" in out else "search" if "layouts" in out else "layout"} | out


def _plan(name: str, device_name: str, tiny: bool, layout: LayoutRequest) -> dict:
    """What `plan` prints: one layout's prediction, the best layouts (a search) or a scaling curve."""
    from mlbench import registry
    from mlbench.planner import devices
    from mlbench.planner import plan as planner
    from mlbench.preflight import check_request

    device = devices.get(device_name)
    bench = registry.load(name, tiny=tiny)
    precision = layout.precision or ("fp32" if device.name == "cpu" else bench.train.precision)
    device.peak_flops(precision)  # a precision the device lacks: one line, exit 2
    layout = dataclasses.replace(layout, precision=precision)
    counts = layout.nodes
    given = any(getattr(layout, k) is not None for k in _LAYOUT_KEYS)
    for n in counts:  # once, not at every candidate of a search (a bound on the devices, before their divisors)
        check_request(bench, dataclasses.replace(layout, nodes=n))

    closed = _closed_rules(bench) if bench.variant == "full" and not given else None

    def best(req: LayoutRequest) -> tuple[list[dict], dict]:
        if given:
            return [planner.evaluate(bench, _resolve(bench, req), device)], {}
        return _search(bench, device, req, closed)

    out: dict
    if len(counts) > 1:
        # A node count with no layout (too few devices to fit the model, say) is a line of the curve, not the end
        # of it; only when no count has one is that the answer.
        points, none_fits = [], []
        for n in counts:
            try:
                points.append(best(dataclasses.replace(layout, nodes=n))[0][0])
            except UserError as e:
                none_fits.append({"nodes": n, "reason": str(e)})
        if not points:
            raise UserError("; ".join(x["reason"] for x in none_fits))
        eff = planner.scaling_efficiencies(points)
        out = {"benchmark": bench.name, "device": device.name,
               "scaling": [p | e for p, e in zip(points, eff, strict=True)], "no_layout": none_fits}
    elif given:
        out = best(dataclasses.replace(layout, nodes=counts[0]))[0][0]
    else:
        results, stats = best(dataclasses.replace(layout, nodes=counts[0]))
        out = {"benchmark": bench.name, "device": device.name, "search": stats, "layouts": results[:planner.TOP]}
    return out


# The shared options, widened where plan goes beyond run: a list of node counts (a scaling curve), and nvfp4 (a
# precision plan predicts for Blackwell but run does not train in) and fp32 (the CPU).
for _param in plan.params:
    if _param.name == "nodes":
        _param.type = _NodeCounts()
    elif _param.name == "precision":
        _param.type = click.Choice(["bf16", "fp8", "nvfp4", "fp32"])


def _resolve(bench, req: LayoutRequest):
    from mlbench.preflight import resolve_layout

    return resolve_layout(bench, req)


def _search(bench, device, req: LayoutRequest, closed) -> tuple[list[dict], dict]:
    from mlbench.planner import plan as planner
    from mlbench.spec import check_expressions, check_schedule

    if req.global_batch_size is not None:
        # The file's expressions at the batch given, once: an error there is the file's, whatever the layout
        # (it was given as the commonest reason no layout passed the layout rules).
        check_expressions(bench, bench.where, [req.global_batch_size])
        check_schedule(bench, bench.where, [req.global_batch_size])

    def resolve(tp, pp, vp, cp, mbs, gbs, ep):
        return _resolve(bench, dataclasses.replace(req, tp=tp, pp=pp, vp=vp, cp=cp, ep=ep, micro_batch_size=mbs,
                                                   global_batch_size=gbs))

    return planner.search(bench, device, req.nodes, req.nproc_per_node, req.global_batch_size, resolve, closed,
                          ep=req.ep)


def _closed_rules(bench):
    """Why the benchmark's closed rules reject a global batch (its hyperparameters there), or None; each batch
    checked once (the official checker, a few seconds) however many node counts ask."""
    import functools

    from mlbench import compliance
    from mlbench.dry_run import closed_rule_problems
    from mlbench.layout import resolve

    @functools.cache
    def check(gbs: int) -> str | None:
        layout = resolve(bench, 1, 1, 1, 1, 1, 1, None, gbs, ep=1)  # the hyperparameters depend on the batch only
        problems = closed_rule_problems(bench, layout, "plan")
        return "; ".join(compliance.summary(p) for p in problems) or None

    return check


def _features_text(ly: dict) -> str:
    f = ly["features"]
    on = [k.replace("_", "-") for k in ("distributed_optimizer", "sequence_parallel", "overlap_grad_reduce",
                                        "overlap_param_gather") if f[k]]
    return f"features: {', '.join(on) or 'none'}; recompute {f['recompute']}"


def _layout_text(ly: dict, features: bool = True) -> str:
    ep = f" ep{ly['ep']}" if ly.get("ep", 1) > 1 else ""
    text = (f"{ly['nodes']}x{ly['nproc_per_node']} tp{ly['tp']} pp{ly['pp']} vp{ly['vp']} cp{ly['cp']} "
            f"dp{ly['dp']}{ep} mbs{ly['micro_batch_size']} gbs{ly['global_batch_size']} {ly['precision']}")
    return text + (f" ({_features_text(ly)})" if features else "")


def _memory_line(r: dict) -> str:
    from mlbench.planner.plan import fmt_bytes

    mem = r["memory"]
    if mem is None:
        return f"memory plan: not available (device memory {fmt_bytes(r['device_memory_bytes'])})"
    parts = ", ".join(f"{k.removesuffix('_bytes')} {fmt_bytes(v)}" for k, v in mem.items() if k.endswith("_bytes"))
    verdict = "fits" if r["fits"] else "does NOT fit"
    return f"memory per device: {parts}; {verdict} in {fmt_bytes(r['device_memory_bytes'])}"


def _print_one(console: Console, r: dict) -> None:
    console.print(Text.assemble((r["benchmark"], "bold"), f" on {r['device']}: {_layout_text(r['layout'])}"))
    console.print(_memory_line(r))
    t = Table(title="step time, term by term", title_justify="left")
    t.add_column("term")
    t.add_column("s", justify="right")
    t.add_column("share", justify="right")
    for k, v in r["step_terms_s"].items():
        t.add_row(k, f"{v:.4g}", f"{v / r['step_time_s']:.1%}")
    t.add_row(Text("step_time_s", style="bold"), f"{r['step_time_s']:.4g}", "100%")
    console.print(t)
    mfu = f"{r['mfu']:.1%}" if r["mfu"] is not None else "-"
    console.print(f"tokens_per_s_per_device {r['tokens_per_s_per_device']:,.1f}   model_tflops_per_device "
                  f"{r['model_tflops_per_device']:,.4g}   mfu {mfu} ({r['mfu_basis']})")
    ttt = r["time_to_train"]
    if ttt:
        console.print(f"time_to_train_min {r['time_to_train_min']:,.1f}: {ttt['steps']} steps "
                      f"({ttt['samples_to_converge']:,.0f} samples to converge, {ttt['rcp']}) and "
                      f"{ttt['evaluations']} evaluations ({ttt['eval_s']:,.0f} s)")


def _print_search(console: Console, out: dict) -> None:
    from mlbench.planner.plan import fmt_bytes, why_between

    s = out["search"]
    console.print(Text.assemble((out["benchmark"], "bold"), f" on {out['device']}: {s['candidates']} candidate "
                                f"layouts, {s['invalid']} break a layout rule, {s['closed_rules']} break the closed "
                                f"rules, {s['does_not_fit']} do not fit; best {len(out['layouts'])} by predicted "
                                f"time-to-train ({_features_text(out['layouts'][0]['layout'])}):"))
    t = Table(title_justify="left")
    for h in ("#", "layout", "step s", "TTT min", "MFU", "bubble", "comm", "memory", "vs best"):
        t.add_column(h, justify="left" if h in ("layout", "vs best") else "right", overflow="fold")
    best = out["layouts"][0]
    for i, r in enumerate(out["layouts"], 1):
        terms = r["step_terms_s"]
        comm = sum(v for k, v in terms.items() if k.endswith("_comm"))  # tp, cp, dp, pipeline p2p, expert all-to-all
        ttt = f"{r['time_to_train_min']:,.1f}" if r["time_to_train_min"] is not None else "-"
        mem = fmt_bytes(r["memory"]["total_bytes"]) if r["memory"] else "n/a"
        t.add_row(str(i), _layout_text(r["layout"], features=False), f"{r['step_time_s']:.3g}", ttt,
                  f"{r['mfu']:.1%}" if r["mfu"] is not None else "-",
                  f"{terms['pipeline_bubble'] / r['step_time_s']:.1%}", f"{comm / r['step_time_s']:.1%}", mem,
                  why_between(best, r))
    console.print(t)
    if best["memory"] is None:
        console.print("memory plan: not available (no layout was dropped for memory)")


def _print_scaling(console: Console, out: dict) -> None:
    console.print(Text.assemble((out["benchmark"], "bold"), f" on {out['device']}, predicted "
                                f"({_features_text(out['scaling'][0]['layout'])}):"))
    t = Table(title_justify="left")
    for h in ("devices", "layout", "step s", "tokens/s per device", "TTT min", "strong eff.", "weak eff."):
        t.add_column(h, justify="left" if h == "layout" else "right", overflow="fold")
    for p in out["scaling"]:
        ttt = f"{p['time_to_train_min']:,.1f}" if p["time_to_train_min"] is not None else "-"
        t.add_row(str(p["devices"]), _layout_text(p["layout"], features=False), f"{p['step_time_s']:.3g}",
                  f"{p['tokens_per_s_per_device']:,.1f}", ttt, f"{p['strong_efficiency']:.3f}",
                  f"{p['weak_efficiency']:.3f}")
    console.print(t)
    console.print("strong: T_base x N_base / (T_n x N_n), time-to-train (step time where there is none); weak: "
                  "tokens/s per device at N / at the base (mlbench scaling's definitions)")
    for x in out.get("no_layout", []):
        console.print(f"not on the curve: {x['reason']}", soft_wrap=True)
