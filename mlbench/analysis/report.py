"""HTML (self-contained, plots inline as base64 PNG) and Markdown (PNGs beside it) reports."""

from __future__ import annotations

import base64
import contextlib
import errno
import fnmatch
import functools
import html
import io
import logging
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


def _quiet_matplotlib_import() -> None:
    """matplotlib imported without its two-line warning where HOME (or XDG_CONFIG_HOME, XDG_CACHE_HOME) cannot be
    written ('mkdir -p failed for path ...', 'Matplotlib created a temporary cache directory ...'), which every
    `compare` and `scaling` printed there: it then keeps its font cache in a temporary folder (0.2 s a process)."""
    log = logging.getLogger("matplotlib")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display: reports are written on headless machines
        # Names are text: a folder named 'x$^{$' was parsed as maths (a traceback out of matplotlib's mathtext)
        matplotlib.rcParams["text.parse_math"] = False
        import matplotlib.pyplot  # noqa: F401
    finally:
        log.setLevel(level)


_quiet_matplotlib_import()
import matplotlib  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402

from mlbench import terminal  # noqa: E402
from mlbench.analysis.logs import RESULT_GLOB  # noqa: E402
from mlbench.errors import OutputFailed, UserError, in_document, printable  # noqa: E402


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
        if len(name) + 4 > len(_LONGEST_IMAGE):  # the image folder was checked for names up to that long
            raise ValueError(f"image name {name!r} is longer than {len(_LONGEST_IMAGE) - 4} characters")
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110, bbox_inches="tight", metadata={"Software": _PNG_MARK})
        plt.close(fig)
        self.parts.append(("img", name, buf.getvalue(), alt))


_CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px;color:#222;overflow-wrap:anywhere}
table{border-collapse:collapse;margin:1em 0;font-size:13px}td,th{border:1px solid #ccc;padding:4px 8px;
text-align:right}th{background:#f0f0f0}td:first-child,th:first-child{text-align:left}
img{max-width:100%;border:1px solid #eee;margin:.5em 0}li{margin:.2em 0}"""


# What every report mlbench writes begins with (the HTML's head, the Markdown's first line: a comment, not shown): an
# existing file is replaced only where it holds it. A report given the path of a run log not named result_* (rank-
# prefixed lines, a long shell preamble) or of a set's scaling.json replaced it.
_MARK = {"html": "<meta name='generator' content='mlbench report'>", "md": "<!-- mlbench report -->"}


# A report's image carries it as a PNG text chunk: an image of a Markdown report replaces only an earlier one (a
# user's convergence.png in rep_files/ was replaced).
_PNG_MARK = "mlbench report image"


def _head_holds(path: Path, marks: list[bytes], size: int) -> bool:
    """Whether the first SIZE bytes of PATH hold one of MARKS (False where it cannot be read)."""
    try:
        with open(path, "rb") as f:
            head = f.read(size)
    except OSError:
        return False
    return any(mark in head for mark in marks)


def _our_image(path: Path) -> bool:
    return _head_holds(path, [b"tEXtSoftware\0" + _PNG_MARK.encode()], 4096)


def _ours(path: Path) -> bool:
    """Whether the regular file PATH is a report mlbench wrote (`_MARK` in its first KiB)."""
    return _head_holds(path, [mark.encode() for mark in _MARK.values()], 1024)


# The most characters of a name a plot shows (a legend entry, a tick label, a title); the report's tables show it
# whole. Names of 250 characters made a legend 2,500 px wide: the plots were squeezed into a corner of the image,
# shrunk to the page unreadable.
PLOT_LABEL = 64


@functools.cache
def _glyphs() -> frozenset[int]:
    """The characters the plots' font draws. Another (a folder '系统', an emoji) was drawn as an empty box, and
    matplotlib warned of each on stderr, two lines with its own source line."""
    from matplotlib import font_manager
    from matplotlib.ft2font import FT2Font

    path = font_manager.findfont(font_manager.FontProperties(family=matplotlib.rcParams["font.family"]))
    return frozenset(FT2Font(path).get_charmap())


def plot_label(text: object) -> str:
    """TEXT as a plot shows it: `in_document`, a character its font lacks written as Python writes it ('\\u7cfb'),
    and past PLOT_LABEL characters its middle cut to '…' (the start and the end, where names of one set or tree
    differ, kept)."""
    s = "".join(c if ord(c) in _glyphs() else f"\\u{ord(c):04x}" if ord(c) <= 0xFFFF else f"\\U{ord(c):08x}"
                for c in in_document(text))
    if len(s) <= PLOT_LABEL:
        return s
    half = (PLOT_LABEL - 1) // 2
    return f"{s[:half]}…{s[len(s) - (PLOT_LABEL - 1 - half):]}"


# Markers that tell lines of one colour apart: filled, and unlike each other at a plot's size
LINE_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h", "p")


def line_looks(n: int) -> list[tuple[tuple[float, float, float], str]]:
    """N (colour, marker) pairs, no two alike, for N lines of one plot: the ten colours of matplotlib's cycle with
    the first marker, then again with the next (120 lines); past that each line a hue of its own, the markers in
    turn. matplotlib's cycle alone repeats after ten lines: two systems of a scaling plot looked the same."""
    from matplotlib.colors import hsv_to_rgb

    cycle = list(plt.get_cmap("tab10").colors)  # (the default cycle's, whatever a matplotlibrc says)
    if n <= len(cycle) * len(LINE_MARKERS):
        return [(cycle[i % len(cycle)], LINE_MARKERS[i // len(cycle)]) for i in range(n)]
    return [(tuple(float(c) for c in hsv_to_rgb((i / n, 0.85, 0.8 if i % 2 else 0.6))),  # (darker every other)
             LINE_MARKERS[i % len(LINE_MARKERS)]) for i in range(n)]


def _esc(text: object) -> str:
    """Text of a report in HTML: `printable` (a log's control characters written out), then HTML's escaping."""
    return html.escape(in_document(text))


def render_html(rep: Report) -> str:
    out = [f"<!DOCTYPE html><html><head><meta charset='utf-8'>{_MARK['html']}<title>{_esc(rep.title)}</title>"
           f"<style>{_CSS}</style></head><body><h1>{_esc(rep.title)}</h1>"]
    for part in rep.parts:
        kind = part[0]
        if kind == "h":
            out.append(f"<h2>{_esc(part[1])}</h2>")
        elif kind == "p":
            out.append(f"<p>{_esc(part[1])}</p>")
        elif kind == "ul":
            out.append("<ul>" + "".join(f"<li>{_esc(x)}</li>" for x in part[1]) + "</ul>")
        elif kind == "table":
            head = "".join(f"<th>{_esc(h)}</th>" for h in part[1])
            body = "".join("<tr>" + "".join(f"<td>{_esc(c)}</td>" for c in r) + "</tr>" for r in part[2])
            out.append(f"<table><tr>{head}</tr>{body}</table>")
        elif kind == "img":
            b64 = base64.b64encode(part[2]).decode()
            out.append(f"<figure><img alt='{_esc(part[3])}' src='data:image/png;base64,{b64}'>"
                       f"<figcaption>{_esc(part[3])}</figcaption></figure>")
    out.append("</body></html>")
    return "\n".join(out)


# What Markdown reads in text anywhere: each written with a backslash; `&` `<` `>` (raw HTML, which Markdown passes
# through) as entities. At a line's start also what opens a heading, list or rule (`#`, `-`, `+`, `=`, and `1.` or
# `1)`: a folder '1. x' opened a numbered list in the notes). Parentheses stay as they are: a link or an image needs
# `](`, and the brackets are escaped (our own labels read "(s)"). `$`: GitHub renders $...$ as maths (a folder named
# '$x^{$' came out typeset).
_MD_SPECIAL = re.compile(r"([\\`*_\[\]|~$])|^([#+=-])|^(\d{1,9})([.)])(?= |$)")


def _md(s: object) -> str:
    """Text of a Markdown report: `printable`, then nothing in it read as Markdown or HTML. A folder named
    'a|b<img src=x onerror=alert(1)>](javascript:x)' or a log's status '<script>...' went into the report raw."""
    text = _MD_SPECIAL.sub(lambda m: f"{m.group(3)}\\{m.group(4)}" if m.group(3) else "\\" + (m.group(1) or m.group(2)),
                           in_document(s))
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    # a leading space as an entity: four (a folder '    x') made the rest of a note an indented code block
    return "&#32;" + text[1:] if text.startswith(" ") else text


def _md_cell(s: object) -> str:
    return _md(s)


def _md_link(target: str) -> str:
    """TARGET, a relative path, as a Markdown link's destination: a character of a URL's syntax or Markdown's (a
    space, parentheses, '#', '?', '%', '<') and a byte of a name that spells no UTF-8 percent-encoded. A report
    'my report (2).md' linked 'my report (2)_files/x.png', which Markdown does not read as an image (shown as
    text), and '#' cut the path at a fragment. Other text (é) stays as it is."""
    out = []
    for c in os.fsencode(target).decode("utf-8", "surrogateescape"):
        keep = c.isascii() and (c.isalnum() or c in "-._~/") or not c.isascii() and c.isprintable() \
            and not "\udc80" <= c <= "\udcff"
        out.append(c if keep else "".join(f"%{b:02X}" for b in c.encode("utf-8", "surrogateescape")))
    return "".join(out)


def markdown_files(path: Path) -> Path:
    """The folder beside a Markdown report that holds its images."""
    return path.parent / f"{path.stem}_files"


def render_markdown(rep: Report, path: Path) -> tuple[str, dict[str, bytes]]:
    """Markdown text, and the images it links (relative, into `markdown_files(PATH)`) by file name. Every text is
    `printable`: one line each, no control character (a log's ESC sequence reached the report raw)."""
    files = markdown_files(path)
    out, images = [_MARK["md"], f"# {_md(rep.title)}", ""], {}
    for part in rep.parts:
        kind = part[0]
        if kind == "h":
            out += [f"## {_md(part[1])}", ""]
        elif kind == "p":
            out += [_md(part[1]), ""]
        elif kind == "ul":
            out += [f"- {_md(x)}" for x in part[1]] + [""]
        elif kind == "table":
            out.append("| " + " | ".join(_md_cell(h) for h in part[1]) + " |")
            out.append("|" + "---|" * len(part[1]))
            out += ["| " + " | ".join(_md_cell(c) for c in r) + " |" for r in part[2]]
            out.append("")
        elif kind == "img":
            images[f"{part[1]}.png"] = part[2]
            out += [f"![{_md(part[3])}]({_md_link(f'{files.name}/{part[1]}.png')})", ""]
    return "\n".join(out), images


def check_outputs(html: Path | None, md: Path | None) -> None:
    """`--html` and `--md` of one command, each checked (`check_output`), and not one file (the second would
    replace the first), nor the HTML at or in the Markdown's image folder (an image would replace it)."""
    check_output(html, "--html")
    check_output(md, "--md")
    if html is not None and md is not None:
        if _guard("--html", html, lambda: Path(html).resolve() == Path(md).resolve()):
            raise UserError(f"--html and --md are both {md}: the Markdown would replace the HTML; give each its own "
                            "name")
        images = markdown_files(Path(md))
        if _guard("--html", html, lambda: images.resolve() in (Path(html).resolve(), Path(html).resolve().parent)):
            raise UserError(f"--html {html} is where --md {md} puts its images ({images}); give each its own name")


def check_output(path: Path | None, option: str) -> None:
    """Refuse a report path that cannot be written, before any work: its folder must exist (it is not created)
    and take a file of that name; the path must not be a symbolic link (the report would replace the link, not
    write where it points: `--html /dev/stdout` replaced the system's link), a folder, a device or a pipe, nor an
    MLPerf result log (a report may replace an earlier report, never a run), nor named as a run's file, there or
    not (result_1.txt written as a report was a log without its record, which failed `mlbench check` on the whole
    folder); a Markdown report's image folder likewise must be a folder, not a link, where it exists, nor named
    as a run's file. Any error of the system (a name too long) names the
    path, never a traceback."""
    if path is None:
        return
    path = Path(path)
    _guard(option, path, lambda: _check_file(path, option))
    if option == "--md":
        files = markdown_files(path)
        _guard(option, path, lambda: _check_images_folder(path, files, option))


def _guard(option: str, path: Path, check: Callable[[], object]) -> object:
    """CHECK(), its OSError (ENAMETOOLONG, ELOOP, EACCES...) one line naming PATH."""
    try:
        return check()
    except OSError as e:
        why = e.strerror or str(e)
        if e.errno == errno.ENAMETOOLONG:
            why += f"; a name takes at most {_name_max(path.parent)} bytes"
        failed = f"cannot write {e.filename}" if e.filename and str(e.filename) != str(path) else "cannot be written"
        raise UserError(f"{option} {path}: {failed} ({why}); give another name") from None


def _name_max(folder: Path) -> int:
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def _lstat(path: Path) -> os.stat_result | None:
    """What PATH is itself (a link not followed); None where nothing is. A name too long raises."""
    try:
        return path.lstat()
    except (FileNotFoundError, NotADirectoryError):
        return None


def _check_file(path: Path, option: str) -> None:
    folder = path.parent
    st = _lstat(path)
    if st is not None and stat.S_ISLNK(st.st_mode):
        raise UserError(f"{option} {path}: is a symbolic link (to {os.readlink(path)}); give the file itself, "
                        "a report never replaces a link")
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise UserError(f"{option} {path}: is a folder; give a file name")
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise UserError(f"{option} {path}: is not a regular file (a device or a pipe); give a file name")
    if st is not None and _is_result_log(path):
        raise UserError(f"{option} {path}: is an MLPerf result log; a report never replaces one, give another name")
    if st is not None and not _ours(path):
        raise UserError(f"{option} {path}: is there, and is no report mlbench wrote; a report replaces only an "
                        "earlier report, give another name")
    if _is_result_name(path.name):  # one that is not there yet too: a log without its record, or a record alone
        raise UserError(f"{option} {path}: is named as a run's file ({_RESULT_NAMES}), and a results folder holds a "
                        "run's log and record both or neither; give another name")
    if path.name == "scaling.json" or (path.suffix == ".json" and folder.name == "systems"):
        # (a report there was read as the set's RCP factor or its system's description: no score, no device count)
        raise UserError(f"{option} {path}: is named as a file analysis reads (a set's scaling.json, a "
                        "systems/<system>.json); give another name")
    if not folder.is_dir():
        raise UserError(f"{option} {path}: folder {folder} does not exist (create it first)")
    for real in (folder.resolve(), *folder.resolve().parents):  # (through a link, in a folder below it too)
        md = real.parent / f"{real.name.removesuffix('_files')}.md"
        if real.name.endswith("_files") and md.is_file() and _ours(md):
            # (refused in one command with both; a second command wrote it among the images the Markdown replaces)
            raise UserError(f"{option} {path}: is in {real}, the images folder of the Markdown report {md}; give "
                            "another folder")
    _check_name(path)
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=_TMP_PREFIX, suffix=".probe"):
            pass
    except OSError as e:
        raise UserError(f"{option} {path}: cannot write in {folder} ({e.strerror or e})") from None


def _check_images_folder(path: Path, files: Path, option: str) -> None:
    if _is_result_name(files.name):
        raise UserError(f"{option} {path}: its images would go in {files}, named as a run's file ({_RESULT_NAMES}); "
                        "give another name")
    st = _lstat(files)
    if st is not None and stat.S_ISLNK(st.st_mode):
        raise UserError(f"{option} {path}: its images go in {files}, a symbolic link; give the folder itself or "
                        "another name")
    if st is not None and not stat.S_ISDIR(st.st_mode):
        raise UserError(f"{option} {path}: its images go in {files}, which is not a folder")
    if st is not None and (odd := next((p for p in files.glob("*.png") if not _regular(p)), None)):
        raise UserError(f"{option} {path}: its images go in {files}, and {odd.name} there is not a regular file "
                        "(a symbolic link, a folder, a device or a pipe); remove it or give another name")
    _check_name(files)
    _check_name(files / _LONGEST_IMAGE)


def _check_name(path: Path) -> None:
    """Raise ENAMETOOLONG where the system would: a name past its folder's limit, or a path past PATH_MAX."""
    if len(os.fsencode(path.name)) > _name_max(path.parent if path.parent.is_dir() else Path(".")):
        raise OSError(errno.ENAMETOOLONG, os.strerror(errno.ENAMETOOLONG), str(path))
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        path.lstat()  # a path too long as a whole raises


# The names of a run's files: MLPerf's result log, and the run record mlbench keeps beside it
_RESULT_NAMES = "result_*.txt, result_*.json"


def _is_result_name(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in _RESULT_NAMES.split(", "))


def _is_result_log(path: Path) -> bool:
    """A run's file: named as the results layout names them, or holding MLPerf log lines."""
    if path.suffix in (".txt", ".json") and fnmatch.fnmatch(path.with_suffix(".txt").name, RESULT_GLOB):
        return True  # a log or its run record
    try:
        with open(path, "rb") as f:
            return re.search(rb"(?m)^:::MLLOG ", f.read(1 << 16)) is not None
    except OSError:
        return False


# Temporary files beside a report: short names, so any name the folder takes can be written (a name of 250 bytes
# with the report's name in its temporary one went past the limit).
_TMP_PREFIX = ".mlbench-"
# The longest image name a report writes (`Report.img` refuses a longer one), probed in the image folder.
_LONGEST_IMAGE = "x" * 32 + ".png"


def write_reports(rep: Report, html_out: Path | None, md_out: Path | None) -> None:
    """The HTML and Markdown reports (the Markdown's images beside it), whole or not at all: every file is
    rendered and staged beside its place first, then each put in place; on any failure what was staged or made
    is removed and nothing is left half written (a failure while putting files in place, after every check, is
    what remains possible: then the files already in place stay, each one whole)."""
    files: dict[Path, bytes] = {}
    folder = None
    # an HTML report written over an earlier Markdown one (`--html r.md`): its images are that report's to drop
    # once this one is in place (they stayed in `r_files/`, linked from nowhere), unless the Markdown written now
    # keeps that folder
    replaced_md = html_out is not None and _regular(Path(html_out)) and \
        _head_holds(Path(html_out), [_MARK["md"].encode()], 1024) and \
        (md_out is None or markdown_files(Path(md_out)) != markdown_files(Path(html_out)))
    if html_out is not None:
        files[Path(html_out)] = terminal.encode(render_html(rep))
    if md_out is not None:
        text, images = render_markdown(rep, Path(md_out))
        if images:
            folder = markdown_files(Path(md_out))
            files.update({folder / name: png for name, png in images.items()})
        files[Path(md_out)] = terminal.encode(text)  # last: the text, once its images are there
    try:
        _publish(files, folder)
    except UserError as e:  # (OutputFailed too): the other report was not written either, said
        if html_out is None or md_out is None:
            raise
        raise type(e)(f"{e}; neither report was written (the two are written together)") from None
    if md_out is not None:
        _drop_earlier_images(markdown_files(Path(md_out)), set(images))
    if replaced_md:
        _drop_earlier_images(markdown_files(Path(html_out)), set())


def _drop_earlier_images(folder: Path, keep: set[str]) -> None:
    """The images an earlier report left in FOLDER that this one does not write (marked as a report's: a user's
    own files stay), removed once the report is in place, and the folder where that empties it. A report with no
    plot (published rows alone) left `r_files/` holding the plots of the comparison it replaced."""
    st = _lstat(folder)
    if st is None or not stat.S_ISDIR(st.st_mode):
        return
    dropped = False
    for image in folder.glob("*.png"):
        if image.name not in keep and _regular(image) and _our_image(image):
            with contextlib.suppress(OSError):
                image.unlink()
                dropped = True
    if dropped:
        with contextlib.suppress(OSError):
            folder.rmdir()  # (only where nothing is left in it)


def _publish(files: dict[Path, bytes], folder: Path | None) -> None:
    """FILES (path: content) in place together, FOLDER (the images') made where it is not; on failure, undone."""
    made = None
    staged: list[tuple[str, Path]] = []
    at: Path | None = folder  # the file (or the images' folder) being written: named where it fails
    try:
        if folder is not None and (st := _lstat(folder)) is None:
            folder.mkdir()
            made = folder
        elif folder is not None and not stat.S_ISDIR(st.st_mode):  # a link put there since the check
            raise UserError(f"{folder}: is not a folder (a symbolic link?); the report is not written")
        for dest, data in files.items():
            at = dest
            staged.append((_stage(dest, data), dest))
        for _tmp, dest in staged:
            _refuse_non_file(dest)  # again: a link put there since the check is never replaced
            if dest.suffix == ".png" and _lstat(dest) is not None and not _our_image(dest):
                raise UserError(f"{dest}: is there, and is no image of a report mlbench wrote; a report replaces "
                                "only an earlier report's images, remove it or give another name")
        while staged:
            tmp, dest = staged[0]
            at = dest
            os.replace(tmp, dest)
            staged.pop(0)
    except (OSError, UserError) as e:
        _undo(staged, made)
        if isinstance(e, UserError):
            raise
        raise _not_written(e, at) from None
    except BaseException:  # Ctrl-C, or a fault of ours: still nothing half written
        _undo(staged, made)
        raise


# What a write fails of that is no fault of the input: the disk or its quota full, an I/O error (exit code 1).
_SYSTEM_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EFBIG})


def _not_written(e: OSError, at: Path | None) -> UserError:
    """The report not written, naming the file being written (mkstemp's ENOSPC names none: it said
    'error: : cannot write the report'); a full disk is OutputFailed (stderr, exit 1), not bad input."""
    name = printable(at if at is not None else e.filename or "the report")
    message = f"{name}: cannot write the report ({e.strerror or e})"
    return OutputFailed(message) if e.errno in _SYSTEM_ERRNOS else UserError(message)


def _stage(dest: Path, data: bytes) -> str:
    """DATA in a temporary file beside DEST, with the mode a file opened for writing gets (it is made 0600)."""
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=_TMP_PREFIX, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o666 & ~_umask())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return tmp


def _regular(path: Path) -> bool:
    """PATH is a regular file itself (not a link to one), or nothing."""
    st = _lstat(path)
    return st is None or stat.S_ISREG(st.st_mode)


def _refuse_non_file(dest: Path) -> None:
    if not _regular(dest):
        raise UserError(f"{dest}: is not a regular file (a symbolic link, a folder, a device or a pipe); the "
                        "report is not written")


def _undo(staged: list[tuple[str, Path]], made: Path | None) -> None:
    for tmp, _dest in staged:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    if made is not None:
        with contextlib.suppress(OSError):
            shutil.rmtree(made)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
