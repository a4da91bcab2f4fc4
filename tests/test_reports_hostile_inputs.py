"""Hostile report paths and options for `compare` and `scaling`: a name too long, a symbolic link, a name the locale
cannot encode, a device count past any machine, output without a terminal. Each is one line and exit 2 before
anything is written, or a report written whole; never a traceback, never a link replaced."""

from __future__ import annotations

import os
import re
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import mlbench_in_process

from mlbench.analysis import report
from mlbench.analysis.scaling import efficiency
from mlbench.errors import UserError

SET = (Path(__file__).parent / "data" / "mlperf-results" / "training_results_v5.1" / "AMD" / "results"
       / "MI355X_EPYC_9575F_pytorch" / "llama31_8b")


def run(*args: str | bytes | Path, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """`mlbench ARGS` with stdout a pipe (no terminal); output as bytes (a name may be no valid UTF-8)."""
    full = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LC_ALL", "LANG", "PYTHONIOENCODING")}
    proc = subprocess.run([sys.executable, "-m", "mlbench.cli", *map(os.fsencode, args)], capture_output=True,
                          cwd=cwd, env={**full, **(env or {})}, timeout=300)
    assert b"Traceback" not in proc.stderr + proc.stdout, proc.stderr.decode(errors="replace")
    return proc


def one_error(proc: subprocess.CompletedProcess, *words: str) -> str:
    """The single line of a refusal (exit 2) on stderr, nothing on stdout, holding each of WORDS."""
    out = proc.stderr.decode(errors="replace").strip()
    assert proc.returncode == 2 and proc.stdout == b"", proc.stdout.decode(errors="replace")
    assert len(out.splitlines()) == 1 and out.startswith("error:"), out
    assert all(w in out for w in words), (words, out)
    return out


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """tmp_path with a second set (`s2`, a copy of SET) and an empty folder `out` for reports."""
    shutil.copytree(SET, tmp_path / "s2")
    (tmp_path / "out").mkdir()
    return tmp_path


def compare(work: Path, *options: str | bytes, env: dict | None = None) -> subprocess.CompletedProcess:
    return run("compare", "--no-score", SET, "s2", *options, cwd=work, env=env)


def here(cli, work: Path, *args: str | Path) -> subprocess.CompletedProcess:
    """`mlbench ARGS` in this process (conftest's cli), in WORK, its output as bytes as run() gives it: for the
    cases whose point is not the process's locale or terminal."""
    proc = cli(*args, cwd=work)
    return subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout.encode(), proc.stderr.encode())


def compare_here(cli, work: Path, *options: str) -> subprocess.CompletedProcess:
    return here(cli, work, "compare", "--no-score", SET, "s2", *options)


def test_a_report_name_too_long_is_refused_naming_it(work: Path, cli) -> None:
    """300 bytes: OSError 'File name too long' from check_output (was a traceback, exit 1). 250 bytes: the report
    fits, its `<name>_files` folder does not (was the same traceback, after the tables were printed)."""
    for option, name, failed in (("--md", "a" * 300 + ".md", "a" * 300), ("--html", "h" * 300 + ".html", "h" * 300),
                                 ("--md", "b" * 250 + ".md", "b" * 250 + "_files")):
        out = one_error(compare_here(cli, work, option, f"out/{name}"), option, f"out/{name}", "too long", failed)
        assert "give another name" in out
        assert os.listdir(work / "out") == [], os.listdir(work / "out")
    # the longest name the folder takes is written whole: its temporary file's name is short
    html = "c" * 250 + ".html"
    proc = compare_here(cli, work, "--html", f"out/{html}")
    assert proc.returncode == 0 and os.listdir(work / "out") == [html], proc.stdout


