"""`python -m mlbench.train.checkpoint.check PLAN.json [--listing-only]`: checks `--init-checkpoint` against the
model a plan describes, at full size, without building it: megatron-core builds the model on the meta device (no memory;
GPT-3 175B in about a second) in a one-process group, and `checkpoint.match` compares names and global shapes.
Prints one JSON line; exits 2 with the reason on stderr when the checkpoint does not fit (`mlbench run --dry-run`
runs this before writing anything, as does a real run before launch). Last, every file's bytes against the
checksums mlbench saved with it (integrity.py); with --listing-only (a real run's check before launch) only the
files and their sizes, each rank then verifying its share of the bytes before it loads (integrity.verify_share)."""

from __future__ import annotations

import contextlib
import json
import sys

import torch

from mlbench.run_plan import RunPlan
from mlbench.train import checkpoint, one_process_world
from mlbench.train.checkpoint import integrity


@contextlib.contextmanager
def _no_embedding_init():
    """torch.nn.Embedding draws its weights whatever megatron's perform_initialization says (the learned position
    embedding's): on the meta device that draws nothing, yet torch's meta normal_ imports dynamo to do it (a third
    of this check's time)."""
    real = torch.nn.Embedding.reset_parameters
    torch.nn.Embedding.reset_parameters = lambda self: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.nn.Embedding.reset_parameters = real  # type: ignore[method-assign]


def meta_model(m):
    """The model of definition M built on the meta device (megatron-core's, at one process: global shapes)."""
    from mlbench.train import model as model_lib

    # Global shapes do not depend on the layout, except the vocabulary padding, which may differ anyway.
    config = model_lib.transformer_config(m, tp=1, pp=1, vp=1, cp=1, bf16=False)
    config.use_cpu_initialization, config.perform_initialization = True, False  # no device, no init: meta
    with torch.device("meta"), _no_embedding_init():
        return model_lib.build(m, config, backend="local")


def check(plan: RunPlan, checksums: bool = True) -> dict:
    one_process_world.init()  # first: megatron-core imported after it skips compiling its fused kernels
    stamps = integrity.file_stamps(plan.init_checkpoint)  # what is checked: carried to the ranks in the run plan
    m = plan.benchmark.model
    model = meta_model(m)
    state = model.sharded_state_dict()
    found = checkpoint.match(plan.init_checkpoint, state, m.vocab_size, plan.benchmark.train.checkpoint_names)
    # last: the checks above name a structural fault better. A real run's launching node reads no byte of it (a
    # 405B checkpoint with its Adam state is ~5 TB: ~30 min here, the ranks waiting); the ranks share that read
    verified = (integrity.verify if checksums else integrity.check_listing)(plan.init_checkpoint)
    if (changed := integrity.changed_since_check(plan.init_checkpoint, stamps)) is not None:
        raise checkpoint.CheckpointError(f"--init-checkpoint {plan.init_checkpoint}: {changed} while it was checked: "
                                         f"a checkpoint being saved or copied into; start from it once it is complete")
    return {"checksummed_bytes": verified if checksums else None,
            "checksums_deferred_bytes": None if checksums else verified, "file_stamps": stamps,
            "tensors": len(found.keys), "renamed": len(found.renamed), "example_name": next(iter(found.renamed), None),
            "vocab_padding_resized": found.resized,
            "optimizer_moments": checkpoint.moments_stored(found),
            "optimizer_chained": any(k.startswith("chained_") for k in found.stored),
            "optimizer_metadata": checkpoint.has_optimizer_metadata(checkpoint.common_state(plan.init_checkpoint))}


def main(argv: list[str]) -> int:
    try:
        print(json.dumps(check(RunPlan.load(argv[0]), checksums="--listing-only" not in argv[1:])))
    except checkpoint.CheckpointError as e:
        print(str(e), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
