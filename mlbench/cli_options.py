"""The layout options `mlbench run` and `mlbench plan` share, declared once: the same flags, the same meaning.

`@layout_options` adds them to a click command and hands the command one `layout: LayoutRequest` in their
place. A flag left unset is left out of the request, so the benchmark file's default applies.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import click

from mlbench.cli_numbers import INT
from mlbench.preflight import LayoutRequest

# FeaturesSpec fields with a flag of their own.
FEATURE_FLAGS = ("distributed_optimizer", "sequence_parallel", "recompute", "recompute_layers", "recompute_method",
                 "overlap_grad_reduce", "overlap_param_gather")
_DEFAULT = "Default: the benchmark file's."

_OPTIONS = (
    click.option("--nodes", default=1, show_default=True, type=INT, help="Nodes the run spans."),
    click.option("--nproc-per-node", default=1, show_default=True, type=INT, help="Processes (devices) per node."),
    click.option("--tp", type=INT, help="Tensor parallel size."),
    click.option("--pp", type=INT, help="Pipeline parallel size."),
    click.option("--vp", type=INT, help="Virtual pipeline stages per rank (interleaved schedule)."),
    click.option("--cp", type=INT, help="Context parallel size."),
    click.option("--ep", type=INT, help="Expert parallel size (mixture-of-experts models): divides dp x cp."),
    click.option("--micro-batch-size", "--mbs", "micro_batch_size", type=INT,
                 help=f"Sequences per micro-batch on each data-parallel rank. {_DEFAULT}"),
    click.option("--global-batch-size", "--gbs", "global_batch_size", type=INT,
                 help=f"Sequences per optimizer step over all ranks (the RCP's batch). {_DEFAULT}"),
    click.option("--distributed-optimizer/--no-distributed-optimizer", default=None,
                 help=f"Shard fp32 master weights and optimizer state over data parallel. {_DEFAULT}"),
    click.option("--sequence-parallel/--no-sequence-parallel", default=None,
                 help=f"Split norms, dropout and residual activations over tensor-parallel ranks (tp > 1). {_DEFAULT}"),
    click.option("--recompute", type=click.Choice(["none", "selective", "full"]),
                 help=f"Activation recompute: selective (core attention) or full (whole layers). {_DEFAULT}"),
    click.option("--recompute-layers", type=INT, help="Full recompute: layers per group (uniform) or per stage "
                                                      "(block)."),
    click.option("--recompute-method", type=click.Choice(["uniform", "block"]),
                 help="Full recompute: how layers are chosen."),
    click.option("--overlap-grad-reduce/--no-overlap-grad-reduce", default=None,
                 help=f"Overlap the gradient reduce(-scatter) with the backward pass. {_DEFAULT}"),
    click.option("--overlap-param-gather/--no-overlap-param-gather", default=None,
                 help=f"Overlap the distributed optimizer's parameter all-gather with the forward pass. {_DEFAULT}"),
    click.option("--asymmetric-pipeline-split/--no-asymmetric-pipeline-split", "asymmetric_split", default=None,
                 help="Megatron's asymmetric pipeline split: the embedding and the loss each count as a layer of the "
                      "first and the last stage (Llama 3.1 405B's 126 layers over pp x vp = 64 or 128). Default: the "
                      "reference layout's, where its pipeline is the one used."),
    click.option("--precision", type=click.Choice(["bf16", "fp8"]),
                 help=f"What the matmuls run in on a GPU (fp8: Transformer Engine, FP8 GPUs only). {_DEFAULT}"),
)
_KEYS = ("nodes", "nproc_per_node", "tp", "pp", "vp", "cp", "ep", "micro_batch_size", "global_batch_size",
         "precision", "asymmetric_split")


def layout_options(command: Callable) -> Callable:
    """Adds the layout options to a click command; it receives them as `layout: LayoutRequest`."""

    @functools.wraps(command)
    def with_layout(*args, **kwargs):
        values = {k: kwargs.pop(k) for k in _KEYS}
        features = {k: v for k in FEATURE_FLAGS if (v := kwargs.pop(k)) is not None}
        return command(*args, layout=LayoutRequest(**values, features=features), **kwargs)

    for option in reversed(_OPTIONS):
        with_layout = option(with_layout)
    return with_layout
