"""What one micro-batch saves for backward, tensor by tensor: `python perf/saved_activations.py BENCH [--tiny]`.

Builds BENCH's model as a run does (mlbench.train.model, one process; on a GPU in the benchmark's precision
under megatron's Float16Module, on the CPU in fp32), runs one micro-batch forward under autograd's
saved-tensor hooks and prints, for the first transformer layer, each saved storage once: the module that saved
it, shape, dtype and bytes; then the totals per layer and outside the layers, beside the memory plan's
per-micro-batch activations (mlbench.planner.memory). This is where the plan's activation terms are checked
one by one, on whatever device is here.
"""

from __future__ import annotations

import os
import sys
from collections import defaultdict


def main(name: str, tiny: bool) -> None:
    import torch
    import torch.distributed as dist

    from mlbench.train import cpu_compat

    on_cpu = cpu_compat.enable()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    dist.init_process_group("gloo" if on_cpu else "nccl", rank=0, world_size=1)
    if not on_cpu:
        torch.cuda.set_device(0)
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from mlbench import registry
    from mlbench.layout import resolve
    from mlbench.planner.memory import estimate
    from mlbench.train.model import attention_backend, build, transformer_config

    ps.initialize_model_parallel(1, 1)
    torch.manual_seed(0)
    model_parallel_cuda_manual_seed(0)
    bench = registry.load(name, tiny=tiny)
    m = bench.model
    precision = "fp32" if on_cpu else bench.train.precision
    bf16 = precision in ("bf16", "fp8")
    config = transformer_config(m, tp=1, pp=1, vp=1, cp=1, bf16=bf16)
    model = build(m, config)
    if not on_cpu:
        from megatron.core.transformer.module import Float16Module

        model = model.cuda()
        if bf16:
            model = Float16Module(config, model)
    mbs, seq = bench.train.micro_batch_size, m.seq_length
    dev = "cpu" if on_cpu else "cuda"
    tokens = torch.randint(0, m.vocab_size, (mbs, seq), device=dev)
    pos = torch.arange(seq, device=dev).unsqueeze(0).expand(mbs, seq)

    names: list[str] = []
    for mod_name, mod in model.named_modules():
        mod.register_forward_pre_hook(lambda _m, _a, n=mod_name: names.append(n))
        mod.register_forward_hook(lambda _m, _a, _o: names.pop() and None)  # None: the output stays
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, tuple[str, tuple, torch.dtype, int]] = {}
    kept: list = []  # the saved tensors stay alive, so their storages (the keys) stay unique

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = t.untyped_storage().data_ptr()
        if key not in params and key not in seen:
            seen[key] = (names[-1] if names else "(top)", tuple(t.shape), t.dtype, t.untyped_storage().nbytes())
            kept.append(t)
        return t

    model.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(tokens, pos, None)  # logits only: the loss's fp32 tensors are the plan's `other`, not activations
    layers: dict[str, int] = defaultdict(int)
    print(f"{name}{' (tiny)' if tiny else ''} on {'CPU' if on_cpu else torch.cuda.get_device_name()}, {precision}, "
          f"micro-batch {mbs} x {seq}; layer 0's saved tensors:")
    for where, shape, dtype, nbytes in seen.values():
        parts = where.split(".")
        layer = next((parts[i + 1] for i, p in enumerate(parts[:-1]) if p == "layers"), None)
        layers[f"layer {layer}" if layer is not None else "outside layers"] += nbytes
        if layer == "0":
            print(f"  {nbytes:>14,}  {str(dtype).removeprefix('torch.'):<9} {shape!s:<24} {where}")
    total = sum(layers.values())
    per_layer = [v for k, v in layers.items() if k.startswith("layer ")]
    print(f"per layer (median of {len(per_layer)}): {sorted(per_layer)[len(per_layer) // 2]:,} bytes; outside layers: "
          f"{layers['outside layers']:,}; total {total:,}")
    layout = resolve(bench, nodes=1, nproc_per_node=1)
    est = estimate(bench, _with_precision(layout, precision), stage=0, on_cpu=on_cpu, attention=attention_backend())
    print(f"memory plan per micro-batch: {est.activations_per_micro_batch_bytes:,} "
          f"(measured / plan {total / est.activations_per_micro_batch_bytes:.3f})")


def _with_precision(layout, precision: str):
    import dataclasses

    return dataclasses.replace(layout, precision=precision)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "gpt3", "--tiny" in sys.argv)