def test_a_report_path_that_is_a_symbolic_link_is_refused_and_the_link_kept(work: Path, cli) -> None:
    """`--html out/so.html` a link: the check followed it, the atomic rename replaced the link with a file (as
    root, `--html /dev/stdout` replaced the system's link). A link is never replaced, nor written through."""
    target = work / "target.html"
    (work / "out" / "so.html").symlink_to(target)
    (work / "out" / "so.md").symlink_to(work / "target.md")
    (work / "elsewhere").mkdir()
    (work / "out" / "r_files").symlink_to(work / "elsewhere")
    for option, path, words in (("--html", "out/so.html", ("is a symbolic link", str(target), "the file itself")),
                                ("--md", "out/so.md", ("is a symbolic link",)),
                                ("--md", "out/r.md", ("out/r_files", "a symbolic link"))):
        one_error(compare_here(cli, work, option, path), option, path, *words)
    assert (work / "out" / "so.html").is_symlink() and (work / "out" / "so.md").is_symlink()
    assert (work / "out" / "r_files").is_symlink() and os.listdir(work / "elsewhere") == []
    assert not target.exists() and not (work / "target.md").exists()
    assert sorted(os.listdir(work / "out")) == ["r_files", "so.html", "so.md"]


def test_a_link_in_the_image_folder_is_not_replaced_and_nothing_is_written(work: Path, cli) -> None:
    """An image folder of the user's holding a link where an image goes: refused before any work (the HTML asked
    beside it not written either), the link kept; the rename had replaced it."""
    files = work / "out" / "r_files"
    files.mkdir()
    (files / "step_times.png").symlink_to(work / "theirs.png")
    proc = compare_here(cli, work, "--md", "out/r.md", "--html", "out/r.html")
    out = one_error(proc, "step_times.png", "not a regular file", "out/r_files")
    assert (files / "step_times.png").is_symlink() and not (work / "theirs.png").exists(), out
    assert sorted(os.listdir(work / "out")) == ["r_files"] and os.listdir(files) == ["step_times.png"]


POSIX = {"LC_ALL": "POSIX", "PYTHONUTF8": "0"}  # file names decoded as ASCII: é is held as two surrogates
# Python 3.11 reads a .pth in the locale's encoding: where one holds a path that is not ASCII (an editable install of
# a clone at '~/Téléchargements/mlbench' that make install did not write relative) it cannot start under an ASCII
# locale at all.
needs_ascii_pth = pytest.mark.skipif(
    not all(p.read_bytes().isascii() for d in site.getsitepackages() for p in Path(d).glob("*.pth")),
    reason="a .pth of this environment names a path that is not ASCII: Python 3.11 cannot start under an ASCII locale")


@needs_ascii_pth
def test_a_non_ascii_report_name_under_a_posix_locale_is_written(work: Path) -> None:
    """Was a UnicodeEncodeError ('surrogates not allowed') writing the Markdown, after its images were written:
    `rép_files/` left with two PNGs and no report."""
    md, html = "out/r\u00e9p.md".encode(), "out/r\u00e9p.html".encode()
    proc = compare(work, "--md", md, "--html", html, env=POSIX)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert b"wrote " + html in proc.stdout and b"wrote " + md in proc.stdout
    out = work / "out"
    text = (out / "r\u00e9p.md").read_text()
    assert "](r\u00e9p_files/convergence.png)" in text and "](r\u00e9p_files/step_times.png)" in text
    assert sorted(os.listdir(out / "r\u00e9p_files")) == ["convergence.png", "step_times.png"]
    assert (out / "r\u00e9p.html").read_text().endswith("</html>")
    assert not [n for n in os.listdir(out) if n.startswith(".")]  # no temporary file left


