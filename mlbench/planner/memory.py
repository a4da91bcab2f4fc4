"""The per-GPU memory plan: what one rank holds at its peak, term by term, for a benchmark at a layout.

Static terms (parameters, gradients, optimizer state) are counted as megatron-core 0.16 allocates them, tensor by
tensor: the parameters a pipeline stage builds (its layers, the embedding on the first stage, the final norm and
output layer, or the tied embedding's copy, on the last), split over tensor parallelism as megatron splits them
(norms, row-parallel biases and the router replicated; experts over expert parallelism); gradients in
DistributedDataParallel's contiguous buffers (fp32 with grad_reduce_in_fp32); Adam's two fp32 moments, and fp32
master weights where the parameters are not fp32; with the distributed optimizer the buffers padded as megatron
pads them (each parameter's start to 64 elements, the buffer's end to lcm(data-parallel size, 128)) and the
optimizer state sharded over data x context parallelism (experts over their own data-parallel group), as the
distributed optimizer documentation describes. On CPU (fp32) these equal the bytes of megatron's real tensors
(tests/test_features_memory.py); parameter order inside a buffer is taken as megatron registers it, which
changes the padding only when sizes are not multiples of 64.

Activations follow Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models",
section 4): per layer, what each operation saves for backward in units of s x b x h elements (sequence split
by context parallelism), with the paper's tensor- and sequence-parallel splits: norms' inputs and outputs
(split only with sequence parallelism), Q/K/V, the attention context, the MLP's activation input and fc2 input
(split by tensor parallelism), and the attention probabilities (a x s x s x b, split by tensor parallelism)
where attention is not fused (megatron's local attention on CPU; Transformer Engine's and PyTorch's fused
attention on a GPU keep only softmax statistics). Widths follow the real model (grouped-query K/V, SwiGLU's
doubled fc1, RoPE's rotated copies of Q and K) rather than the paper's 34 + 5as/h constant, and no dropout masks
are kept when dropout is 0. Selective recompute drops the attention probabilities; full recompute keeps only the
inputs of recomputed layers. The micro-batches in flight are the pipeline schedule's: one without pipelining,
pp - stage for 1F1B, megatron's warm-up count + 1 chunks for the interleaved schedule. Nothing here is fitted:
against the bytes one micro-batch saves on CPU (saved_tensors_hooks) it is within 3 % for the tiny layouts.

`other_bytes` is a guess, stated as one: the last stage's fp32 logits and their gradient, one layer's working set
for full recompute, and on a GPU 3 GiB of CUDA context, cuBLAS/NCCL workspaces and allocator fragmentation.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from mlbench.layout import Layout
from mlbench.models import family
from mlbench.models.transformer import decoder_params, norm_params, padded_vocab, shapes
from mlbench.spec import Benchmark, ModelSpec

GPU_WORKSPACE_BYTES = 3 * 2**30  # CUDA context, cuBLAS and NCCL workspaces, fragmentation: a stated allowance


@dataclass(frozen=True)
class MemoryPlan:
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    other_bytes: int
    stage: int  # the pipeline stage this plan is for (the worst one unless asked)
    activations_per_micro_batch_bytes: int  # what one micro-batch saves through the stage's first chunk
    micro_batches_in_flight: int  # model chunks' activations the schedule holds at once

    @property
    def total_bytes(self) -> int:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes + self.activations_bytes + self.other_bytes

    def as_dict(self) -> dict:
        return {"params_bytes": self.params_bytes, "grads_bytes": self.grads_bytes,
                "optimizer_bytes": self.optimizer_bytes, "activations_bytes": self.activations_bytes,
                "other_bytes": self.other_bytes, "total_bytes": self.total_bytes, "stage": self.stage,
                "activations_per_micro_batch_bytes": self.activations_per_micro_batch_bytes,
                "micro_batches_in_flight": self.micro_batches_in_flight}

    def largest_term(self) -> str:
        terms = {k: v for k, v in self.as_dict().items() if k in
                 ("params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "other_bytes")}
        return max(terms, key=terms.__getitem__).removesuffix("_bytes")

    def fits(self, device_memory_bytes: float) -> bool:
        return self.total_bytes <= device_memory_bytes


# What shrinks each term: the message a refused run names.
SHRINK = {"params": "more pipeline or tensor parallelism (--pp, --tp), or --precision fp8 with FP8 parameters",
          "grads": "more pipeline or tensor parallelism (--pp, --tp)",
          "optimizer": "--distributed-optimizer (shards it over data parallelism), or more --pp / --tp",
          "activations": "--recompute selective or full, --sequence-parallel, --cp, or a smaller --mbs",
          "other": "more tensor parallelism (--tp) for the logits, or a smaller --mbs"}


def estimate(bench: Benchmark, layout: Layout, stage: int | None = None) -> MemoryPlan:
    """The plan for pipeline stage `stage`, or for the stage with the largest total (None)."""
    stages = range(layout.pp) if stage is None else [stage]
    return max((_stage_plan(bench, layout, s) for s in stages), key=lambda p: p.total_bytes)


# ---- parameters ---------------------------------------------------------------------------------------------


def _layer_params(m: ModelSpec, tp: int, ep: int) -> tuple[list[int], list[int]]:
    """One layer's parameters on a tensor-parallel rank, in megatron's registration order: (dense, expert)."""
    s = shapes(m)
    norm = norm_params(m)
    bias = m.add_bias_linear
    kv_channels = m.kv_channels or m.hidden_size // m.num_attention_heads
    qk = [norm // m.hidden_size * kv_channels] * 2 if m.qk_layernorm else []
    dense = [norm, s.h * (s.q + 2 * s.kv) // tp, *([(s.q + 2 * s.kv) // tp] if bias else []), *qk,
             s.q * s.h // tp, *([s.h] if bias else []), norm]
    if m.num_experts:
        ffn = m.moe_ffn_hidden_size or m.ffn_hidden_size
        gated = 2 if m.activation == "swiglu" else 1
        dense.append(s.h * m.num_experts)  # the router, replicated
        expert = [s.h * gated * ffn // tp, ffn * s.h // tp] * (m.num_experts // ep)
        return dense, expert
    return dense + [s.h * s.fc1 // tp, *([s.fc1 // tp] if bias else []), s.ffn * s.h // tp,
                    *([s.h] if bias else [])], []


def _stage_layers(m: ModelSpec, layout: Layout, stage: int) -> list[int]:
    """Transformer layers in each of the stage's model chunks (virtual stages), with megatron's asymmetric split:
    the embedding and the loss each take one layer's place in the first and the last chunk."""
    embed, loss = layout.account_for_embedding_in_pipeline_split, layout.account_for_loss_in_pipeline_split
    per_chunk = (m.num_layers + int(embed) + int(loss)) // (layout.pp * layout.vp)
    out = []
    for v in range(layout.vp):
        n = per_chunk
        if embed and stage == 0 and v == 0:
            n -= 1
        if loss and stage == layout.pp - 1 and v == layout.vp - 1:
            n -= 1
        out.append(n)
    return out


