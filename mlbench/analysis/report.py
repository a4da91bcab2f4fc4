"""HTML (self-contained, plots inline as base64 PNG) and Markdown (PNGs beside it) reports."""

from __future__ import annotations

import base64
import html
import io
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display: reports are written on headless machines
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from mlbench.errors import UserError  # noqa: E402


@dataclass
class Report:
    title: str
    # ("h", text) | ("p", text) | ("ul", [text]) | ("table", header, rows) | ("img", name, png, alt)
    parts: list[tuple] = field(default_factory=list)

    def h(self, text: str) -> None:
        self.parts.append(("h", text))

    def p(self, text: str) -> None:
        self.parts.append(("p", text))

    def ul(self, items: list[str]) -> None:
        if items:
            self.parts.append(("ul", list(items)))

    def table(self, header: list[str], rows: list[list[str]]) -> None:
        self.parts.append(("table", header, rows))

    def img(self, name: str, fig, alt: str) -> None:
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
        plt.close(fig)
        self.parts.append(("img", name, buf.getvalue(), alt))


_CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:13px}td,th{border:1px solid #ccc;padding:4px 8px;
text-align:right}th{background:#f0f0f0}td:first-child,th:first-child{text-align:left}
img{max-width:100%;border:1px solid #eee;margin:.5em 0}li{margin:.2em 0}"""


def render_html(rep: Report) -> str:
    out = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(rep.title)}</title>"
           f"<style>{_CSS}</style></head><body><h1>{html.escape(rep.title)}</h1>"]
    for part in rep.parts:
        kind = part[0]
        if kind == "h":
            out.append(f"<h2>{html.escape(part[1])}</h2>")
        elif kind == "p":
            out.append(f"<p>{html.escape(part[1])}</p>")
        elif kind == "ul":
            out.append("<ul>" + "".join(f"<li>{html.escape(x)}</li>" for x in part[1]) + "</ul>")
        elif kind == "table":
            head = "".join(f"<th>{html.escape(h)}</th>" for h in part[1])
            body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>"
                           for r in part[2])
            out.append(f"<table><tr>{head}</tr>{body}</table>")
        elif kind == "img":
            b64 = base64.b64encode(part[2]).decode()
            out.append(f"<figure><img alt='{html.escape(part[3])}' src='data:image/png;base64,{b64}'>"
                       f"<figcaption>{html.escape(part[3])}</figcaption></figure>")
    out.append("</body></html>")
    return "\n".join(out)


def _md_cell(s: object) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def render_markdown(rep: Report, path: Path) -> str:
    """Markdown text; images are written to <stem>_files/ beside PATH and linked relatively."""
    files = path.parent / f"{path.stem}_files"
    out = [f"# {rep.title}", ""]
    for part in rep.parts:
        kind = part[0]
        if kind == "h":
            out += [f"## {part[1]}", ""]
        elif kind == "p":
            out += [part[1], ""]
        elif kind == "ul":
            out += [f"- {x}" for x in part[1]] + [""]
        elif kind == "table":
            out.append("| " + " | ".join(_md_cell(h) for h in part[1]) + " |")
            out.append("|" + "---|" * len(part[1]))
            out += ["| " + " | ".join(_md_cell(c) for c in r) + " |" for r in part[2]]
            out.append("")
        elif kind == "img":
            files.mkdir(parents=True, exist_ok=True)
            (files / f"{part[1]}.png").write_bytes(part[2])
            out += [f"![{part[3]}]({files.name}/{part[1]}.png)", ""]
    return "\n".join(out)


def _write(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError as e:
        raise UserError(f"{path}: cannot write the report ({e.strerror})") from None


# --- comparison -----------------------------------------------------------------------------------

def comparison_report(cmp) -> Report:
    rep = Report("mlbench compare")
    rep.h("Side by side")
    rows = cmp.rows()
    rep.table([""] + [e.label for e in cmp.entries], [[name, *cells] for name, cells in rows])
    rep.p("Time to train: the MLPerf score (olympic mean x RCP factor) for a scored set, the run's own "
          "time for a single run, the headline number for a published row. Jitter: (p90 - p10) / median "
          "of the per-step times. Per-device throughput: global batch x sequence length / median step "
          "time / devices.")
    diff = cmp.differing_hyperparams()
    rep.h("Hyperparameters and layout that differ")
    if diff:
        labels = [e.label for e in cmp.entries if e.runs]
        rep.table(["key", *labels], [[k, *["-" if v is None else str(v) for v in vals]] for k, vals in diff.items()])
    else:
        rep.p("No differences among the logged hyperparameters.")
    rep.h("Plots")
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


def _convergence_plot(cmp):
    series = [(e, r) for e in cmp.entries for r in e.runs if r.evals]
    if not series:
        return None
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, e in enumerate(cmp.entries):
        for j, r in enumerate(x for x in e.runs if x.evals):
            ev = np.array(r.evals)
            kw = {"color": colors[i % len(colors)], "alpha": 0.85, "marker": ".",
                  "label": e.label if j == 0 else None}
            a.plot(ev[:, 0], ev[:, 1], **kw)
            b.plot(ev[:, 2], ev[:, 1], **kw)
    a.set_xlabel("samples")
    b.set_xlabel("minutes since run_start")
    for ax in (a, b):
        ax.set_ylabel("eval_accuracy")
        ax.grid(alpha=0.3)
    a.legend(fontsize=8)
    fig.suptitle("Convergence (each line one run)")
    return fig


def _step_time_plot(cmp):
    data = [(e.label, e.step_seconds) for e in cmp.entries if len(e.step_seconds)]
    if not data:
        return None
    fig, ax = plt.subplots(figsize=(max(6, 2.2 * len(data)), 4.2))
    ax.boxplot([d for _, d in data], whis=(1, 99), showfliers=True)
    ax.set_xticks(range(1, len(data) + 1), [lbl.replace("/", "/\n") for lbl, _ in data], fontsize=7)
    ax.set_ylabel("seconds per step")
    ax.grid(alpha=0.3, axis="y")
    ax.set_title("Step-time distribution (box: quartiles, whiskers: p1-p99)")
    return fig


def write_html(cmp, path: Path) -> None:
    _write(Path(path), render_html(comparison_report(cmp)))


def write_markdown(cmp, path: Path) -> None:
    path = Path(path)
    _write(path, render_markdown(comparison_report(cmp), path))


# --- scaling --------------------------------------------------------------------------------------

def write_scaling_html(sc, path: Path) -> None:
    from mlbench.analysis.scaling import scaling_report

    _write(Path(path), render_html(scaling_report(sc)))


def write_scaling_markdown(sc, path: Path) -> None:
    from mlbench.analysis.scaling import scaling_report

    path = Path(path)
    _write(path, render_markdown(scaling_report(sc), path))
