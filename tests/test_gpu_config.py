"""What the model builder asks of megatron-core on a GPU, checked on CPU by making CUDA look present for the
config alone (mocked: this machine has no GPU; nothing is built or run on one)."""

from __future__ import annotations

from functools import partial

import pytest
import torch
import torch.nn.functional as F

from mlbench import registry
from mlbench.train import model as M
from mlbench.train.model import config as model_config

# The measurements below build a megatron world, so they need a fresh interpreter (this one may hold another):
# one interpreter for all, not one each (an interpreter importing torch and megatron-core: about 3 s of CPU).
_MEGATRON_WORLD = """
import json, torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from mlbench.train import one_process_world
one_process_world.init()
measured = {}
# SwiGLU, fused and not (test_fused_swiglu_...)
from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.mlp import MLP, MLPSubmodules
from mlbench import registry
from mlbench.train.measured_memory import saved_activation_bytes
from mlbench.train.model import transformer_config
m = registry.load("llama31_8b", tiny=True).model
out = {}
for fused in (False, True):
    cfg = transformer_config(m, tp=1, pp=1, vp=1, cp=1, bf16=False)
    cfg.bias_activation_fusion = fused
    torch.manual_seed(0)
    mlp = MLP(cfg, MLPSubmodules(linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear))
    x = torch.randn(64, 8, m.hidden_size, requires_grad=True)
    held = []
    saved = saved_activation_bytes(lambda: held.append(mlp(x)[0]), list(mlp.parameters()))
    held[0].square().sum().backward()
    out[fused] = {"saved": saved, "y": held[0].flatten()[:50].tolist(), "dx": x.grad.flatten()[:50].tolist(),
                  "dw": mlp.linear_fc1.weight.grad.flatten()[:50].tolist()}
measured["swiglu"] = [out[False], out[True], m.hidden_size, m.ffn_hidden_size]
# attention's saved bytes by SDPA kernel (test_the_plan_counts_...)
from mlbench import registry
from mlbench.train.measured_memory import saved_activation_bytes
from mlbench.train.model import build, transformer_config
bench = registry.load("llama31_8b", tiny=True)
m, b = bench.model, bench.train.micro_batch_size
torch.manual_seed(0)
model = build(m, transformer_config(m, tp=1, pp=1, vp=1, cp=1, bf16=False), backend="sdpa")
model.train()
tokens = torch.randint(0, m.vocab_size, (b, m.seq_length))
pos = torch.arange(m.seq_length).unsqueeze(0).expand(b, -1)
def forward():
    held.append(model(tokens, pos, None))  # logits: the loss's tensors are the plan's `other`
out = {}
for kernel in ("default", "math"):
    held = []
    if kernel == "math":
        with sdpa_kernel(SDPBackend.MATH):
            out[kernel] = saved_activation_bytes(forward, list(model.parameters()))
    else:
        out[kernel] = saved_activation_bytes(forward, list(model.parameters()))
    held.clear()
measured["attention"] = out
# the GPU path's SDPA against megatron's local attention: causal gpt3, grouped-query llama (test_sdpa_attention_...)
from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
from mlbench.train import model as M
measured["sdpa_error"] = {}
for name in ("gpt3", "llama31_405b"):
    m = registry.load(name, tiny=True).model
    cfg = M.transformer_config(m, tp=1, pp=1, vp=1, cp=1, bf16=False)
    out = {}
    for backend in ("local", "sdpa"):
        torch.manual_seed(0); model_parallel_cuda_manual_seed(0)
        model = M.build(m, cfg, backend=backend).eval()
        tokens = torch.randint(0, m.vocab_size - 1, (3, m.seq_length))
        with torch.no_grad():
            y = model(tokens, torch.arange(m.seq_length).expand(3, -1), None)
        out[backend] = y
    measured["sdpa_error"][name] = (out["local"] - out["sdpa"]).abs().max().item()
print(json.dumps(measured))
"""


@pytest.fixture(scope="module")
def megatron_world() -> dict:
    """{"swiglu": [unfused, fused, hidden size, ffn size], "attention": {kernel: saved bytes}, "sdpa_error":
    {benchmark: largest difference of SDPA's logits from local attention's}}, measured in one fresh interpreter."""
    import json
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", _MEGATRON_WORLD], capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.splitlines()[-1])


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


