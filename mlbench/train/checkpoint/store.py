"""Starting from, and saving, megatron-core distributed checkpoints (the `torch_dist` format).

A distributed checkpoint stores every tensor once, by its global name and shape, so it loads into any parallel
layout: a checkpoint saved at TP 1 loads at TP 2 or PP 2. What is checked before anything is read: the folder
is a distributed checkpoint in a format this megatron-core reads, and every tensor the model needs is there with
the model's global shape (names may carry one common prefix, as NeMo's `model.`). The optimizer's state is
loaded when the checkpoint holds all of it (megatron's names, `optimizer.state.exp_avg.<tensor>`, the names of
the MLPerf GPT-3 checkpoint), else the run starts with fresh moments and says so.

Saving writes to a staging folder next to the destination and renames it into place once every rank is done:
a checkpoint is complete or absent, and an existing one is never replaced.
"""

from __future__ import annotations

import copy
import errno
import math
import os
import queue
import shutil
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from mlbench import owners
from mlbench.train.checkpoint import folder, integrity, unpickle
from mlbench.train.checkpoint.folder import CheckpointError, check_readable, load_error, refused_global

MLBENCH_KEY = "mlbench"  # common (non-tensor) entry: what saved the checkpoint, from which benchmark and step
# How the distributed optimizer lays out its state, as megatron-LM's training passes it (`metadata` of
# sharded_state_dict, also stored as the checkpoint's content metadata). 'fully_reshardable' gathers each
# parameter's moments into the model's shape under the plain optimizer's names (optimizer.state.exp_avg.<tensor>):
# the state loads at any data-, tensor- or pipeline-parallel size, with or without the distributed optimizer.
# megatron-core 0.16's default ('fully_sharded_model_space') refuses to save ("ShardedTensor.flattened_range is not
# supported"). The plain optimizers ignore the key.
OPTIMIZER_METADATA = {"distrib_optim_sharding_type": "fully_reshardable"}


def _inner(chunk) -> torch.nn.Module:
    """A chunk's model below the DDP wrapper (which would prefix every name with `module.`) and, in bf16 on a
    GPU, megatron's Float16Module (whose load_state_dict returns nothing to check)."""
    from megatron.core.transformer.module import Float16Module

    m = chunk.module
    return m.module if isinstance(m, Float16Module) else m


def model_state(model: list) -> dict:
    """The model chunks' sharded state dict, nested as megatron-LM nests it (`model` or `model0`, `model1`...),
    with megatron-core's names."""
    if len(model) == 1:
        return {"model": _inner(model[0]).sharded_state_dict()}
    return {f"model{i}": _inner(chunk).sharded_state_dict() for i, chunk in enumerate(model)}


def _sharded_items(state: dict, kind: type | None = None):
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedBase

    for v in nested_values(state):
        if isinstance(v, kind or ShardedBase):
            yield v


