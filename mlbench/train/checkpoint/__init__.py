"""Checkpoints: megatron-core distributed checkpoints loaded into any layout and saved after run_stop
(store.py), the GPT-3 reference's zarr checkpoint read as it is (zarr_reference.py), the BERT reference's
conversion (convert_bert.py) and the pre-launch check of a checkpoint against the full-size model (check.py).
Nothing heavy is imported at the top: the CLI checks a checkpoint folder's readability before launch
(folder.py) without importing torch."""

from typing import Any

from mlbench.train.checkpoint.folder import CheckpointError, check_readable

_STORE = ("common_state", "has_optimizer_metadata", "load", "match", "model_state", "moments_stored", "renamer",
          "resolve_names", "save", "save_strategy")


def __getattr__(name: str) -> Any:  # the rest imports torch: loaded on first use, not by the CLI's folder check
    if name in _STORE:
        from mlbench.train.checkpoint import store

        return getattr(store, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["CheckpointError", "check_readable", *_STORE]
