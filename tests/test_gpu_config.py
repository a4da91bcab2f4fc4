"""What the model builder asks of megatron-core on a GPU, checked on CPU by making CUDA look present for the
config alone (mocked: this machine has no GPU; nothing is built or run on one)."""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F

from mlbench import registry
from mlbench.train import model as M


def test_gelu_tanh_uses_megatrons_fused_kernel_on_gpu_and_the_tanh_gelu_on_cpu(monkeypatch) -> None:
    m = registry.load("gpt3", tiny=True).model
    assert m.activation == "gelu_tanh"
    cpu = M.transformer_config(m, tp=1, pp=1, vp=1, cp=1, bf16=False)
    assert not cpu.bias_activation_fusion
    assert isinstance(cpu.activation_func, partial) and cpu.activation_func.keywords == {"approximate": "tanh"}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    gpu = M.transformer_config(m, tp=1, pp=1, vp=1, cp=1, bf16=True)
    # megatron's MLP picks its fused bias-gelu (the tanh approximation) by identity with F.gelu
    assert gpu.bias_activation_fusion and gpu.activation_func is F.gelu
    x = torch.linspace(-4, 4, 101)
    assert torch.allclose(cpu.activation_func(x), F.gelu(x, approximate="tanh"))
    assert not torch.allclose(cpu.activation_func(x), F.gelu(x), atol=1e-5)


def test_exact_gelu_is_never_fused(monkeypatch) -> None:
    import dataclasses

    m = dataclasses.replace(registry.load("gpt3", tiny=True).model, activation="gelu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    gpu = M.transformer_config(m, tp=1, pp=1, vp=1, cp=1, bf16=True)
    assert not gpu.bias_activation_fusion and gpu.activation_func is F.gelu
