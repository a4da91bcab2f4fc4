"""Installing says only what matters: the packaging metadata builds without setuptools' deprecation warnings
(an SPDX license expression and the license file, as PEP 639 has them), and the wheel carries the data files."""

from __future__ import annotations

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
