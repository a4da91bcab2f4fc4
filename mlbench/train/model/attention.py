"""Core attention through PyTorch's fused kernels, for a GPU without Transformer Engine.

megatron-core's local `DotProductAttention` materialises the [b, heads, s, s] score matrix; this module keeps its
construction and contract (query/key/value [s, b, heads, head_dim] in, [s, b, hidden/tp] out, megatron's mask
convention) and computes the same attention with `torch.nn.functional.scaled_dot_product_attention`, which picks
flash or memory-efficient kernels on a GPU. Plugged in as the layer spec's `core_attention` submodule.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from megatron.core import tensor_parallel
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType


class SDPAttention(DotProductAttention):
    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, attn_mask_type: AttnMaskType | None = None,
                attention_bias: torch.Tensor | None = None, packed_seq_params=None) -> torch.Tensor:
        if packed_seq_params is not None or attention_bias is not None:
            raise NotImplementedError("SDPAttention supports neither packed sequences nor attention bias")
        groups = self.num_attention_heads_per_partition // self.num_query_groups_per_partition
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [s, b, h, d] -> [b, h, s, d]
        mask_type = attn_mask_type if attn_mask_type is not None else self.attn_mask_type
        causal = mask_type == AttnMaskType.causal and attention_mask is None
        # megatron's masks are True where attention is *not* allowed; SDPA's boolean masks the opposite.
        keep = None if attention_mask is None else ~attention_mask
        p = self.attention_dropout.p if self.training else 0.0
        with tensor_parallel.get_cuda_rng_tracker().fork():  # dropout agrees across tensor-parallel ranks
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, dropout_p=p, is_causal=causal,
                                                 scale=self.softmax_scale, enable_gqa=groups > 1)
        s, b = out.size(2), out.size(0)
        return out.permute(2, 0, 1, 3).reshape(s, b, -1)  # [b, h, s, d] -> [s, b, h*d]
