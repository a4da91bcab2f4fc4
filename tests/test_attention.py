"""The GPU path's fused attention (PyTorch SDPA in megatron's layer spec) computes what megatron's own local
attention computes: checked here on CPU, for causal GPT and grouped-query llama. (BERT keeps megatron's local
attention without Transformer Engine: its BertModel accepts no other core attention.)"""

from __future__ import annotations

import subprocess
import sys
import textwrap

_COMPARE = textwrap.dedent("""
    from mlbench.train import cpu_compat; cpu_compat.import_megatron_without_jit_fuser()  # first: 2-3 s less
    import os
    import torch, torch.distributed as dist
    from mlbench.train import cpu_compat, model as M
    from mlbench import registry
    cpu_compat.enable()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(20000 + os.getpid() % 20000))
    dist.init_process_group("gloo", rank=0, world_size=1)
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    parallel_state.initialize_model_parallel(1, 1)
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
        err = (out["local"] - out["sdpa"]).abs().max().item()
        print(name, err)
        assert err < 1e-4, (name, err)
""")


def test_sdpa_attention_matches_megatron_local_attention() -> None:
    proc = subprocess.run([sys.executable, "-c", _COMPARE], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert [ln.split()[0] for ln in proc.stdout.splitlines()] == ["gpt3", "llama31_405b"]
