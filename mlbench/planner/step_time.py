"""An explicit step-time model for megatron-core training: term by term, a handful of fitted efficiencies.

One optimizer step on one rank of the slowest pipeline stage:

  step = (micro-batches + bubble) x per-micro-batch stage time + exposed data-parallel communication + optimizer

- per-micro-batch stage time: the stage's share of the model's layers (and of the logit layer), each layer
  - GEMMs: the layer's model FLOPs (`mlbench.flops`) / (tp x cp) at the device's dense peak for the precision
    they run in, times an efficiency on a roofline: it falls as each GEMM's size on the rank nears the device's
    FLOP/byte ridge at that precision (short, narrow or thin GEMMs, and devices with much compute per HBM byte,
    run further from peak); nvfp4 keeps its recipe's bf16 layers; the logit layer runs in bf16; never faster
    than reading the weights from HBM;
  - attention (the s^2 products): at the bf16 peak with its own efficiency (attention kernels run in bf16);
  - elementwise work (norms, residual adds, activation, rotary embedding, fp8 casts): bytes moved / HBM bandwidth
    with a fitted efficiency; with sequence parallelism the hidden-sized tensors are split over tp;
  - tensor/sequence-parallel collectives: 8 x (tp-1)/tp x a micro-batch's activations per layer (4 forward, 4
    backward) over NVLink when the tp group is inside one NVLink domain (72 GPUs on NVL72), else the
    scale-out network (`placement`); a fitted share of it is exposed (the rest overlaps the GEMMs);
  - context-parallel ring exchange of keys and values (3 x forward volume), overlapped with attention;
  - mixture of experts: the expert-parallel all-to-all (token dispatch and combine, forward and backward) of each
    token's top-k copies, over NVLink inside a domain and each rank's NIC beyond it, not overlapped;
  - recompute: full recompute repeats the layer's forward (a third of its compute and half its collectives),
    selective the attention's forward.
- pipeline point-to-point: each micro-batch's activations sent forward and their gradients back at each of a
  rank's vp stage boundaries, on the critical path (Narayanan et al. 2021, sec. 5.3.2: the interleaved schedule's
  extra point-to-point traffic costs throughput); over NVLink when the next stage is in the domain, else the
  rank's own NIC, where it does not shrink as the GPU gets faster.
- bubble: (pp - 1) / vp stage times (Megatron's interleaved 1F1B; vp = 1 is plain 1F1B).
- data parallel (over dp x cp ranks): gradients reduce-scattered and parameters all-gathered (distributed
  optimizer) or gradients all-reduced, over NVLink when the group fits in a domain, else the scale-out network;
  with overlap flags only what outlasts the last micro-batch's backward (forward for the gather) is exposed.
- optimizer: Adam's fp32 state read and written once per step from HBM (the shard with a distributed optimizer).

Fitted constants (few, shared by every device): `Constants`, stored in constants.yaml with the script and
date that fitted them (perf/calibrate_planner.py).
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import yaml

from mlbench import flops
from mlbench.layout import Layout
from mlbench.planner.devices import Device
from mlbench.planner.op_flops import flops_by_op, widths
from mlbench.spec import ModelSpec

CONSTANTS = Path(__file__).with_name("constants.yaml")
# share of linear layers NVIDIA's NVFP4 training recipe keeps in bf16 ("Pretraining Large Language Models with
# NVFP4", arXiv 2509.25149, sec. 4: about 15 % of the network, mostly the last blocks)
NVFP4_BF16_LAYERS = 0.15


@dataclass(frozen=True)
class Constants:
    gemm_efficiency: float = 0.75  # achieved / peak for bf16 GEMMs of unbounded size
    # GEMM shape as a roofline: efficiency x size / (size + gemm_traffic x ridge), size = 1 / (1/M + 1/N + 1/K) of
    # the GEMM on a rank (FLOPs per operand element / 2), ridge = peak x bytes per element / (2 x HBM bandwidth) for
    # the precision it runs in (the device's FLOP/byte balance); gemm_traffic: HBM bytes moved / the operands' size
    gemm_traffic: float = 2.0
    # achieved / bf16 peak on the model-FLOPs count of attention, which counts the full s x s products that causal
    # kernels halve: up to 2
    attention_efficiency: float = 0.8
    hbm_efficiency: float = 0.7  # achieved / peak HBM bandwidth for elementwise kernels and the optimizer
    tp_exposed: float = 0.3  # share of tensor-parallel communication not hidden behind GEMMs

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]


@functools.cache
def shipped() -> Constants:
    """The fitted constants shipped with the package (perf/calibrate_planner.py wrote them)."""
    data = yaml.safe_load(CONSTANTS.read_text())
    return Constants(**data["constants"])


@functools.cache
def provenance() -> dict:
    """Which fitted constants predicted: their values, the script that fitted them and when."""
    data = yaml.safe_load(CONSTANTS.read_text())
    return {"constants": data["constants"], "fitted_by": data.get("fitted_by"), "date": data.get("date")}


def _bytes_per_element(precision: str) -> float:
    return {"fp32": 4.0, "bf16": 2.0, "fp8": 1.0, "nvfp4": 0.5625}[precision]  # nvfp4: 4 bits + e4m3 scale / 16


@dataclass(frozen=True)
class Placement:
    """The bandwidth each parallel group's collectives get: effective one-way bytes/s per GPU."""

    tp_bw: float
    cp_bw: float
    dp_bw: float
    pp_bw: float = 0.0  # to the next pipeline stage
    ep_bw: float = 0.0  # the expert-parallel all-to-all's effective rate (mixture of experts)


