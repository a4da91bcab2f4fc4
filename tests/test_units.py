"""Fast checks of the pieces: the source's floor, layout rules, expressions, results publishing, the log."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from mlbench import layout, registry
from mlbench.errors import UserError
from mlbench.mlperf_log import MLPerfLog, finalize_aborted, read
from mlbench.run_plan import eval_schedule
from mlbench.spec import evaluate
from mlbench.train.data.markov import MarkovSource


def test_entropy_rate_matches_empirical_conditional_entropy() -> None:
    src = MarkovSource(64, branching=4, concentration=0.5, seed=7)
    seqs = src.sample(400, 200, np.random.default_rng(0))
    nll = -np.log(src.transition[seqs[:, :-1], seqs[:, 1:]]).mean()  # the true model's cross-entropy
    assert abs(nll - src.entropy_rate) < 0.02
    assert np.allclose(src.stationary @ src.transition, src.stationary, atol=1e-10)


def test_masked_lm_floor_is_below_one_and_above_chance() -> None:
    src = MarkovSource(64, branching=4, concentration=0.5, seed=7)
    acc = src.masked_lm_best_accuracy(32, 0.15, n=200)
    assert 1 / 64 < acc < 1.0


def test_masked_lm_bound_is_the_accuracy_with_every_neighbour_seen() -> None:
    """The cheap bound a target is checked against before launch: above the masked-token floor at any masking,
    and that floor itself where almost no neighbour is masked."""
    src = MarkovSource(31, branching=4, concentration=1.0, seed=1234)
    bound = src.masked_lm_accuracy_bound(32)
    assert src.masked_lm_best_accuracy(32, 0.3, n=300) < bound
    assert src.masked_lm_best_accuracy(32, 0.01, n=3000) == pytest.approx(bound, abs=0.01)


def test_masked_lm_bound_at_the_masking_rate_is_the_floor() -> None:
    """The bound a target is checked against counts the masked neighbours (tiny BERT masks 30 %): with every
    neighbour seen it was 0.9205, and a target between it and the floor (0.8135) was accepted and unreachable.
    Computed (nearest unmasked neighbours' law, Bayes accuracy per gap), it agrees with the sampled floor and
    stays a bound as it computes fewer gaps."""
    src = MarkovSource(31, branching=4, concentration=1.0, seed=1234)
    bound = src.masked_lm_accuracy_bound(32, 0.3)
    assert bound == pytest.approx(0.8135, abs=5e-4) and bound < src.masked_lm_accuracy_bound(32) - 0.1
    assert src.masked_lm_best_accuracy(32, 0.3, n=1000) == pytest.approx(bound, abs=0.01)
    shallow = MarkovSource(31, branching=4, concentration=1.0, seed=1234)
    shallow.__dict__["_bound_depth"] = lambda length: 2  # (an instance's own: gaps past 2 counted as 2's)
    assert bound < shallow.masked_lm_accuracy_bound(32, 0.3) < src.masked_lm_accuracy_bound(32)


@pytest.mark.parametrize(("name", "margin"), [("gpt3", 0.15), ("llama31_405b", 0.15), ("bert", -0.2)])
def test_tiny_targets_are_the_floor_and_the_stated_margin(name: str, margin: float) -> None:
    """Each tiny target is the source's best achievable value plus the margin its note states."""
    from mlbench.train.data.source import markov_source

    b = registry.load(name, tiny=True)
    src = markov_source(b)
    if b.quality.metric == "log_perplexity":
        floor = src.entropy_rate
    else:
        floor = src.masked_lm_best_accuracy(b.model.seq_length, b.data.mask_prob, n=1500)
    assert f"floor {'+' if margin > 0 else '-'} {abs(margin):g}" in b.quality.note
    assert b.quality.target == pytest.approx(floor + margin, abs=0.01)


def test_layout_resolution_and_reference_layouts() -> None:
    b = registry.load("gpt3")
    ly = layout.resolve(b, nodes=32, nproc_per_node=8)  # NVIDIA's 32x8 reference layout
    assert (ly.tp, ly.pp, ly.vp, ly.dp, ly.global_batch_size) == (4, 8, 6, 8, 2048)
    ly = layout.resolve(b, nodes=64, nproc_per_node=8, tp=8, pp=8, global_batch_size=1536)
    assert ly.dp == 8 and ly.micro_batch_size == 2 and ly.num_microbatches == 96 and ly.source == "flags"
    # No 4096-device reference: the 2048-device shape (gbs 1152) leaves 36 micro-batches, not a multiple of pp 8
    # as the interleaved schedule needs, so the 8192-device one (gbs 1536, 48 micro-batches) is taken.
    llama = layout.resolve(registry.load("llama31_405b"), nodes=1024, nproc_per_node=4)
    assert (llama.tp, llama.pp, llama.vp, llama.cp, llama.dp, llama.global_batch_size) == (8, 8, 8, 2, 32, 1536)
    assert llama.source.startswith("adapted from the 8192-device reference layout")
    # a batch given over the reference's: the source said the reference's alone (a dry run's 'layout from')
    given = layout.resolve(b, nodes=64, nproc_per_node=8, global_batch_size=1024)
    assert given.source.endswith("; --global-batch-size from the flags") and given.global_batch_size == 1024
    assert not layout.resolve(b, nodes=64, nproc_per_node=8).source.endswith("from the flags")
    with pytest.raises(UserError, match="sequence length 2048 must divide by 2 x cp"):
        layout.resolve(b, nodes=3, nproc_per_node=1, tp=1, pp=1, cp=3)
    with pytest.raises(UserError, match="needs pipeline parallelism"):
        layout.resolve(b, nodes=2, nproc_per_node=1, tp=2, pp=1, vp=2)


def test_expressions_are_exact_and_restricted() -> None:
    assert evaluate("ceil(265 * 1536 / global_batch_size)", global_batch_size=2048) == 199
    assert evaluate("global_batch_size * 8e-5 / 1152", global_batch_size=2304) == 2304 * 8e-5 / 1152
    with pytest.raises(UserError, match="cannot evaluate"):
        evaluate("__import__('os')", global_batch_size=1)


def test_finalize_aborted_appends_run_stop_once(tmp_path: Path) -> None:
    log_path = tmp_path / "log.txt"
    log = MLPerfLog(log_path)
    log.start("run_start")
    log.close()
    assert finalize_aborted(log_path, "rank 1 died")
    assert not finalize_aborted(log_path, "again")
    stops = [e for e in read(log_path) if e["key"] == "run_stop"]
    assert len(stops) == 1 and stops[0]["metadata"] == {**stops[0]["metadata"], "status": "aborted",
                                                         "reason": "rank 1 died"}


def test_two_logs_in_one_process_do_not_duplicate_lines(tmp_path: Path) -> None:
    a, b = MLPerfLog(tmp_path / "a"), MLPerfLog(tmp_path / "b")
    a.event("seed", 1)
    b.event("seed", 2)
    a.close()
    b.close()
    assert [e["value"] for e in read(tmp_path / "a")] == [1]
    assert [e["value"] for e in read(tmp_path / "b")] == [2]


def test_a_log_line_names_its_call_site_without_reading_source(tmp_path: Path, monkeypatch) -> None:
    """Rank 0 logs a line a training step (tracked_stats). mllog's own call-site lookup went through
    inspect.getframeinfo: a scan of sys.modules and a stat of the source file, 40-75 us of CPU a line, most of the
    line's cost. The file and line are the same, read from the frame; no line reaches inspect or linecache."""
    import inspect
    import linecache

    from mlperf_logging.mllog import mllog

    from mlbench import mlperf_log

    assert mllog.get_caller is mlperf_log.call_site  # what MLLogger calls for every line
    looked: list[str] = []
    for owner, name in ((inspect, "getframeinfo"), (inspect, "getmodule"), (linecache, "checkcache")):
        real = getattr(owner, name)
        monkeypatch.setattr(owner, name, lambda *a, _n=name, _f=real, **k: looked.append(_n) or _f(*a, **k))
    log = MLPerfLog(tmp_path / "log.txt")
    line = inspect.currentframe().f_lineno + 2
    for step in range(50):
        log.event("tracked_stats", value={"loss": 1.0}, metadata={"step": step})
    log.close()
    monkeypatch.undo()
    assert looked == []
    events = read(tmp_path / "log.txt")
    assert [e["metadata"]["step"] for e in events] == list(range(50))
    assert {(e["metadata"]["file"], e["metadata"]["lineno"]) for e in events} == {(__file__, line)}
    # mllog's own answer, read from a frame's source, for the same frame
    here = inspect.getframeinfo(inspect.currentframe())
    assert mlperf_log.call_site(1) == {"file": here.filename, "lineno": here.lineno + 1}
    assert mlperf_log.call_site(1, root_dir=str(Path(__file__).parent))["file"] == Path(__file__).name


def test_every_benchmark_file_loads_with_its_tiny_variant() -> None:
    for name in registry.names():
        full = registry.load(name)
        assert full.variant == "full" and full.sources
        assert math.isfinite(full.quality.target)


def test_mfu_peak_is_per_device_and_precision() -> None:
    from mlbench import hardware

    assert hardware.peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == 989.4
    assert hardware.peak_tflops("NVIDIA H100 PCIe", "bf16") == 756.5  # the more specific name wins
    assert hardware.peak_tflops("NVIDIA GB200", "bf16") == 2500.0
    assert hardware.peak_tflops("Some New GPU", "bf16") is None  # unknown: no MFU rather than a guess
    assert "not defined on CPU" in hardware.mfu_note("cpu", "cpu", "fp32")


def _evals(name: str, gbs: int, until: int) -> list[int]:
    next_eval, steps = eval_schedule(registry.load(name), gbs), [0]
    while (s := next_eval(steps[-1])) <= until:
        steps.append(s)
    return steps[1:]


def test_evals_fall_on_multiples_of_the_interval_in_samples() -> None:
    # BERT at 8192: every 225,000 samples, the first step at or past each multiple (as NVIDIA's reference
    # does), not every ceil(225000 / 8192) = 28 steps, which would be 9 steps late by the 18th eval.
    bert = _evals("bert", 8192, 500)
    assert bert[:4] == [28, 55, 83, 110]
    assert all(s * 8192 >= k * 225000 > (s - 1) * 8192 for k, s in enumerate(bert, 1))
    assert _evals("gpt3", 2048, 60) == [12, 24, 36, 48, 60]  # 24576 / 2048: the batch divides the interval
    assert _evals("llama31_405b", 1000, 60) == [19, 38, 57]  # ceil(18432 / 1000) steps: rounded in the file


def test_zarr_arrays_read_by_slice_across_chunks(tmp_path: Path) -> None:
    """The reference checkpoint's zarr arrays (uncompressed, '<f4' or tensorstore's 'bfloat16', edge chunks
    stored whole): any slice a rank asks for, across chunk borders, with layer indices and clipped ends."""
    import torch
    from zarr_reference import write_array

    from mlbench.train.checkpoint.zarr_reference import array_meta, read

    x = torch.randn(3, 17, 24)
    write_array(tmp_path / "f32", x.numpy())  # chunks [1, 17, 3]: 17 does not divide by 8
    write_array(tmp_path / "bf16", x.bfloat16().view(torch.uint16).numpy(), dtype="bfloat16")
    for index in [(), (1,), (2, slice(3, 11)), (0, slice(5, 17), slice(2, 23)), (slice(1, 3), slice(16, 40))]:
        assert torch.equal(read(tmp_path / "f32", index), x[index]), index
        assert torch.equal(read(tmp_path / "bf16", index), x.bfloat16()[index]), index
    wide = torch.randn(400, 16)  # over 200 rows: chunks [50, 2]
    write_array(tmp_path / "wide", wide.numpy())
    assert torch.equal(read(tmp_path / "wide", (slice(37, 301), slice(3, 9))), wide[37:301, 3:9])
    # numcodecs' pickle codec as a "compressor" unpickled (ran) each chunk it read, where numcodecs is installed
    meta = json.loads((tmp_path / "wide" / ".zarray").read_text())
    (tmp_path / "wide" / ".zarray").write_text(json.dumps({**meta, "compressor": {"id": "pickle"}}))
    with pytest.raises(Exception, match=r"compressor 'pickle'; a zarr checkpoint's arrays are compressed with one"):
        read(tmp_path / "wide", ())
    with pytest.raises(Exception, match=r"compressor 'pickle'"):  # as the check before launch lists the arrays
        array_meta(tmp_path / "wide")


def test_finalize_aborted_ends_a_log_that_never_reached_run_start(tmp_path: Path) -> None:
    """A rank killed during init, after its preamble: the log had no run_stop, as rank 0 itself writes for a run
    that fails there."""
    log_path = tmp_path / "log.txt"
    log = MLPerfLog(log_path)
    log.event("seed", 1)
    log.close()
    assert finalize_aborted(log_path, "killed in init")
    assert [e["key"] for e in read(log_path)] == ["seed", "train_samples", "run_stop"]
    assert not finalize_aborted(tmp_path / "never-begun.txt", "no plan: left alone")
    assert not (tmp_path / "never-begun.txt").exists()


def test_finalize_aborted_counts_train_samples_in_the_logs_unit(tmp_path: Path) -> None:
    """gpt3 logs samples as tokens (eval metadata and rank 0's own train_samples); the supervisor's train_samples
    was in samples: 2048 times too small for a run that rank 0 could not end itself."""
    from mlbench.run_plan import RunPlan

    bench = registry.load("gpt3", tiny=True)
    assert bench.eval_unit_size == bench.model.seq_length > 1
    plan = RunPlan(benchmark=bench, layout={"global_batch_size": 16}, seed=1, run_dir=str(tmp_path), system="s")
    log = MLPerfLog(tmp_path / "log.txt")
    log.event("tracked_stats", value={}, metadata={"step": 3, "samples_count": 48})
    log.close()
    assert finalize_aborted(tmp_path / "log.txt", "killed", plan)
    assert next(e for e in read(tmp_path / "log.txt") if e["key"] == "train_samples")["value"] == \
        48 * bench.model.seq_length



@pytest.mark.parametrize(("n", "mbs"), [(32, 16), (256, 43)])  # a training batch; the eval set, padded
def test_masked_lm_masks_a_row_the_same_on_every_data_parallel_layout(n: int, mbs: int) -> None:
    """Tiny bert at DP 2 masked rank 1's rows with the draws rank 0 used for its own: its step-1 loss was 3.4807
    against one process's 3.4747, and its eval set (the masks too) changed with the layout."""
    from types import SimpleNamespace

    from mlbench.train.data.source import MarkovTokens
    from mlbench.train.objectives import MaskedLM
    from mlbench.train.step import Stepper

    source = MarkovTokens(MarkovSource(31, branching=4, concentration=1.0, seed=1234), 32, n)

    def batch(dp: int) -> dict[str, np.ndarray]:
        """The global batch's rows, padding left out, as the DP ranks make them."""
        per_rank, out = -(-n // (dp * mbs)) * mbs, []
        for rank in range(dp):
            me = SimpleNamespace(dp=dp, dp_rank=rank, parts=SimpleNamespace(source=source,
                                                                            objective=MaskedLM(31, 0.3)))
            rng = np.random.default_rng([3, 5])
            got = Stepper._microbatches(me, n, mbs, lambda rows, rng=rng: source.train_batch(5, rng, rows), rng)
            real = min(per_rank, max(n - rank * per_rank, 0))
            out.append({k: np.concatenate([b[k].numpy() for b in got])[:real] for k in ("tokens", "labels")})
        return {k: np.concatenate([o[k] for o in out]) for k in ("tokens", "labels")}

    one = batch(1)
    for dp in (2, 4):
        assert all(np.array_equal(v, one[k]) for k, v in batch(dp).items())


def test_each_pipeline_stage_draws_its_initial_weights_from_its_own_seed(monkeypatch) -> None:
    """Every stage seeded the run's seed: stages holding layers of one shape (llama31_8b's 32 layers at --pp 4,
    stages 1 and 2) started from the same weights. Stage 0 keeps the seed; each other stage gets its own."""
    import torch
    from megatron.core import parallel_state as ps

    from mlbench.train.build import seed_model_init

    monkeypatch.setattr("megatron.core.tensor_parallel.random.model_parallel_cuda_manual_seed", lambda seed: None)
    draws = []
    for stage in range(4):
        monkeypatch.setattr(ps, "get_pipeline_model_parallel_rank", lambda stage=stage: stage)
        seed_model_init(7)
        draws.append(torch.randn(8))
    torch.manual_seed(7)
    assert torch.equal(draws[0], torch.randn(8))
    assert all(not torch.equal(draws[i], draws[j]) for i in range(4) for j in range(i))