def _cuda_present(monkeypatch, te: bool = False) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(model_config, "have_transformer_engine", lambda: te)  # where attention_backend looks


def test_attention_backend_follows_the_device_and_transformer_engine(monkeypatch) -> None:
    assert M.attention_backend() == "local"  # this machine: CPU, no Transformer Engine
    _cuda_present(monkeypatch)
    assert M.attention_backend() == "sdpa"
    _cuda_present(monkeypatch, te=True)
    assert M.attention_backend() == "te"


def test_gpu_without_transformer_engine_puts_sdpa_into_gpt_and_llama_but_not_bert(monkeypatch) -> None:
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    from mlbench.train.model.attention import SDPAttention

    _cuda_present(monkeypatch)
    core = {}
    for name in ("gpt3", "llama31_405b", "bert"):
        m = registry.load(name, tiny=True).model
        config = M.transformer_config(m, tp=1, pp=1, vp=1, cp=1, bf16=True)
        core[name] = M.layer_spec(m, config).submodules.self_attention.submodules.core_attention
    assert core == {"gpt3": SDPAttention, "llama31_405b": SDPAttention, "bert": DotProductAttention}
    # the spec is copied, not edited: bert's module-level spec and a CPU build keep megatron's local attention
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    m = registry.load("gpt3", tiny=True).model
    cpu = M.layer_spec(m, M.transformer_config(m, tp=1, pp=1, vp=1, cp=1, bf16=False))
    assert cpu.submodules.self_attention.submodules.core_attention is DotProductAttention


def test_bf16_config_keeps_params_and_pipeline_in_bf16_and_batches_p2p_on_gpu(monkeypatch) -> None:
    m = registry.load("llama31_405b", tiny=True).model
    cpu = M.transformer_config(m, tp=1, pp=1, vp=1, cp=1, bf16=False)
    assert (cpu.bf16, cpu.params_dtype, cpu.pipeline_dtype, cpu.batch_p2p_comm) == (
        False, torch.float32, torch.float32, False)
    _cuda_present(monkeypatch)
    gpu = M.transformer_config(m, tp=1, pp=1, vp=1, cp=1, bf16=True)
    assert (gpu.bf16, gpu.params_dtype, gpu.pipeline_dtype, gpu.batch_p2p_comm) == (
        True, torch.bfloat16, torch.bfloat16, True)


def test_cpu_compatibility_layer_stays_off_where_cuda_is_present(monkeypatch) -> None:
    from mlbench.train import cpu_compat

    was_active = cpu_compat.active()
    _cuda_present(monkeypatch)
    assert cpu_compat.enable() is False
    assert cpu_compat.active() == was_active  # nothing patched by this call


def test_optimizers_step_as_before_without_importing_dynamo() -> None:
    """On CPU, the layer keeps torch's optimizers from importing dynamo (0.5 s a process): AdamW's steps give the
    same parameters as torch's own wrappers, grad mode is restored, and dynamo is never imported. Each in a fresh
    interpreter (this one has imported dynamo already)."""
    import subprocess
    import sys

    train = """
import sys, torch
if LAYER:
    from mlbench.train import cpu_compat
    cpu_compat._optimizers_without_dynamo()
p = torch.nn.Parameter(torch.arange(4.0))
opt = torch.optim.AdamW([p], lr=0.1, weight_decay=0.1)
for i in range(3):
    p.grad = torch.full((4,), float(i + 1))
    opt.step()
opt.zero_grad()
opt.load_state_dict(opt.state_dict())
assert torch.is_grad_enabled()
print(p.tolist(), "torch._dynamo" in sys.modules)
"""
    runs = [subprocess.run([sys.executable, "-c", train.replace("LAYER", layer)], capture_output=True, text=True,
                           timeout=120) for layer in ("False", "True")]
    for out in runs:
        assert out.returncode == 0, out.stderr[-2000:]
    torch_own, layer = (out.stdout.rsplit(" ", 1) for out in runs)
    assert torch_own[1].strip() == "True" and layer[1].strip() == "False"  # imported by torch's wrappers alone
    assert layer[0] == torch_own[0]  # the same parameters, to the last digit


