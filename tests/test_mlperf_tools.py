"""Each call mlbench makes into mlperf-logging's internals (mlbench/mlperf_tools.py), on known input.

An upgrade of the pinned package that renames, drops or changes one of them fails here, naming the call.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlbench import mlperf_tools as tools


def _log(path: Path, benchmark: str = "llama31_405b", gbs: int = 1152, samples: int = 46080,
         status: str = "success", unit: str = "samples_count") -> Path:
    t0 = 1_700_000_000_000
    lines = [("submission_benchmark", benchmark, {}), ("global_batch_size", gbs, {}), ("run_start", None, {}),
             ("eval_accuracy", 5.6, {unit: samples}), ("run_stop", None, {"status": status})]
    path.write_text("".join(":::MLLOG " + json.dumps({"namespace": "", "time_ms": t0 + i, "event_type": "POINT_IN_TIME",
                                                      "key": k, "value": v, "metadata": md}) + "\n"
                            for i, (k, v, md) in enumerate(lines)))
    return path


def _gpt3() -> tools.Rcp:
    return tools.Rcp("gpt3", "4.1.0")


def test_result_summarizer_compute_olympic_average():
    assert tools.olympic_average([5.0, 1.0, 3.0, 2.0, 4.0], 0, 1) == 3.0, \
        "result_summarizer._compute_olympic_average changed: olympic mean of 1..5 is no longer 3"
    assert tools.olympic_average([1.0, 2.0, 3.0], 1, 1) == 2.5, \
        "result_summarizer._compute_olympic_average changed: with one run dropped, only the fastest is left out"


def test_result_summarizer_get_scaling_factor(tmp_path):
    assert tools.scaling_factor(tmp_path) is None
    (tmp_path / "scaling.json").write_text('{"scaling_factor": 1.25}')
    assert tools.scaling_factor(tmp_path) == 1.25, "result_summarizer._get_scaling_factor changed"
    (tmp_path / "scaling.json").write_text('{"scaling_factor": NaN}')
    with pytest.raises(ValueError, match="scaling.json: scaling_factor is NaN, expected"):
        tools.scaling_factor(tmp_path)
    (tmp_path / "scaling.json").write_text("[" * 100000 + "]" * 100000)  # was a RecursionError out of score
    with pytest.raises(ValueError, match="scaling.json: not JSON .JSON nested too deeply to parse.$"):
        tools.scaling_factor(tmp_path)
    # a 400-digit int: OverflowError out of score (below float('inf') as an int); 1e308: a score of inf
    for factor in ("1" + "0" * 400, "1e308"):
        (tmp_path / "scaling.json").write_text(f'{{"scaling_factor": {factor}}}')
        with pytest.raises(ValueError, match=r"scaling.json: scaling_factor is 1.*, expected a positive number at "
                                             r"most 1000 \(the RCP check's factor"):
            tools.scaling_factor(tmp_path)
    # the summarizer's own error was "TypeError: JSONDecodeError.__init__() missing 2 required positional arguments"
    (tmp_path / "scaling.json").write_text("garbage")
    with pytest.raises(ValueError, match=r"scaling.json: not JSON \(Expecting value: line 1 column 1 \(char 0\)\)$"):
        tools.scaling_factor(tmp_path)
    # JSON with a UTF-8 BOM: the summarizer's reader refuses it (its TypeError, passed on as 'no scaling_factor')
    (tmp_path / "scaling.json").write_bytes(b'\xef\xbb\xbf{"scaling_factor": 1.25}')
    with pytest.raises(ValueError, match=r"scaling.json: begins with a UTF-8 byte order mark, which the official "
                                         r"summarizer's JSON reader refuses; remove it$"):
        tools.scaling_factor(tmp_path)


def test_rcp_checker_read_submission_file(tmp_path):
    assert tools.read_convergence(_log(tmp_path / "result_0.txt"), "5.0.0") == (True, 46080, 1152), \
        "rcp_checker.read_submission_file changed: (converged, samples, batch) of a plain log"
    assert tools.read_convergence(_log(tmp_path / "result_1.txt", status="aborted"), "5.0.0")[:2] == (False, 1e9), \
        "rcp_checker.read_submission_file changed: a non-converged run is no longer marked 1e9"


def test_rcp_checker_check_directory(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    files = [_log(logs / f"result_{i}.txt", gbs=4096, samples=1_200_000_000, benchmark="gpt3", unit="epoch_num")
             for i in range(3)]
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    ok, msg, factor, per_file = tools.rcp_check_files(files, "4.1.0", scratch)
    assert msg == "RCP found" and isinstance(ok, bool) and factor > 0, f"rcp_checker.check_directory changed: {msg}"
    assert per_file == [(True, 1_200_000_000, 4096)] * 3


def test_rcp_checker_glob_lists_the_files_in_the_order_given(tmp_path):
    """rcp_checker.check_directory lists the folder through its module's `glob`, which the adapter replaces to give
    the files in the real folder's order: a run logging no global_batch_size is passed over first, and stops the
    checker (KeyError: None) after another."""
    logs = tmp_path / "logs"
    logs.mkdir()
    good = [_log(logs / f"result_{i}.txt", gbs=4096, samples=1_200_000_000, benchmark="gpt3", unit="epoch_num")
            for i in range(3)]
    batchless = logs / "result_3.txt"
    batchless.write_text("".join(ln for ln in good[0].read_text().splitlines(keepends=True)
                                 if '"global_batch_size"' not in ln))
    for order, stops in (([batchless, *good], False), ([*good, batchless], True)):
        scratch = tmp_path / f"scratch_{stops}"
        scratch.mkdir()
        if stops:
            with pytest.raises(KeyError):
                tools.rcp_check_files(order, "4.1.0", scratch)
        else:
            assert tools.rcp_check_files(order, "4.1.0", scratch)[1] == "RCP found", \
                "rcp_checker.check_directory no longer lists the files through its module's glob in the order given"


SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "mlperf-results"


def test_rcp_reader_sees_the_same_in_the_relevant_lines(tmp_path):
    """rcp_checker.read_submission_file acts only on lines holding the strings the adapter keeps: on the copy it
    returns what it returns on the whole log (published logs where present, and a run that did not converge)."""
    logs = sorted(SHARED.glob("training_results_v*/*/results/*/*/result_0.txt"))[:6]
    logs.append(_log(tmp_path / "aborted.txt", status="aborted"))
    for i, log in enumerate(logs):
        ruleset = next((f"{p.name[18:]}.0" for p in log.parents if p.name.startswith("training_results_v")), "5.0.0")
        copy = tmp_path / f"copy_{i}.txt"
        tools.rcp_relevant_copy(log, copy)
        assert copy.stat().st_size < log.stat().st_size or log.name == "aborted.txt"
        assert tools.read_convergence(copy, ruleset) == tools.read_convergence(log, ruleset), \
            f"rcp_checker.read_submission_file reads lines the adapter leaves out ({log})"


def test_rcp_checker_rcp_data_and_pruned_rcp_data():
    r = _gpt3()
    assert r.batch_sizes(pruned=False) == [1536, 2048, 3072, 4096, 6144, 8192], "RCP_Checker.rcp_data changed"
    assert r.batch_sizes() == [2048, 3072, 4096, 6144, 8192], "RCP_Checker.pruned_rcp_data changed"


def test_rcp_checker_find_rcp():
    r = _gpt3()
    assert r.at(2048)["BS"] == 2048 and r.at(1536) is None, "RCP_Checker._find_rcp changed"


def test_rcp_checker_find_top_min_rcp_and_find_bottom_max_rcp():
    r = _gpt3()
    assert r.below(3000)["BS"] == 2048, "RCP_Checker._find_top_min_rcp changed"
    assert r.above(3000)["BS"] == 3072, "RCP_Checker._find_bottom_max_rcp changed"


def test_rcp_checker_find_min_rcp():
    assert _gpt3().smallest()["BS"] == 2048, "RCP_Checker._find_min_rcp changed"


def test_rcp_checker_create_interp_rcp():
    r = _gpt3()
    lo, hi = r.below(3000), r.above(3000)
    mid = r.interpolated(3000, lo, hi)
    assert mid["BS"] == 3000, "RCP_Checker._create_interp_rcp changed"
    assert min(lo["RCP Mean"], hi["RCP Mean"]) <= mid["RCP Mean"] <= max(lo["RCP Mean"], hi["RCP Mean"]), \
        "RCP_Checker._create_interp_rcp changed: the interpolated mean is not between its neighbours"


def test_rcp_checker_eval_submission_record():
    r = _gpt3()
    rec = r.at(2048)
    assert r.judge(rec, [rec["RCP Mean"] * 1.1] * 3) == (True, 1.0), "RCP_Checker._eval_submission_record changed"
    ok, factor = r.judge(rec, [rec["RCP Mean"] * 0.5] * 3)
    assert not ok and factor == pytest.approx(2.0), "RCP_Checker._eval_submission_record changed (too-fast set)"


def test_rcp_data_file():
    assert json.loads(tools.rcp_file("gpt3", "4.1.0").read_text()), "rcp_checker's rcps_<benchmark>.json moved"


def test_benchmark_meta_and_ruleset_folders():
    assert tools.required_runs("gpt3") == 3 and tools.required_runs("llama31_405b") == 3, \
        "benchmark_meta.get_result_file_counts changed"
    assert {"4.1.0", "5.0.0", "5.1.0"} <= set(tools.rulesets()), "the checker's training_X.Y.Z folders changed"
    assert "4.1.0" in tools.rulesets_with("gpt3"), "the checker's closed_<benchmark>.yaml files changed"
    # found by their files, the checker not imported (every command's registry asks)
    assert (tools._PKG / "mlp_compliance.py").is_file(), "the compliance checker's folder moved"
    assert tools.has_rules("4.1.0", "gpt3") and tools.has_rules("5.1.0", "llama31_8b")
    assert not tools.has_rules("99.9.9", "gpt3") and not tools.has_rules("4.1.0", "no_such_benchmark")


def test_a_missing_internal_names_the_call(monkeypatch):
    from mlperf_logging.result_summarizer import result_summarizer

    monkeypatch.delattr(result_summarizer, "_compute_olympic_average")
    with pytest.raises(tools.ToolsChanged, match=r"result_summarizer\._compute_olympic_average.*mlperf_tools\.py"):
        tools.olympic_average([1.0, 2.0, 3.0], 0, 1)


def test_only_the_adapter_reaches_into_mlperf_logging():
    """Every mlperf_logging import outside the log writer lives in mlbench/mlperf_tools.py."""
    root = Path(__file__).resolve().parents[1] / "mlbench"
    allowed = {root / "mlperf_tools.py", root / "mlperf_log.py"}
    offenders = [str(p.relative_to(root)) for p in root.rglob("*.py") if p not in allowed
                 and any(ln.lstrip().startswith(("from mlperf_logging", "import mlperf_logging"))
                         and "mllog" not in ln or 'find_spec("mlperf_logging' in ln
                         for ln in p.read_text().splitlines())]
    assert offenders == []


def test_rulesets_with_a_benchmark_are_those_whose_common_rules_accept_it() -> None:
    """5.1.0 keeps closed_bert.yaml, but its common rules' submission_benchmark check lists no bert: a BERT log under
    training_results_v5.1 was judged by 5.1.0 and every run FAILed, and refusals listed 5.1.0 as holding bert."""
    assert tools.rulesets_with("bert")[-1] == "5.0.0" and "5.1.0" not in tools.rulesets_with("bert")
    assert tools.rulesets_with("llama31_8b") == ["5.1.0", "6.0.0", "6.1.0"]
    # the innermost round a path names: the tree the files belong to
    assert tools.round_in_path(Path("/a/training_results_v4.1/x/training_results_v5.1/NVIDIA/results/s/b")) == "5.1.0"
    assert tools.ruleset_in_path(Path("/training_results_v5.1/NVIDIA/results/s/bert"), "bert") is None
