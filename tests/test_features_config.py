"""The features' configuration without training: context parallel's load-balanced shares, what reaches megatron's
configs (recompute, per-token loss under CP, FP8 with CUDA mocked: this machine has no GPU, nothing is built on
one), and the features refused before launch with one line and exit 2."""

from __future__ import annotations

import torch

from mlbench import registry
from mlbench.train import model as M
from mlbench.train.build import ddp_config
from mlbench.train.model.context_parallel import positions, share


def test_context_parallel_shares_are_megatrons_load_balanced_chunks() -> None:
    # seq 16 at cp 2: four chunks of 4; rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2
    assert positions(16, 2, 0).tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert positions(16, 2, 1).tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    for cp in (2, 4):
        held = torch.cat([positions(64, cp, r) for r in range(cp)])
        assert sorted(held.tolist()) == list(range(64))  # every position once
        # balanced causal work: each rank's queries see the same number of keys in total
        assert len({int((positions(64, cp, r) + 1).sum()) for r in range(cp)}) == 1
    tokens = torch.arange(2 * 16).reshape(2, 16)
    batch = {"tokens": tokens, "labels": tokens + 1, "loss_mask": torch.ones(2, 16),
             "position_ids": torch.arange(16).expand(2, 16), "next_sentence_labels": torch.tensor([0, 1])}
    mine = share(batch, 2, 1)
    assert mine["tokens"][1].tolist() == list(range(20, 28))
    assert torch.equal(mine["labels"], mine["tokens"] + 1) and mine["position_ids"][0].tolist() == list(range(4, 12))
    assert mine["next_sentence_labels"].tolist() == [0, 1]


def test_recompute_and_context_parallel_reach_transformer_config() -> None:
    m = registry.load("gpt3", tiny=True).model
    none = M.transformer_config(m, tp=1, pp=1, vp=1, cp=1, bf16=False)
    # every layout sums the loss and divides it by the step's scored tokens (under CP: of the whole data x
    # context-parallel group)
    assert none.recompute_granularity is None and none.calculate_per_token_loss
    sel = M.transformer_config(m, tp=1, pp=1, vp=1, cp=1, bf16=False, features={"recompute": "selective"})
    assert sel.recompute_granularity == "selective" and sel.recompute_method is None
    full = M.transformer_config(m, tp=1, pp=1, vp=1, cp=2, bf16=False,
                                features={"recompute": "full", "recompute_method": "block", "recompute_layers": 2})
    assert (full.recompute_granularity, full.recompute_method, full.recompute_num_layers) == ("full", "block", 2)
    assert full.calculate_per_token_loss


def test_fp8_reaches_transformer_config_and_ddp_only_with_fp8(monkeypatch) -> None:
    m = registry.load("llama31_405b", tiny=True).model
    f = {"fp8_param_gather": True}
    cpu = M.transformer_config(m, tp=1, pp=1, vp=1, cp=1, bf16=False, features=f)
    assert cpu.fp8 is None and not cpu.fp8_param
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    gpu = M.transformer_config(m, tp=1, pp=1, vp=1, cp=1, bf16=True, fp8=True, features=f)
    assert (gpu.fp8, gpu.fp8_param, gpu.fp8_recipe) == ("hybrid", True, "delayed")
    bf16 = M.transformer_config(m, tp=1, pp=1, vp=1, cp=1, bf16=True, features=f)
    assert bf16.fp8 is None and not bf16.fp8_param
    assert ddp_config(f, fp8=True).fp8_param_gather and not ddp_config(f, fp8=False).fp8_param_gather


def test_features_a_run_cannot_take_are_refused_before_launch(tmp_path, cli) -> None:
    cases = {
        ("bert", "--distributed-optimizer"): "--no-distributed-optimizer",  # LAMB's trust ratio: whole parameters
        ("bert", "--cp", "2"): "--cp 1",  # our CP attention is causal; BERT's is padding-masked
        ("gpt_oss_20b", "--cp", "2"): "--cp 1",  # ... and has no sliding window
        ("bert", "--tp", "2", "--sequence-parallel"): "--no-sequence-parallel",  # its LM head's norm refuses SP
    }
    for (name, *flags), fix in cases.items():
        proc = cli("run", name, "--tiny", "--nproc-per-node", "2", *flags, "--results", str(tmp_path / "r"))
        assert proc.returncode == 2 and proc.stdout == "", (proc.stdout, proc.stderr)  # (a refusal: stderr only)
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: ") and fix in lines[0], lines
    assert not (tmp_path / "r").exists()  # nothing written
    # (the distributed optimizer's checkpoints save and load: tests/test_features.py)


def test_a_failed_memory_measurement_is_recorded_not_raised(monkeypatch) -> None:
    """After run_stop the run's result is settled: a measurement or estimate that fails goes into the record."""
    from types import SimpleNamespace

    from mlbench.planner import memory
    from mlbench.train import measured_memory

    def fail(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.setattr(measured_memory, "measure", fail)
    monkeypatch.setattr(memory, "estimate", fail)
    plan = SimpleNamespace(benchmark=None, layout={})
    out = measured_memory.record(plan, None, SimpleNamespace(first_micro_batch=lambda: None), True)
    assert out["measured"] == {"error": "RuntimeError: boom"}
    assert out["estimated"]["error"].startswith(("RuntimeError", "KeyError"))
