"""LAMB (You et al. 2019, "Large Batch Optimization for Deep Learning: Training BERT in 76 minutes").

As MLPerf BERT's reference uses it (training retired_benchmarks/bert: lamb_optimizer_v1.py, optimization.py):

    m = b1 m + (1 - b1) g;   v = b2 v + (1 - b2) g^2;   m^ = m / (1 - b1^t);   v^ = v / (1 - b2^t)
    u = m^ / (sqrt(v^) + eps) + wd * w                       (decoupled weight decay inside the update)
    r = ||w|| / ||u|| if both norms > 0 else 1               (per-parameter trust ratio)
    w = w - lr * r * u

Bias and LayerNorm parameters get neither weight decay nor the trust ratio (the reference's
`exclude_from_weight_decay=["LayerNorm", "layer_norm", "bias"]`, which also is its layer-adaptation exclusion).

megatron-core 0.16's `get_megatron_optimizer` builds only Adam and SGD, so `megatron_optimizer` builds the Adam
`MegatronOptimizer` and swaps its inner torch optimizer for LAMB over the very same parameter groups: gradient
clipping, main-grad handling, fp32 master weights (bf16 on GPU) and the scheduler's per-group lr / weight decay
all stay megatron's. Those groups already carry megatron's weight-decay exclusion (`wd_mult` 0 for 1-D and
`*.bias` parameters, i.e. every bias and norm weight), which is used for the trust-ratio exclusion too.

Tensor parallelism: a parameter split across the tensor-parallel group (`tensor_model_parallel` set by
megatron's parallel layers) holds only a shard, so the squared norms of its weight and update are summed over
that group before the ratio is taken; the trust ratio is that of the full parameter, as on one device.
Replicated parameters (norms, row-parallel biases) and pipeline stages hold whole tensors. The distributed
optimizer (parameters sharded over data-parallel ranks) is refused: it would need a second reduction.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist


class LAMB(torch.optim.Optimizer):
    """LAMB over parameter groups; a group with `layer_adaptation: False` skips the trust ratio."""

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        tp_group: dist.ProcessGroup | None = None,
    ) -> None:
        if lr < 0 or eps < 0 or weight_decay < 0 or not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"invalid LAMB settings: lr {lr}, betas {betas}, eps {eps}, weight decay {weight_decay}")
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay, "layer_adaptation": True}
        super().__init__(params, defaults)
        self.tp_group = tp_group

    def _tp_split(self, p: torch.Tensor) -> bool:
        return (self.tp_group is not None and dist.get_world_size(self.tp_group) > 1
                and bool(getattr(p, "tensor_model_parallel", False)))

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        # Pass 1: moments and raw updates; the norms of every adapted parameter, reduced in one collective.
        updates: list[tuple[torch.Tensor, torch.Tensor, float, bool]] = []  # (param, update, lr, adapted)
        norms: list[torch.Tensor] = []  # squared ||w||, ||u|| per adapted parameter, in order
        split: list[bool] = []
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad.float()
                state = self.state[p]
                if "exp_avg" not in state:
                    state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32)
                # megatron's init_state_fn (checkpoint loading) creates the moments without a step count
                state["step"] = state.get("step", 0) + 1
                t = state["step"]
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(b1).add_(g, alpha=1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                u = (m / (1 - b1**t)) / ((v / (1 - b2**t)).sqrt_().add_(group["eps"]))
                if group["weight_decay"]:
                    u.add_(p.float(), alpha=group["weight_decay"])
                adapted = bool(group.get("layer_adaptation", True))
                if adapted:
                    norms.append(torch.stack([p.float().pow(2).sum(), u.pow(2).sum()]))
                    split.append(self._tp_split(p))
                updates.append((p, u, group["lr"], adapted))
        if norms:
            sq = torch.stack(norms)  # [n, 2]
            if any(split):
                # Split parameters: sum their shards' squared norms over the tensor-parallel group. Replicated
                # ones are masked out of the sum and keep their local norms (each rank holds the whole tensor).
                mask = torch.tensor(split, dtype=sq.dtype, device=sq.device).unsqueeze(1)
                shard = sq * mask
                dist.all_reduce(shard, group=self.tp_group)
                sq = shard + sq * (1 - mask)
            w_norm, u_norm = sq.sqrt().unbind(dim=1)
            ratios = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones_like(w_norm)).tolist()
        else:
            ratios = []
        i = 0
        for p, u, lr, adapted in updates:
            ratio = 1.0
            if adapted:
                ratio, i = ratios[i], i + 1
            p.add_(u.to(p.dtype), alpha=-lr * ratio)
        return loss


def megatron_optimizer(opt_config: Any, model: list[torch.nn.Module], name: str,
                       decay_norms_and_biases: bool = False) -> Any:
    """megatron-core's optimizer for `model`: Adam(W) as `get_megatron_optimizer` builds it, or LAMB inside it.
    `decay_norms_and_biases`: one parameter group, all decayed (no overrides), instead of megatron's default
    of no decay on biases and 1-D parameters."""
    from megatron.core import parallel_state
    from megatron.core.optimizer import get_megatron_optimizer

    optimizer = get_megatron_optimizer(opt_config, model, config_overrides={} if decay_norms_and_biases else None)
    if name != "lamb":
        return optimizer
    if opt_config.use_distributed_optimizer:
        raise ValueError("LAMB needs whole parameters on each data-parallel rank (no distributed optimizer)")
    tp_group = parallel_state.get_tensor_model_parallel_group()
    # get_megatron_optimizer returns a ChainedOptimizer (dense and expert parts); swap inside each member.
    for member in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(member, "optimizer", None)
        if inner is None:  # a rank with no trainable parameters: nothing to swap
            continue
        groups = []
        for g in inner.param_groups:
            # Fresh dicts over the same tensors (fp32 main params under bf16), keeping megatron's group keys
            # (wd_mult, max_lr, min_lr, ...) that the scheduler reads.
            group = {k: v for k, v in g.items() if k not in ("betas", "eps")}
            group["layer_adaptation"] = g.get("wd_mult", 1.0) != 0.0
            groups.append(group)
        member.optimizer = LAMB(groups, lr=opt_config.lr, betas=(opt_config.adam_beta1, opt_config.adam_beta2),
                                eps=opt_config.adam_eps, weight_decay=opt_config.weight_decay, tp_group=tp_group)
    return optimizer
