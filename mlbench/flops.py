"""Parameter counts and model FLOPs of a benchmark's model, computed analytically from its `ModelSpec`.

`param_count` counts exactly what megatron-core 0.16's `GPTModel` / `BertModel` build for the spec (checked
against the built modules in tests/test_benchmarks_full.py). `flops_per_sample` is the model-FLOPs count used
for MFU, in the Megatron-LM convention (see its docstring).
"""

from __future__ import annotations

from dataclasses import dataclass

from mlbench.spec import ModelSpec


def padded_vocab(m: ModelSpec, tp: int = 1) -> int:
    """The vocabulary as Megatron builds it: padded to a multiple of make_vocab_size_divisible_by x tp."""
    multiple = m.make_vocab_size_divisible_by * tp
    return -(-m.vocab_size // multiple) * multiple


@dataclass(frozen=True)
class _Shapes:
    h: int  # hidden
    q: int  # query projection width: heads x kv_channels
    kv: int  # key (= value) projection width: groups x kv_channels
    fc1: int  # fc1 output width (doubled for a gated unit)
    ffn: int  # fc2 input width


def _shapes(m: ModelSpec) -> _Shapes:
    kv_channels = m.kv_channels or m.hidden_size // m.num_attention_heads
    groups = m.num_query_groups or m.num_attention_heads
    gated = 2 if m.activation == "swiglu" else 1
    return _Shapes(h=m.hidden_size, q=m.num_attention_heads * kv_channels, kv=groups * kv_channels,
                   fc1=gated * m.ffn_hidden_size, ffn=m.ffn_hidden_size)


def _layer_matmul_params(s: _Shapes) -> int:
    """Weights of the GEMMs in one transformer layer: QKV, output projection, fc1, fc2."""
    return s.h * (s.q + 2 * s.kv) + s.q * s.h + s.h * s.fc1 + s.ffn * s.h


def param_count(m: ModelSpec, tp: int = 1) -> int:
    """Parameters of the full (unsharded) model megatron-core builds for `m` at tensor parallelism `tp`.

    Per layer: input norm, QKV (GQA: q + 2 kv rows), output projection, pre-MLP norm, fc1 (x2 when gated),
    fc2; biases on the linear layers when add_bias_linear (QKV bias follows it, as megatron-core's default);
    LayerNorm has weight and bias, RMSNorm weight only. Then the word embedding (padded vocabulary), learned
    positions if any, the final norm, and an output layer when embeddings are untied. BertModel adds
    token-type embeddings, the LM head (dense h x h + bias, LayerNorm), the output-layer bias (padded vocab),
    and with add_binary_head the pooler (h x h + bias) and the next-sentence head (h x 2 + bias).
    """
    s = _shapes(m)
    vocab = padded_vocab(m, tp)
    norm = (2 if m.normalization == "LayerNorm" else 1) * s.h
    layer = _layer_matmul_params(s) + 2 * norm
    if m.add_bias_linear:
        layer += (s.q + 2 * s.kv) + s.h + s.fc1 + s.h
    total = m.num_layers * layer + norm + vocab * s.h
    if m.position_embedding == "learned_absolute":
        total += m.seq_length * s.h
    if m.family == "bert":
        total += m.num_tokentypes * s.h
        total += s.h * s.h + s.h + 2 * s.h  # lm_head: dense + bias, LayerNorm (weight, bias)
        total += vocab  # output-layer bias
        if m.add_binary_head:
            total += s.h * s.h + s.h + s.h * 2 + 2  # pooler dense, binary head
    if m.untie_embeddings:
        total += vocab * s.h
    return total


def flops_per_sample(m: ModelSpec, tp: int = 1) -> float:
    """Model FLOPs to train on one sample (sequence of seq_length tokens): forward + backward = 3 x forward.

    Forward, per sample of s tokens, in the Megatron-LM convention (Narayanan et al. 2021, appendix; Megatron-LM
    `num_floating_point_operations`), the convention MFU reports for these MLPerf models use:
      - 2 x (matmul weights per layer) x s x layers: QKV (GQA-aware), output projection, fc1 (x2 gated), fc2;
      - attention 2 x 2 x s^2 x (heads x kv_channels) per layer: the Q K^T scores and the scores x V context.
        No causal halving: the convention counts the full s x s products whatever the kernel skips, so
        numbers stay comparable with Megatron-LM's and published MFU figures (halving would give ~5% less
        for GPT-3 and ~15% less for Llama 3.1 405B at their sequence lengths);
      - the logit layer 2 x s x hidden x padded vocab; BERT's LM-head dense (applied to every position, as
        megatron-core's BertModel does) and pooler are counted too. Embedding lookups, norms, activations,
        softmax and biases are not (elementwise, not GEMMs).
    Backward is twice the forward (data and weight gradients), so training FLOPs = 3 x forward. Activation
    recomputation is not counted (model FLOPs, not hardware FLOPs).
    """
    sh = _shapes(m)
    seq = m.seq_length
    vocab = padded_vocab(m, tp)
    per_layer = 2 * _layer_matmul_params(sh) * seq + 4 * seq * seq * sh.q
    forward = m.num_layers * per_layer + 2 * seq * sh.h * vocab
    if m.family == "bert":
        forward += 2 * seq * sh.h * sh.h  # LM-head dense
        if m.add_binary_head:
            forward += 2 * sh.h * sh.h + 2 * sh.h * 2  # pooler and next-sentence head, first token only
    return 3.0 * forward


__all__ = ["flops_per_sample", "padded_vocab", "param_count"]