def placement(layout: Layout, device: Device) -> Placement:
    """Megatron orders ranks tp, cp, dp, pp (tp fastest): a group of `size` ranks `stride` apart stays inside one
    NVLink domain when stride x size fits in it (an 8-GPU node is a domain; NVL72 racks span nodes). A group that
    spans domains crosses the scale-out network, where NCCL's rings and trees send each domain's share once: with
    k of the group's ranks in a domain, each GPU's network link carries 1/k of the data (k NICs share it)."""
    domain = device.nvlink_domain if device.nvlink_domain > 8 else min(device.nvlink_domain, layout.nproc_per_node)
    nvlink = device.nvlink_bytes_per_s / 2

    def bw(stride: int, size: int) -> float:
        if stride * size <= domain:
            return nvlink
        k = max(1, min(size, domain // stride))  # the group's ranks in one domain
        return min(nvlink, device.scaleout_bytes_per_s * k)

    # the next pipeline stage is tp x cp x dp ranks on: over NVLink when both stages' ranks share a domain, else
    # each rank sends through its own NIC (one peer each: no rail sharing)
    stride = layout.tp * layout.cp * layout.dp
    pp_bw = nvlink if 2 * stride <= domain else min(nvlink, device.scaleout_bytes_per_s)
    return Placement(tp_bw=bw(1, layout.tp), cp_bw=bw(layout.tp, layout.cp), dp_bw=bw(layout.tp, layout.cp * layout.dp),
                     pp_bw=pp_bw, ep_bw=_all_to_all_bw(layout.tp, layout.ep, domain, nvlink,
                                                       device.scaleout_bytes_per_s))


def _all_to_all_bw(stride: int, size: int, domain: int, nvlink: float, nic: float) -> float:
    """Effective rate of an all-to-all over `size` ranks `stride` apart, per byte a rank sends: of its (size - 1)
    peers, those in its NVLink domain are reached over NVLink and the rest through its own NIC, both at once."""
    if size <= 1:
        return nvlink
    k = max(1, min(size, domain // stride))  # the group's ranks in one domain, this one included
    t = max((k - 1) / (size - 1) / nvlink, (size - k) / (size - 1) / nic)
    return 1 / t


def _gemm_efficiency(c: Constants, ridge: float, rows: float, inner: float, out: float) -> float:
    size = 1 / (1 / rows + 1 / inner + 1 / out)
    return c.gemm_efficiency * size / (size + c.gemm_traffic * ridge)


def predict(m: ModelSpec, layout: Layout, device: Device, c: Constants | None = None) -> dict:
    """Predicted seconds per optimizer step, with every term (seconds per step) that makes it up."""
    if device.is_cpu:
        from mlbench.planner import cpu

        return cpu.predict(m, layout, device)
    c = c or shipped()
    prec = layout.precision
    f = layout.features
    tp, pp, vp, cp, mbs = layout.tp, layout.pp, layout.vp, layout.cp, layout.micro_batch_size
    micro = layout.num_microbatches
    h, q, kv, fc1, ffn = widths(m)
    seq, layers = m.seq_length, m.num_layers
    tokens = mbs * seq / cp  # tokens of one micro-batch on this rank
    peak_bf16 = device.peak_flops("bf16") if "bf16" in device.peaks else device.peak_flops(prec)
    hbm = device.hbm_bytes_per_s * c.hbm_efficiency
    link = placement(layout, device)
    act = _bytes_per_element("bf16" if prec != "fp32" else "fp32")  # activations between kernels

    # FLOPs per micro-batch per layer on this rank, split by operation class; the total is flops.py's
    by_op = flops_by_op(m, tp)
    gemm_flops = by_op["layer_gemm"] * mbs / (tp * cp)
    attn_flops = by_op["layer_attention"] * mbs / (tp * cp)
    head_flops = by_op["head"] * mbs / (tp * cp)
    weight_bytes = 3 * (h * (q + 2 * kv) + q * h + h * fc1 + ffn * h) / tp * _bytes_per_element(prec)
    # the layer's four GEMMs (rows, inner, out) on this rank: QKV, output projection, fc1, fc2
    shapes = [(tokens, h, (q + 2 * kv) / tp), (tokens, q / tp, h), (tokens, h, fc1 / tp), (tokens, ffn / tp, h)]
    work = [mm * kk * nn for mm, kk, nn in shapes]

    def gemm_time(flop: float, gemm_shapes: list, weights: list, p: str) -> float:
        """Seconds for GEMMs of these shapes run in precision p: its peak x the shape's roofline efficiency."""
        peak = device.peak_flops(p)
        # the roofline's ridge in elements: a GEMM smaller than it waits on HBM (time F / peak + bytes / bandwidth)
        ridge = peak * _bytes_per_element(p) / (2 * device.hbm_bytes_per_s)
        inverse_eff = sum(w / _gemm_efficiency(c, ridge, *g) for w, g in zip(weights, gemm_shapes, strict=True))
        return flop * inverse_eff / sum(weights) / peak

    gemm = gemm_time(gemm_flops, shapes, work, prec)
    if prec == "nvfp4":  # NVIDIA's NVFP4 recipe keeps the most sensitive ~15 % of linear layers in bf16
        gemm = (1 - NVFP4_BF16_LAYERS) * gemm + NVFP4_BF16_LAYERS * gemm_time(gemm_flops, shapes, work, "bf16")
    gemm = max(gemm, weight_bytes / hbm)
    # the logit layer is megatron-core's ColumnParallelLinear, not a Transformer Engine layer: bf16 at any precision
    vocab = flops.padded_vocab(m, tp) / tp
    head = gemm_time(head_flops, [(tokens, h, vocab)], [1.0], "bf16" if "bf16" in device.peaks else prec)
    attention = attn_flops / (c.attention_efficiency * peak_bf16)
    # elementwise traffic per token, forward (x3 with backward): 2 norms (read, write), 2 residual adds (2 reads,
    # a write), the activation (read fc1, write ffn), rotary on q and k; fp8 casts of the 4 GEMM inputs
    hidden_elems = 2 * 2 * h + 2 * 3 * h
    split_elems = fc1 + ffn + (2 * (q + kv) if m.position_embedding == "rope" else 0)
    elems = hidden_elems / (tp if f.sequence_parallel else 1) + split_elems / tp
    cast = (h + q + h + ffn) / tp * (act + _bytes_per_element(prec)) if prec in ("fp8", "nvfp4") else 0.0
    elementwise = 3 * tokens * (elems * act + cast) / hbm
    tp_comm = 8 * (tp - 1) / tp * tokens * h * act / link.tp_bw * c.tp_exposed if tp > 1 else 0.0
    cp_volume = 3 * (cp - 1) * tokens * 2 * kv / tp * act
    cp_comm = max(0.0, cp_volume / link.cp_bw - attention) if cp > 1 else 0.0
    ep_comm = _expert_all_to_all(m, layout, tokens, act, link)
    layer = gemm + attention + elementwise + tp_comm + cp_comm + ep_comm
    if f.recompute == "full":
        share = 1.0 if f.recompute_method == "uniform" else min(1.0, f.recompute_layers * pp * vp / layers)
        recompute_layer = share * ((gemm + attention + elementwise) / 3 + (tp_comm + ep_comm) / 2)
    elif f.recompute == "selective":
        recompute_layer = attention / 3
    else:
        recompute_layer = 0.0
    # pipeline point-to-point: at each of the rank's vp stage boundaries a micro-batch's activations go forward and
    # their gradients back ([s / cp, b, h], split over tp with sequence parallelism or Megatron-LM 2021's
    # scatter/gather), on the critical path
    split = tp if (f.sequence_parallel or getattr(f, "pipeline_scatter_gather", False)) else 1
    pp_comm = 2 * vp * tokens * h / split * act / link.pp_bw if pp > 1 else 0.0
    # one micro-batch through this rank's layers
    stage = (layers * (layer + recompute_layer) + head) / pp + pp_comm
    bubble = (pp - 1) / vp * stage

    dp_comm, optimizer = _data_parallel(m, layout, link, stage + bubble, hbm)

    per_micro = {"gemm": layers * gemm / pp + head / pp, "attention": layers * attention / pp,
                 "elementwise": layers * elementwise / pp, "tp_comm": layers * tp_comm / pp,
                 "cp_comm": layers * cp_comm / pp, "ep_comm": layers * ep_comm / pp, "pp_comm": pp_comm,
                 "recompute": layers * recompute_layer / pp}
    terms = {k: v * micro for k, v in per_micro.items()}
    terms |= {"pipeline_bubble": bubble, "dp_comm": dp_comm, "optimizer": optimizer}
    step = sum(terms.values())
    return {"step_time_s": step, "terms_s": terms, "links_bytes_per_s": asdict(link)}


def _expert_all_to_all(m: ModelSpec, layout: Layout, tokens: float, act: float, link: Placement) -> float:
    """Seconds per layer per micro-batch of a mixture-of-experts layer's token traffic (megatron-core's alltoall
    dispatcher, no token dropping): each token this rank routes (its sequence-parallel shard) goes to its top-k
    experts and comes back: dispatch and combine forward, their gradients backward, 4 all-to-alls over the
    expert-parallel group of which (ep - 1) / ep leaves the rank with balanced routing; with tensor parallelism the
    received copies are all-gathered over the tp group (and reduce-scattered back), 4 collectives more. Not
    overlapped with compute (megatron-core's default)."""
    if not m.num_experts:
        return 0.0
    tp, ep = layout.tp, layout.ep
    routed = tokens / (tp if layout.features.sequence_parallel else 1)
    copies = routed * m.moe_router_topk * m.hidden_size * act  # bytes of the token copies this rank sends
    a2a = 4 * (ep - 1) / ep * copies / link.ep_bw if ep > 1 else 0.0
    gather = 4 * (tp - 1) * copies / link.tp_bw if tp > 1 and layout.features.sequence_parallel else 0.0
    return a2a + gather


def _data_parallel(m: ModelSpec, layout: Layout, link, busy: float, hbm: float) -> tuple[float, float]:
    """(exposed data-parallel communication, optimizer step) seconds per step; `busy`: one micro-batch's stage
    time plus the pipeline bubble, what overlapped communication hides behind."""
    f, tp, pp, dp, cp = layout.features, layout.tp, layout.pp, layout.dp, layout.cp
    # data parallel over dp x cp ranks; each holds 1 / (tp x pp) of the parameters
    group = dp * cp
    params = flops.param_count(m, tp) / (tp * pp)
    grad_bytes = 4.0 if f.grad_reduce_in_fp32 else 2.0
    share = (group - 1) / group
    if f.distributed_optimizer:
        reduce = share * params * grad_bytes / link.dp_bw
        gather = share * params * (1.0 if f.fp8_param_gather else 2.0) / link.dp_bw
    else:
        reduce, gather = 2 * share * params * grad_bytes / link.dp_bw, 0.0
    # overlapped: hidden behind the last micro-batch's backward and the pipeline's cool-down (the reduce), the
    # first micro-batch's forward and the warm-up (the gather)
    if f.overlap_grad_reduce:
        reduce = max(0.0, reduce - busy * 2 / 3)
    if f.overlap_param_gather:
        gather = max(0.0, gather - busy / 3)
    # Adam: read fp32 param, grad, m, v; write param, m, v and the bf16 copy: 30 bytes a parameter
    optimizer = 30 * params / (group if f.distributed_optimizer else 1) / hbm
    return reduce + gather, optimizer
