"""HTML (self-contained, plots inline as base64 PNG) and Markdown (PNGs beside it) reports."""

from __future__ import annotations

import base64
import contextlib
import fnmatch
import html
import io
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display: reports are written on headless machines
import matplotlib.pyplot as plt  # noqa: E402

from mlbench.analysis.logs import RESULT_GLOB  # noqa: E402
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


def markdown_files(path: Path) -> Path:
    """The folder beside a Markdown report that holds its images."""
    return path.parent / f"{path.stem}_files"


def render_markdown(rep: Report, path: Path) -> tuple[str, dict[str, bytes]]:
    """Markdown text, and the images it links (relative, into `markdown_files(PATH)`) by file name."""
    files = markdown_files(path)
    out, images = [f"# {rep.title}", ""], {}
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
            images[f"{part[1]}.png"] = part[2]
            out += [f"![{part[3]}]({files.name}/{part[1]}.png)", ""]
    return "\n".join(out), images


def check_outputs(html: Path | None, md: Path | None) -> None:
    """`--html` and `--md` of one command, each checked (`check_output`), and not one file (the second would
    replace the first)."""
    check_output(html, "--html")
    check_output(md, "--md")
    if html is not None and md is not None and Path(html).resolve() == Path(md).resolve():
        raise UserError(f"--html and --md are both {md}: the Markdown would replace the HTML; give each its own name")


def check_output(path: Path | None, option: str) -> None:
    """Refuse a report path that cannot be written, before any work: its folder must exist (it is not created)
    and take a file; the path must not be a folder, a device or a pipe, nor an MLPerf result log (a report may
    replace an earlier report, never a run); a Markdown report's image folder must be a folder where it exists."""
    if path is None:
        return
    path = Path(path)
    folder = path.parent
    if path.is_dir():
        raise UserError(f"{option} {path}: is a folder; give a file name")
    if path.exists() and not path.is_file():
        raise UserError(f"{option} {path}: is not a regular file (a device or a pipe); give a file name")
    if path.is_file() and _is_result_log(path):
        raise UserError(f"{option} {path}: is an MLPerf result log; a report never replaces one, give another name")
    if option == "--md" and (files := markdown_files(path)).exists() and not files.is_dir():
        raise UserError(f"{option} {path}: its images go in {files}, which is not a folder")
    if not folder.is_dir():
        raise UserError(f"{option} {path}: folder {folder} does not exist (create it first)")
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=f".{path.name}.", suffix=".probe"):
            pass
    except OSError as e:
        raise UserError(f"{option} {path}: cannot write in {folder} ({e.strerror or e})") from None


def _is_result_log(path: Path) -> bool:
    """A run's file: named as the results layout names them, or holding MLPerf log lines."""
    if path.suffix in (".txt", ".json") and fnmatch.fnmatch(path.with_suffix(".txt").name, RESULT_GLOB):
        return True  # a log or its run record
    try:
        with open(path, "rb") as f:
            return re.search(rb"(?m)^:::MLLOG ", f.read(1 << 16)) is not None
    except OSError:
        return False


def _write(path: Path, data: str | bytes) -> None:
    """Atomically: a reader sees the old file or the new one, never half of one."""
    try:
        with tempfile.NamedTemporaryFile("wb", dir=path.parent, prefix=f".{path.name}.", suffix=".tmp",
                                         delete=False) as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.chmod(f.name, 0o666 & ~_umask())  # as a file opened for writing gets (the temporary file is 0600)
        os.replace(f.name, path)
    except OSError as e:
        with contextlib.suppress(OSError, UnboundLocalError):
            os.unlink(f.name)
        raise UserError(f"{path}: cannot write the report ({e.strerror})") from None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_html(rep: Report, path: Path) -> None:
    _write(Path(path), render_html(rep))


def write_markdown(rep: Report, path: Path) -> None:
    """The images first, then the text that links them."""
    path = Path(path)
    text, images = render_markdown(rep, path)
    if images:
        files = markdown_files(path)
        try:
            files.mkdir(exist_ok=True)
        except OSError as e:
            raise UserError(f"{path}: cannot make {files} for its images ({e.strerror})") from None
        for name, png in images.items():
            _write(files / name, png)
    _write(path, text)