def _stage_params(bench: Benchmark, layout: Layout, stage: int) -> tuple[list[int], list[int]]:
    m, tp = bench.model, layout.tp
    vocab = padded_vocab(m, tp) * m.hidden_size // tp
    first, last = stage == 0, stage == layout.pp - 1
    dense: list[int] = []
    expert: list[int] = []
    if first:
        dense += [vocab] + ([m.seq_length * m.hidden_size] if m.position_embedding == "learned_absolute" else [])
    layer_dense, layer_expert = _layer_params(m, tp, layout.ep)
    for _ in range(sum(_stage_layers(m, layout, stage))):
        dense += layer_dense
        expert += layer_expert
    if last:
        dense.append(norm_params(m))
        if m.untie_embeddings or (layout.pp > 1 and not first):
            dense.append(vocab)  # the output layer (an untied one, or the tied embedding's last-stage copy)
        extra = family(m.family).param_count(m, tp) - decoder_params(m, tp)
        if extra > 0 and not m.num_experts:
            dense.append(extra)  # the family's heads (BERT: token types, LM head, pooler), counted whole
    return dense, expert




def _buffer_numel(sizes: list[int], padded: bool, dp: int) -> tuple[int, int]:
    """Elements of megatron's contiguous buffer for these parameters (registered in this order; the buffer takes
    them in reverse), and the most parameter elements one data-parallel shard holds: the distributed optimizer keeps
    state for the parameters in its shard, never for the padding. With it each parameter starts on a 64-element
    boundary and the buffer's end is padded to lcm(dp, 128), so it shards evenly."""
    if not padded:
        return sum(sizes), sum(sizes)
    ranges, end = [], 0
    for n in reversed(sizes):
        start = -(-end // 64) * 64
        ranges.append((start, start + n))
        end = start + n
    numel = -(-end // math.lcm(dp, 128)) * math.lcm(dp, 128)
    shard = numel // dp
    held = [sum(max(0, min(e, (r + 1) * shard) - max(b, r * shard)) for b, e in ranges) for r in range(dp)]
    return numel, max(held)


# ---- activations --------------------------------------------------------------------------------------------


def _layer_activation_elements(m: ModelSpec, layout: Layout, fused_attention: bool) -> float:
    """Elements one layer saves for one micro-batch on this rank (units of s/cp x b x h, Korthikanti et al.)."""
    s = shapes(m)
    f = layout.features
    t, cp, b = layout.tp, layout.cp, layout.micro_batch_size
    seq = m.seq_length // cp
    unit = seq * b * m.hidden_size
    if f.recompute == "full":
        return unit / (t if f.sequence_parallel else 1)  # the layer's input only
    norms = 4 / (t if f.sequence_parallel else 1)  # the two norms' inputs and outputs
    width = (s.q + 2 * s.kv + s.q + s.fc1 + s.ffn) / s.h  # Q, K, V; the context; activation input; fc2 input
    if m.position_embedding == "rope":
        width += (s.q + s.kv) / s.h  # the rotated copies of Q and K
    if cp > 1 and not fused_attention:
        width += 2 * s.kv / s.h * cp  # keys and values all-gathered over the context-parallel group
    elements = unit * (norms + width / t)
    if not fused_attention and f.recompute != "selective":
        kv_seq = min(m.window_size + 1, m.seq_length) if m.window_size else m.seq_length
        elements += m.num_attention_heads * seq * kv_seq * b / t  # the softmax's probabilities
    return elements


def _in_flight(layout: Layout, stage: int) -> int:
    """Model chunks' activations a rank holds at once (megatron's pipeline schedules)."""
    pp, vp, micro = layout.pp, layout.vp, layout.num_microbatches
    if pp == 1:
        return 1
    if vp == 1:
        return min(pp - stage, micro)
    warmup = (pp - stage - 1) * 2 + (vp - 1) * pp  # megatron's interleaved warm-up micro-batches
    return min(warmup + 1, micro * vp)


def _stage_plan(bench: Benchmark, layout: Layout, stage: int) -> MemoryPlan:
    m, f = bench.model, layout.features
    cpu = layout.precision == "fp32"
    param_b = 4 if cpu else (1 if layout.precision == "fp8" and f.fp8_param_gather else 2)
    grad_b = 4 if cpu or f.grad_reduce_in_fp32 else 2
    state_b = 8 if cpu else 12  # Adam's two fp32 moments (+ an fp32 master copy of 16-bit parameters)
    dense, expert = _stage_params(bench, layout, stage)
    groups = [(dense, layout.dp * layout.cp), (expert, max(layout.dp * layout.cp // layout.ep, 1))]
    params = grads = optimizer = 0
    for sizes, shard in groups:
        if not sizes:
            continue
        padded = f.distributed_optimizer
        numel, held = _buffer_numel(sizes, padded, shard)
        params += numel * param_b if padded else sum(sizes) * param_b
        grads += numel * grad_b
        optimizer += state_b * held
    fused = not cpu  # on a GPU: Transformer Engine's or PyTorch's fused attention
    act_b = 4 if cpu else 2
    per_layer = _layer_activation_elements(m, layout, fused)
    chunks = _stage_layers(m, layout, stage)
    seq_unit = m.seq_length // layout.cp * layout.micro_batch_size * m.hidden_size
    last = stage == layout.pp - 1
    final = 2 * seq_unit / (layout.tp if f.sequence_parallel else 1) if last else 0  # final norm in/out
    first_chunk = chunks[0] * per_layer + (final if layout.vp == 1 else 0)
    per_chunk = sum(chunks) / layout.vp * per_layer
    in_flight = _in_flight(layout, stage)
    if layout.vp == 1:
        activations = in_flight * first_chunk * act_b
    else:  # chunks of about equal size in flight, the first one's exactly
        activations = (first_chunk + (in_flight - 1) * per_chunk + final) * act_b
    other = 0.0
    if last:
        logits = m.seq_length // layout.cp * layout.micro_batch_size * padded_vocab(m, layout.tp) / layout.tp
        other += 2 * 4 * logits  # fp32 logits and their gradient
    if f.recompute == "full":
        full = dataclasses.replace(layout, features=dataclasses.replace(f, recompute="none"))
        other += _layer_activation_elements(m, full, fused) * act_b  # one layer recomputed at a time
    if not cpu:
        other += GPU_WORKSPACE_BYTES
    return MemoryPlan(params_bytes=int(params), grads_bytes=int(grads), optimizer_bytes=int(optimizer),
                      activations_bytes=int(activations), other_bytes=int(other), stage=stage,
                      activations_per_micro_batch_bytes=int(first_chunk * act_b), micro_batches_in_flight=in_flight)