def test_a_failure_while_writing_leaves_no_part_of_a_report(work: Path, monkeypatch) -> None:
    """Any failure between the check and the last file (a full disk, here) removes what was staged and the image
    folder it made: no images without their text, no HTML without the Markdown asked beside it."""
    from mlbench.analysis.compare import build_comparison, comparison_report

    rep = comparison_report(build_comparison([str(SET), str(work / "s2")], with_score=False))
    out = work / "out"
    (out / "old.html").write_text("earlier report")
    stage = report._stage

    def full_disk(dest: Path, data: bytes) -> str:
        if dest.suffix == ".md":
            raise OSError(28, "No space left on device", str(dest))
        return stage(dest, data)

    monkeypatch.setattr(report, "_stage", full_disk)
    # said whole: the HTML's failure alone was named where both were asked for, the other never mentioned
    with pytest.raises(UserError, match=r"r.md: cannot write the report .No space left on device.; neither report "
                                        r"was written \(the two are written together\)$"):
        report.write_reports(rep, out / "old.html", out / "r.md")
    assert os.listdir(out) == ["old.html"] and (out / "old.html").read_text() == "earlier report"


@needs_ascii_pth
def test_check_prints_a_name_its_output_encoding_lacks(work: Path) -> None:
    """`check` of a path with ü, stdout ASCII: a UnicodeEncodeError in mlbench/terminal.py (it caught OSError
    only). The verdict is printed, the character it cannot encode as '?'; a name's undecodable bytes (a POSIX
    locale) go out as they were."""
    for name, env, shown in (("\u00fc", {"LC_ALL": "C", "PYTHONIOENCODING": "ascii"}, b"?"),
                             ("\u00fc", {**POSIX, "PYTHONIOENCODING": "ascii"}, "\u00fc".encode()),
                             ("\u00fc", {**POSIX, "PYTHONIOENCODING": "ascii", "LC_ALL": "C"}, "\u00fc".encode())):
        d = work / name
        d.mkdir(exist_ok=True)
        shutil.copy(SET / "result_0.txt", d)
        proc = run("check", f"{name}/result_0.txt", cwd=work, env=env)
        assert proc.returncode == 0 and b"PASS " + shown + b"/result_0.txt" in proc.stdout, (env, proc.stdout)
    # an error naming such a path is its one line too
    env = {**POSIX, "PYTHONIOENCODING": "ascii"}
    proc = run("compare", "--no-score", SET, "s2", "--md", "nowhere/\u00fc.md", cwd=work, env=env)
    assert proc.returncode == 2 and "nowhere/\u00fc.md".encode() in proc.stderr, proc.stderr


@pytest.mark.parametrize("devices", [str(10**400), str(10**30), "9" * 5000, "10000001"])
def test_a_device_count_past_any_machine_is_refused(work: Path, devices: str, cli) -> None:
    """10**400: OverflowError in scaling.efficiency; 10**30 with --md: TypeError in matplotlib's log2; both after
    the logs were read. One line naming the bound, the value shortened."""
    proc = here(cli, work, "scaling", "--devices", devices, "--devices", "1", SET, "s2", "--md", "out/x.md")
    out = one_error(proc, "--devices", "from 1 to 10,000,000")
    assert len(out) < 200 and os.listdir(work / "out") == [], out


def test_the_largest_device_count_is_computed_and_drawn(work: Path, cli) -> None:
    proc = here(cli, work, "scaling", "--devices", "10000000", "--devices", "1", SET, "s2", "--md", "out/x.md")
    assert proc.returncode == 0 and (work / "out" / "x_files" / "efficiency.png").exists(), proc.stdout


def test_efficiency_takes_counts_of_any_size() -> None:
    assert efficiency(10.0, 10**400, 1.0, 1) is None  # no finite float: not an OverflowError
    assert efficiency(10.0, 1, 1.0, 10**400) is None
    assert efficiency(100.0, 8, 60.0, 16) == pytest.approx(100 * 8 / (60 * 16))
    assert efficiency(None, 8, 60.0, 16) is None and efficiency(1e308, 10**300, 1e-308, 1) is None


LONG = "a-system-name-long-enough-to-make-the-configuration-table-wider-than-any-cap-x" * 2


