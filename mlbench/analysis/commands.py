"""Click commands `score`, `compare`, `scaling` (registered by mlbench/cli.py with cli.add_command)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from mlbench import schema, terminal
from mlbench.analysis import MAX_DEVICES
from mlbench.cli_numbers import misread, not_ascii
from mlbench.cli_paths import FileParam, PathParam
from mlbench.errors import (
    ProductStream,
    UserError,
    document_on_stdout,
    printable,
    stops_on_signals,
)


def strict_json(doc: object) -> str:
    """JSON any parser reads (schema.dumps: no NaN or Infinity, a name's undecodable bytes as \\xNN)."""
    return schema.dumps(doc, indent=2)


class DeviceCount(click.IntRange):
    """A device count from 1 to MAX_DEVICES, in ASCII digits (cli_numbers); a refused value is shown shortened (a
    400-digit one filled the screen)."""

    def __init__(self) -> None:
        super().__init__(min=1, max=MAX_DEVICES)

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> object:
        if isinstance(value, str) and misread(value, integer=True):
            self.fail(not_ascii(value, integer=True), param, ctx)  # '٣' or '1_0': what int() reads, not ASCII
        try:
            return super().convert(value, param, ctx)
        except click.BadParameter:
            shown = str(value) if len(str(value)) <= 24 else f"{str(value)[:12]}... ({len(str(value))} characters)"
            self.fail(f"{shown} is not a device count; give a whole number from 1 to {MAX_DEVICES:,}", param, ctx)


def _console() -> Console:
    """The console of an analysis command's output: what it is run for, so a failure to write it is said (a full
    disk), not dropped as a run's progress lines are."""
    return terminal.console(file=ProductStream())


def _fmt(v: object, nd: int = 4) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


@click.command("score")
@click.argument("path", type=PathParam())
@click.option("--ruleset", default=None,
              help="Training ruleset to check against (default: the round a training_results_vX.Y path names, "
                   "else the benchmark definition's, as check infers it).")
@click.option("--devices", type=DeviceCount(), default=None,
              help="Device count, in place of what the systems json or our run record says (a note says where "
                   "they differ); needed where neither says.")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON document: a list, one object per set (its fields: docs/output.md).")
@stops_on_signals
def score(path: Path, ruleset: str | None, devices: int | None, as_json: bool) -> None:
    """Score a benchmark folder of result_*.txt, or every folder in a submission tree, like MLCommons."""
    from mlbench.analysis.score import score_path
    from mlbench.logfile import records_read_once

    if as_json:  # stdout carries the document alone: an error goes to stderr
        with document_on_stdout() as write, records_read_once():
            write(strict_json([s.to_json() for s in score_path(path, ruleset, devices)]))
        return
    with records_read_once():
        sets = score_path(path, ruleset, devices)
    console = _console()
    for s in sets:
        _print_set(console, s)


COMPLIANT = {True: "yes", False: "NO", None: "unknown"}  # None: the checker did not finish (compliance.Verdict)


def _print_set(console: Console, s) -> None:
    """A set's score. Every text from its logs and folders (names, statuses, problems, notes) is `printable`."""
    head = f"{s.benchmark or 'benchmark unknown'}, ruleset {s.ruleset}, {s.devices or '?'} " \
        f"device{'' if s.devices == 1 else 's'}"
    t = Table(title=printable(f"{s.label}  ({head})"), title_justify="left")
    for c in ("file", "status", "compliant", "time to train (min)", "samples to converge", "global batch", "counted"):
        t.add_column(c, justify="right" if "(" in c or c in ("global batch",) else "left", overflow="fold")
    for r in s.runs:
        t.add_row(printable(r.file), printable(r.status), COMPLIANT[r.compliant], _fmt(r.ttt_min),
                  _fmt(r.samples_to_converge, 0), _fmt(r.global_batch), "yes" if r.counted else "no")
    console.print(t)
    for r in s.runs:
        file = printable(r.file)
        for p in r.problems:
            console.print(Text.assemble("  ", (file, "yellow"), f": {printable(p)}"), highlight=False)
        if r.compliant is not True:
            said = (f"{file} non-compliant", "red") if r.compliant is False else (f"{file} not checked", "yellow")
            for m in r.compliance[:3]:
                console.print(Text.assemble("  ", said, f": {printable(m)}"), highlight=False)
    rcp = s.rcp.status if s.rcp.message in s.rcp.status else f"{s.rcp.status} ({s.rcp.message})"  # said once
    console.print(
        f"  olympic mean {_fmt(s.olympic_min)} min over {len([r for r in s.runs if r.counted])} counted of "
        f"{s.required_runs or '?'} required runs; RCP {printable(rcp)}, factor "
        f"{_fmt(s.rcp_factor)}{' from scaling.json' if s.rcp.scaling_json is not None else ''}", highlight=False)
    console.print(Text.assemble("  ", (f"score {_fmt(s.score_min)} min", "bold"),
                                f"   (official summarizer: {_fmt(s.official_score_min)})"), highlight=False)
    for n in s.notes:
        console.print(Text.assemble("  ", ("note", "cyan"), f": {printable(n)}"), highlight=False)
    console.print()


@click.command("compare")
@click.argument("paths", nargs=-1, required=True)
@click.option("--html", "html_out", type=FileParam(), default=None,
              help="Write a self-contained HTML report.")
@click.option("--md", "md_out", type=FileParam(), default=None,
              help="Write a Markdown report (plots beside it).")
@click.option("--ruleset", default=None, help="Ruleset for the scores (default: inferred per set).")
@click.option("--no-score", is_flag=True, help="Skip compliance/RCP scoring (faster; time-to-train still shown).")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON document in place of the tables (its fields: docs/output.md); with --html or "
                   "--md the reports are written too, and what is said of them goes to stderr.")
