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
section 4): per layer, what each operation saves for backward in units of s x b x h elements (sequence split by
context parallelism), with the paper's tensor- and sequence-parallel splits: norms' inputs and outputs (split only
with sequence parallelism), Q/K/V, the attention context, the MLP's activation input and fc2 input (split by tensor
parallelism), and the attention probabilities (a x s x s x b, split by tensor parallelism) where the attention
kernel keeps them (_keeps_probabilities: megatron's local attention, and PyTorch's math kernel, which SDPA falls to
on a GPU for fp32 grouped-query heads; Transformer Engine's fused attention and SDPA's flash, cuDNN and memory-
efficient kernels keep only softmax statistics). Widths follow the real model (grouped-query K/V, SwiGLU's doubled
fc1, RoPE's rotated copies of Q and K) rather than the paper's 34 + 5as/h constant. With dropout (the full BERT's
0.1) each dropout keeps a mask, a byte an element on a GPU and on the CPU (torch's unfused dropout) its noise at the
activations' width: the embedding's, the two bias-dropout-adds' of each layer, and where the attention
probabilities are kept, their dropout's, with the dropped copy the context's product keeps; none when dropout is 0
(traced on CPU, exact for the tiny bert and gpt3 at dropout 0.1). Selective recompute drops the attention
probabilities; full recompute keeps only the inputs of recomputed layers. The micro-batches in flight are the
pipeline schedule's: one without pipelining, pp - stage for 1F1B, megatron's warm-up count + 1 chunks for the
interleaved schedule. Where attention is not fused (megatron's local attention, SDPA's math kernel) the tensors are
those that path saves (_unfused_attention_width): grouped-query keys and values expanded to the query heads, q/k
norms' inputs and copies, the full s x s probabilities under a sliding window. On the CPU, torch's RMSNorm also
keeps its normalized copy and the unfused glu two extra ffn-wide tensors; a GPU runs the fused ones.

Which path runs is the estimate's `on_cpu` and `attention` (the layer spec's backend: "te", "sdpa", "local"),
narrowed by the family (models.core_attention). A run's record passes what it ran; the planner's default for a
16-bit or FP8 precision is Transformer Engine on a GPU (the published runs' stack), for fp32 the CPU.

Outside the layers a pre-norm decoder saves its final norm's input and output; a family that differs says so in
the family table (edge_activation_units): BERT's post-LN model saves its embedding LayerNorm's input and output on
the first stage and its LM head's dense, GeLU and LayerNorm outputs on the last, with no final norm (traced).

Mixture-of-experts layers (gpt_oss_20b) are counted as megatron-core's MoELayer saves them (_moe_layer_bytes):
the router's top-k indices and softmax, the permutation's routing map, probabilities and sorted indices, and per
token copy the experts compute (tokens x top-k, all-gathered over the expert tensor-parallel group, balanced over
expert parallelism) its input and the SwiGLU's six ffn-wide tensors; `other` adds the all-to-all dispatcher's
send/receive buffers for one layer (_moe_dispatch_buffers). Nothing here is fitted: against the bytes one
micro-batch saves on CPU (saved_tensors_hooks) it is within 3 % for the tiny layouts, dense and MoE.

`other_bytes` is a guess, stated as one: the last stage's fp32 logits and their gradient, one layer's working set
for full recompute, an MoE layer's all-to-all buffers, and on a GPU 3 GiB of CUDA context, cuBLAS/NCCL workspaces
and allocator fragmentation.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from dataclasses import dataclass

from mlbench.layout import Layout
from mlbench.models import core_attention, family
from mlbench.models.transformer import norm_params, padded_vocab, shapes
from mlbench.spec import Benchmark, ModelSpec

GPU_WORKSPACE_BYTES = 3 * 2**30  # CUDA context, cuBLAS and NCCL workspaces, fragmentation: a stated allowance
# The device a local CPU run's plan is held against (preflight.memory_device): its name says on_cpu, as a GPU's
# name says the GPU's kernels and allowance, whatever the precision
THIS_CPU = "this machine (CPU)"


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


def estimate(bench: Benchmark, layout: Layout, stage: int | None = None, *, on_cpu: bool | None = None,
             attention: str | None = None) -> MemoryPlan:
    """The plan for pipeline stage `stage`, or for the stage with the largest total (None). `on_cpu` and
    `attention` (the layer spec's backend) say which kernels run; by default fp32 means the CPU's, any other
    precision a GPU with Transformer Engine."""
    on_cpu = layout.precision == "fp32" if on_cpu is None else on_cpu
    path = _Path(on_cpu, core_attention(bench.model, attention or ("local" if on_cpu else "te")))
    stages = range(layout.pp) if stage is None else [stage]
    return max((_stage_plan(bench, layout, s, path) for s in stages), key=lambda p: p.total_bytes)


@dataclass(frozen=True)
class _Path:
    """The kernels a run takes: the CPU's composite norms and glu or a GPU's fused ones, and the core attention
    ("te", "sdpa" or "local")."""
    on_cpu: bool
    attention: str


def _keeps_probabilities(m: ModelSpec, layout: Layout, path: _Path) -> bool:
    """Whether the core attention saves the s x s probabilities for backward. Measured on an H100 (torch 2.11,
    perf/gpu_check.py's sdpa_kernels) for mlbench's causal grouped-query call: flash and cuDNN take 16-bit inputs
    only and the memory-efficient kernel equal head counts only, so fp32 with grouped-query heads falls to the
    math kernel, which keeps them (and the fp32 tiny llama's activations then measure within 1 % of this plan).
    On the CPU, SDPA's flash kernel takes fp32 and grouped-query heads."""
    if path.attention != "sdpa":
        return path.attention == "local"
    heads, groups = m.num_attention_heads, m.num_query_groups or m.num_attention_heads
    return not path.on_cpu and layout.precision == "fp32" and groups < heads


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
        if heads := family(m.family).head_params(m, tp):
            dense.append(heads)  # the family's heads (BERT: token types, LM head, pooler; the output bias split)
    return dense, expert




@functools.lru_cache(maxsize=4096)  # a search asks for the same stages at many layouts
def _buffer_numel(sizes: tuple[int, ...], padded: bool, dp: int) -> tuple[int, int]:
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
    # Each shard's parameter elements, range by range: a range adds to the shards it starts and ends in, and whole
    # shards between (a difference array: linear in ranges + shards, where dp x ranges took seconds at dp 1024).
    held, whole = [0] * dp, [0] * (dp + 1)
    for b, e in ranges:
        if e == b:
            continue
        first, last = b // shard, (e - 1) // shard
        if first == last:
            held[first] += e - b
            continue
        held[first] += (first + 1) * shard - b
        held[last] += e - last * shard
        whole[first + 1] += 1
        whole[last] -= 1
    return numel, max(h + n * shard for h, n in zip(held, itertools.accumulate(whole), strict=False))


# ---- activations --------------------------------------------------------------------------------------------


def _layer_activation_bytes(m: ModelSpec, layout: Layout, path: _Path, act_b: int) -> float:
    """Bytes one layer saves for one micro-batch on this rank (Korthikanti et al.'s units of s/cp x b x h
    elements of `act_b` bytes; the routing's fp32, int64 and bool tensors at their own sizes)."""
    s = shapes(m)
    f = layout.features
    t, cp, b = layout.tp, layout.cp, layout.micro_batch_size
    seq = m.seq_length // cp
    unit = seq * b * m.hidden_size
    if f.recompute == "full":
        return unit / (t if f.sequence_parallel else 1) * act_b  # the layer's input only
    unfused = _keeps_probabilities(m, layout, path)  # megatron's local attention, or SDPA's math kernel
    # The two norms' inputs and outputs (the output as its consumer, QKV / fc1 / the router, keeps it); torch's
    # RMSNorm on the CPU also keeps x * rsqrt(mean(x^2) + eps) for its weight's gradient.
    norms = (6 if path.on_cpu and m.normalization == "RMSNorm" else 4) / (t if f.sequence_parallel else 1)
    if unfused:
        width = _unfused_attention_width(m, t)
    else:
        width = (s.q + 2 * s.kv + s.q) / t  # Q, K, V; the context
        if m.position_embedding == "rope":
            width += (s.q + s.kv) / t  # the rotated copies of Q and K
    if cp > 1 and unfused:
        width += 2 * s.kv / t * cp  # keys and values all-gathered over the context-parallel group
    elements = unit * (norms + width / s.h)
    masks = 0.0  # dropout's masks, in elements (_mask_bytes each)
    if m.dropout > 0:  # the hidden dropout of attention's and the MLP's bias-dropout-add
        masks += 2 * unit / (t if f.sequence_parallel else 1)
    if unfused and f.recompute != "selective":
        # megatron's DotProductAttention computes all s x s scores and masks them: a sliding window saves the
        # same probabilities (dot_product_attention.py: baddbmm, then scale_mask_softmax)
        probs = m.num_attention_heads * seq * m.seq_length * b / t
        elements += probs  # the softmax's probabilities
        if m.dropout > 0:  # dropped, a second copy (the context's bmm keeps it), and its mask
            elements += probs
            masks += probs
    masks *= _mask_bytes(path, act_b)
    if m.num_experts:
        return elements * act_b + masks + _moe_layer_bytes(m, layout, act_b)
    mlp = s.fc1 + s.ffn  # the activation's input, fc2's input
    if path.on_cpu and m.activation == "swiglu":
        mlp += 2 * s.ffn  # megatron's unfused glu (mlp.py: glu): silu(x_glu) and x_linear + glu_linear_offset
    return (elements + seq * b * mlp / t) * act_b + masks


def _mask_bytes(path: _Path, act_b: int) -> int:
    """Bytes a dropout keeps an element for backward: on the CPU, where torch's dropout is not fused, its noise,
    multiplied in and kept at the activations' own width (traced); on a GPU a bool mask (torch's native_dropout:
    from its source, not measured here)."""
    return act_b if path.on_cpu else 1


def _unfused_attention_width(m: ModelSpec, t: int) -> float:
    """Elements per token that megatron's local attention path (CPU) saves from Q, K and V to the context, on a
    tensor-parallel rank. megatron-core 0.16, transformer/attention.py get_query_key_value_tensors: Q, K, V are
    views of the mixed QKV output; the query's reshape to [sq, b, np, hn] copies it where a rank holds more than
    one group of several heads; q/k norms keep their inputs (the key's a view: the whole mixed QKV stays) and,
    torch's RMSNorm, the normalized copies. rope_utils.py: the rotation keeps only cos and sin, and makes new Q
    and K. dot_product_attention.py: grouped-query keys and values are expanded to the query heads
    (repeat_interleave: new tensors of the query's width); the batched matmuls keep Q, K and V; linear_proj
    keeps the context. Any view of the mixed QKV keeps all of it, counted once."""
    s = shapes(m)
    q, kv = s.q / t, s.kv / t
    heads, groups = m.num_attention_heads, m.num_query_groups or m.num_attention_heads
    rope, qk_norm = m.position_embedding == "rope", m.qk_layernorm
    new, view = 0.0, False
    if rope or qk_norm:
        new += q  # the query attention gets: rotated or normalized, a new tensor
    else:
        view = True
    if heads > groups:
        new += 2 * q  # keys and values expanded to the query heads
    else:
        view = True  # the values are a view (so are the keys without rope or q/k norms)
        if rope or qk_norm:
            new += kv  # the keys: rotated or normalized
    if qk_norm:
        view = True  # the key's norm keeps its input, a view of the mixed QKV
        if heads > groups and groups / t > 1:
            new += q  # the query's reshape copies it
        if m.normalization == "RMSNorm":
            new += q + kv  # the norms' normalized copies
    return new + (q + 2 * kv if view else 0) + q  # + the context, linear_proj's input


def _moe_tokens(m: ModelSpec, layout: Layout) -> tuple[int, float]:
    """Tokens this rank routes (the MoE layer's input: a sequence-parallel shard under tensor parallelism), and the
    token copies its experts compute on average: top-k of each, all-gathered over the expert tensor-parallel
    group (megatron's default: the tensor-parallel group) by the all-to-all dispatcher, balanced over expert
    parallelism (each rank sends its copies to the experts' ranks and receives as many, on average; routing
    without a load-balancing loss is not balanced, so one rank measures a few % more or less)."""
    t = layout.tp
    tokens = m.seq_length // layout.cp * layout.micro_batch_size // (t if layout.features.sequence_parallel else 1)
    return tokens, tokens * m.moe_router_topk * t


def _moe_layer_bytes(m: ModelSpec, layout: Layout, act_b: int) -> float:
    """What megatron-core 0.16's MoELayer (alltoall dispatcher, dropless, no fusions) saves for backward beyond the
    pre-MLP norm's output (which the router keeps, in place of the dense MLP's fc1; moe_utils.py
    router_gating_linear), on this rank, for one micro-batch:

    - router (router.py TopKRouter.routing -> moe_utils.py topk_routing_with_score_function): the top-k indices
      (int64) and the softmax over the k (fp32: mlbench's moe_router_dtype), tokens x k each;
    - permutation (moe_utils.py permute, from token_dispatcher.py MoEAlltoAllTokenDispatcher.dispatch_preprocess):
      the [experts, tokens] routing map (bool) and probabilities (fp32, probs.T.contiguous() for masked_select),
      and the sorted token indices (int64, tokens x k; unpermute's scatter_add keeps the same);
    - experts (experts.py SequentialMLP / TEGroupedMLP, mlp.py MLP.forward with per_token_scale), per token copy
      they compute: the permuted input (h: the all-to-all's and the tensor-parallel all-gather's output, sorted by
      local expert in dispatch_postprocess), fc1's output (2 f / t gated: the unfused glu's silu keeps it),
      silu(x_glu) and x_linear + glu_linear_offset (f / t each), the glu's output and the permuted probability
      (f / t, and one fp32) for the probability multiply, fc2's input (f / t); without a gated unit, fc1's output,
      the activation's and fc2's input (f / t each).
    """
    t, k, n = layout.tp, m.moe_router_topk, m.num_experts
    ffn = m.moe_ffn_hidden_size or m.ffn_hidden_size
    tokens, copies = _moe_tokens(m, layout)
    per_copy = m.hidden_size + (6 if m.activation == "swiglu" else 3) * ffn / t
    return (copies * per_copy * act_b  # the experts' inputs and activations
            + 4 * (tokens * k + n * tokens + copies)  # fp32: softmax over the k, probs for masked_select, permuted
            + 8 * 2 * tokens * k  # int64: top-k indices, sorted token indices
            + n * tokens)  # bool: the routing map


def _moe_dispatch_buffers(m: ModelSpec, layout: Layout, act_b: int) -> float:
    """The all-to-all dispatcher's transient buffers for one MoE layer at a time (a guess at the peak, stated as
    one: nothing measures it): with expert parallelism, the all-to-all's send (the permuted token copies, made
    contiguous) and receive buffers (tensor_parallel/mappings.py _AllToAll: bypassed at one rank); with expert
    tensor parallelism, the all-gathered copies and combine_preprocess's fp32 input to the reduce-scatter
    (token_dispatcher.py: hidden_states.to(self.probs.dtype))."""
    tokens, copies = _moe_tokens(m, layout)
    h, out = m.hidden_size, 0.0
    if layout.ep > 1:
        out += 2 * tokens * m.moe_router_topk * h * act_b
    if layout.tp > 1:
        out += copies * h * (act_b + 4)
    return out


def _in_flight(layout: Layout, stage: int) -> int:
    """Model chunks' activations a rank holds at once (megatron's pipeline schedules)."""
    pp, vp, micro = layout.pp, layout.vp, layout.num_microbatches
    if pp == 1:
        return 1
    if vp == 1:
        return min(pp - stage, micro)
    warmup = (pp - stage - 1) * 2 + (vp - 1) * pp  # megatron's interleaved warm-up micro-batches
    return min(warmup + 1, micro * vp)


def _stage_plan(bench: Benchmark, layout: Layout, stage: int, path: _Path) -> MemoryPlan:
    m, f = bench.model, layout.features
    fp32 = layout.precision == "fp32"
    param_b = 4 if fp32 else (1 if layout.precision == "fp8" and f.fp8_param_gather else 2)
    grad_b = 4 if fp32 or f.grad_reduce_in_fp32 else 2
    state_b = 8 if fp32 else 12  # Adam's two fp32 moments (+ an fp32 master copy of 16-bit parameters)
    dense, expert = _stage_params(bench, layout, stage)
    groups = [(dense, layout.dp * layout.cp), (expert, max(layout.dp * layout.cp // layout.ep, 1))]
    params = grads = optimizer = 0
    for sizes, shard in groups:
        if not sizes:
            continue
        padded = f.distributed_optimizer
        numel, held = _buffer_numel(tuple(sizes), padded, shard)
        params += numel * param_b if padded else sum(sizes) * param_b
        grads += numel * grad_b
        optimizer += state_b * held
    act_b = 4 if fp32 else 2
    per_layer = _layer_activation_bytes(m, layout, path, act_b)
    chunks = _stage_layers(m, layout, stage)
    seq_elements = m.seq_length // layout.cp * layout.micro_batch_size * m.hidden_size
    seq_unit = seq_elements * act_b
    last = stage == layout.pp - 1
    if edges := family(m.family).edge_activation_units:  # the family's own before and after the layers
        before, after = edges(m)
        first = before * seq_unit if stage == 0 else 0
        final = after * seq_unit if last else 0
    else:  # a pre-norm decoder: the final norm's input and output (+ torch RMSNorm's normalized copy)
        final_copies = 3 if path.on_cpu and m.normalization == "RMSNorm" else 2
        first, final = 0, final_copies * seq_unit / (layout.tp if f.sequence_parallel else 1) if last else 0
    if m.dropout > 0 and stage == 0:  # the embedding's dropout (megatron's LanguageModelEmbedding): its mask
        first += seq_elements * _mask_bytes(path, act_b) / (layout.tp if f.sequence_parallel else 1)
    first_chunk = chunks[0] * per_layer + first + (final if layout.vp == 1 else 0)
    per_chunk = sum(chunks) / layout.vp * per_layer
    in_flight = _in_flight(layout, stage)
    # interleaved: chunks of about equal size in flight, the first one's exactly
    activations = in_flight * first_chunk if layout.vp == 1 else first_chunk + (in_flight - 1) * per_chunk + final
    other = 0.0
    if last:
        logits = m.seq_length // layout.cp * layout.micro_batch_size * padded_vocab(m, layout.tp) / layout.tp
        other += 2 * 4 * logits  # fp32 logits and their gradient
    if f.recompute == "full":
        full = dataclasses.replace(layout, features=dataclasses.replace(f, recompute="none"))
        other += _layer_activation_bytes(m, full, path, act_b)  # one layer recomputed at a time
    if m.num_experts:
        other += _moe_dispatch_buffers(m, layout, act_b)
    if not path.on_cpu:
        other += GPU_WORKSPACE_BYTES
    return MemoryPlan(params_bytes=int(params), grads_bytes=int(grads), optimizer_bytes=int(optimizer),
                      activations_bytes=int(activations), other_bytes=int(other), stage=stage,
                      activations_per_micro_batch_bytes=int(first_chunk), micro_batches_in_flight=in_flight)