@pytest.mark.parametrize("columns", [None, "5", "80"])
def test_tables_without_a_terminal_are_whole_lines_at_their_natural_width(work: Path, columns: str | None,
                                                                          cli) -> None:
    """stdout a file or a pipe: tables were capped at 170 columns (a configuration cell split over two lines),
    COLUMNS=5 printed a table of empty cells, and `score` cut numbers with '…'. (tests/test_plain_output.py runs
    the command with its output a pipe.)"""
    label = f"{LONG}/llama31_8b"
    shutil.copytree(SET, work / LONG / "llama31_8b")
    env = {"COLUMNS": columns}  # stdout not a terminal: in this process, capsys's
    proc = cli("scaling", "--devices", "8", "--devices", "16", SET, f"{LONG}/llama31_8b", cwd=work, env=env)
    out = proc.stdout
    assert proc.returncode == 0 and "…" not in out, out
    rows = [ln for ln in out.splitlines() if label in ln]
    assert len(rows) >= 2 and all("16 (given)" in ln for ln in rows[:1]), out
    proc = cli("score", SET, cwd=work, env=env)
    out = proc.stdout
    assert proc.returncode == 0 and "…" not in out, out
    row = next(ln for ln in out.splitlines() if "result_0.txt" in ln)
    cells = [c.strip() for c in row.split("│")[1:-1]]
    assert [cells[i] for i in (0, 1, 3, 4, 5)] == ["result_0.txt", "success", "95.9689", "172000", "32"], row


def test_a_link_put_in_place_after_the_check_is_not_replaced(work: Path) -> None:
    """Between the check and the writing (plots take a while) a link appears where the report goes: the rename
    would replace it; the report is refused whole instead, nothing staged left."""
    from mlbench.analysis.report import Report

    out = work / "out"
    (out / "r.md").symlink_to(work / "theirs.md")
    with pytest.raises(UserError, match="r.md: is not a regular file"):
        report.write_reports(Report("t"), out / "r.html", out / "r.md")
    assert os.listdir(out) == ["r.md"] and (out / "r.md").is_symlink() and not (work / "theirs.md").exists()




@pytest.mark.parametrize("option", ["--html", "--md"])
def test_a_report_on_a_full_disk_names_its_file_on_stderr_exit_1(work: Path, monkeypatch, capsys, option) -> None:
    """A full tmpfs: 'error: : cannot write the report (No space left on device)' on stdout, exit 2: no file named
    (the write into mkstemp's file names none), and a full disk taken for bad input."""

    def full_disk(dest: Path, data: bytes) -> str:
        raise OSError(28, "No space left on device")  # as a write to the staged file raises it: no file name

    monkeypatch.setattr(report, "_stage", full_disk)
    dest = work / "out" / f"r{option.replace('--', '.')}"
    code, out, err = mlbench_in_process(monkeypatch, capsys, "compare", "--no-score", SET, work / "s2", option, dest)
    assert code == 1 and "error" not in out, out
    written = dest if option == "--html" else work / "out" / "r_files" / "convergence.png"  # the md's images first
    assert err == f"error: {written}: cannot write the report (No space left on device)\n", err
    assert os.listdir(work / "out") == []


HOSTILE_NAME = "a|b<img src=x onerror=alert(1)>](javascript:x)"
HOSTILE_STATUS = "<script>alert(1)</script>"


def test_the_markdown_report_passes_no_markdown_or_html_through(work: Path, monkeypatch, capsys) -> None:
    """A folder 'a|b<img src=x onerror=alert(1)>](javascript:x)' and a log's status '<script>alert(1)</script>'
    went into the --md report raw: an image that runs script, a link, a table cell split at the '|'."""
    hostile = work / HOSTILE_NAME
    hostile.mkdir()
    log = (SET / "result_0.txt").read_text()
    assert '"status": "success"' in log
    (hostile / "result_0.txt").write_text(log.replace('"status": "success"', f'"status": "{HOSTILE_STATUS}"', 1))
    md = work / "out" / "r.md"
    code, out, err = mlbench_in_process(monkeypatch, capsys, "compare", "--no-score", hostile, work / "s2", "--md",
                                         md)
    assert code == 0, out + err
    text = md.read_text()
    assert "<img" not in text and "<script" not in text and not re.search(r"(?<!\\)\]\(javascript", text), text
    assert "a\\|b&lt;img src=x onerror=alert(1)&gt;\\](javascript:x)" in text, text  # `\\](`: no link
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text, text
    cells = {line.replace("\\|", "").count("|") for line in text.splitlines() if line.startswith("| ")}
    assert len(cells) == 1, text  # (one table) no '|' of a name splits a cell: each row has the header's cells


