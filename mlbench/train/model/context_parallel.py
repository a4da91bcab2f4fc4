"""Context parallelism without Transformer Engine (CPU): each context-parallel rank holds a load-balanced share
of every sequence and attends over the whole of it.

megatron-core splits a sequence into 2 x cp chunks and gives rank r chunks r and 2cp-1-r (its
`get_batch_on_this_cp_rank`), so every rank holds as much of the causal mask's work as any other. Its only
attention under CP is Transformer Engine's (ring exchange of keys and values); megatron's local
DotProductAttention refuses CP. `ContextParallelAttention` is that local attention with the keys and values of
the whole sequence all-gathered over the CP group (their gradients summed back to the rank that owns them) and a
causal mask over the true positions of the shuffled chunks. Plugged in as the layer spec's `core_attention`.
The batch split (`share`) is the stepper's; the loss is summed over the CP group by megatron's per-token loss
(`calculate_per_token_loss`, set in config.py under CP).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.transformer_config import TransformerConfig


def positions(seq: int, cp: int, rank: int) -> torch.Tensor:
    """The sequence positions CP rank `rank` holds, in order: chunks rank and 2cp-1-rank of 2 x cp."""
    c = seq // (2 * cp)
    first, second = rank, 2 * cp - 1 - rank
    return torch.cat([torch.arange(first * c, (first + 1) * c), torch.arange(second * c, (second + 1) * c)])


def share(batch: dict[str, torch.Tensor], cp: int, rank: int) -> dict[str, torch.Tensor]:
    """This CP rank's share of a micro-batch: every [b, s] tensor (tokens, labels, loss mask, position ids) cut
    along the sequence as megatron's get_batch_on_this_cp_rank cuts it."""
    out = {}
    for k, v in batch.items():
        if v.dim() < 2:  # per-sample values (a next-sentence label) are the same on every CP rank
            out[k] = v
            continue
        if v.shape[1] % (2 * cp):
            raise ValueError(f"sequence length {v.shape[1]} does not split into 2 x cp = {2 * cp} chunks")
        out[k] = v.index_select(1, positions(v.shape[1], cp, rank)).contiguous()
    return out


class _GatherSequence(torch.autograd.Function):
    """All-gather along dim 0 over the CP group; backward: each rank's slice of the summed gradients. (gloo has
    no reduce-scatter: an all-reduce then the own slice computes the same.)"""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:  # type: ignore[override]
        ctx.group = group
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=0)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        n = grad.shape[0] // dist.get_world_size(ctx.group)
        rank = dist.get_rank(ctx.group)
        return grad[rank * n:(rank + 1) * n], None


class ContextParallelAttention(DotProductAttention):
    def __init__(self, config: TransformerConfig, *args, **kwargs) -> None:
        if config.window_size is not None:
            raise NotImplementedError("context parallel without Transformer Engine: no sliding-window attention")
        cp = config.context_parallel_size
        # megatron's local attention asserts cp == 1 at construction; it reads nothing else of cp.
        config.context_parallel_size = 1
        try:
            super().__init__(config, *args, **kwargs)
        finally:
            config.context_parallel_size = cp
        self.cp = cp
        self.cp_group = parallel_state.get_context_parallel_group()
        self.cp_rank = parallel_state.get_context_parallel_rank()

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, attn_mask_type: AttnMaskType | None = None,
                attention_bias: torch.Tensor | None = None, packed_seq_params=None) -> torch.Tensor:
        mask_type = attn_mask_type if attn_mask_type is not None else self.attn_mask_type
        if attention_mask is not None or mask_type != AttnMaskType.causal:
            raise NotImplementedError("context parallel without Transformer Engine: causal attention only")
        # Keys and values of the whole sequence, one collective for both: [s/cp, b, g, d] -> [s, b, g, d].
        kv = _GatherSequence.apply(torch.cat([key, value], dim=-1), self.cp_group)
        key, value = kv.split([key.shape[-1], value.shape[-1]], dim=-1)
        s_local = query.shape[0]
        seq = s_local * self.cp
        q_pos = positions(seq, self.cp, self.cp_rank)
        k_pos = torch.cat([positions(seq, self.cp, r) for r in range(self.cp)])
        mask = (k_pos[None, :] > q_pos[:, None])[None, None]  # True: not attended (megatron's convention)
        return super().forward(query, key.contiguous(), value.contiguous(), mask, AttnMaskType.arbitrary,
                               attention_bias, packed_seq_params)
