"""The one error type a user sees (a message, no traceback, exit code 2), and SIGTERM or SIGHUP taken as Ctrl-C is;
how text from an input is printed (`printable`), and where a command's output and its failure to be written go."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from mlbench import terminal


class UserError(Exception):
    """Bad input: what is wrong and what would be right. The CLI prints it on one line and exits 2."""

    exit_code = 2


class Stopped(KeyboardInterrupt):
    """A stop signal (SIGTERM, SIGHUP; for `run` every one its supervisor stops on), raised where the program is,
    as Ctrl-C raises KeyboardInterrupt: whatever cleans up after Ctrl-C (a scratch folder, a half-staged report, a
    running checker, a set's claim on its seeds) cleans up after it too. The CLI exits 128 + the signal's number,
    as a shell reports a process the signal stopped."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.exit_code = 128 + signum


STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def stopped_by_signals(signals: tuple[signal.Signals, ...] = STOP_SIGNALS) -> Iterator[None]:
    """Within: SIGNALS (SIGTERM and SIGHUP unless told) raise `Stopped` (by default they end the process at once,
    and a scratch folder or a staged file stays behind). For the analysis commands, and `run` until its supervisor
    puts its own in place (there every signal that supervisor stops a run on). The handlers before are put back
    after; in a thread other than the main one (which alone gets signals in Python) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, _frame: object) -> None:
        for s in signals:  # one is enough: a second one would cut short the cleaning up this one starts
            signal.signal(s, signal.SIG_IGN)
        raise Stopped(signum)

    before = {s: signal.signal(s, stop) for s in signals}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


def stops_on_signals(command: Callable[..., Any]) -> Callable[..., Any]:
    """COMMAND (an analysis command's function, under its click decorators) run within `stopped_by_signals`."""
    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        with stopped_by_signals():
            return command(*args, **kwargs)
    return run


# --- what is printed of an input, and the output a command is run for -----------------------------------------

def clipped(text: str, limit: int = 300) -> str:
    """TEXT's first line in at most LIMIT characters, cut at a word with '...' where it is longer: CUDA's
    out-of-memory message ended a run's reason '... of the allocated memory 1.91 GiB is allocated by PyT'."""
    line = text.splitlines()[0] if text else ""
    if len(line) <= limit:
        return line
    cut = line[: limit - 3]
    return (cut.rsplit(" ", 1)[0] if " " in cut[limit // 2:] else cut).rstrip(" ,;:") + "..."


def printable(text: object) -> str:
    """TEXT from an input (a log's benchmark name, system or status, a key, a file name) as it may be printed: as it
    is where every character is printable, else each one that is not (a newline, ESC, a bidirectional override)
    written as Python writes it in a string (`\\n`, `\\x1b`, `\\u202e`), the escaping a garbled run_stop status
    is shown with ('\\x1b[2J...'). A log's "gpt3\\nerror: ..." printed raw forged a line of output; "\\x1b]0;...\\x07"
    reached the terminal and the Markdown report. A name's undecodable bytes (surrogates U+DC80 to U+DCFF) are
    left for the output to write as the bytes they were where they spell UTF-8 text (a UTF-8 name a POSIX locale
    could not decode: `terminal.encode`), else written \\xNN, as `--json` writes them: output stays UTF-8 (0xFE
    from a folder's name went out raw; 0x9B, CSI to an 8-bit terminal, cleared the screen). Idempotent."""
    s = str(text)
    if s.isprintable():
        return s
    return "".join((run if terminal.spelled(run) is not None else terminal.escaped(run)) if _is_undecoded(run) else
                   "".join(c if c.isprintable() else repr(c)[1:-1] for c in run) for run in _UNDECODED.split(s))


# a name's bytes the locale could not decode (surrogateescape), in runs: split keeps them, every other piece
_UNDECODED = re.compile("([\udc80-\udcff]+)")


def _is_undecoded(run: str) -> bool:
    return bool(run) and "\udc80" <= run[0] <= "\udcff"


def undecodable_escaped(s: str) -> str:
    """S with every run of a name's undecodable bytes written as the UTF-8 text it spells, else \\xNN a byte, for a
    file that must be UTF-8 (a JSON document, a report) or a figure."""
    if s.isprintable():
        return s
    return "".join((terminal.spelled(run) or terminal.escaped(run)) if _is_undecoded(run) else run
                   for run in _UNDECODED.split(s))


def in_document(text: object) -> str:
    """TEXT as `printable` gives it, for a file that is UTF-8 or a figure (an HTML or Markdown report, a plot): a
    name's undecodable bytes as the text they spell, else \\xNN (matplotlib refused them: a traceback)."""
    return undecodable_escaped(printable(text))


def unprintable(text: str) -> str | None:
    """The first character of TEXT, a name given as input, that is a control character, or None. A name's
    undecodable bytes that spell UTF-8 text are that text; others are taken but 0x80 to 0x9F, C1 control codes."""
    for run in _UNDECODED.split(text):
        if _is_undecoded(run):
            if terminal.spelled(run) is None and (c := next((c for c in run if c <= "\udc9f"), None)) is not None:
                return c
        elif (c := next((c for c in run if not c.isprintable()), None)) is not None:
            return c
    return None


class SystemFailure(UserError):
    """A failure of the system the command relies on, not of its input (a scheduler that does not answer, or answers
    junk): one line, as bad input is, but exit code 1."""

    exit_code = 1


class OutputFailed(UserError):
    """A command's output (what it was run for: a score, a table, a JSON document) could not be written: a full disk
    (ENOSPC), an I/O error. Told on stderr, exit code 1 (a failure of the system, not bad input)."""

    exit_code = 1


class IncompleteInstall(UserError):
    """A package mlbench needs is not importable (removed, or half installed): one line naming it and how to install
    again, exit code 1 (a failure of the system, not bad input)."""

    exit_code = 1


def missing_package(module: str, needed_by: str = "mlbench") -> str:
    """What to say where MODULE (a top-level module name) cannot be imported."""
    return (f"this Python environment lacks the module '{module}', which {needed_by} imports (a package removed or "
            f"half installed); install mlbench's dependencies again: `make clean install` in its checkout, or "
            f"`pip install -e .`")


class ProductStream:
    """The stream a command's product goes to (a score, a table, a JSON document): `terminal.STDOUT` (sys.stdout as
    it is at each write; a reader that left, `| head`, ends it quietly, and stdout is then held on /dev/null), but
    a failure to write is not left for the command's end, as a run's progress lines are: it is OutputFailed at
    once (`score > /dev/full` printed nothing and exited 0), what is printed after it (the CLI's error line) goes
    to stderr, and the rest of the product is dropped."""

    def __init__(self) -> None:
        self.dropped = False

    def write(self, text: str) -> int:
        if not self.dropped:
            terminal.STDOUT.write(text)
            self._said_failure()
        return len(text)

    def flush(self) -> None:
        if not self.dropped:
            terminal.STDOUT.flush()
            self._said_failure()

    def _said_failure(self) -> None:
        if (why := terminal.STDOUT.take_failure()) is not None:
            self.dropped = True
            sys.stdout = sys.stderr
            raise OutputFailed(f"could not write to standard output: {why}") from None

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding: the stream's own
        return getattr(sys.stdout, name)


@contextlib.contextmanager
def document_on_stdout() -> Iterator[Callable[[str], None]]:
    """For a command whose stdout carries one document (--json: `mlbench score --json X | jq`): yields the function
    that writes it (a ProductStream: a full disk is OutputFailed). Should the command fail instead (a UserError, a
    stop signal), what the CLI then prints of it goes to stderr, not into the document's stream: its console
    writes to sys.stdout as it is at each write (`terminal.STDOUT`), pointed at stderr on the way out."""
    stream = ProductStream()

    def write(document: str) -> None:
        stream.write(document if document.endswith("\n") else document + "\n")
        stream.flush()

    try:
        yield write
    except BaseException:
        sys.stdout = sys.stderr
        raise


def disk_free(path: object) -> str:
    """'the disk holding PATH has N MB free' (PATH, else its parent where it is not there yet), for the reason a
    write failed: a full disk fails inside torch's writer with messages such as "unexpected pos 704 vs 598" that do
    not say so; "" where the disk cannot be asked."""
    for where in (str(path), os.path.dirname(str(path)) or "."):
        try:
            st = os.statvfs(where)
        except OSError:
            continue
        if st.f_files and not st.f_favail:  # (room, but no file can be made: 'No space left on device' too)
            return f"the disk holding {path} has no free inode left ({st.f_bavail * st.f_frsize / 1e6:,.1f} MB free)"
        return f"the disk holding {path} has {st.f_bavail * st.f_frsize / 1e6:,.1f} MB free"
    return ""
