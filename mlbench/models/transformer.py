"""What every family's transformer shares, counted analytically from a `ModelSpec` (no torch): the GEMM shapes
of a layer, its parameters as megatron-core 0.16 builds them, the padded vocabulary, and the Megatron-LM
model-FLOPs convention. Family modules add their embeddings and heads."""

from __future__ import annotations

from dataclasses import dataclass

from mlbench.spec import ModelSpec


def padded_vocab(m: ModelSpec, tp: int = 1) -> int:
    """The vocabulary as Megatron builds it: padded to a multiple of make_vocab_size_divisible_by x tp."""
    multiple = m.make_vocab_size_divisible_by * tp
    return -(-m.vocab_size // multiple) * multiple


@dataclass(frozen=True)
class Shapes:
    h: int  # hidden
    q: int  # query projection width: heads x kv_channels
    kv: int  # key (= value) projection width: groups x kv_channels
    fc1: int  # fc1 output width (doubled for a gated unit)
    ffn: int  # fc2 input width


def shapes(m: ModelSpec) -> Shapes:
    kv_channels = m.kv_channels or m.hidden_size // m.num_attention_heads
    groups = m.num_query_groups or m.num_attention_heads
    gated = 2 if m.activation == "swiglu" else 1
    return Shapes(h=m.hidden_size, q=m.num_attention_heads * kv_channels, kv=groups * kv_channels,
                  fc1=gated * m.ffn_hidden_size, ffn=m.ffn_hidden_size)


def layer_matmul_params(s: Shapes) -> int:
    """Weights of the GEMMs in one transformer layer: QKV, output projection, fc1, fc2."""
    return s.h * (s.q + 2 * s.kv) + s.q * s.h + s.h * s.fc1 + s.ffn * s.h


def norm_params(m: ModelSpec) -> int:
    """One norm's parameters: LayerNorm has weight and bias, RMSNorm weight only."""
    return (2 if m.normalization == "LayerNorm" else 1) * m.hidden_size


def decoder_params(m: ModelSpec, tp: int = 1) -> int:
    """The transformer stack, word (and learned position) embeddings, final norm and an untied output layer.

    Per layer: input norm, QKV (GQA: q + 2 kv rows), output projection, pre-MLP norm, fc1 (x2 when gated),
    fc2; biases on the linear layers when add_bias_linear (QKV bias follows it, as megatron-core's default).
    """
    s = shapes(m)
    vocab = padded_vocab(m, tp)
    norm = norm_params(m)
    layer = layer_matmul_params(s) + 2 * norm
    if m.add_bias_linear:
        layer += (s.q + 2 * s.kv) + s.h + s.fc1 + s.h
    total = m.num_layers * layer + norm + vocab * s.h
    if m.position_embedding == "learned_absolute":
        total += m.seq_length * s.h
    if m.untie_embeddings:
        total += vocab * s.h
    return total


def decoder_forward_flops(m: ModelSpec, tp: int = 1) -> float:
    """Forward model FLOPs per sample (sequence of seq_length tokens) of the stack and the logit layer, in the
    Megatron-LM convention (Narayanan et al. 2021, appendix; Megatron-LM `num_floating_point_operations`), the
    convention MFU reports for these MLPerf models use:
      - 2 x (matmul weights per layer) x s x layers: QKV (GQA-aware), output projection, fc1 (x2 gated), fc2;
      - attention 2 x 2 x s^2 x (heads x kv_channels) per layer: the Q K^T scores and the scores x V context.
        No causal halving: the convention counts the full s x s products whatever the kernel skips, so
        numbers stay comparable with Megatron-LM's and published MFU figures (halving would give ~5% less
        for GPT-3 and ~15% less for Llama 3.1 405B at their sequence lengths);
      - the logit layer 2 x s x hidden x padded vocab. Embedding lookups, norms, activations, softmax and
        biases are not counted (elementwise, not GEMMs).
    Training FLOPs are 3 x forward (backward = data and weight gradients); recomputation is not counted (model
    FLOPs, not hardware FLOPs).
    """
    sh = shapes(m)
    seq = m.seq_length
    per_layer = 2 * layer_matmul_params(sh) * seq + 4 * seq * seq * sh.q
    return m.num_layers * per_layer + 2 * seq * sh.h * padded_vocab(m, tp)


def describe(m: ModelSpec) -> str:
    kv = f", {m.num_query_groups} kv groups" if m.num_query_groups else ""
    return (f"{m.num_layers} layers, hidden {m.hidden_size}, {m.num_attention_heads} heads{kv}, "
            f"ffn {m.ffn_hidden_size}, {m.activation}, {m.norm_position}-{m.normalization}, "
            f"{m.position_embedding} positions, vocab {m.vocab_size}, sequence {m.seq_length}")