def tensors(state: dict):
    """Tensors and tensor factories (a fused SwiGLU weight); ShardedObjects (layers' `_extra_state`, stored per
    shard) are left to megatron's own load checks."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory

    return _sharded_items(state, (ShardedTensor, ShardedTensorFactory))


def _global_shape(item) -> tuple | None:
    return tuple(item.global_shape) if hasattr(item, "global_shape") else None


def _rekey(state: dict, fn: Callable[[str], str]) -> None:
    for item in _sharded_items(state):
        item.key = fn(item.key)


def _drop_absent_objects(state: dict, stored: dict) -> None:
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    def walk(d: dict) -> None:
        for k, v in list(d.items()):
            if isinstance(v, dict):
                walk(v)
            elif isinstance(v, ShardedObject) and v.unique_key not in stored and v.key not in stored:
                del d[k]

    walk(state)


def _find_prefix(needed: list[str], stored: dict) -> str | None:
    """The one prefix under which the checkpoint holds every needed name ('' or, for NeMo, 'model.'), if any."""
    if all(k in stored for k in needed):
        return ""
    anchor = needed[0]
    for key in stored:
        if key.endswith(anchor) and key != anchor:
            prefix = key[: -len(anchor)]
            if all(prefix + k in stored for k in needed):
                return prefix
    return None


def renamer(rules: tuple[str, ...] | list[str]) -> Callable[[str], str]:
    """megatron-core name -> checkpoint name, from 'FROM -> TO' fragment replacements applied in order."""
    pairs = [tuple(part.strip() for part in rule.split(" -> ")) for rule in rules]

    def rename(key: str) -> str:
        for old, new in pairs:
            key = key.replace(old, new)
        return key

    return rename


def resolve_names(needed: list[str], stored: dict, rules: dict[str, tuple[str, ...]]) -> Callable[[str], str] | None:
    """How the checkpoint names the model's tensors: megatron-core's own names, else one of the benchmark's
    reference checkpoint namings (`rules`, by name), in each case under one common prefix; None when none holds
    every tensor."""
    for rename in [lambda k: k, *(renamer(r) for r in rules.values())]:
        prefix = _find_prefix([rename(k) for k in needed], stored)
        if prefix is not None:
            return lambda k, rename=rename, prefix=prefix: prefix + rename(k)
    return None


def _same_but_padding(item, want: tuple, got: tuple, vocab_size: int) -> bool:
    """Embedding and output rows padded for another TP size (megatron marks those tensors allow_shape_mismatch
    and pads or trims on load); both must still hold every real token."""
    return (getattr(item, "allow_shape_mismatch", False) and want[1:] == got[1:]
            and min(want[0], got[0]) >= vocab_size)


def _groups_holder(opt: object) -> dict | None:
    """The dict holding torch's param_groups in a megatron optimizer state: at the top for an fp32 optimizer,
    under `optimizer` for the bf16 one (Float16OptimizerWithFloat16Params nests torch's state dict)."""
    for _ in range(2):
        if not isinstance(opt, dict):
            return None
        if "param_groups" in opt:
            return opt
        opt = opt.get("optimizer")
    return None


def _members(opt: object) -> list:
    """The state dicts of an optimizer's members: a ChainedOptimizer's (a mixture of experts trains its dense and
    its expert parameters with one each) are held under their indices 0, 1, ...; any other is its own one."""
    if isinstance(opt, dict) and opt and all(isinstance(k, int) for k in opt):
        return list(opt.values())
    return [opt]


def _distributed(opt: object) -> bool:
    """Whether an optimizer state dict is the distributed optimizer's (it names its parameter-state layout)."""
    return all(isinstance(m, dict) and "param_state_sharding_type" in m for m in _members(opt))


def moments_stored(found: Match) -> bool:
    """Adam's two moments for every model tensor the match found, under megatron-core's names
    (optimizer.state.exp_avg.<tensor>; a chained optimizer's members' under chained_<i>.optimizer...)."""
    chained = sorted({k.split(".", 1)[0] + "." for k in found.stored if k.startswith("chained_")})
    return all(any(f"{member}optimizer.state.{kind}.{found.to_ckpt(k)}" in found.stored for member in ["", *chained])
               for k in found.keys for kind in ("exp_avg", "exp_avg_sq"))


def has_optimizer_metadata(common: dict) -> bool:
    """Optimizer metadata (param groups) in common.pt, for every member of a chained optimizer."""
    opt = common.get("optimizer") if isinstance(common, dict) else None
    return opt is not None and all(_groups_holder(m) is not None for m in _members(opt))


def foreign_groups(common: dict) -> list[dict] | None:
    """The checkpoint's param groups when megatron-core did not write them (no group identifiers such as
    wd_mult / is_expert_parallel): the MLPerf GPT-3 reference's common.pt holds one group with its step and no
    parameter ids, which megatron-core cannot match to its own groups."""
    from megatron.core.optimizer.optimizer import param_group_identifier_keys

    holder = _groups_holder(common.get("optimizer"))
    groups = holder["param_groups"] if holder else []
    known = all(all(k in g or f"pre_{k}" in g for k in param_group_identifier_keys) for g in groups)
    return None if known else groups


@dataclass
class Match:
    """How a checkpoint holds a model's tensors (see `match`)."""

    to_ckpt: Callable[[str], str]  # model name -> checkpoint name
    stored: dict  # the checkpoint's metadata, by checkpoint name
    keys: list[str]  # the model's tensor names, once each (stacked layers share one)
    renamed: list[str]  # checkpoint names that differ from the model's
    resized: list[str]  # model names whose vocabulary padding differs from the checkpoint's


def match(path: str | Path, state: dict, vocab_size: int, names: dict[str, tuple[str, ...]] | None = None) -> Match:
    """Checks that the checkpoint holds every tensor of the model's sharded `state` with its global shape.
    `vocab_size` is the tokenizer's: embedding rows beyond it are padding and may differ. `names`: the
    benchmark's checkpoint_names, tried when the checkpoint does not use megatron-core's names."""
    from megatron.core.dist_checkpointing.serialization import load_sharded_metadata

    from mlbench.train.checkpoint import zarr_reference  # imports megatron: not at module level, which the CLI imports

    check_readable(path)
    zarr_reference.register()
    try:
        with unpickle.no_code_run():
            stored = load_sharded_metadata(str(path))
    except Exception as e:  # garbage where the index should be: torch's unpickler, megatron's or zarr's reasons
        if (name := refused_global(e)) is not None:
            raise unpickle.refused(path, ".metadata", name) from None
        raise CheckpointError(f"--init-checkpoint {path}: cannot read its tensor index ({load_error(e)})") from None
    _check_data_files(Path(path))
    items = {item.key: item for item in tensors(state)}
    to_ckpt = resolve_names(list(items), stored, names or {})
    if to_ckpt is None:
        missing = [k for k in items if k not in stored]
        tried = f" (nor under the benchmark's checkpoint names: {', '.join(names)})" if names else ""
        raise CheckpointError(f"--init-checkpoint {path}: {len(missing)} of the model's {len(items)} tensors are "
                              f"not in the checkpoint{tried}, e.g. {', '.join(missing[:3])}{_saved_by(path)}")
    differ = {k: (want, got) for k, item in items.items()
              if (want := _global_shape(item)) is not None
              and (got := _global_shape(stored[to_ckpt(k)])) not in (None, want)}
    # Padding rows the checkpoint lacks load as zeros; megatron's softmax spans them, so the loss moves a little.
    resized = [k for k, (want, got) in differ.items() if _same_but_padding(items[k], want, got, vocab_size)]
    wrong = [k for k in differ if k not in resized]
    if wrong:
        want, got = differ[wrong[0]]
        raise CheckpointError(f"--init-checkpoint {path}: {len(wrong)} tensors differ in shape from this model, e.g. "
                              f"{wrong[0]}: checkpoint {list(got)}, model {list(want)} (a different architecture)"
                              f"{_saved_by(path)}")
    return Match(to_ckpt, stored, list(items), [to_ckpt(k) for k in items if to_ckpt(k) != k], resized)


def _saved_by(path: str | Path) -> str:
    """'; it was saved by mlbench's gpt3 (tiny) run' where common.pt says so: which benchmark a checkpoint that does
    not fit is of (a tiny gpt3's, loaded by llama31_8b --tiny, was '1 of the model's 9 tensors are not in the
    checkpoint, e.g. output_layer.weight' alone)."""
    try:
        info = common_state(path).get(MLBENCH_KEY)
    except CheckpointError:
        return ""
    if not isinstance(info, dict) or not isinstance(info.get("benchmark"), str):
        return ""
    variant = f" ({info['variant']})" if isinstance(info.get("variant"), str) and info["variant"] else ""
    return f"; it was saved by mlbench's {info['benchmark']}{variant} run"


def _check_data_files(path: Path) -> None:
    """A torch_dist checkpoint's data files hold every byte its index points at: a file missing, or cut short by a
    partial copy, failed only as the run loaded it (a CheckpointException, which is no Exception)."""
    if not (path / ".metadata").is_file():
        return  # zarr: each array's chunks are checked as they are read
    from torch.distributed.checkpoint import FileSystemReader

    with unpickle.no_code_run():
        metadata = FileSystemReader(str(path)).read_metadata()
    needed: dict[str, int] = {}
    for info in metadata.storage_data.values():
        name = info.relative_path
        if not isinstance(name, str) or name in ("", ".", "..") or Path(name).name != name:
            # torch's reader joins it to the folder: '../x.distcp' or '/etc/x' loaded tensors from outside it
            raise CheckpointError(f"--init-checkpoint {path}: its index points at {name!r}, outside the checkpoint's "
                                  f"folder; a checkpoint's data files are in its folder (an edited or hostile index)")
        needed[name] = max(needed.get(name, 0), info.offset + info.length)
    for name, size in sorted(needed.items()):
        f = path / name
        have = f.stat().st_size if f.is_file() else None
        if have is None or have < size:
            got = "is missing" if have is None else f"is {have:,} bytes"
            raise CheckpointError(f"--init-checkpoint {path}: {name} {got}; the checkpoint's index needs {size:,} "
                                  f"(a damaged or partly copied checkpoint)")
    _check_coverage(path, metadata)
    unpickle.check_byte_records(path, metadata)


def _check_coverage(path: Path, metadata) -> None:
    """Each tensor's chunks lie within its shape, cover all of it and are each stored: a tensor whose index lacked
    chunks loaded silently, the part it lacked left as the model's random initialisation."""
    from torch.distributed.checkpoint.metadata import MetadataIndex, TensorStorageMetadata

    for key, meta in metadata.state_dict_metadata.items():
        if not isinstance(meta, TensorStorageMetadata):
            continue
        total, covered = math.prod(meta.size), 0
        for chunk in meta.chunks:
            fits = len(chunk.offsets) == len(chunk.sizes) == len(meta.size) and all(
                min(o, n) >= 0 and o + n <= s for o, n, s in zip(chunk.offsets, chunk.sizes, meta.size, strict=True))
            if not fits or MetadataIndex(key, chunk.offsets) not in metadata.storage_data:
                what = "lies outside its shape" if not fits else "is not stored in any data file"
                raise CheckpointError(f"--init-checkpoint {path}: a chunk of {key} {what} (offsets "
                                      f"{list(chunk.offsets)}, sizes {list(chunk.sizes)}, tensor {list(meta.size)}); a "
                                      f"damaged index: save or copy the checkpoint again")
            covered += math.prod(chunk.sizes)
        if covered < total:
            raise CheckpointError(f"--init-checkpoint {path}: its index covers {covered:,} of the {total:,} values of "
                                  f"{key} (the rest would keep the model's random initialisation); a damaged index: "
                                  f"save or copy the checkpoint again")


def common_state(path: str | Path) -> dict:
    """The checkpoint's non-tensor state (common.pt), {} where it holds no mapping; one line where it cannot be read."""
    from megatron.core.dist_checkpointing.serialization import load_common_state_dict

    try:
        with unpickle.no_code_run():
            common = load_common_state_dict(str(path))
    except Exception as e:  # torch.load's reason comes with a page of advice about weights_only
        if (name := refused_global(e)) is not None:
            raise unpickle.refused(path, "common.pt", name) from None
        raise CheckpointError(f"--init-checkpoint {path}: cannot read common.pt ({load_error(e)})") from None
    return common if isinstance(common, dict) else {}


def load(path: str | Path, model: list, optimizer, vocab_size: int,
         names: dict[str, tuple[str, ...]] | None = None, checked: dict[str, list[int]] | None = None) -> dict:
    """Loads the model (and optimizer state when the checkpoint has it) from `path`, after `match`; returns
    what was loaded. CHECKED: its files as the check before launch read them (integrity.file_stamps, from the run
    plan): files changed since (a checkpoint saved or copied into between the check and the load) are refused."""
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.validation import StrictHandling

    before = integrity.stamp(path)  # (the check before launch verified its bytes; here, that they stay)
    if checked and (changed := integrity.changed_since_check(path, checked)) is not None:
        raise CheckpointError(f"--init-checkpoint {path}: {changed} since the check before launch: a checkpoint "
                              f"being saved or copied into; start the run again once it is complete")
    _verify_my_share(path)
    state = model_state(model)
    found = match(path, state, vocab_size, names)
    stored = found.stored
    _rekey(state, found.to_ckpt)
    # Per-layer extra state (Transformer Engine's FP8 metadata) that the checkpoint lacks is not requested.
    _drop_absent_objects(state, stored)
    common = common_state(path)
    members = getattr(optimizer, "chained_optimizers", [optimizer])
    for m in members:
        _placeholder_adam_state(m.optimizer)
    # is_loading: megatron's init_state_fn creates the moments (torch's Adam has none before its first step)
    opt_state = optimizer.sharded_state_dict(state, is_loading=True, metadata=OPTIMIZER_METADATA)
    opt_keys = [item.key for item in tensors(opt_state)]
    # Moments load with megatron-core's own optimizer metadata (param groups, step) from common.pt; without it
    # (a checkpoint written by another framework) the run starts with fresh moments.
    if not opt_keys or not all(k in stored for k in opt_keys):
        optimizer_note = "the checkpoint does not hold this optimizer's state"
    elif not has_optimizer_metadata(common):
        optimizer_note = "the checkpoint has no megatron-core optimizer metadata (param groups, step)"
    elif _distributed(common.get("optimizer")) != _distributed(opt_state):
        # megatron-core nests the two optimizers' common state differently and cannot load one into the other
        saved = "with" if _distributed(common.get("optimizer")) else "without"
        optimizer_note = f"the optimizer state was saved {saved} the distributed optimizer; this run is not"
    else:
        optimizer_note = ""
        state["optimizer"] = opt_state
    with_optimizer = not optimizer_note
    foreign = foreign_groups(common) if with_optimizer else None
    if foreign is not None:  # this run's groups are set after the load (merging the checkpoint's would fail)
        _groups_holder(opt_state).pop("param_groups")
        optimizer_note = "param groups from this run; moments and step from the checkpoint"
    if not with_optimizer:  # undo the placeholder moments sharded_state_dict(is_loading=True) created
        for m in members:
            m.optimizer.state.clear()
    try:
        with unpickle.no_code_run():
            loaded = dist_checkpointing.load(state, str(path), strict=StrictHandling.RAISE_UNEXPECTED)
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as e:  # a file's bytes damaged past what the index can tell: torch's CheckpointException
        # (no Exception), whose text was its advice to load with weights_only=False, cut short
        if (name := refused_global(e)) is not None:  # (changed since the check before launch)
            raise unpickle.refused(path, "a file", name) from None
        raise CheckpointError(f"--init-checkpoint {path}: its tensors could not be read ({load_error(e)}); a "
                              f"damaged checkpoint: save or copy it again") from None
    for i, chunk in enumerate(model):
        result = _inner(chunk).load_state_dict(loaded["model" if len(model) == 1 else f"model{i}"], strict=False)
        off = [k for k in result.missing_keys + result.unexpected_keys if not k.endswith("_extra_state")]
        if off:
            raise CheckpointError(f"--init-checkpoint {path}: loaded state does not fit the model: {off[:3]}")
    if foreign is not None:
        holder = _groups_holder(loaded["optimizer"])
        holder["param_groups"] = copy.deepcopy(_groups_holder(members[0].optimizer.state_dict())["param_groups"])
        steps = {g["step"] for g in foreign if "step" in g}
        if len(steps) == 1:  # torch's Adam keeps the step per parameter, as a float tensor
            holder.setdefault("state", {})["common_step"] = torch.tensor(float(steps.pop()))
    if with_optimizer:
        # The moments and step come from the checkpoint; the hyperparameters stay the benchmark's (the ones the
        # MLPerf log states): param groups restored from the checkpoint would carry the saving run's lr rules.
        groups = [[{k: v for k, v in g.items() if k != "params"} for g in m.optimizer.param_groups] for m in members]
        with _distributed_optimizer_keeps_step(members):
            optimizer.load_state_dict(loaded["optimizer"])
        for m, saved in zip(members, groups, strict=True):
            for g, hyper in zip(m.optimizer.param_groups, saved, strict=True):
                g.update(hyper)
    else:
        # bf16: the optimizer copied the model's random weights into its fp32 main params when it was built;
        # refresh them from the loaded weights, or the first step would write the random ones back.
        optimizer.reload_model_params()
    _check_finite(path, model, members if with_optimizer else [])
    if (name := integrity.changed(path, before)) is not None:
        raise CheckpointError(f"--init-checkpoint {path}: {name} changed while the run read it (written, replaced, "
                              f"added or removed): a checkpoint being saved or copied into; start from it once it "
                              f"is complete")
    return {"path": str(path), "renamed": len(found.renamed), "example_name": next(iter(found.renamed), None),
            "optimizer_state": with_optimizer, "optimizer_note": optimizer_note, "tensors": len(found.keys),
            "vocab_padding_resized": found.resized, "saved_by": common.get(MLBENCH_KEY)}


def _verify_my_share(path: str | Path) -> None:
    """This rank's share of the checkpoint's bytes against the checksums saved with it (the check before launch
    read its listing alone): a file whose bytes differ aborts the run, named, before anything is read into the
    model. Every rank computes the same split, so the ranks read the checkpoint once between them."""
    on = dist.is_available() and dist.is_initialized()
    integrity.verify_share(path, dist.get_rank() if on else 0, dist.get_world_size() if on else 1)


def _check_finite(path: str | Path, model: list, members: list) -> None:
    """Every loaded weight and moment is a finite number: bytes damaged inside a tensor's record (its zip archive
    intact) loaded as NaN, and the run aborted at its first step, its loss NaN, after run_start."""
    for chunk in model:
        for name, p in _inner(chunk).named_parameters():
            if not torch.isfinite(p).all():
                raise CheckpointError(f"--init-checkpoint {path}: its weight {name} holds NaN or infinite values "
                                      f"(a damaged checkpoint, or one saved from a run that diverged); a checkpoint "
                                      f"to start from holds finite numbers")
    for m in members:
        for state in m.optimizer.state.values():
            for key, t in state.items():
                if torch.is_tensor(t) and t.is_floating_point() and not torch.isfinite(t).all():
                    raise CheckpointError(f"--init-checkpoint {path}: its optimizer state ({key}) holds NaN or "
                                          f"infinite values (a damaged checkpoint, or one saved from a run that "
                                          f"diverged); a checkpoint to start from holds finite numbers")


def _placeholder_adam_state(inner: torch.optim.Optimizer) -> None:
    """Gives every parameter the state torch's Adam creates at its first step (step, two zero moments), to be
    overwritten by the load. The distributed optimizer describes its state from the torch optimizer's (one
    `step` shared by all parameters, which it asserts) and, unlike the plain optimizers, calls no init_state_fn
    first; megatron-LM relies on Apex's or Transformer Engine's Adam, which keeps the step per group."""
    for group in inner.param_groups:
        for p in group["params"]:
            if not inner.state[p]:
                inner.state[p] = {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(p),
                                  "exp_avg_sq": torch.zeros_like(p)}


@contextmanager
def _distributed_optimizer_keeps_step(members: list):
    """megatron-core 0.16's distributed optimizer with torch's Adam (no Apex or Transformer Engine) sets every
    parameter's `step` from the checkpoint's param groups, then copies each state tensor from the loaded
    fully_reshardable state, which holds no `step` (KeyError 'step'): the copy is given the step it already set.
    That step is one tensor shared by every parameter; torch's Adam would add 1 to it once per parameter."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    patched = [m for m in members if isinstance(m, DistributedOptimizer)]
    for m in patched:
        def set_states(param, tensors, m=m, original=m._set_main_param_and_optimizer_states):
            step = m._get_main_param_and_optimizer_states(param).get("step")
            original(param, tensors if step is None else {**tensors, "step": step})

        m._set_main_param_and_optimizer_states = set_states
    try:
        yield
    finally:
        for m in patched:
            del m._set_main_param_and_optimizer_states
    for m in patched:  # megatron gives every parameter the same step tensor, which torch's Adam increments in
        for state in m.optimizer.state.values():  # place once per parameter: each gets its own
            if torch.is_tensor(state.get("step")):
                state["step"] = state["step"].clone()


def save_strategy():
    """megatron-core's torch_dist writer, synchronous, one writer, started in this process alone.

    The writer hands its results to the finalize step through a queue that megatron makes, by default, in a
    Manager process of its own, started by spawn: a fresh interpreter that imports torch and megatron again (2 to
    3.6 s of CPU a save, for a queue). A synchronous save puts and gets in this process, so an in-process queue
    is the same queue without that process."""
    from megatron.core.dist_checkpointing.strategies import filesystem_async
    from megatron.core.dist_checkpointing.strategies.torch import TorchDistSaveShardedStrategy

    if filesystem_async._results_queue is None:
        filesystem_async._results_queue = queue.Queue()
    return TorchDistSaveShardedStrategy("torch_dist", 1, thread_count=1)


def save(path: str | Path, model: list, optimizer, info: dict, what: str = "--save-checkpoint") -> None:
    """Saves model and optimizer state (model only when `optimizer` is None) to `path` (which must not exist)
    through a staging folder. WHAT: how errors name the path (the option or argument that gave it)."""
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.strategies.fully_parallel import FullyParallelSaveStrategyWrapper

    dest = Path(path)

    def publish() -> None:
        try:
            if dest.exists():  # checked again just before the rename, which would replace an empty folder
                raise FileExistsError(errno.EEXIST, "appeared meanwhile")
            os.rename(staging, dest)
        except OSError as e:
            raise CheckpointError(f"{what} {dest}: {e.strerror or e}; {folder.keep_unplaced(staging, dest)}") \
                from None

    # The folder must be on a filesystem every node sees.
    staging = _on_rank0(lambda: begin_save(dest, what))
    state = model_state(model)
    if optimizer is not None:
        state["optimizer"] = optimizer.sharded_state_dict(state, metadata=OPTIMIZER_METADATA)
    state[MLBENCH_KEY] = info
    strategy = FullyParallelSaveStrategyWrapper(save_strategy())  # tensors replicated across DP are written once
    dist_checkpointing.save(state, str(staging), sharded_strategy=strategy, content_metadata=OPTIMIZER_METADATA)
    dist.barrier()
    _write_checksums(staging, dest, what)
    _on_rank0(publish)


def _write_checksums(staging: Path, dest: Path, what: str) -> None:
    """The checksums of the saved files (integrity.MANIFEST), verified before a run starts from it: each rank sums
    the data files it wrote (torch's writer names them __<rank>_<i>.distcp), rank 0 the rest and writes them."""
    try:
        mine = integrity.sums(staging, sorted(f.name for f in staging.glob(f"__{dist.get_rank()}_*.distcp")))
        error = ""
    except OSError as e:
        mine, error = {}, e.strerror or str(e)
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (mine, error))

    def write() -> None:
        known: dict = {}
        try:
            for sums, err in gathered:
                if err:
                    raise OSError(err)
                known.update(sums)
            integrity.write(staging, known)
        except OSError as e:  # (disk full): a checkpoint without its checksums is not published
            shutil.rmtree(staging, ignore_errors=True)
            raise CheckpointError(f"{what} {dest}: its checksums could not be written ({e.strerror or e}); nothing "
                                  f"saved") from None

    _on_rank0(write)


def begin_save(dest: Path, what: str = "--save-checkpoint") -> Path:
    """The staging folder a save of DEST is written into, made beside it (rank 0's: every node sees it)."""
    if dest.exists():
        raise CheckpointError(f"{what} {dest}: exists; a checkpoint is never overwritten")
    staging = dest.with_name(f"{folder.partial_prefix(dest)}{owners.tag()}")  # unique to this save
    try:
        staging.mkdir(parents=True)
    except OSError as e:  # (its folder made read-only, or full, since the check before launch): the option's
        # destination named, not the staging folder beside it ('OSError: [Errno 30] ... .ck.partial-...')
        raise CheckpointError(f"{what} {dest}: cannot be written ({e.strerror or e}); the folder it goes in must "
                              f"be writable when the run ends") from None
    return staging


def _on_rank0(fn: Callable[[], object]):
    """Runs `fn` on rank 0 and gives every rank its result, or raises its CheckpointError on every rank: ranks
    fail together instead of waiting at a barrier for one that raised."""
    outcome: list = [None, None]  # [error message, result]
    if dist.get_rank() == 0:
        try:
            outcome[1] = fn()
        except CheckpointError as e:
            outcome[0] = str(e)
    dist.broadcast_object_list(outcome, src=0)
    if outcome[0]:
        raise CheckpointError(outcome[0])
    return outcome[1]
