"""`mlbench list` and `mlbench show` as a user runs them: the three benchmarks with size, target, ruleset and
runs, on an 80-column terminal without cutting a name or a metric; parameter counts against the published sizes."""

from __future__ import annotations

import re

import pytest
from conftest import mlbench

ROWS = {  # name: size, quality target, ruleset, runs, tiny target
    "bert": ("340M", "masked_lm_accuracy", ">= 0.72", "5.0.0", "10", ">= 0.616"),
    "gpt3": ("175B", "log_perplexity", "<= 2.69", "4.1.0", "3", "<= 1.04"),
    "llama31_405b": ("405B", "log_perplexity", "<= 5.6", "6.0.0", "3", "<= 1.04"),
}


def test_columns_0_is_no_width_not_an_empty_screen() -> None:
    # a process of its own: `list`'s console reads COLUMNS as the CLI is imported
    proc = mlbench("list", env={"COLUMNS": "0"})  # rich printed nothing at all, exit 0
    assert proc.returncode == 0 and all(f" {name} " in proc.stdout for name in ROWS), proc.stdout


def _on_terminal(*args: str, columns: int) -> str:
    """`mlbench ARGS` on a pseudo-terminal COLUMNS wide (without one, output is whole lines at natural width);
    its output without colour codes."""
    import fcntl
    import os
    import pty
    import struct
    import subprocess
    import sys
    import termios

    main_fd, tty = pty.openpty()
    fcntl.ioctl(tty, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "mlbench.cli", *args], stdin=tty, stdout=tty, stderr=tty,
                            env={k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")})
    os.close(tty)
    out = b""
    while True:
        try:
            chunk = os.read(main_fd, 65536)
        except OSError:  # EIO: the terminal's other end is closed
            break
        if not chunk:
            break
        out += chunk
    os.close(main_fd)
    assert proc.wait(60) == 0, out.decode(errors="replace")
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.decode()).replace("\r\n", "\n")


def test_list_shows_every_benchmark_on_80_columns() -> None:
    out = _on_terminal("list", columns=80)
    lines = out.splitlines()
    assert max(len(ln.rstrip()) for ln in lines) <= 80 and "…" not in out, out
    for name, (size, metric, target, ruleset, runs, tiny) in ROWS.items():
        i = next(i for i, ln in enumerate(lines) if ln.split()[:1] == [name])
        row = " ".join(" ".join(lines[i:i + 3]).split())  # a wrapped row continues on the next lines
        for value in (size, metric, ruleset, runs, tiny):
            assert f" {value} " in f" {row} ", (name, value, row)
        assert target.split()[1] in row, (name, target, row)


def test_list_names_a_malformed_file_and_lists_the_others(benchmarks_copy, cli) -> None:
    """One broken file in the folder: `list` printed its error alone, the good benchmarks unlisted. Now they are
    listed, each broken file is named with its reason on stderr, and the exit code (2) tells a script; `show` of a
    good one is unaffected."""
    (benchmarks_copy / "broken.yaml").write_text("name: broken\noops: [\n")
    (benchmarks_copy / "misnamed.yaml").write_text((benchmarks_copy / "bert.yaml").read_text())
    env = {"MLBENCH_BENCHMARKS": str(benchmarks_copy)}
    proc = cli("list", env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert all(f" {name} " in proc.stdout for name in ROWS) and "broken" not in proc.stdout, proc.stdout
    assert proc.stderr.splitlines() == [
        f"error: {benchmarks_copy}/broken.yaml: not valid YAML at line 3: did not find expected node content",
        f"error: {benchmarks_copy}/misnamed.yaml: 'name' is 'bert', expected 'misnamed' (the file's name)"], proc.stderr
    shown = cli("show", "gpt3", env=env)
    assert shown.returncode == 0 and "GPT-3 175B" in shown.stdout and shown.stderr == "", shown.stdout + shown.stderr


@pytest.mark.parametrize(("name", "published", "within"), [("gpt3", 175e9, 0.01), ("llama31_405b", 405e9, 0.01),
                                                           ("bert", 340e6, 0.011)])
def test_show_gives_the_parameter_count_against_the_published_size(name: str, published: float,
                                                                   within: float, cli) -> None:
    proc = cli("show", name)
    assert proc.returncode == 0, proc.stderr
    count = int(re.search(r"parameters\s*│\s*([\d,]+)", proc.stdout).group(1).replace(",", ""))
    assert abs(count / published - 1) < within, (name, count)
    assert f"training {ROWS[name][3]}, {ROWS[name][4]} runs" in proc.stdout
    tiny = cli("show", name, "--tiny")
    assert tiny.returncode == 0 and "(tiny variant)" in tiny.stdout, tiny.stderr


def test_show_gives_values_with_the_expression_they_come_from(monkeypatch) -> None:
    from click.testing import CliRunner
    from rich.console import Console

    from mlbench import cli as cli_module
    from mlbench import registry
    from mlbench.cli import cli

    # The CLI's console took its width when first imported (80 in a worker without a terminal): a wide one here.
    monkeypatch.setattr(cli_module, "console", Console(width=300))

    out = " ".join(CliRunner(env={"COLUMNS": "300"}).invoke(cli, ["show", "gpt3"]).output.split())
    assert "warm-up 265 (= ceil(265 * 1536 / global_batch_size)) steps" in out
    assert "lr 2e-05 (= max(2e-5, " in out
    moe = [n for n in registry.names() if registry.load(n).model.num_experts]
    for name in moe:  # mixture of experts: the parameters a token passes through, beside the total
        out = " ".join(CliRunner(env={"COLUMNS": "300"}).invoke(cli, ["show", name]).output.split())
        assert re.search(r"active parameters │ [\d,]+ per token \(top-\d+ of \d+ experts\)", out), out
