"""The encoder family (BERT-large): megatron-core's BertModel, masked LM (and next-sentence prediction) on the
Markov source or MLPerf BERT's pre-masked TFRecord samples."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mlbench.models import Family, transformer

if TYPE_CHECKING:
    from mlbench.spec import Benchmark, ModelSpec


def _replicated_heads(m: ModelSpec) -> int:
    """What BertModel adds to the decoder whole on every tensor-parallel rank: token-type embeddings, the LM head
    (dense h x h + bias, LayerNorm), and with add_binary_head the pooler (h x h + bias) and the next-sentence head
    (h x 2 + bias)."""
    h = m.hidden_size
    total = m.num_tokentypes * h + h * h + h + 2 * h
    if m.add_binary_head:
        total += h * h + h + h * 2 + 2
    return total


def param_count(m: ModelSpec, tp: int = 1) -> int:
    """The decoder's count, the heads (_replicated_heads) and the output-layer bias (padded vocab)."""
    return transformer.decoder_params(m, tp) + _replicated_heads(m) + transformer.padded_vocab(m, tp)


def head_params(m: ModelSpec, tp: int = 1) -> int:
    """The heads' parameters on one tensor-parallel rank: the output-layer bias is split with the output layer
    (megatron's ColumnParallelLinear), the rest whole."""
    return _replicated_heads(m) + transformer.padded_vocab(m, tp) // tp


def flops_per_sample(m: ModelSpec, tp: int = 1) -> float:
    """The decoder's, plus the LM-head dense (applied to every position, as megatron-core's BertModel does) and
    the pooler and next-sentence head (first token only)."""
    h = m.hidden_size
    forward = transformer.decoder_forward_flops(m, tp) + 2 * m.seq_length * h * h
    if m.add_binary_head:
        forward += 2 * h * h + 2 * h * 2
    return 3.0 * forward


def describe(m: ModelSpec) -> str:
    heads = f", {m.num_tokentypes} token types" + (", next-sentence head" if m.add_binary_head else "")
    return transformer.describe(m) + heads


def layer_spec(m: ModelSpec, backend: str) -> Any:
    # megatron's BertModel accepts only its own DotProductAttention or TE's (it compares the class, then asks
    # for TE's version), so BERT keeps the local attention where TE is absent, even on a GPU.
    if backend == "te":
        from megatron.core.models.bert.bert_layer_specs import bert_layer_with_transformer_engine_spec

        spec = bert_layer_with_transformer_engine_spec
    else:
        from megatron.core.models.bert.bert_layer_specs import bert_layer_local_spec

        spec = bert_layer_local_spec
    import copy

    return copy.deepcopy(spec)  # module-level objects shared by every caller: edits stay ours


def build_model(m: ModelSpec, config: Any, spec: Any, common: dict) -> Any:
    from megatron.core.models.bert.bert_model import BertModel

    from mlbench.train.model.config import activation

    model = BertModel(config=config, transformer_layer_spec=spec, **common, num_tokentypes=m.num_tokentypes,
                      add_binary_head=m.add_binary_head)
    if common["post_process"]:
        model.lm_head.gelu = activation(m)  # megatron's BertLMHead hard-codes the erf GeLU; BERT's uses hidden_act
    return model


def objective(b: Benchmark) -> Any:
    from mlbench.train.objectives import MaskedLM, PreMaskedLM

    vocab = b.model.vocab_size if b.model.mask_padded_vocab else None
    if b.data.source == "tfrecord":
        return PreMaskedLM(b.model.seq_length, b.data.max_predictions_per_seq, output_vocab=vocab)
    # the last id is [MASK]
    return MaskedLM(vocab_size=b.model.vocab_size - 1, mask_prob=b.data.mask_prob,
                    num_tokentypes=b.model.num_tokentypes, output_vocab=vocab)


def edge_activation_units(m: ModelSpec) -> tuple[float, float]:
    """Outside the layers (saved tensors traced on CPU, megatron-core 0.16 BertModel): the embedding LayerNorm's
    input and output on the first stage; on the last, the LM head's dense output, GeLU output and LayerNorm output
    (the last layer's output is the dense layer's input, counted with the layer), and no final norm: post-LN layers
    end normalized. A pre-LN encoder has megatron's final norm (input and output) before the head instead: not
    traced, no benchmark runs one."""
    return (2.0, 3.0) if m.norm_position == "post" else (0.0, 5.0)


FAMILY = Family(
    name="bert",
    data_sources=("markov", "tfrecord"),
    markov_vocab=lambda m: m.vocab_size - 1,  # one id kept for [MASK]
    param_count=param_count,
    head_params=head_params,
    edge_activation_units=edge_activation_units,
    flops_per_sample=flops_per_sample,
    describe=describe,
    build_model=build_model,
    layer_spec=layer_spec,
    objective=objective,
    metric="masked_lm_accuracy",
    # The MLPerf reference checkpoint (TF, in its PyTorch form) maps onto the post-LN model only.
    converter=lambda m: "mlbench.train.checkpoint.convert_bert" if m.norm_position == "post" else None,
)
