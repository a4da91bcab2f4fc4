"""Side-by-side comparison of runs, sets and published rows: time, convergence, step times, layout."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table
from rich.text import Text

from mlbench import compliance
from mlbench.analysis import published, step_times
from mlbench.analysis.logs import (
    GivenOnce,
    ResultSet,
    RunLog,
    find_sets,
    holds_no_log,
    passed_over,
    record_number,
    run_record,
    told_apart,
)
from mlbench.analysis.report import Report, line_looks, plot_label, plt  # pyplot on the reports' headless backend
from mlbench.analysis.score import SetScore, require_rules_for, score_set
from mlbench.errors import UserError, printable
from mlbench.logfile import MAX_TEXT, is_number
from mlbench.schema import versioned

# Layout keys shown first in the differences table (ours log them; NVIDIA logs some).
LAYOUT = ("global_batch_size", "micro_batch_size", "tensor_parallelism", "pipeline_parallelism",
          "context_parallelism", "gradient_accumulation_steps", "max_sequence_length")


def _cut(text: str) -> str:
    """A string from a run record, at most MAX_TEXT characters (a million-character device name was printed whole)."""
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT - 3] + "..."


@dataclass
class Entry:
    label: str
    kind: str  # "set", "run" or "published"
    benchmark: str | None
    devices: int | None = None
    devices_from: str = ""
    score: SetScore | None = None
    runs: list[RunLog] = field(default_factory=list)
    published: published.PublishedRow | None = None
    problems: list[str] = field(default_factory=list)
    where: Path | None = None  # the run's file or the set's folder, to tell apart two entries of one label

    # --- figures -------------------------------------------------------------------------------------
    @property
    def ttt_min(self) -> float | None:
        """Score when scored; else the olympic-free median run time; published: the headline time."""
        if self.published:
            return self.published.time_to_train_min
        if self.score and self.score.score_min is not None:
            return self.score.score_min
        t = [r.ttt_min for r in self.runs if r.ttt_min is not None and r.status == "success"]
        return float(np.median(t)) if t else None

    @property
    def ttt_kind(self) -> str:
        if self.published:
            return "published"
        if self.score and self.score.score_min is not None:
            return "score"
        return "median run" if len(self.runs) > 1 else "run"

    def _median(self, values: list[float | None]) -> float | None:
        v = [x for x in values if x is not None]
        return float(np.median(v)) if v else None

    @property
    def samples_to_converge(self) -> float | None:
        return self._median([r.samples_to_converge for r in self.runs])

    @property
    def steps_to_converge(self) -> float | None:
        return self._median([r.steps_to_converge for r in self.runs])

    @cached_property  # (the runs' step times joined: as many numbers as steps, once)
    def step_seconds(self) -> np.ndarray:
        parts = [r.step_times.seconds for r in self.runs if len(r.step_times.seconds)]
        return np.concatenate(parts) if parts else np.zeros(0)

    @property
    def step_source(self) -> str:
        if self.published:
            return "published" if self.published.step_time_s else "-"
        return ", ".join(sorted({r.step_times.source for r in self.runs})) or "-"

    def step_stats(self) -> dict[str, float | None]:
        return dict(self._step_stats)

    @cached_property  # (read by several rows: percentiles of every step, once)
    def _step_stats(self) -> dict[str, float | None]:
        if self.published:
            s = self.published.step_time_s
            return {**step_times.NO_STATS, "median": s, "mean": s}
        return step_times.step_stats(self.step_seconds)

    @property
    def gbs(self) -> int | None:
        return next((r.gbs for r in self.runs if r.gbs), None)

    @property
    def seq_len(self) -> int | None:
        return next((r.seq_len for r in self.runs if r.seq_len), None)

    def tokens_per_s_per_device(self) -> float | None:
        med, gbs, seq = self.step_stats()["median"], self.gbs, self.seq_len
        if not (med and gbs and seq and self.devices):
            return None
        return gbs * seq / med / self.devices

    def samples_per_s_per_device(self) -> float | None:
        med, gbs = self.step_stats()["median"], self.gbs
        if not (med and gbs and self.devices):
            return None
        return gbs / med / self.devices

    def tflops_per_device(self) -> float | None:
        v = np.concatenate([np.zeros(0), *(r.step_times.tflops_per_device for r in self.runs)])
        return float(np.median(v)) if len(v) else None

    def model_tflops_per_device(self) -> float | None:
        """Model TFLOP/s per device from the benchmark definition's FLOPs per sample (attention included) and the
        measured samples/s: comparable across submissions, whatever precision or recipe they used. Only for a
        full-size run of a benchmark we define (its sequence length says which model it trained)."""
        from mlbench import flops, registry
        from mlbench.errors import UserError

        rate = self.samples_per_s_per_device()
        if rate is None or self.benchmark not in registry.names():
            return None
        try:
            model = registry.load(self.benchmark).model
        except UserError:
            return None
        if self.seq_len != model.seq_length:
            return None
        return flops.flops_per_sample(model) * rate / 1e12

    def mfu(self) -> float | None:
        """From our run record when it says (published logs do not)."""
        # a fraction of the device's peak: 0 to 1 (a record edited to -5 or 50 showed -500 % and 5,000 %)
        v = [x for r in self.runs if (x := record_number(r.path, "mfu")) is not None and 0 <= x <= 1]
        return float(np.mean(v)) if v else None

    def prediction(self) -> tuple[float | None, str]:
        """The planner's step time for the run's own layout and device, from our run records (`prediction`,
        written before the run's figures are read): the median over runs, and the device(s) it was predicted on."""
        preds = [p for r in self.runs if isinstance(p := run_record(r.path).get("prediction"), dict)]
        times = [t for p in preds if is_number(t := p.get("step_time_s")) and 0 < t <= step_times.MAX_STEP_S]
        return self._median(times), ", ".join(sorted({_cut(str(p["device"])) for p in preds if p.get("device")}))

    def prediction_notes(self) -> list[str]:
        """What the runs' predictions say they do not model (a GPU run without Transformer Engine), once each."""
        preds = [run_record(r.path).get("prediction") for r in self.runs]
        return sorted({_cut(p["note"]) for p in preds if isinstance(p, dict) and isinstance(p.get("note"), str)})

    def predicted_over_measured(self) -> float | None:
        predicted, measured = self.prediction()[0], self.step_stats()["median"]
        return predicted / measured if predicted and measured else None

    def hyperparams(self) -> dict[str, object]:
        """The first run's logged hyperparameters, and for our runs the features its record's layout states
        (features.sequence_parallel, ...: no MLPerf key logs them), each a short flag or word."""
        if not self.runs:
            return {}
        out: dict[str, object] = dict(self.runs[0].hyperparams)
        layout = run_record(self.runs[0].path).get("layout")
        features = layout.get("features") if isinstance(layout, dict) else None
        for k, v in list(features.items())[:64] if isinstance(features, dict) else ():
            if isinstance(k, str) and len(k) <= 64 and (type(v) in (bool, int) and abs(v) < 1 << 53
                                                         or isinstance(v, str) and len(v) <= 64):
                out[f"features.{printable(k)}"] = v
        return out


@dataclass
class Comparison:
    entries: list[Entry]
    notes: list[str] = field(default_factory=list)

    def differing_hyperparams(self) -> dict[str, list[object]]:
        given = [e.hyperparams() for e in self.entries if e.runs]
        keys = sorted({k for h in given for k in h},
                      key=lambda k: (k not in LAYOUT, LAYOUT.index(k) if k in LAYOUT else 0, k))
        out = {}
        for k in keys:
            vals = [h.get(k) for h in given]
            if k.startswith("features.") and any(k not in h for h in given):
                continue  # (a record's, which a published run has not: not a difference of its own)
            if len({repr(v) for v in vals}) > 1:  # (values as logs.RunLog keeps them: short, and flat)
                out[k] = vals
        return out

    def rows(self) -> list[tuple[str, list[str]]]:
        """The side-by-side table, as text cells (shared by the terminal, HTML and Markdown)."""
        E = self.entries

        def f(v: float | None, nd: int = 3, scale: float = 1.0) -> str:
            return "-" if v is None else f"{v * scale:,.{nd}f}"

        def rate(v: float | None) -> str:  # (a CPU's 0.0163 TFLOP/s read '0.0' at one decimal)
            return "-" if v is None else f"{v:,.1f}" if abs(v) >= 10 else f"{v:.3g}"

        st = [e.step_stats() for e in E]
        pred = [e.prediction() for e in E]
        return [
            ("benchmark", [e.benchmark or "-" for e in E]),
            ("kind", [e.kind + (f" ({len(e.runs)} runs)" if e.kind == "set" else "") for e in E]),
            ("devices", [f"{e.devices} ({e.devices_from})" if e.devices else "?" for e in E]),
            ("time to train (min)", [f"{f(e.ttt_min, 4)} ({e.ttt_kind})" for e in E]),
            ("RCP", [f"{e.score.rcp.status}, x{e.score.rcp_factor:.4f}" if e.score else "-" for e in E]),
            ("global batch", [str(e.gbs or "-") for e in E]),
            ("steps to converge", [f(e.steps_to_converge, 1) for e in E]),
            ("samples to converge", [f(e.samples_to_converge, 0) for e in E]),
            ("step time median (s)", [f(s["median"], 4) for s in st]),
            ("step time predicted (s)", [f(p, 4) + (f" ({d})" if d else "") for p, d in pred]),
            ("predicted / measured", [f(e.predicted_over_measured(), 2) for e in E]),
            ("step time p90 (s)", [f(s["p90"], 4) for s in st]),
            ("step time p99 (s)", [f(s["p99"], 4) for s in st]),
            ("jitter (p90-p10)/median", [f(s["jitter"], 2, 100) + ("%" if s["jitter"] is not None else "")
                                         for s in st]),
            ("step times from", [e.step_source for e in E]),
            ("tokens/s per device", [f(e.tokens_per_s_per_device(), 0) for e in E]),
            ("samples/s per device", [f(e.samples_per_s_per_device(), 4) for e in E]),
            ("TFLOP/s per device (logged)", [rate(e.tflops_per_device()) for e in E]),
            ("model TFLOP/s per device", [rate(e.model_tflops_per_device()) for e in E]),
            ("MFU", [f(e.mfu(), 1, 100) + ("%" if e.mfu() is not None else "") for e in E]),
        ]


def _entry_from_set(rs: ResultSet, ruleset: str | None, with_score: bool) -> Entry:
    bench, runs = rs.benchmark, rs.benchmark_runs
    n, src = rs.devices()
    kind = "run" if len(rs.files) == 1 else "set"
    e = Entry(label=rs.label if kind == "set" else f"{rs.label}/{rs.files[0].name}", kind=kind,
              benchmark=bench, devices=n, devices_from=src, runs=runs,
              where=Path(rs.folder) if kind == "set" else Path(rs.files[0]))
    for r in runs:
        e.problems += [f"{r.name}: {p}" for p in r.problems]
    if with_score and kind == "set":
        e.score = score_set(rs, ruleset)  # its notes say which files were left out
    else:
        require_rules_for(ruleset, bench, e.where)  # (unused here, but refused as where it is used)
        e.problems += rs.left_out_notes
    return e


def _tell_apart(entries: list[Entry]) -> None:
    """Entries of one label get their path after it (`told_apart`)."""
    for e, label in zip(entries, told_apart([(e.label, e.where) for e in entries]), strict=True):
        e.label = label


def build_comparison(paths: list[str], ruleset: str | None = None, with_score: bool = True) -> Comparison:
    """The entries PATHS name, side by side. A RULESET the installed checker does not know is refused first, as
    `score` and `check` refuse it (it judged every file non-compliant: "3 runs failed or did not converge")."""
    if ruleset is not None:
        compliance.require_ruleset(ruleset)
    entries: list[Entry] = []
    once = GivenOnce("compare takes each run, set or published row")
    for p in paths:
        if p.startswith(published.PREFIX):
            row = published.get(p)
            once.add(("published", row.label), p, p)
            entries.append(Entry(label=row.label, kind="published", benchmark=row.benchmark,
                                 devices=row.devices, devices_from="published", published=row))
            continue
        path = Path(p)
        sets = find_sets(path)  # (a file: its one-run set)
        for rs in sets:
            if path.is_file():
                once.add(("run", path.resolve()), path, p)
            else:
                once.add(("set", Path(rs.folder).resolve()), rs.folder, p)
        if why := holds_no_log(sets):
            what = "is not an MLPerf result log" if path.is_file() else "holds no MLPerf result log"
            raise UserError(printable(f"{p} {what} ({why})"))
        entries += [_entry_from_set(rs, ruleset, with_score and not path.is_file()) for rs in sets]
    if len(entries) < 2:
        raise UserError("compare needs at least two runs, sets or published rows; got "
                        f"{len(entries)} from {' '.join(paths)}")
    _tell_apart(entries)
    cmp = Comparison(entries)
    benches = {e.benchmark for e in entries if e.benchmark}
    if len(benches) > 1:
        cmp.notes.append(f"different benchmarks side by side ({', '.join(sorted(benches))}): "
                         "times are not comparable")
    for e in entries:
        if e.published and e.published.note:
            cmp.notes.append(f"{e.label}: {e.published.note} [{e.published.source}]")
        cmp.notes += [f"{e.label}: {p}" for p in e.problems]
        cmp.notes += [f"{e.label}: {n}" for n in e.prediction_notes()]
        if e.score:
            cmp.notes += [f"{e.label}: {n}" for n in e.score.notes]
        why = passed_over(e.devices_from)[1]
        if e.devices is None and e.kind != "published" and not (e.score and why):  # (a score's notes say why)
            cmp.notes.append(f"{e.label}: device count unknown ({why or 'no systems json or run record'}), "
                             "so no per-device throughput")
    return cmp


def print_comparison(console: Console, cmp: Comparison) -> None:
    """The comparison on the terminal. Every text from the logs and folders (labels, benchmark names, keys, values,
    notes) is `printable`: a log's benchmark "gpt3\nerror: ..." forged a line."""
    t = Table(title="comparison", title_justify="left")
    t.add_column("")
    for e in cmp.entries:
        t.add_column(printable(e.label), justify="right", overflow="fold")
    for name, cells in cmp.rows():
        t.add_row(name, *map(printable, cells))
    console.print(t)
    diff = cmp.differing_hyperparams()
    if diff:
        h = Table(title="hyperparameters and layout that differ", title_justify="left")
        h.add_column("key")
        for e in cmp.entries:
            if e.runs:
                h.add_column(printable(e.label), overflow="fold")
        for k, vals in diff.items():
            h.add_row(printable(k), *["-" if v is None else printable(v) for v in vals])
        console.print(h)
    else:
        console.print("hyperparameters and layout: no differences among the logged ones")
    for n in cmp.notes:
        console.print(Text.assemble(("note", "cyan"), f": {printable(n)}"), highlight=False)



# --- compare --json (docs/output.md) --------------------------------------------------------------------------

def comparison_json(cmp: Comparison) -> dict:
    """The comparison as `compare --json` gives it: the side-by-side table's figures as numbers, named as the other
    documents name them (time_to_train_min, step_time_s, global_batch_size, tokens_per_s_per_device, ...)."""
    return versioned({"entries": [_entry_json(e) for e in cmp.entries],
                      "differing_hyperparameters": list(cmp.differing_hyperparams()),
                      "notes": list(cmp.notes)})


def _entry_json(e: Entry) -> dict:
    st, (predicted, predicted_on) = e.step_stats(), e.prediction()
    score = e.score
    return {
        "label": e.label, "kind": e.kind, "benchmark": e.benchmark,
        "path": str(e.where) if e.where is not None else None,
        "run_count": len(e.runs), "devices": e.devices, "devices_from": e.devices_from or None,
        "time_to_train_min": e.ttt_min, "time_to_train_from": e.ttt_kind,
        "rcp": asdict(score.rcp) if score else None, "rcp_factor": score.rcp_factor if score else None,
        "global_batch_size": e.gbs, "steps_to_converge": e.steps_to_converge,
        "samples_to_converge": e.samples_to_converge,
        "step_time_s": st["median"], "step_time_mean_s": st["mean"], "step_time_p90_s": st["p90"],
        "step_time_p99_s": st["p99"], "step_time_jitter": st["jitter"],
        "step_times_from": None if e.step_source == "-" else e.step_source,
        "predicted_step_time_s": predicted, "predicted_on": predicted_on or None,
        "predicted_over_measured": e.predicted_over_measured(),
        "tokens_per_s_per_device": e.tokens_per_s_per_device(),
        "samples_per_s_per_device": e.samples_per_s_per_device(),
        "tflops_per_device": e.tflops_per_device(), "model_tflops_per_device": e.model_tflops_per_device(),
        "mfu": e.mfu(), "hyperparameters": e.hyperparams(),
        "source": e.published.source.strip() if e.published else None,
    }


# --- the report -----------------------------------------------------------------------------------

def comparison_report(cmp: Comparison) -> Report:
    rep = Report("mlbench compare")
    rep.h("Side by side")
    rows = cmp.rows()
    rep.table([""] + [e.label for e in cmp.entries], [[name, *cells] for name, cells in rows])
    rep.p("Time to train: the MLPerf score (olympic mean x RCP factor) for a scored set, the run's own "
          "time for a single run, the headline number for a published row. Jitter: (p90 - p10) / median "
          "of the per-step times. Predicted step time: the planner's, for the run's own layout and device, as its run "
          "record holds it (mlbench plan; on CPU the CPU measured once and cached). "
          "Per-device throughput: global batch x sequence length / median step "
          "time / devices.")
    diff = cmp.differing_hyperparams()
    rep.h("Hyperparameters and layout that differ")
    if diff:
        labels = [e.label for e in cmp.entries if e.runs]
        rep.table(["key", *labels], [[k, *["-" if v is None else str(v) for v in vals]] for k, vals in diff.items()])
    else:
        rep.p("No differences among the logged hyperparameters.")
    rep.h("Plots")
    if note := plots_note(cmp):
        rep.p(note[0].upper() + note[1:] + ".")
    fig = _convergence_plot(cmp)
    if fig is not None:
        rep.img("convergence", fig, "eval accuracy against samples and minutes since run_start")
    fig = _step_time_plot(cmp)
    if fig is not None:
        rep.img("step_times", fig, "distribution of per-step times")
    if cmp.notes:
        rep.h("Notes")
        rep.ul(cmp.notes)
    return rep


PLOTTABLE = 1e150  # far beyond any metric, time or count a log can hold; far below where axis arithmetic overflows


# Entries one plot shows at most: 2,900 sets made a step-time plot 69,000 px tall (a row each) and a convergence
# legend of 725 rows; past this the plots show those with the shortest time to train, the tables every entry.
PLOT_ENTRIES = 50


def _converging(cmp: Comparison) -> list[Entry]:
    return [e for e in cmp.entries if any(r.evals for r in e.runs)]


def _timed(cmp: Comparison) -> list[Entry]:
    return [e for e in cmp.entries if len(e.step_seconds)]


def _plotted(entries: list[Entry]) -> list[Entry]:
    """ENTRIES, or past PLOT_ENTRIES those of the shortest time to train (then those without one, as given), in
    the order given."""
    if len(entries) <= PLOT_ENTRIES:
        return entries
    ranked = sorted(range(len(entries)), key=lambda i: (entries[i].ttt_min is None, entries[i].ttt_min or 0.0, i))
    kept = set(ranked[:PLOT_ENTRIES])
    return [e for i, e in enumerate(entries) if i in kept]


def plots_note(cmp: Comparison) -> str | None:
    """What the report's plots leave out, where they hold more entries than PLOT_ENTRIES; None where nothing."""
    left = [f"{len(es) - PLOT_ENTRIES:,} of the {len(es):,} entries {where}"
            for where, es in (("with evaluations", _converging(cmp)), ("with step times", _timed(cmp)))
            if len(es) > PLOT_ENTRIES]
    if not left:
        return None
    return (f"the plots show at most {PLOT_ENTRIES} entries each, those with the shortest time to train: "
            f"{' and '.join(left)} are left out of them (the tables hold every entry)")


def _convergence_plot(cmp):
    entries = _plotted(_converging(cmp))
    if not entries:
        return None
    n = len(entries)
    # Beyond a few entries the legend goes below the plots, in columns (over them it hid the lines and the title
    # at 50), and each entry has a colour and marker of its own (the colour cycle repeats after 10).
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.2))
    looks = line_looks(n)
    for i, e in enumerate(entries):
        for j, r in enumerate(x for x in e.runs if x.evals):
            ev = np.array(r.evals, dtype=float)
            # matplotlib's axis limits overflow near the float maximum (1.7e308: a ValueError out of its ticker;
            # 1e307: overflow warnings): such a point is left off the plot, and the notes say so
            plottable = np.isfinite(ev).all(axis=1) & (np.abs(ev) < PLOTTABLE).all(axis=1)
            if not plottable.all():
                cmp.notes.append(f"{e.label}: {int((~plottable).sum())} eval point(s) with a value of "
                                 f"magnitude {PLOTTABLE:g} or more left off the convergence plot")
                ev = ev[plottable]
            kw = {"color": looks[i][0], "marker": looks[i][1], "markersize": 4, "alpha": 0.85,
                  "label": plot_label(e.label) if j == 0 else None}  # a name's ESC: no raw glyph warning
            a.plot(ev[:, 0], ev[:, 1], **kw)
            b.plot(ev[:, 2], ev[:, 1], **kw)
    a.set_xlabel("samples")
    b.set_xlabel("minutes since run_start")
    for ax in (a, b):
        ax.set_ylabel("eval_accuracy")
        ax.grid(alpha=0.3)
    if n <= _LEGEND_INSIDE:
        a.legend(fontsize=8)
    else:  # under the figure (the image is cut to what is drawn: it grows to hold it)
        a.legend(loc="upper center", bbox_to_anchor=(1.1, -0.15), ncol=min(4, -(-n // 12)), fontsize=7,
                 frameon=False)
    fig.suptitle("Convergence (each line one run)")
    return fig


_LEGEND_INSIDE = 8  # entries whose legend fits inside the left plot


def _stacked(label: str, width: int = 26) -> str:
    """LABEL over lines of at most WIDTH characters (and its '/'), broken after each '/' and within a longer part:
    one line of 64 characters under a box ran into its neighbours' labels."""
    parts = label.split("/")
    return "/\n".join("\n".join(p[i:i + width] for i in range(0, max(len(p), 1), width)) for p in parts)


def _step_time_plot(cmp):
    data = [(e.label, e.step_seconds) for e in _plotted(_timed(cmp))]
    if not data:
        return None
    labels = [plot_label(lbl) for lbl, _ in data]
    if len(data) <= 6:  # side by side, each label over two lines
        fig, ax = plt.subplots(figsize=(max(6, 2.2 * len(data)), 4.2))
        ax.boxplot([d for _, d in data], whis=(1, 99), showfliers=True)
        ax.set_xticks(range(1, len(data) + 1), [_stacked(lbl) for lbl in labels], fontsize=7)
        ax.set_ylabel("seconds per step")
        ax.grid(alpha=0.3, axis="y")
    else:  # one row each, top to bottom: 50 side by side were 9510 px wide, squeezed to the page unreadable
        fig, ax = plt.subplots(figsize=(10, 1.2 + 0.28 * len(data)))
        ax.boxplot([d for _, d in data], whis=(1, 99), showfliers=True, orientation="horizontal")
        ax.set_yticks(range(1, len(data) + 1), labels, fontsize=7)
        ax.invert_yaxis()  # in the order given
        ax.set_xlabel("seconds per step")
        ax.grid(alpha=0.3, axis="x")
    ax.set_title("Step-time distribution (box: quartiles, whiskers: p1-p99)")
    return fig
