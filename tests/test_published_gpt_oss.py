"""A published MLPerf Training v6.0 gpt_oss_20b submission (tests/data/published, Apache-2.0): CoreWeave's 8x8 B200
at global batch 64, scored by `mlbench score` and by MLCommons' official result summarizer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_analysis_score import OFFICIAL

PUBLISHED = Path(__file__).resolve().parent / "data" / "published"
COREWEAVE = PUBLISHED / "training_results_v6.0" / "CoreWeave"


def test_published_gpt_oss_20b_score_equals_the_official_summarizer() -> None:
    proc = subprocess.run([sys.executable, "-c", OFFICIAL, str(COREWEAVE)], capture_output=True, text=True,
                          timeout=300, check=True)
    official = json.loads(proc.stdout)
    from mlbench.analysis.score import score_path

    ours = {s.folder: s for s in score_path(PUBLISHED, jobs=1)}
    assert set(ours) == set(official) and len(ours) == 1
    folder, s = next(iter(ours.items()))
    assert official[folder] == pytest.approx(26.982652, abs=1e-4)  # the summarizer's olympic mean, minutes
    assert s.benchmark == "gpt_oss_20b" and s.ruleset == "6.0.0"
    assert s.score_min == pytest.approx(official[folder], abs=1e-4)
    assert s.official_score_min == pytest.approx(official[folder], abs=1e-4)
    assert len(s.runs) == 10 and all(r.compliant and r.counted for r in s.runs)
    assert s.rcp.status == "Pass"