@stops_on_signals
def compare(paths: tuple[str, ...], html_out: Path | None, md_out: Path | None, ruleset: str | None,
            no_score: bool, as_json: bool) -> None:
    """Compare two or more runs or sets side by side. A PATH may be published:<id> (a row of results/published)."""
    from mlbench.analysis.compare import (
        build_comparison,
        comparison_json,
        comparison_report,
        plots_note,
        print_comparison,
    )
    from mlbench.analysis.report import check_outputs
    from mlbench.logfile import records_read_once

    check_outputs(html_out, md_out)
    if "" in paths:  # Path("") would be the working directory
        raise UserError("a PATH is empty; give a path (a run, a set, or published:<id>)")
    if len(paths) < 2:
        raise UserError("compare needs two or more PATHs (runs, sets, or published:<id>)")
    with _product(as_json) as write, records_read_once():  # each run's record read once, for all its figures
        cmp = build_comparison(list(paths), ruleset=ruleset, with_score=not no_score)
        if write is None:
            print_comparison(_console(), cmp)
        said = _write_reports(lambda: comparison_report(cmp), html_out, md_out, as_json)
        if (html_out or md_out) and (note := plots_note(cmp)):  # as the report says it, above its plots
            said.print(Text.assemble(("note", "cyan"), f": {note}"), highlight=False)
        if write is not None:  # after the reports: the notes their plots add are in it; a failed write, no document
            write(strict_json(comparison_json(cmp)))


@click.command("scaling")
@click.argument("paths", nargs=-1, required=True, type=PathParam())
@click.option("--html", "html_out", type=FileParam(), default=None,
              help="Write a self-contained HTML report.")
@click.option("--md", "md_out", type=FileParam(), default=None,
              help="Write a Markdown report (plots beside it).")
@click.option("--devices", "devices", multiple=True, type=DeviceCount(),
              help="Device count per PATH, in order, in place of what the systems json or our run record says "
                   "(a note says where they differ); needed where neither says.")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON document in place of the tables (its fields: docs/output.md); with --html or "
                   "--md the reports are written too, and what is said of them goes to stderr.")
@stops_on_signals
def scaling(paths: tuple[Path, ...], html_out: Path | None, md_out: Path | None, devices: tuple[int, ...],
            as_json: bool) -> None:
    """Strong and weak scaling efficiency of one benchmark at several device counts."""
    from mlbench.analysis.published import PREFIX as PUBLISHED
    from mlbench.analysis.report import check_outputs
    from mlbench.analysis.scaling import build_scaling, print_scaling, scaling_json, scaling_report
    from mlbench.logfile import records_read_once

    check_outputs(html_out, md_out)
    if row := next((p for p in paths if str(p).startswith(PUBLISHED) and not p.exists()), None):  # compare's form
        raise UserError(f"{printable(str(row))}: a published row is one headline time, with no runs or steps to scale; "
                        f"scaling takes folders of result logs (compare takes published:<id>)")
    if devices and len(devices) != len(paths):
        raise UserError(f"--devices given {len(devices)} time{'' if len(devices) == 1 else 's'} for {len(paths)} "
                        f"PATHs; give one per PATH or none")
    with _product(as_json) as write, records_read_once():
        sc = build_scaling(list(paths), list(devices) or None)
        if write is None:
            print_scaling(_console(), sc)
        _write_reports(lambda: scaling_report(sc), html_out, md_out, as_json)
        if write is not None:
            write(strict_json(scaling_json(sc)))


def _product(as_json: bool) -> contextlib.AbstractContextManager[Callable[[str], None] | None]:
    """For --json, the function that writes the one document stdout carries (an error then goes to stderr with no
    document, as `score --json`'s); None for the tables."""
    return document_on_stdout() if as_json else contextlib.nullcontext(None)


def _write_reports(build, html_out: Path | None, md_out: Path | None, as_json: bool = False) -> Console:
    """Build the report (plots take a while) only when one is asked for; write the two whole or not at all. Returns
    the console where what is said of them goes: stderr where stdout carries a --json document."""
    from mlbench.analysis.report import write_reports

    console = terminal.console(file=sys.stderr) if as_json else _console()
    if not (html_out or md_out):
        return console
    write_reports(build(), html_out, md_out)
    for out in (html_out, md_out):
        if out:
            console.print(printable(f"wrote {out}"), highlight=False, soft_wrap=True)
    return console