@pytest.mark.parametrize("option", ["--html", "--md"])
def test_a_report_named_dash_is_refused_as_not_standard_output(work: Path, cli, option: str) -> None:
    """`compare A B --html -` (standard output, to most tools) wrote a file named '-' in the working folder, exit 0;
    ./- still names that file."""
    one_error(compare_here(cli, work, option, "-"), f"{option} -: a report is a file", "not standard output")
    assert not (work / "-").exists()
    assert compare_here(cli, work, option, "./-").returncode == 0 and (work / "-").is_file()


def _markdown_tokens(text: str) -> list:
    """TEXT parsed as CommonMark with tables (GitHub's reading), inline tokens opened: a flat list."""
    from markdown_it import MarkdownIt

    tokens = MarkdownIt("commonmark").enable("table").parse(text)
    return tokens + [c for t in tokens for c in (t.children or [])]


def test_the_markdown_reports_images_are_linked_whatever_the_reports_name(work: Path, cli) -> None:
    """`--md 'out/my report (2)#1.md'` linked `my report (2)#1_files/convergence.png`: a space and parentheses
    are no link destination in Markdown (the image shown as its source text), '#' would cut the path."""
    from urllib.parse import unquote

    name = "my report (2)#1"
    assert compare_here(cli, work, "--md", f"out/{name}.md").returncode == 0
    text = (work / "out" / f"{name}.md").read_text()
    srcs = [t.attrs["src"] for t in _markdown_tokens(text) if t.type == "image"]
    assert srcs == [f"my%20report%20%282%29%231_files/{png}" for png in ("convergence.png", "step_times.png")], text
    assert all((work / "out" / unquote(s)).is_file() for s in srcs)


def test_a_name_opening_a_markdown_list_or_code_block_is_text(work: Path, cli) -> None:
    """Systems '1. x' and '    x' (four spaces) began notes of the --md report: a numbered list, and the rest of a
    note an indented code block."""
    tree = work / "tree"
    for system in ("1. x", "    x"):
        shutil.copytree(SET, tree / "org" / "results" / system / "llama31_8b")
    proc = here(cli, work, "compare", "--no-score", tree / "org" / "results" / "1. x", tree / "org" / "results" /
                "    x", "--md", "out/r.md")
    assert proc.returncode == 0, proc.stdout
    text = (work / "out" / "r.md").read_text()
    tokens = _markdown_tokens(text)
    assert not [t.type for t in tokens if t.type in ("ordered_list_open", "code_block", "code_inline")], text
    items = [t.content for t in tokens if t.type == "inline" and t.map and text.splitlines()[t.map[0]].startswith("- ")]
    assert any(i.startswith("1\\. x/llama31\\_8b") for i in items) and any(i.startswith("&#32;   x/") for i in items)


def test_a_markdown_report_leaves_no_plot_of_the_report_it_replaced(work: Path, cli) -> None:
    """`--md out/r.md` of two published rows (no plot) after a comparison with plots: r_files/ still held the
    earlier comparison's convergence.png and step_times.png beside a report that shows none. A user's own file in
    the folder stays."""
    rows = ("published:nvidia-eos-gpt3-v3.1", "published:azure-ndh100v5-gpt3-v3.1")
    files = work / "out" / "r_files"
    assert compare_here(cli, work, "--md", "out/r.md").returncode == 0
    assert sorted(os.listdir(files)) == ["convergence.png", "step_times.png"]
    assert here(cli, work, "compare", *rows, "--md", "out/r.md").returncode == 0
    assert os.listdir(work / "out") == ["r.md"]
    assert compare_here(cli, work, "--md", "out/r.md").returncode == 0
    (files / "mine.png").write_text("a user's file")
    assert here(cli, work, "compare", *rows, "--md", "out/r.md").returncode == 0
    assert os.listdir(files) == ["mine.png"]


