"""Installing says only what matters: the packaging metadata builds without setuptools' deprecation warnings
(an SPDX license expression and the license file, as PEP 639 has them), and the wheel carries the data files."""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_builds_without_warnings_and_with_its_data(tmp_path: Path) -> None:
    setuptools = pytest.importorskip("setuptools")
    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip(f"setuptools {setuptools.__version__} here; the build requires >= 77 (PEP 639 license fields)")
    src = tmp_path / "src"  # a copy: the build writes build/ and *.egg-info next to the sources
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "mlbench", src / "mlbench", ignore=shutil.ignore_patterns("__pycache__"))
    # The build backend as pip calls it for `pip install` and for `make install`'s `pip install -e`, in this
    # environment (no package index needed); its warnings go to stderr.
    proc = subprocess.run([sys.executable, "-W", "always", "-c", "import setuptools.build_meta as b; "
                           "b.build_wheel('dist'); b.build_editable('editable')"], cwd=src, capture_output=True,
                          text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    # SetuptoolsDeprecationWarning, InformationOnly (what pip shows as BuildBackendWarning), ...
    warnings = re.findall(r"\b\w*(?:Warning|InformationOnly): .*", out)
    assert not warnings, "\n".join(warnings)
    with zipfile.ZipFile(next((src / "dist").glob("mlbench_ttt-*.whl"))) as whl:
        names = whl.namelist()
        meta = whl.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: Apache-2.0" in meta and "License-File: LICENSE" in meta
    assert "Classifier: License" not in meta  # PEP 639: the expression replaces license classifiers
    for data in ("mlbench/rules/smoke.yaml", "mlbench/planner/devices.yaml"):
        assert data in names, data
    assert not [n for n in names if n.startswith(("tests/", "perf/", "benchmarks/"))]


# The Makefile's two commands on a fresh or a damaged checkout, read with `make -n` in a copy (nothing installed).
needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="no make on PATH")


def _checkout(tmp_path: Path, name: str = "clone") -> Path:
    root = tmp_path / name
    root.mkdir()
    for f in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / f, root / f)
    return root


