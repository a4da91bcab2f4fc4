"""Strong and weak scaling efficiency of one benchmark measured at several device counts."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table
from rich.text import Text

from mlbench import mlperf_tools
from mlbench.analysis.logs import GivenOnce, ResultSet, find_sets, holds_no_log, passed_over, told_apart
from mlbench.analysis.report import Report, line_looks, plot_label, plt
from mlbench.errors import UserError, printable
from mlbench.schema import versioned

DEFINITIONS = [
    "Strong scaling, time to train: E = T_base x N_base / (T_n x N_n), T the olympic mean of the successful "
    "runs' times (run_stop - run_start; no RCP factor), N the device count, base the smallest configuration. "
    "Global batch and so steps to converge may differ between configurations; this is the end-to-end view.",
    "Strong scaling per step at fixed global batch: the same formula with t the median time per optimizer "
    "step, among configurations sharing a global batch (base: the smallest of them).",
    "Weak scaling: E = throughput per device at N / throughput per device at the base, among configurations "
    "sharing a per-device batch (global batch / N); throughput = global batch x sequence length / median step time.",
    "Per-step times come from the logs' tracked per-step statistics where recorded, else from block events "
    "(block duration / steps in the block).",
]


@dataclass
class Point:
    label: str
    devices: int
    devices_from: str
    gbs: int | None
    seq: int | None
    ttt_min: float | None
    ttt_runs: int
    step_s: float | None
    step_source: str

    @property
    def per_device_batch(self) -> float | None:
        return ratio(self.gbs, self.devices)

    @property
    def tokens_per_s_per_device(self) -> float | None:
        if not (self.gbs and self.step_s):
            return None
        return ratio(ratio(self.gbs * (self.seq or 1), self.step_s), self.devices)


@dataclass
class Scaling:
    benchmark: str | None
    points: list[Point]
    strong_ttt: list[tuple[Point, float | None]] = field(default_factory=list)
    strong_step: dict[int, list[tuple[Point, float | None]]] = field(default_factory=dict)
    weak: dict[float, list[tuple[Point, float | None]]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def ratio(a: float | None, b: float | None) -> float | None:
    """A / B, or None where either is missing or zero or the quotient is no finite float (device counts are ints
    of any size: 10**400 / 1 is an OverflowError)."""
    if not a or not b:
        return None
    try:
        q = a / b
    except (OverflowError, ZeroDivisionError):
        return None
    return q if math.isfinite(q) else None


def efficiency(t_base: float | None, n_base: int, t_n: float | None, n_n: int) -> float | None:
    """T_base x N_base / (T_n x N_n), as (T_base / T_n) x (N_base / N_n): each quotient a float, whatever the
    size of the counts."""
    t, n = ratio(t_base, t_n), ratio(n_base, n_n)
    return ratio(t * n, 1.0) if t is not None and n is not None else None


def _point(rs: ResultSet, devices: int | None, notes: list[str], label: str) -> Point:
    n, src = rs.devices(devices)
    where, why = passed_over(src)
    if not n:  # (a file there but garbled: said, not "no systems json")
        what = why or "no systems/<system>.json, no run record with 'devices'"
        raise UserError(printable(f"{rs.folder}: device count unknown ({what}); give it with --devices, one per "
                                  f"PATH"))
    if why:  # (the table shows where the count came from; why another was passed over, here)
        notes.append(f"{label}: device count {n}, {'given' if where == 'given' else f'from the {where}'}: {why}")
    runs = rs.benchmark_runs
    ok = [r for r in runs if r.status == "success" and r.ttt_min is not None]
    notes += [f"{label}: {n}" for n in rs.left_out_notes]
    for r in runs:
        for p in r.problems:
            notes.append(f"{label}/{r.name}: {p}")
    times = [r.ttt_min for r in ok]
    if len(times) >= 3:
        ttt = mlperf_tools.olympic_average(times, 0, 1)
    elif times:
        ttt = float(np.mean(times))
        notes.append(f"{label}: {len(times)} successful run(s), time to train is their plain mean")
    else:
        ttt = None
    steps = [r.step_times.seconds for r in ok if len(r.step_times.seconds)]
    step = float(np.median(np.concatenate(steps))) if steps else None
    source = ", ".join(sorted({r.step_times.source for r in ok})) or "-"
    gbs = next((r.gbs for r in runs if r.gbs), None)
    seq = next((r.seq_len for r in runs if r.seq_len), None)
    return Point(label, n, where, gbs, seq, ttt, len(times), step, source)


def base_of(points: list[Point], figure: str) -> Point:
    """The base of an efficiency among POINTS (smallest first): the first that has the FIGURE it is computed from,
    else the first."""
    return next((q for q in points if getattr(q, figure) is not None), points[0])


def build_scaling(paths: list[Path], devices: list[int] | None = None) -> Scaling:
    notes: list[str] = []
    points: list[Point] = []
    benches: dict[str, list[str]] = defaultdict(list)
    once = GivenOnce("scaling takes each configuration")
    found: list[tuple[ResultSet, int | None]] = []
    for i, p in enumerate(paths):
        sets = find_sets(Path(p))
        if devices and len(sets) > 1:
            raise UserError(f"{p} holds {len(sets)} benchmark folders; with --devices give one folder per PATH")
        if why := holds_no_log(sets):
            raise UserError(printable(f"{p} holds no MLPerf result log ({why})"))
        for rs in sets:
            once.add(Path(rs.folder).resolve(), rs.folder, p)
            found.append((rs, devices[i] if devices else None))
    # sets of one label (an organisation, system and benchmark from two trees) named apart by their paths
    for (rs, given), label in zip(found, told_apart([(rs.label, rs.folder) for rs, _ in found]), strict=True):
        benches[rs.benchmark or rs.folder.name].append(label)
        points.append(_point(rs, given, notes, label))
    if len(benches) > 1:
        raise UserError("scaling compares one benchmark at several device counts; got "
                        + printable("; ".join(f"{b}: {', '.join(v)}" for b, v in benches.items())))
    if len(points) < 2:
        raise UserError("scaling needs at least two configurations (benchmark folders)")
    points.sort(key=lambda q: (q.devices, q.label))
    sc = Scaling(next(iter(benches)), points, notes=notes)
    # the base: the smallest configuration that has a figure (one whose runs all failed blanked every efficiency)
    base = base_of(points, "ttt_min")
    if base is not points[0]:
        sc.notes.append(f"{points[0].label}: no successful run, so the time-to-train base is {base.label} "
                        f"({base.devices} devices)")
    sc.strong_ttt = [(q, efficiency(base.ttt_min, base.devices, q.ttt_min, q.devices)) for q in points]
    by_gbs: dict[int, list[Point]] = defaultdict(list)
    by_pdb: dict[float, list[Point]] = defaultdict(list)
    for q in points:
        if q.gbs:
            by_gbs[q.gbs].append(q)
            if (pdb := q.per_device_batch) is not None:
                by_pdb[round(pdb, 9)].append(q)
    for g, qs in sorted(by_gbs.items()):
        if len(qs) > 1:
            b = base_of(qs, "step_s")
            sc.strong_step[g] = [(q, efficiency(b.step_s, b.devices, q.step_s, q.devices)) for q in qs]
    for pdb, qs in sorted(by_pdb.items()):
        if len(qs) > 1:
            b = base_of(qs, "tokens_per_s_per_device")
            sc.weak[pdb] = [(q, ratio(q.tokens_per_s_per_device, b.tokens_per_s_per_device)) for q in qs]
    if not sc.strong_step:
        sc.notes.append("no two configurations share a global batch: no per-step strong scaling")
    if not sc.weak:
        sc.notes.append("no two configurations share a per-device batch: no weak scaling; the points table "
                        "shows per-device throughput for each")
    return sc


def _f(v: float | None, nd: int = 3) -> str:
    return "-" if v is None else f"{v:,.{nd}f}"


def tables(sc: Scaling) -> list[tuple[str, list[str], list[list[str]]]]:
    out = []
    out.append((f"configurations ({sc.benchmark})",
                ["configuration", "devices", "global batch", "per-device batch", "time to train (min)",
                 "median step (s)", "tokens/s per device", "step times from"],
                [[q.label, f"{q.devices} ({q.devices_from})", str(q.gbs or "-"), _f(q.per_device_batch, 4),
                  _f(q.ttt_min, 4) + f" ({q.ttt_runs} runs)", _f(q.step_s, 4), _f(q.tokens_per_s_per_device, 1),
                  q.step_source] for q in sc.points]))
    b = base_of(sc.points, "ttt_min")  # (the efficiencies' base: the smallest with a time, not the smallest)
    out.append(("strong scaling, time to train (base: " + b.label + ")",
                ["configuration", "devices", "speed-up T_base/T_n", "ideal N_n/N_base", "efficiency"],
                [[q.label, str(q.devices), _f(ratio(b.ttt_min, q.ttt_min)), _f(ratio(q.devices, b.devices)), _f(e)]
                 for q, e in sc.strong_ttt]))
    for g, rows in sc.strong_step.items():
        bb = base_of([q for q, _ in rows], "step_s")
        out.append((f"strong scaling per step, global batch {g} (base: {bb.label})",
                    ["configuration", "devices", "median step (s)", "efficiency"],
                    [[q.label, str(q.devices), _f(q.step_s, 4), _f(e)] for q, e in rows]))
    for pdb, rows in sc.weak.items():
        out.append((f"weak scaling, per-device batch {pdb:g}",
                    ["configuration", "devices", "tokens/s per device", "efficiency"],
                    [[q.label, str(q.devices), _f(q.tokens_per_s_per_device, 1), _f(e)] for q, e in rows]))
    return out


def print_scaling(console: Console, sc: Scaling) -> None:
    """The scaling tables on the terminal; every text from the logs and folders (labels, notes) `printable`."""
    for title, header, rows in tables(sc):
        t = Table(title=printable(title), title_justify="left")
        for h in header:
            t.add_column(h, justify="left" if h == "configuration" else "right", overflow="fold")
        for r in rows:
            t.add_row(*map(printable, r))
        console.print(t)
    console.print(Text("definitions", style="bold"))
    for d in DEFINITIONS:
        console.print(f"  - {d}", highlight=False)
    for n in sc.notes:
        console.print(Text.assemble(("note", "cyan"), f": {printable(n)}"), highlight=False)


def scaling_json(sc: Scaling) -> dict:
    """The scaling as `scaling --json` gives it (docs/output.md): each configuration's figures and each
    efficiency, named as the other documents name them. A base is the point each efficiency is computed against
    (`base_of`)."""
    def curve(rows: list[tuple[Point, float | None]], figure: str, name: str) -> dict:
        return {"base": base_of([q for q, _ in rows], figure).label,
                "points": [{"label": q.label, "devices": q.devices, name: getattr(q, figure), "efficiency": e}
                           for q, e in rows]}

    base = base_of(sc.points, "ttt_min")
    strong = curve(sc.strong_ttt, "ttt_min", "time_to_train_min")
    for point, (q, _) in zip(strong["points"], sc.strong_ttt, strict=True):
        point |= {"speedup": ratio(base.ttt_min, q.ttt_min), "ideal_speedup": ratio(q.devices, base.devices)}
    return versioned({
        "benchmark": sc.benchmark,
        "points": [{"label": q.label, "devices": q.devices, "devices_from": q.devices_from,
                    "global_batch_size": q.gbs, "per_device_batch_size": q.per_device_batch,
                    "seq_length": q.seq, "time_to_train_min": q.ttt_min, "successful_runs": q.ttt_runs,
                    "step_time_s": q.step_s, "tokens_per_s_per_device": q.tokens_per_s_per_device,
                    "step_times_from": None if q.step_source == "-" else q.step_source} for q in sc.points],
        "strong_time_to_train": strong,
        "strong_per_step": [{"global_batch_size": g} | curve(rows, "step_s", "step_time_s")
                            for g, rows in sc.strong_step.items()],
        "weak": [{"per_device_batch_size": pdb} | curve(rows, "tokens_per_s_per_device", "tokens_per_s_per_device")
                 for pdb, rows in sc.weak.items()],
        "notes": list(sc.notes),
    })


def efficiency_plot(sc: Scaling):
    fig, ax = plt.subplots(figsize=(8, 4.5))
    x = [float(q.devices) for q, _ in sc.strong_ttt]  # floats: numpy's log2 takes no int past 64 bits
    # (line style, label, points) of each line: the style says the kind, colour and marker tell every line apart
    lines = [("-", "strong, time to train", sc.strong_ttt)]
    lines += [("--", f"strong per step, global batch {g}", rows) for g, rows in sc.strong_step.items()]
    lines += [(":", f"weak, per-device batch {pdb:g}", rows) for pdb, rows in sc.weak.items()]
    for (style, label, rows), (colour, marker) in zip(lines, line_looks(len(lines)), strict=True):
        ax.plot([float(q.devices) for q, _ in rows], [e if e is not None else np.nan for _, e in rows],
                color=colour, marker=marker, linestyle=style, label=label)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlim(min(x) / 1.25, max(x) * 1.25)  # fixed: with no efficiency to draw, autoscaling has no data
    ax.set_xticks(x, [str(q.devices) for q, _ in sc.strong_ttt], rotation=60, fontsize=8)
    ax.set_xlabel("devices")
    ax.set_ylabel("efficiency")
    ax.set_ylim(0, max([1.1, *(e for _, e in sc.strong_ttt if e is not None)]) * 1.05)
    ax.grid(alpha=0.3)
    if len(lines) <= _LEGEND_INSIDE:
        ax.legend(fontsize=8)
    else:  # under the figure, in columns: inside, 20 lines (60 configurations) hid half the plot and its points
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=min(3, -(-len(lines) // 10)),
                  fontsize=7, frameon=False)
    ax.set_title(f"Scaling efficiency, {plot_label(sc.benchmark)}")
    return fig


_LEGEND_INSIDE = 6  # lines whose legend fits inside the plot without hiding it


def scaling_report(sc: Scaling) -> Report:
    rep = Report(f"mlbench scaling: {sc.benchmark}")
    for title, header, rows in tables(sc):
        rep.h(title)
        rep.table(header, rows)
    rep.h("Efficiency against device count")
    rep.img("efficiency", efficiency_plot(sc), "scaling efficiency against device count")
    rep.h("Definitions")
    rep.ul(DEFINITIONS)
    if sc.notes:
        rep.h("Notes")
        rep.ul(sc.notes)
    return rep