def test_the_scaling_plots_legend_of_many_lines_does_not_hide_the_plot() -> None:
    """60 configurations in 20 weak-scaling groups: the legend, inside the plot, covered half of it (its points
    and lines hidden). A legend of many lines goes under the plot; one of a few stays inside."""
    from mlbench.analysis.scaling import Point, Scaling, efficiency_plot

    for groups, inside in ((20, False), (2, True)):
        points = [Point(f"c{i}", 2 ** (i % groups) * (1 + i // groups), "given", 2 ** (i % groups), 1, 10.0, 1,
                        1.0, "x") for i in range(3 * groups)]
        sc = Scaling("b", points, strong_ttt=[(q, 1.0) for q in points],
                     weak={float(g): [(q, 1.0) for q in points if q.gbs == 2 ** g] for g in range(groups)})
        fig = efficiency_plot(sc)
        fig.canvas.draw()
        ax = fig.axes[0]
        legend, frame = ax.get_legend().get_window_extent(), ax.get_window_extent()
        assert bool(legend.overlaps(frame)) is inside, (groups, legend, frame)
        report.plt.close(fig)


def _looks(ax) -> list[tuple]:
    """(colour, marker, line style) of each line of AX drawn for data (not the reference line at 1)."""
    from matplotlib.colors import to_rgba

    return [(to_rgba(ln.get_color()), ln.get_marker(), ln.get_linestyle()) for ln in ax.get_lines()
            if ln.get_label() and not ln.get_label().startswith("_")]


def test_every_line_of_the_scaling_plot_has_a_look_of_its_own() -> None:
    """25 lines (12 global batches strong per step, 12 per-device batches weak): the colours repeated after 10
    lines, each kind with one marker and line style, so two systems' lines looked the same. Now each line's colour,
    marker and line style together are its own, the line style still the kind."""
    from mlbench.analysis.scaling import Point, Scaling, efficiency_plot

    points = [Point(f"c{i}", 2 ** i, "given", 2 ** i, 1, 10.0, 1, 1.0, "x") for i in range(12)]
    sc = Scaling("b", points, strong_ttt=[(q, 1.0) for q in points],
                 strong_step={q.gbs: [(q, 1.0)] for q in points},
                 weak={float(i): [(q, 1.0)] for i, q in enumerate(points)})
    fig = efficiency_plot(sc)
    looks = _looks(fig.axes[0])
    assert len(looks) == 25 and len(set(looks)) == 25, looks
    assert [style for _, _, style in looks] == ["-"] + ["--"] * 12 + [":"] * 12
    report.plt.close(fig)


def test_every_entry_of_the_convergence_plot_has_a_look_of_its_own() -> None:
    """The same for `compare`'s convergence plot, an entry's runs in its look: 25 entries of two runs each."""
    from mlbench.analysis.compare import Comparison, Entry, _convergence_plot
    from mlbench.analysis.logs import RunLog

    entries = [Entry(f"e{i}", "set", "gpt3", runs=[RunLog(Path(f"result_{j}.txt"), run_start_ms=0.0,
                                                          eval_points=[(1.0, 0.5, 6e4), (2.0, 0.6, 12e4)])
                                                   for j in range(2)]) for i in range(25)]
    fig = _convergence_plot(Comparison(entries))
    lines = fig.axes[0].get_lines()
    looks = [(ln.get_color(), ln.get_marker(), ln.get_linestyle()) for ln in lines]
    assert len(lines) == 50 and len(set(looks)) == 25 and looks[0] == looks[1], looks  # (two runs an entry)
    report.plt.close(fig)


def _synthetic_comparison(n: int):
    """N entries of one run each, made in memory (no log read): an evaluation, and 20 step times of 1 + i / n s; the
    time to train of entry i is n - i minutes, so the last entries are the fastest."""
    import numpy as np

    from mlbench.analysis.compare import Comparison, Entry
    from mlbench.analysis.logs import RunLog

    entries = []
    for i in range(n):
        run = RunLog(Path(f"s{i}/result_0.txt"), run_start_ms=0.0, run_stop_ms=(n - i) * 60000.0,
                     logged_status="success", eval_points=[(8.0, 0.5, 6e4)])
        entry = Entry(f"s{i}", "run", "llama31_8b", runs=[run])
        entry.__dict__["step_seconds"] = np.full(20, 1 + i / n)  # (the cached property, set)
        entries.append(entry)
    return Comparison(entries)


def test_the_plots_of_thousands_of_sets_stay_readable() -> None:
    """`compare` of 2,900 sets wrote a step-time plot 69,000 px tall (a row a set) and a convergence legend of 725
    rows. The plots show at most PLOT_ENTRIES sets, those with the shortest time to train, in the order given; the
    report says how many were left out; the image's height does not grow with the sets."""
    from mlbench.analysis.compare import PLOT_ENTRIES, _convergence_plot, _step_time_plot, plots_note

    heights = {}
    for n in (PLOT_ENTRIES, 2900):
        cmp = _synthetic_comparison(n)
        steps, convergence = _step_time_plot(cmp), _convergence_plot(cmp)
        heights[n] = steps.get_size_inches()[1]
        labels = [t.get_text() for t in steps.axes[0].get_yticklabels()]
        assert labels == [f"s{i}" for i in range(n - PLOT_ENTRIES, n)], labels[:3]  # the fastest, as given
        legend = [t.get_text() for t in convergence.axes[0].get_legend().get_texts()]
        assert legend == labels
        report.plt.close(steps)
        report.plt.close(convergence)
    assert heights[2900] == heights[PLOT_ENTRIES] and heights[2900] * 110 < 2000, heights  # (px at the report's dpi)
    assert plots_note(_synthetic_comparison(PLOT_ENTRIES)) is None
    assert "2,850 of the 2,900 entries with evaluations and 2,850 of the 2,900 entries with step times are left " \
           "out" in plots_note(cmp)


def test_a_report_and_the_terminal_say_what_its_plots_leave_out(tmp_path: Path, cli) -> None:
    from test_analysis_logs import tiny_log

    from mlbench.analysis.compare import PLOT_ENTRIES

    sets = [tmp_path / "s" / f"set{i:02d}" for i in range(PLOT_ENTRIES + 3)]
    for i, folder in enumerate(sets):
        folder.mkdir(parents=True)
        (folder / "result_0.txt").write_text(tiny_log(step_s=0.5 + i / 1000))
    proc = cli("compare", "--no-score", *sets, "--md", tmp_path / "r.md")
    said = "3 of the 53 entries with evaluations and 3 of the 53 entries with step times are left out of them"
    assert proc.returncode == 0 and said in proc.stdout.splitlines()[-1], proc.stdout[-2000:]
    text = (tmp_path / "r.md").read_text()
    table = [ln for ln in text.splitlines() if ln.startswith("|")]
    assert said in text and "set52" in table[0], text[:3000]  # the side-by-side table keeps the sets left out


def _png_size(path: Path) -> tuple[int, int]:
    import struct

    return struct.unpack(">II", path.read_bytes()[16:24])


def test_long_names_do_not_squeeze_the_plots(work: Path, cli) -> None:
    """Systems of 250 characters: the convergence legend made its image 2,773 px wide (the plots in a corner of
    it, shrunk to the page unreadable) and the step-time labels ran into each other (2,137 px). Plots show a name's
    start and end; the tables show it whole."""
    tree = work / "tree" / "org" / "results"
    paths = [shutil.copytree(SET, tree / f"{i}{'s' * 249}" / "llama31_8b") for i in range(3)]
    assert here(cli, work, "compare", "--no-score", *paths, "--md", "out/r.md").returncode == 0
    for png in ("convergence.png", "step_times.png"):
        assert _png_size(work / "out" / "r_files" / png)[0] < 1200, png
    assert f"{'s' * 249}/llama31\\_8b |" in (work / "out" / "r.md").read_text()  # the table: the name whole


def test_a_name_in_characters_the_plots_font_lacks_is_written_out_without_warnings(work: Path) -> None:
    """A folder '系统😀': each character drawn as an empty box, and matplotlib's 'Glyph 31995 missing from font(s)'
    warnings (two lines each, with a line of mlbench's source) on stderr. Plots write it as '\\u7cfb...'; the
    tables show it as it is."""
    shutil.copytree(SET, work / "\u7cfb\u7edf\U0001f600")
    proc = run("compare", "--no-score", "\u7cfb\u7edf\U0001f600", "s2", "--md", "out/r.md", cwd=work)
    assert proc.returncode == 0 and proc.stderr == b"", proc.stderr.decode()
    assert "\u7cfb\u7edf\U0001f600" in (work / "out" / "r.md").read_text()
    assert report.plot_label("\u7cfb\u00e9") == "\\u7cfb\u00e9"


def test_an_unknown_published_id_is_cut_in_its_one_line(tmp_path: Path, cli) -> None:
    """An id of 3,000 characters was printed whole in the refusal, beside every known id."""
    proc = cli("compare", "published:" + "x" * 3000, "published:nvidia-eos-gpt3-v3.1")
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1 and proc.stdout == "", proc.stderr
    assert "no published row" in proc.stderr and len(proc.stderr) < 1000, len(proc.stderr)


def test_an_html_report_over_a_markdown_one_drops_its_plots(work: Path, cli) -> None:
    """`--html out/r.md` over an earlier Markdown report of that name replaced its text and left its plots in
    r_files/, linked from nowhere. They go with it; a Markdown report written beside it that keeps the folder
    (`--md out/r.x --html out/r.md`: both r_files/) keeps its plots."""
    files = work / "out" / "r_files"
    assert compare_here(cli, work, "--md", "out/r.md").returncode == 0
    assert sorted(os.listdir(files)) == ["convergence.png", "step_times.png"]
    assert compare_here(cli, work, "--html", "out/r.md").returncode == 0
    assert os.listdir(work / "out") == ["r.md"] and (work / "out" / "r.md").read_text().startswith("<!DOCTYPE html>")
    assert compare_here(cli, work, "--md", "out/r.md").returncode == 0
    assert compare_here(cli, work, "--md", "out/r.x", "--html", "out/r.md").returncode == 0
    assert sorted(os.listdir(files)) == ["convergence.png", "step_times.png"]


def test_reports_import_quietly_where_home_cannot_be_written(tmp_path: Path) -> None:
    """With HOME (and XDG_CACHE_HOME) a file, not a folder, every `compare` and `scaling` began with matplotlib's
    two-line warning ('mkdir -p failed for path ...', 'Matplotlib created a temporary cache directory ...'). Now
    nothing is said; matplotlib keeps its cache in a temporary folder."""
    home = tmp_path / "home"
    home.write_text("")
    env = {k: v for k, v in os.environ.items() if k not in ("MPLCONFIGDIR", "XDG_CONFIG_HOME")}
    root = str(Path(__file__).resolve().parents[1])
    proc = subprocess.run([sys.executable, "-c", "import mlbench.analysis.report"], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path,
                          env={**env, "HOME": str(home), "XDG_CACHE_HOME": str(home / "c"), "PYTHONPATH": root})
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