def _venv(root: Path, pip_names: str) -> None:
    """A venv (no pip: 50 ms) whose bin/pip script names `pip_names` as its interpreter, as pip writes it."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / ".venv")], check=True, timeout=60)
    sh = f"#!/bin/sh\n'''exec' \"{pip_names}\" \"$0\" \"$@\"\n' '''\n"  # pip's form for a path with a space
    first = sh if " " in pip_names else f"#!{pip_names}\n"
    (root / ".venv/bin/pip").write_text(first + "import sys\n")
    (root / ".venv/.installed").touch()


def _make(root: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """make ARGS in ROOT as a user's top-level make: without the variables of the `make test` this suite may run
    under (MAKELEVEL 1 made it a sub-make, which says nothing of a kept venv)."""
    inherited = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS", "MAKEOVERRIDES")}
    return subprocess.run(["make", "--no-print-directory", *args], cwd=root, capture_output=True, text=True,
                          timeout=60, env={**inherited, **(env or {})})


@needs_make
@pytest.mark.parametrize("name", ["clone", "a b ü"])
def test_make_keeps_a_venv_that_works_here(tmp_path: Path, name: str) -> None:
    root = _checkout(tmp_path, name)
    _venv(root, str(root / ".venv/bin/python"))
    proc = _make(root, "-n", "run")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [".venv/bin/mlbench run gpt3 --tiny"]
    # under an ASCII locale too: the check read pip's first line as UTF-8, and the path it named could not be
    # encoded there, so every make remade the venv
    ascii_locale = _make(root, "-n", "run", env={"LC_ALL": "POSIX", "PYTHONUTF8": "0"})
    assert ascii_locale.stdout.splitlines() == [".venv/bin/mlbench run gpt3 --tiny"], ascii_locale.stdout
    # make lint holds the code to the project's bar: perf/ too (it was left out)
    assert _make(root, "-n", "lint").stdout.splitlines() == [".venv/bin/ruff check mlbench tests perf"]


@needs_make
def test_make_remakes_a_venv_moved_or_without_its_python(tmp_path: Path) -> None:
    root = _checkout(tmp_path)
    _venv(root, str(tmp_path / "old place/.venv/bin/python"))  # the clone was moved: its scripts name the old path
    out = _make(root, "-n", "run").stdout
    assert "no longer works here" in out and "-m venv --clear .venv" in out, out
    _venv(root, str(root / ".venv/bin/python"))
    for python in (root / ".venv/bin").glob("python*"):  # the Python it was made with is gone
        python.unlink()
        python.symlink_to(tmp_path / "uninstalled/python3")
    out = _make(root, "-n", "run").stdout
    assert "-m venv --clear .venv" in out, out


@needs_make
def test_make_says_in_one_line_what_is_wrong(tmp_path: Path) -> None:
    root = _checkout(tmp_path)
    proc = _make(root, "install", "PYTHON=/no/python3.11")
    assert proc.returncode == 2 and not (root / ".venv").exists()
    assert proc.stderr.splitlines()[0] == ("make: cannot run '/no/python3.11' (not installed?): make install "
                                           "PYTHON=python3.11 (or the path of a Python 3.11 or newer)")
    proc = _make(root, "tset")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "no target 'tset'" in proc.stderr
    assert "make help" in proc.stderr
    proc = _make(root)  # no goal: what the targets are, nothing installed
    assert proc.returncode == 0 and "make run" in proc.stdout and not (root / ".venv").exists()


@needs_make
def test_make_says_which_python_a_kept_venv_uses(tmp_path: Path) -> None:
    """make run PYTHON=<another Python> beside a .venv made by the first kept the old venv without a word; now it
    says so in one line, with how to change it, and goes on."""
    root = _checkout(tmp_path)
    _venv(root, str(root / ".venv/bin/python"))
    other = tmp_path / "other"  # a Python at another real path (its own copy of the interpreter)
    subprocess.run([sys.executable, "-m", "venv", "--copies", "--without-pip", str(other)], check=True, timeout=60)
    proc = _make(root, "-n", "run", f"PYTHON={other}/bin/python")
    assert proc.returncode == 0 and proc.stdout.splitlines() == [".venv/bin/mlbench run gpt3 --tiny"], proc.stderr
    note = proc.stderr.splitlines()
    assert len(note) == 1 and note[0].startswith(f"make: .venv uses Python {platform.python_version()} ("), note
    assert note[0].endswith(f"keeping it: make clean run PYTHON={other}/bin/python makes it again with that one")
    for quiet in (["run", f"PYTHON={sys.executable}"], ["clean", "run", f"PYTHON={other}/bin/python"],
                  ["help", f"PYTHON={other}/bin/python"]):
        proc = _make(root, "-n", *quiet)
        assert proc.returncode == 0 and proc.stderr == "", (quiet, proc.stderr)


@needs_make
def test_a_venv_that_is_a_file_is_one_line(tmp_path: Path) -> None:
    """A .venv that is a plain file: venv's 'File exists' traceback and make's error; now one line, exit 2, before
    anything runs (make clean still removes it)."""
    root = _checkout(tmp_path)
    (root / ".venv").write_text("")
    proc = _make(root, "run")
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stdout + proc.stderr
    assert ".venv is not a folder (a file of that name?): remove it" in proc.stderr
    assert _make(root, "-n", "clean", "run").returncode == 0


@needs_make
def test_make_test_beside_another_goal_waits_for_one_install(tmp_path: Path) -> None:
    # make -j2 run test: the sub-make of `test` would install into the same .venv at the same time as `run`'s.
    root = _checkout(tmp_path)
    db = _make(root, "-n", "-p", "run", "test").stdout
    assert "\ntest: install\n" in db
    # make -j2 test: the sub-make shares the parent's jobs ('-j2 forced in submake: resetting jobserver mode')
    parallel = _make(root, "-n", "-j2", "test")
    assert "warning" not in parallel.stderr and "install system-deps" in parallel.stdout, parallel.stderr


@needs_make
def test_a_non_ascii_checkout_starts_under_an_ascii_locale(tmp_path: Path) -> None:
    """A clone at a path that is not ASCII: Python 3.11 reads the editable install's .pth (which named the clone)
    in the locale's encoding, so under LC_ALL=C no Python of its .venv could start ('init_import_site ...
    UnicodeDecodeError'); make install now writes the .pth relative to site-packages."""
    root = _checkout(tmp_path, "Téléchargements")
    _venv(root, str(root / ".venv/bin/python"))
    (root / "here_mod.py").write_text("")
    site = subprocess.run([str(root / ".venv/bin/python"), "-c", "import site; print(site.getsitepackages()[0])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    pth = Path(site) / "__editable__.mlbench_ttt-0.1.0.pth"
    pth.write_text(f"{root}\n", encoding="utf-8")  # as setuptools writes it
    db = _make(root, "-p", "-n", "help").stdout
    code = next(line.split(" := ", 1)[1] for line in db.splitlines() if line.startswith("PTH_RELATIVE := "))
    subprocess.run([str(root / ".venv/bin/python"), "-c", code], check=True, timeout=60)
    assert pth.read_text() == "../../../..\n"
    proc = subprocess.run([str(root / ".venv/bin/python"), "-c", "import here_mod"], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path, env={"PATH": os.environ["PATH"], "LC_ALL": "C"})
    assert proc.returncode == 0, proc.stderr
