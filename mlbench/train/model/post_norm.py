"""Post-LayerNorm transformer layers from megatron-core parts: the original BERT's residual ordering.

megatron-core's layers are pre-LN, x + f(LN(x)), with a final LayerNorm after the last layer. The MLPerf
BERT reference (TF modeling.py) is post-LN: LN(x + f(x)) after attention and after the MLP, and a LayerNorm on
the embeddings (word + position + token type, before dropout), with no final one. megatron-core's
`apply_residual_connection_post_layernorm` is a config field its layers do not read, so this builds the
ordering from the layer's own spec slots instead of a copied layer:

- the input and pre-MLP norms become identities, so attention and MLP see the un-normalised residual stream;
- the two bias-dropout-add slots become `PostNormAdd`: megatron's bias-dropout-add, then a LayerNorm;
- the embedding's dropout becomes `NormThenDropout` and the block's final LayerNorm is removed (`post_norm_model`).

The parameter count is unchanged (two norms a layer, one more on the embeddings, one fewer at the end).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
from megatron.core.transformer.identity_op import IdentityOp
from megatron.core.transformer.spec_utils import ModuleSpec, build_module
from megatron.core.transformer.transformer_config import TransformerConfig


class PostNormAdd(torch.nn.Module):
    """A bias-dropout-add slot that normalises the sum: LN(residual + dropout(x + bias))."""

    def __init__(self, config: TransformerConfig, norm: type | ModuleSpec) -> None:
        super().__init__()
        self.norm = build_module(norm, config=config, hidden_size=config.hidden_size, eps=config.layernorm_epsilon)

    def forward(self, training: bool, fused: bool) -> Callable:
        # Called like megatron's get_bias_dropout_add(training, fused): returns the function to apply.
        bda = get_bias_dropout_add(training, fused)

        def add_then_norm(x_with_bias, residual, prob):
            out = bda(x_with_bias, residual, prob)
            # megatron runs this slot under enable_grad (its bias-add needs it); in a no-grad evaluation the
            # norm would otherwise record a graph and keep its input alive, layer after layer.
            with torch.set_grad_enabled(x_with_bias[0].requires_grad or residual.requires_grad):
                return self.norm(out)

        return add_then_norm


class NormThenDropout(torch.nn.Module):
    """The embedding's last step, BERT's layer_norm_and_dropout: LayerNorm, then dropout."""

    def __init__(self, norm: torch.nn.Module, dropout: torch.nn.Module) -> None:
        super().__init__()
        self.layer_norm = norm
        self.dropout = dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.layer_norm(x))


def norm_module(spec: ModuleSpec, te: bool) -> type:
    """The norm the pre-LN spec uses (Transformer Engine's specs fuse it into the linear layers)."""
    if te:
        from megatron.core.extensions.transformer_engine import TENorm

        return TENorm
    return spec.submodules.input_layernorm


def post_norm_spec(spec: ModuleSpec, config: TransformerConfig, te: bool) -> ModuleSpec:
    """`spec` (a pre-LN layer spec) with the post-LN ordering."""
    norm = norm_module(spec, te)
    spec = copy.deepcopy(spec)
    sub = spec.submodules
    sub.input_layernorm = IdentityOp
    sub.pre_mlp_layernorm = IdentityOp
    sub.sharded_state_dict_keys_map = {}  # the pre-LN norms it renames are gone
    sub.self_attn_bda = ModuleSpec(module=PostNormAdd, params={"config": config, "norm": norm})
    sub.mlp_bda = ModuleSpec(module=PostNormAdd, params={"config": config, "norm": norm})
    if te:  # the linear layers without Transformer Engine's fused input LayerNorm
        from megatron.core.extensions.transformer_engine import TEColumnParallelLinear

        sub.self_attention.submodules.linear_qkv = TEColumnParallelLinear
        sub.mlp.submodules.linear_fc1 = TEColumnParallelLinear
    return spec


def post_norm_model(model: torch.nn.Module, config: TransformerConfig, spec: ModuleSpec) -> torch.nn.Module:
    """Adds the embedding LayerNorm (first pipeline stage) and drops the final one (last stage); `spec` is the
    post-LN layer spec the model was built with."""
    norm = spec.submodules.self_attn_bda.params["norm"]
    embedding = getattr(model, "embedding", None)
    if embedding is not None:
        ln = build_module(norm, config=config, hidden_size=config.hidden_size, eps=config.layernorm_epsilon)
        embedding.embedding_dropout = NormThenDropout(ln, embedding.embedding_dropout)
    block = model.encoder if hasattr(model, "encoder") else model.decoder  # BertModel / GPTModel
    block.final_layernorm = None
    return model
