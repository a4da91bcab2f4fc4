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
