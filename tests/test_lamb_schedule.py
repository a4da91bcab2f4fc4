"""LAMB against a hand-computed step, and the shape of BERT's schedule (poly decay with overlaid warm-up)."""

from __future__ import annotations

import math
import types

import pytest
import torch

from mlbench import registry
from mlbench.train.optim.lamb import LAMB
from mlbench.train.optim.schedule import PolyWarmupOverlay, build


def test_lamb_single_step_by_hand() -> None:
    w0 = torch.tensor([3.0, 4.0])  # ||w|| = 5
    g = torch.tensor([1.0, -2.0])
    b1, b2, eps, wd, lr = 0.9, 0.999, 1e-6, 0.1, 0.01
    w = torch.nn.Parameter(w0.clone())
    bias = torch.nn.Parameter(torch.tensor([1.0, 1.0]))
    opt = LAMB([{"params": [w]}, {"params": [bias], "weight_decay": 0.0, "layer_adaptation": False}],
               lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)
    w.grad, bias.grad = g.clone(), g.clone()
    opt.step()
    # step 1: m^ = g, v^ = g^2, so the Adam part is g / (|g| + eps) = sign(g) (almost)
    adam = [1.0 / (1.0 + eps), -2.0 / (2.0 + eps)]
    u = [adam[0] + wd * 3.0, adam[1] + wd * 4.0]
    ratio = 5.0 / math.hypot(*u)
    expected = [3.0 - lr * ratio * u[0], 4.0 - lr * ratio * u[1]]
    assert w.detach().tolist() == pytest.approx(expected, rel=1e-6)
    # excluded parameter: no weight decay, no trust ratio
    assert bias.detach().tolist() == pytest.approx([1.0 - lr * adam[0], 1.0 - lr * adam[1]], rel=1e-6)
    # second step: bias-corrected moments
    w.grad = torch.tensor([0.5, 0.5])
    before = w.detach().clone()
    opt.step()
    m = [b1 * (1 - b1) * gi + (1 - b1) * 0.5 for gi in g.tolist()]
    v = [b2 * (1 - b2) * gi**2 + (1 - b2) * 0.25 for gi in g.tolist()]
    u2 = [(mi / (1 - b1**2)) / (math.sqrt(vi / (1 - b2**2)) + eps) + wd * wi
          for mi, vi, wi in zip(m, v, before.tolist(), strict=True)]
    r2 = math.hypot(*before.tolist()) / math.hypot(*u2)
    assert w.detach().tolist() == pytest.approx([wi - lr * r2 * ui for wi, ui in zip(before.tolist(), u2, strict=True)],
                                                rel=1e-6)


def test_lamb_zero_weight_keeps_ratio_one() -> None:
    w = torch.nn.Parameter(torch.zeros(3))
    opt = LAMB([w], lr=0.1, weight_decay=0.0)
    w.grad = torch.tensor([1.0, 1.0, 1.0])
    opt.step()
    assert w.detach().tolist() == pytest.approx([-0.1] * 3, rel=1e-5)


def _groups(n: int = 2) -> types.SimpleNamespace:
    return types.SimpleNamespace(param_groups=[{"wd_mult": 1.0}, {"wd_mult": 0.0}][:n])


def test_bert_schedule_shape() -> None:
    # BERT's reference: lr 0.00288293, warm-up 287 from step -76, poly power 1 over 600 steps to 0
    bench = registry.load("bert")
    o = bench.optimizer
    opt = _groups()
    sched = build(opt, o, bench.train.global_batch_size)
    assert isinstance(sched, PolyWarmupOverlay)
    lr = 0.00288293
    seen = []
    for _ in range(601):
        seen.append(sched.get_lr(opt.param_groups[0]))
        assert opt.param_groups[0]["lr"] == seen[-1]
        sched.step(1)
    assert seen[0] == pytest.approx(lr * 76 / 287)  # warm-up starts part-way: (0 - (-76)) / 287
    assert seen[100] == pytest.approx(lr * 176 / 287)
    assert seen[210] == pytest.approx(lr * 286 / 287)  # last warm-up step
    assert seen[211] == pytest.approx(lr * (1 - 211 / 600))  # then the poly decay that ran underneath
    assert seen[400] == pytest.approx(lr * (1 - 400 / 600))
    assert seen[600] == 0.0
    assert max(seen) < lr  # the overlay meets the decay below the peak
    # weight decay follows megatron's per-group multiplier (bias and norms excluded)
    assert opt.param_groups[0]["weight_decay"] == pytest.approx(0.0166629)
    assert opt.param_groups[1]["weight_decay"] == 0.0


def test_schedule_without_overlay_is_megatrons() -> None:
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    bench = registry.load("gpt3", tiny=True)
    opt = _groups()
    sched = build(opt, bench.optimizer, bench.train.global_batch_size)
    assert isinstance(sched, OptimizerParamScheduler)
    assert opt.param_groups[0]["lr"] == 0.0  # linear warm-up from 0
    sched.step(10)
    assert opt.param_groups[0]["lr"] == pytest.approx(3.0e-3)
