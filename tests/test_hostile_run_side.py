"""What a hostile user does around a run rather than to its input: closes its stdout, kills mlbench at the worst
moment and leaves a dead run's staging folder unreadable. Each is cheap: in-process, or a command that trains
nothing."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import MLBENCH

from mlbench import terminal
from mlbench.progress import Progress

# ---- stdout closed (`>&-`): what nobody can read is dropped, the run goes on --------------------------------

_START = {"event": "start", "budget": 10, "target": 3.0, "metric": "log_perplexity", "direction": "min",
          "device": {"type": "cpu", "name": "x86", "precision": "fp32", "attention": "local"}}


def test_a_console_prints_nothing_and_fails_nothing_without_a_stdout(monkeypatch: pytest.MonkeyPatch) -> None:
    """Python sets sys.stdout to None when the command starts with fd 1 closed; the progress lines of a run crashed
    the supervisor (AttributeError: 'NoneType' object has no attribute 'write') right after run_start, its ranks
    were SIGTERMed and nothing was published."""
    monkeypatch.setattr(sys, "stdout", None)
    console = terminal.console()
    console.print("a line nobody reads")
    with Progress("gpt3 run 1/1", console) as progress:
        progress.on_events([_START, {"event": "eval", "value": 2.5, "step": 4}])
    console.file.flush()


def _closed_stdout() -> None:
    os.close(1)


@pytest.mark.parametrize("args", [["list"], ["show", "gpt3"], ["run", "gpt3", "--tiny", "--dry-run", "--results",
                                                               "{tmp}"]], ids=["list", "show", "run-dry-run"])
def test_commands_run_to_their_end_with_stdout_closed(args: list[str], tmp_path) -> None:
    args = [a.format(tmp=tmp_path) for a in args]
    proc = subprocess.run([*MLBENCH, *args], stdout=None, stderr=subprocess.PIPE, text=True, timeout=120,
                          preexec_fn=_closed_stdout)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr


def test_a_closed_standard_stream_is_held_on_dev_null() -> None:
    """With fd 1 closed, the first file mlbench opened took number 1, and a process started after (without its own
    stdout) wrote its output into that file: mlbench holds the number on /dev/null first."""
    code = ("import contextlib, os, sys\nfrom mlbench import cli\nsys.argv = ['mlbench', 'list']\n"
            "with contextlib.suppress(SystemExit):\n    cli.main()\n"
            "sys.stderr.write(f\"{os.open(os.devnull, os.O_RDONLY)} {os.readlink('/proc/self/fd/1')}\")")
    proc = subprocess.run([sys.executable, "-c", code], stdout=None, stderr=subprocess.PIPE, text=True, timeout=60,
                          preexec_fn=_closed_stdout)
    fd, held = proc.stderr.split()
    assert int(fd) > 2 and held == os.devnull, proc.stderr
