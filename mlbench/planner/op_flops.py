"""A model's FLOPs split by the kind of operation the step-time models time separately (GEMMs, attention, the
logit layer), for the GPU model (step_time.py) and the measured CPU (cpu.py) alike."""

from __future__ import annotations

from mlbench import flops
from mlbench.spec import ModelSpec


def widths(m: ModelSpec) -> tuple[int, int, int, int, int]:
    kv_channels = m.kv_channels or m.hidden_size // m.num_attention_heads
    q = m.num_attention_heads * kv_channels
    kv = (m.num_query_groups or m.num_attention_heads) * kv_channels
    fc1 = (2 if m.activation == "swiglu" else 1) * m.ffn_hidden_size
    return m.hidden_size, q, kv, fc1, m.ffn_hidden_size


def flops_by_op(m: ModelSpec, tp: int) -> dict[str, float]:
    """flops.flops_per_sample split into per-layer GEMMs, per-layer attention and the rest (the logit layer and any
    heads): attention is 3 x 4 s^2 (heads x kv_channels) per layer and the logit layer 3 x 2 s h vocab, as flops.py
    counts them; the GEMMs are what remains of its total."""
    _, q, _, _, _ = widths(m)
    total = flops.flops_per_sample(m, tp)
    attention = 3.0 * 4 * m.seq_length ** 2 * q
    head = 3.0 * 2 * m.seq_length * m.hidden_size * flops.padded_vocab(m, tp)
    return {"layer_attention": attention, "head": head,
            "layer_gemm": (total - head) / m.num_layers - attention}
