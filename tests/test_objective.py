"""The losses under tensor parallelism, on real processes: with `model.mask_padded_vocab` the padded vocabulary
(megatron pads the output layer to a multiple of make_vocab_size_divisible_by x tp) takes no probability, is
never the argmax and gets no gradient, so loss and accuracy are those of the real vocabulary (BERT's reference
output is exactly 30,522 wide)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from conftest import launch_ranks

_SCRIPT = textwrap.dedent("""
    import json, sys
    import torch, torch.distributed as dist, torch.nn.functional as F
    from mlbench.train import cpu_compat
    cpu_compat.enable()
    from mlbench.train.build import init_process_group
    init_process_group("gloo")  # as mlbench's ranks do under its agent (rank 0's store on the port the agent holds)
    from megatron.core import parallel_state
    parallel_state.initialize_model_parallel(2, 1)
    from mlbench.train.objectives import _loss
    rank, real, padded = dist.get_rank(), 7, 10  # ids 7, 8, 9 are padding, all on rank 1
    torch.manual_seed(0)
    full = torch.randn(4, 3, padded)
    full[..., real:] += 20.0  # padding that would win every argmax and take most of the probability
    labels = torch.randint(0, real, (4, 3))
    mask = torch.ones(4, 3)
    out = {}
    for vocab in (real, None):
        part = full[..., rank * 5:(rank + 1) * 5].clone().requires_grad_()
        loss_sum, n, stats = _loss(mask, labels, True, vocab, part)
        loss_sum.backward()
        out[str(vocab)] = {"loss": loss_sum.item(), "correct": stats["correct"].item(),
                           "pad_grad": part.grad[..., max(real - rank * 5, 0):].abs().sum().item()}
    ref = F.cross_entropy(full[..., :real].reshape(-1, real), labels.reshape(-1), reduction="sum").item()
    out["reference_loss"] = ref
    out["reference_correct"] = (full[..., :real].argmax(-1) == labels).sum().item()
    if rank == 1:
        print(json.dumps(out))
    sys.stdout.flush()
    import os
    os._exit(0)  # as mlbench's ranks do: the interpreter's teardown of gloo's threads can abort ("terminate called")
""")


def test_padded_vocabulary_is_left_out_of_loss_and_accuracy(tmp_path: Path) -> None:
    script = tmp_path / "padded.py"
    script.write_text(_SCRIPT)
    out = json.loads(launch_ranks(script, 2, rank=1).strip().splitlines()[-1])
    masked, kept = out["7"], out["None"]
    assert abs(masked["loss"] - out["reference_loss"]) < 1e-4 * out["reference_loss"]
    assert masked["correct"] == out["reference_correct"]
    assert masked["pad_grad"] == 0.0
    # Without the mask the padding dominates: the check above can tell the two apart.
    assert kept["loss"] > masked["loss"] + 10 and kept["correct"] == 0 and kept["pad_grad"] > 0


def test_bert_loss_weighs_every_masked_token_and_every_sample_alike_on_any_micro_batch_split(monkeypatch) -> None:
    """Tiny bert's loss was each micro-batch's masked-token mean, the means averaged: `--mbs 8` (same global
    batch) trained otherwise than 16 and reached the target at 240 steps, not 220. megatron now divides the
    step's summed loss by its masked tokens on every layout, and the next-sentence loss is the mean over the
    step's samples, as the reference adds the two; on one micro-batch of 16, two of 8, or two ranks of 8."""
    import dataclasses

    import torch
    import torch.nn.functional as F
    from megatron.core import parallel_state, tensor_parallel

    from mlbench import registry
    from mlbench.train import model as M
    from mlbench.train.objectives import PreMaskedLM, _pre_masked_loss

    bert = registry.load("bert", tiny=True).model
    for cp in (1, 2):
        assert M.transformer_config(dataclasses.replace(bert, num_layers=2), tp=1, pp=1, vp=1, cp=cp,
                                    bf16=False).calculate_per_token_loss
    monkeypatch.setattr(tensor_parallel, "vocab_parallel_cross_entropy",
                        lambda logits, labels: F.cross_entropy(logits.transpose(1, 2), labels, reduction="none"))
    monkeypatch.setattr(parallel_state, "get_tensor_model_parallel_rank", lambda: 0)
    g = torch.Generator().manual_seed(0)
    logits, labels = torch.randn(16, 6, 11, generator=g), torch.randint(0, 11, (16, 6), generator=g)
    mask = (torch.rand(16, 6, generator=g) < torch.linspace(0.1, 0.9, 16)[:, None]).float()  # 0 to 6 per row
    mask[:, 0] = 1.0
    binary, nsp = torch.randn(16, 2, generator=g), torch.randint(0, 2, (16,), generator=g)
    want = ((F.cross_entropy(logits.transpose(1, 2), labels, reduction="none") * mask).sum() / mask.sum()
            + F.cross_entropy(binary, nsp)).item()

    def step_loss(ranks: int, mbs: int) -> float:
        """The loss megatron differentiates: every micro-batch's summed loss over the step's masked tokens."""
        rows = [list(range(r * 16 // ranks, (r + 1) * 16 // ranks)) for r in range(ranks)]
        per_rank = [[{"loss_mask": mask[i:i + mbs]} for i in r[::mbs]] for r in rows]
        every = torch.cat([b["loss_mask"] for bs in per_rank for b in bs]).sum()
        summed, tokens = 0.0, 0
        for r, bs in zip(rows, per_rank, strict=True):
            PreMaskedLM(6, 3).weigh(bs, 16, lambda mine: every.to(mine.dtype))
            for b, i in zip(bs, r[::mbs], strict=True):
                s = slice(i, i + mbs)
                loss, n, _ = _pre_masked_loss(mask[s], labels[s], nsp[s], b["nsp_scale"], False, None,
                                              (logits[s], binary[s]))
                summed, tokens = summed + loss.item(), tokens + int(n)
        return summed / tokens

    for ranks, mbs in ((1, 16), (1, 8), (2, 8), (2, 4)):
        assert abs(step_loss(ranks, mbs) - want) < 1e-5, (ranks, mbs)