def test_swiglu_is_fused_on_gpu_for_dense_models_and_not_for_experts(monkeypatch) -> None:
    """Dense SwiGLU models fuse their activation on a GPU (megatron's bias_swiglu_impl, as Megatron-LM runs them:
    what the memory plan counts there); on CPU and in a mixture's experts the unfused glu runs."""
    llama, moe = (registry.load(n, tiny=True).model for n in ("llama31_8b", "gpt_oss_20b"))
    assert not M.transformer_config(llama, tp=1, pp=1, vp=1, cp=1, bf16=False).bias_activation_fusion
    _cuda_present(monkeypatch)
    gpu = M.transformer_config(llama, tp=1, pp=1, vp=1, cp=1, bf16=True)
    assert gpu.bias_activation_fusion and gpu.gated_linear_unit and gpu.activation_func is F.silu
    assert not M.transformer_config(moe, tp=1, pp=1, vp=1, cp=1, bf16=True).bias_activation_fusion


def test_fused_swiglu_computes_the_same_and_saves_what_the_plan_counts_on_a_gpu(megatron_world: dict) -> None:
    """megatron's fused SwiGLU (run here uncompiled, on CPU) gives the unfused glu's output and gradients and keeps
    two ffn-wide tensors fewer for backward: fc1's input and output and fc2's input, the plan's GPU MLP terms
    (planner/memory.py: h + fc1 + ffn elements a token). Measured in megatron_world's interpreter."""
    unfused, fused, h, ffn = megatron_world["swiglu"]
    for k in ("y", "dx", "dw"):
        assert torch.allclose(torch.tensor(fused[k]), torch.tensor(unfused[k]), rtol=1e-5, atol=1e-6), k
    tokens, fp32 = 64 * 8, 4
    assert fused["saved"] == tokens * (h + 2 * ffn + ffn) * fp32  # x (fc1's input), fc1's output, fc2's input
    assert unfused["saved"] - fused["saved"] == tokens * 2 * ffn * fp32  # silu(x_glu), x_linear + offset


def test_collective_tensors_live_where_the_backend_takes_them(monkeypatch) -> None:
    """NCCL takes only the rank's GPU: the layout check and the loss sums hand their collectives tensors on the
    device they are given (on an H100 every run aborted at the first with 'No backend type associated with device
    type cpu'; run there by perf/gpu_check.py). Here the device is torch's meta device and the collectives record
    where their tensor lives, then stop the call: a tensor made on the CPU again fails this."""
    import torch.distributed as dist

    from mlbench.train import build, step
    from mlbench.train.build import collectives_device

    assert collectives_device(on_cpu=True) == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert collectives_device(on_cpu=False) == torch.device("cuda", 3)

    class Handed(Exception):
        pass

    seen = []

    def collective(tensor, *args, **kwargs):
        seen.append(tensor.device)
        raise Handed

    monkeypatch.setattr(dist, "broadcast", collective)
    monkeypatch.setattr(dist, "all_reduce", collective)
    meta = torch.device("meta")
    from mlbench import registry

    plan = type("Plan", (), {"layout": {"tp": 1, "global_batch_size": 16},
                             "benchmark": registry.load("gpt3", tiny=True)})()
    for call in (lambda: build._same_run_as_rank0(plan, meta),
                 lambda: step.start_sum_over_ranks([{"loss_sum": 1.0, "tokens": 2.0}], ("loss_sum", "tokens"), meta)):
        with pytest.raises(Handed):
            call()
    assert seen == [meta, meta]


