"""The console every command prints through. On a terminal, rich's own width; elsewhere (CI logs, `| tee`, SLURM
output files) rich would wrap at 80 columns, cutting progress lines mid-word and squeezing tables, so lines are
printed whole and tables at their natural width, whatever COLUMNS says."""

from __future__ import annotations

import codecs
import contextlib
import errno
import os
import shutil
import sys

from rich.console import Console

# Without a terminal nothing is wrapped or cut: a width no table reaches, so each takes its natural width (rich
# pads nothing to the console's width: soft wrap for lines, tables as wide as their cells).
WIDTH_WITHOUT_TERMINAL = 1 << 20

SAFE_ERRORS = "mlbench-safe"


def spelled(run: str) -> str | None:
    """The text a run of a name's undecodable bytes spells as UTF-8 (a UTF-8 name a POSIX locale could not decode),
    or None where they are no UTF-8 or spell a character that is not printable."""
    try:
        text = bytes(ord(c) - 0xDC00 for c in run).decode("utf-8")
    except UnicodeDecodeError:
        return None
    return text if text.isprintable() else None


def escaped(run: str) -> str:
    """Undecodable bytes of a name (surrogateescape's U+DC80 to U+DCFF) written as \\xNN each."""
    return "".join(f"\\x{ord(c) - 0xDC00:02x}" for c in run)


def _safe(err: UnicodeError) -> tuple[str | bytes, int]:
    """Encoding errors handler: a path from the command line, decoded under a C/POSIX locale, holds its undecodable
    bytes as surrogates (surrogateescape): those go out as the bytes they were where they spell UTF-8 text (as `ls`
    prints the name), else written \\xNN (`errors.printable`: output stays UTF-8); any other character the encoding
    lacks becomes '?'."""
    if not isinstance(err, UnicodeEncodeError):
        raise err
    bad = err.object[err.start:err.end]
    if all("\udc80" <= c <= "\udcff" for c in bad):
        return (bytes(ord(c) - 0xDC00 for c in bad) if spelled(bad) is not None else escaped(bad)), err.end
    return "?" * len(bad), err.end


codecs.register_error(SAFE_ERRORS, _safe)


def encode(text: str, encoding: str = "utf-8") -> bytes:
    """TEXT in ENCODING, never failing (SAFE_ERRORS)."""
    return text.encode(encoding, SAFE_ERRORS)


class _Stdout:
    """sys.stdout (whichever it is at the time of each write) that outlives its reader: a terminal that closed
    (an SSH session that dropped: EIO) or a pipe whose reader left (`| head`: EPIPE). Output is what a run
    matters least for: it goes on to its end, its log and result published, and what it would have printed is
    dropped (stdout pointed at /dev/null, so the interpreter's last flush cannot fail either). A failure other than
    the reader leaving (a full disk: ENOSPC, EIO) is kept in `failure`: the CLI says it on stderr at the end, exit 1
    (`mlbench list > /dev/full` exited 0, its table lost), and prints an error line that stdout lost on stderr."""

    lost: object = None  # the stream that failed: what is written to it is dropped
    failure: str | None = None  # why it failed, the reader leaving (EPIPE) aside

    def write(self, text: str) -> int:
        out = sys.stdout
        if out is not None and out is not _Stdout.lost:  # None: started without a stdout (`>&-`), nobody reads it
            try:
                try:
                    if not text.isascii() and getattr(out, "errors", None) == "backslashreplace":
                        # stderr (an error line where stdout carries the output) takes any character, a name's
                        # undecodable bytes as '\udcc3': never raised, never the bytes the name was
                        return self._write_encoded(text)
                    return out.write(text)
                except UnicodeEncodeError:  # a name the stream's encoding lacks (LC_ALL=C, PYTHONIOENCODING=ascii)
                    return self._write_encoded(text)
            except OSError as e:
                self._lose(out, e)
        return len(text)

    @staticmethod
    def _write_encoded(text: str) -> int:
        encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
        data = encode(text, encoding)
        if buffer := getattr(sys.stdout, "buffer", None):
            sys.stdout.flush()
            buffer.write(data)
        else:  # a text-only stream: the characters it can take
            sys.stdout.write(data.decode(encoding, "replace"))
        return len(text)

    def flush(self) -> None:
        out = sys.stdout
        if out is not None and out is not _Stdout.lost:
            try:
                out.flush()
            except OSError as e:
                self._lose(out, e)

    @staticmethod
    def _lose(out: object, e: OSError) -> None:
        _Stdout.lost = out
        if e.errno != errno.EPIPE and _Stdout.failure is None:
            _Stdout.failure = e.strerror or str(e)
        with contextlib.suppress(OSError, ValueError, AttributeError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())  # type: ignore[attr-defined]

    @staticmethod
    def take_failure() -> str | None:
        """Why stdout could not be written, once: the one who says it takes it."""
        why, _Stdout.failure = _Stdout.failure, None
        return why

    @staticmethod
    def reset() -> None:
        """Nothing lost yet (a command's start: the CLI run again in one process, as the tests do)."""
        _Stdout.lost = None
        _Stdout.failure = None

    def __getattr__(self, name: str) -> object:  # isatty, fileno, encoding: the stream's own
        return getattr(sys.stdout, name)


STDOUT = _Stdout()


def hold_standard_streams() -> None:
    """A standard stream the command was started without (`>&-`, `2>&-`, `<&-`; Python then has None for it, and
    the output goes nowhere, as it was meant to): its descriptor is held on /dev/null. Left free, the first file
    mlbench opened took its number, and a process started after wrote its output or errors into that file."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)


def console(**kwargs) -> Console:
    """On a terminal, its width (a set COLUMNS, else the terminal's; COLUMNS=0 is no width: rich would print every
    line at width 0, nothing at all). Without one, whole lines and tables at their natural width whatever COLUMNS
    says: a log or a file has no width to fit (COLUMNS=5 gave tables of empty cells, 170 columns cut numbers).
    No markup: what is printed holds paths and log values, and a `[/red]` in one was read as a closing tag (a
    MarkupError traceback); styled words are `Text` (`Text.assemble(("error:", "red"), " ", message)`)."""
    kwargs.setdefault("file", STDOUT)
    kwargs.setdefault("markup", False)
    if _is_tty(kwargs["file"]):
        c = Console(**kwargs)
        if c.is_terminal:
            return c if c.width > 0 else Console(width=shutil.get_terminal_size().columns, **kwargs)
    # Not a terminal whatever FORCE_COLOR or TTY_COMPATIBLE=1 say (CI sets them for colour): rich took those for
    # one, wrapped lines and tables at 80 columns and drew the live panel's redraws (cursor moves) into the log.
    return Console(width=WIDTH_WITHOUT_TERMINAL, soft_wrap=True, force_terminal=False, **kwargs)


def _is_tty(stream: object) -> bool:
    """Whether STREAM is a terminal (a closed stream, or none, is not)."""
    try:
        return bool(stream.isatty())  # type: ignore[attr-defined]
    except (AttributeError, ValueError, OSError):
        return False
