"""Checkpoints: megatron-core distributed checkpoints loaded into any layout and saved after run_stop
(store.py), the GPT-3 reference's zarr checkpoint read as it is (zarr_reference.py), the BERT reference's
conversion (convert_bert.py) and the pre-launch check of a checkpoint against the full-size model (check.py).
Nothing heavy is imported at the top: the CLI checks a checkpoint folder's readability before launch."""

from mlbench.train.checkpoint.store import (
    CheckpointError,
    check_readable,
    has_optimizer_metadata,
    load,
    match,
    model_state,
    renamer,
    resolve_names,
    save,
)

__all__ = ["CheckpointError", "check_readable", "has_optimizer_metadata", "load", "match", "model_state", "renamer",
           "resolve_names", "save"]