def test_the_plan_counts_what_each_attention_kernel_saves(megatron_world: dict) -> None:
    """The memory plan's attention paths against the bytes one micro-batch of the tiny llama (grouped-query heads,
    rope) saves, with mlbench's SDPA module in megatron's place, on the CPU: SDPA's default here (a fused kernel,
    no s x s probabilities) against the plan's fused path, and SDPA's math kernel, which a GPU falls to for fp32
    grouped-query heads (measured on an H100: perf/gpu_check.py), against the plan's unfused path (megatron's
    local attention saves the same tensors: Q, K and V expanded to the query heads, the probabilities, the
    context). Measured in megatron_world's interpreter."""
    measured = megatron_world["attention"]

    from mlbench import registry
    from mlbench.layout import resolve
    from mlbench.planner.memory import estimate

    bench = registry.load("llama31_8b", tiny=True)
    layout = resolve(bench, nodes=1, nproc_per_node=1)
    fused = estimate(bench, layout, stage=0, on_cpu=True, attention="sdpa").activations_per_micro_batch_bytes
    local = estimate(bench, layout, stage=0, on_cpu=True, attention="local").activations_per_micro_batch_bytes
    m = bench.model
    probabilities = 2 * m.num_attention_heads * m.seq_length**2 * bench.train.micro_batch_size * 4  # 2 layers
    assert local - fused > probabilities / 2  # the paths differ by the probabilities, less fused K/V's copies
    assert measured["default"] == pytest.approx(fused, rel=0.02), (measured, fused, local)
    assert measured["math"] == pytest.approx(local, rel=0.02), (measured, fused, local)


def test_which_attention_path_the_plan_takes() -> None:
    """SDPA's kernel choice as measured on an H100 (torch 2.11; perf/gpu_check.py sdpa_kernels): fp32 with
    grouped-query heads falls to the math kernel (the probabilities kept); fp32 with equal heads runs the
    memory-efficient kernel, 16-bit inputs flash or cuDNN. BERT and the mixture-of-experts family keep
    megatron's local attention on a GPU without Transformer Engine. Nothing can measure these here (no GPU):
    the rules are pinned to what the H100 gave."""
    import dataclasses

    from mlbench import registry
    from mlbench.layout import resolve
    from mlbench.models import core_attention
    from mlbench.planner.memory import estimate

    def act(name: str, precision: str, **path) -> int:
        bench = registry.load(name, tiny=True)
        layout = dataclasses.replace(resolve(bench, nodes=1, nproc_per_node=1), precision=precision)
        return estimate(bench, layout, stage=0, **path).activations_per_micro_batch_bytes

    # measured on the H100 (fp32 tiny runs' records): gpt3 4,502,816 bytes, llama31_8b 6,010,880
    assert act("gpt3", "fp32", on_cpu=False, attention="sdpa") == pytest.approx(4_502_816, rel=0.015)
    assert act("llama31_8b", "fp32", on_cpu=False, attention="sdpa") == pytest.approx(6_010_880, rel=0.015)
    # the same models in bf16 keep no probabilities: exactly half of fp32's plan, which kept none either for gpt3
    assert act("gpt3", "bf16", on_cpu=False, attention="sdpa") * 2 == act("gpt3", "fp32", on_cpu=False,
                                                                          attention="sdpa")
    llama_bf16 = act("llama31_8b", "bf16", on_cpu=False, attention="sdpa")
    assert llama_bf16 == act("llama31_8b", "bf16", on_cpu=False, attention="te")
    assert llama_bf16 * 2 < act("llama31_8b", "fp32", on_cpu=False, attention="sdpa")
    for name in ("bert", "gpt_oss_20b"):
        m = registry.load(name, tiny=True).model
        assert core_attention(m, "sdpa") == "local" and core_attention(m, "te") == "te"
        assert act(name, "bf16", on_cpu=False, attention="sdpa") > act(name, "bf16", on_cpu=False, attention="te")
    assert core_attention(registry.load("gpt3", tiny=True).model, "sdpa") == "sdpa"


def test_sdpa_attention_matches_megatron_local_attention(megatron_world: dict) -> None:
    """The GPU path's fused attention (PyTorch SDPA in megatron's layer spec) computes what megatron's own local
    attention computes: checked here on CPU, for causal GPT and grouped-query llama. (BERT keeps megatron's local
    attention without Transformer Engine: its BertModel accepts no other core attention.)"""
    errors = megatron_world["sdpa_error"]
    assert list(errors) == ["gpt3", "llama31_405b"]
    assert all(err < 1e-4 for err in errors.values()), errors
