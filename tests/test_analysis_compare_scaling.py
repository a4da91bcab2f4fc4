"""Compare and scaling on published logs (skip without ../shared), and the published table."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlbench.analysis import published
from mlbench.analysis.commands import compare as compare_cmd
from mlbench.analysis.compare import build_comparison
from mlbench.analysis.scaling import build_scaling, efficiency

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "mlperf-results"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason=f"{SHARED} is absent (a user's clone has no ../shared)")
V41 = SHARED / "training_results_v4.1"
EOS = SHARED / "training_results_v5.0/NVIDIA/results"


def test_published_table_rows_are_cited():
    rows = published.load()
    assert len(rows) >= 4
    for r in rows:
        assert r.source.strip().startswith("http"), r.id
        assert r.verified, r.id
    assert published.get("published:nvidia-eos-gpt3-v3.1").devices == 10752


@needs_shared
def test_compare_eos_against_trillium_gpt3(tmp_path):
    cmp = build_comparison([str(V41 / "NVIDIA"), str(V41 / "Google"), "published:nvidia-eos-gpt3-v3.1"],
                           with_score=False)
    eos, tpu, pub = cmp.entries
    assert eos.step_source == "tracked_stats" and tpu.step_source == "blocks"
    assert eos.step_stats()["median"] == pytest.approx(18.378, abs=1e-3)
    assert tpu.devices == 1024 and eos.devices == 256
    assert pub.ttt_min == pytest.approx(3.92)
    # model FLOPs: GPT-3 175B's 2.2046e15 per sample x 2048 samples per 18.378 s step / 256 devices
    assert eos.model_tflops_per_device() == pytest.approx(2.2046e15 * 2048 / 18.378 / 256 / 1e12, rel=1e-3)
    assert "gradient_accumulation_steps" in cmp.differing_hyperparams()
    html = tmp_path / "r.html"
    res = CliRunner().invoke(compare_cmd, [str(V41 / "NVIDIA"), str(V41 / "Google"), "--no-score",
                                           "--html", str(html)])
    assert res.exit_code == 0, res.output
    assert html.read_text().count("<img") == 2


@needs_shared
def test_scaling_on_the_eos_llama_series_matches_a_hand_computation():
    sc = build_scaling([EOS / f"eos-dfw_n{n}_ngc25.01_nemo" for n in (64, 256, 304, 320, 1024)])
    n64, n256 = sc.points[0], sc.points[1]
    assert (n64.devices, n256.devices) == (512, 2048)
    # Hand computation from the logs: median tracked train_step_time 55.1324 s at 512 GPUs and
    # 14.2192 s at 2048 GPUs, both at global batch 1152: 55.1324 x 512 / (14.2192 x 2048) = 0.9693.
    assert n64.step_s == pytest.approx(55.1324, abs=1e-3) and n256.step_s == pytest.approx(14.2192, abs=1e-3)
    (_, e_base), (_, e256) = sc.strong_step[1152]
    assert e_base == 1.0 and e256 == pytest.approx(55.1324 * 512 / (14.2192 * 2048), abs=1e-4)
    # Time to train (olympic mean of the run times): 230.6756 min at 512, 19.6379 min at 8192.
    e1024 = dict((q.devices, e) for q, e in sc.strong_ttt)[8192]
    assert e1024 == pytest.approx(efficiency(230.6756, 512, 19.6379, 8192), abs=1e-4)
    assert not sc.weak and any("per-device batch" in n for n in sc.notes)


@needs_shared
def test_scaling_refuses_a_configuration_given_twice():
    """The same folder twice, or inside another PATH, was one configuration counted as two (efficiency 1.0)."""
    from mlbench.errors import UserError

    n64 = EOS / "eos-dfw_n64_ngc25.01_nemo"
    with pytest.raises(UserError, match=r"eos-dfw_n64_ngc25.01_nemo/llama31_405b is given twice; scaling takes"):
        build_scaling([n64, n64])
    with pytest.raises(UserError, match=r"given twice \(in .*/results and in .*eos-dfw_n64_ngc25.01_nemo\)"):
        build_scaling([EOS, n64])


@needs_shared
def test_compare_refuses_an_entry_given_twice():
    """The same set twice (or inside another PATH), the same run file or published row twice, was compared with
    itself: 'no differences'. A run beside the set that holds it is a comparison, and stays one."""
    from mlbench.errors import UserError

    n64 = EOS / "eos-dfw_n64_ngc25.01_nemo/llama31_405b"
    for paths, match in (([n64, n64], r"llama31_405b is given twice; compare takes each"),
                         ([EOS, n64], r"given twice \(in .*/results and in .*nemo/llama31_405b\)"),
                         ([n64 / "result_0.txt", n64 / "result_0.txt"], r"result_0.txt is given twice"),
                         ([n64, "published:nvidia-eos-gpt3-v3.1", "published:nvidia-eos-gpt3-v3.1"],
                          r"published:nvidia-eos-gpt3-v3.1 is given twice")):
        with pytest.raises(UserError, match=match):
            build_comparison([str(p) for p in paths], with_score=False)
    cmp = build_comparison([str(n64), str(n64 / "result_0.txt")], with_score=False)
    assert [e.kind for e in cmp.entries] == ["set", "run"]


def test_compare_tells_apart_two_sets_of_one_label(tmp_path, monkeypatch):
    """One organisation's system and benchmark from two results trees (two copies of a submission, a rerun kept
    apart) had the same label: the table's two columns, the notes and the plots' legends could not be told apart.
    Each now carries its folder after the label."""
    amd = Path(__file__).parent / "data/mlperf-results/training_results_v5.1/AMD"
    for tree in ("before", "after"):
        shutil.copytree(amd, tmp_path / tree / "AMD")
    monkeypatch.chdir(tmp_path)
    sets = [f"{tree}/AMD/results/MI355X_EPYC_9575F_pytorch/llama31_8b" for tree in ("before", "after")]
    cmp = build_comparison(sets, with_score=False)
    assert [e.label for e in cmp.entries] == [f"AMD/MI355X_EPYC_9575F_pytorch/llama31_8b [{s}]" for s in sets]
    res = CliRunner().invoke(compare_cmd, [*sets, "--no-score"])
    assert res.exit_code == 0, res.output
    assert "[before/AMD" in res.output and "[after/AMD" in res.output


def test_scaling_says_a_published_row_is_for_compare(cli, tmp_path):
    """`scaling RUNS published:<id>` (compare's form) said only 'published:<id>: no such file or folder'."""
    out = cli("scaling", tmp_path, "published:nvidia-eos-gpt3-v3.1")
    assert out.returncode == 2 and out.stdout == "" and out.stderr == (
        "error: published:nvidia-eos-gpt3-v3.1: a published row is one headline time, with no runs or steps to "
        "scale; scaling takes folders of result logs (compare takes published:<id>)\n"), out.stdout + out.stderr
