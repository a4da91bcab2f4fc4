"""Starting from and saving megatron-core distributed checkpoints, with real runs: a checkpoint saved at one
layout starts a run at another with the same numbers (tensor-parallel resharding of a SwiGLU, GQA model), the
optimizer state comes along, and every bad checkpoint is refused with a message that says what is wrong.
(test_checkpoint_names.py: reference-checkpoint names, and a save that fails after run_stop.)"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import mlbench, result_dir

from mlbench.train.checkpoint import has_optimizer_metadata, resolve_names

pytestmark = pytest.mark.slow


def _run(root: Path, benchmark: str, *flags: str, seed: int = 5, env: dict | None = None, via=None):
    """`mlbench run BENCHMARK --tiny` in a subprocess, or through VIA (conftest's cli: a refusal, in this process)."""
    args = ("run", benchmark, "--tiny", "--results", str(root), "--system", "ci", "--seed", str(seed), *flags)
    return via(*args, env=env) if via else mlbench(*args, env=env, timeout=600)


def _records(root: Path, benchmark: str) -> list[dict]:
    folder = result_dir(root, benchmark)
    return [json.loads((folder / f"result_{i}.json").read_text())
            for i in range(len(list(folder.glob("result_*.json"))))]


@pytest.fixture(scope="module")
def llama_checkpoint(tmp_path_factory, quick_env: dict) -> tuple[Path, dict]:
    """A tiny llama31_405b trained 20 steps (quick_env's target) at TP 1 and saved: (checkpoint folder, its run
    record)."""
    root = tmp_path_factory.mktemp("save")
    ckpt = root / "ckpt"
    proc = _run(root / "results", "llama31_405b", "--save-checkpoint", str(ckpt), seed=1, env=quick_env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return ckpt, _records(root / "results", "llama31_405b")[0]


def test_saved_checkpoint_is_complete_and_recorded(llama_checkpoint) -> None:
    ckpt, record = llama_checkpoint
    assert json.loads((ckpt / "metadata.json").read_text())["sharded_backend"] == "torch_dist"
    assert record["saved_checkpoint"]["path"] == str(ckpt) and record["checkpoint_error"] is None
    assert record["saved_checkpoint"]["seconds"] > 0
    assert not list(ckpt.parent.glob(".*partial*")), "staging folder left behind"
    assert record["steps"][0]["loss"] > 3.0  # from random weights: about ln(vocab)
    from mlbench.train.checkpoint import integrity  # every file's checksum saved with it

    saved = json.loads((ckpt / integrity.MANIFEST).read_text())["files"]
    assert sorted(saved) == sorted(p.name for p in ckpt.iterdir() if p.name != integrity.MANIFEST)
    assert integrity.verify(ckpt) == sum(f["bytes"] for f in saved.values())


def test_nothing_is_written_into_the_checkpoint_a_run_starts_from(llama_checkpoint, tmp_path: Path, cli) -> None:
    """--results or --save-checkpoint inside --init-checkpoint: accepted, the run's files (or a second checkpoint)
    written among the checkpoint's own."""
    ckpt, _ = llama_checkpoint
    before = sorted(p.name for p in ckpt.iterdir())
    for flag, path in (("--results", ckpt), ("--results", ckpt / "r"), ("--save-checkpoint", ckpt / "inner")):
        args = ("--save-checkpoint", str(path)) if flag == "--save-checkpoint" else ()
        root = path if flag == "--results" else tmp_path / "r"
        _assert_refused(_run(root, "llama31_405b", "--init-checkpoint", str(ckpt), *args, via=cli),
                        f"{flag} {path} is inside --init-checkpoint {ckpt}, which a run only reads")
    assert sorted(p.name for p in ckpt.iterdir()) == before
    # nor through a bind mount of it (the paths alone missed it: the run wrote among the checkpoint's files)
    bind = tmp_path / "bind"
    bind.mkdir()
    if os.geteuid() == 0 and subprocess.run(["mount", "--bind", str(ckpt), str(bind)]).returncode == 0:
        try:
            _assert_refused(_run(bind / "res", "llama31_405b", "--init-checkpoint", str(ckpt), via=cli),
                            f"--results {bind / 'res'} is inside --init-checkpoint {ckpt}")
        finally:
            subprocess.run(["umount", "-l", str(bind)], check=False)
    assert sorted(p.name for p in ckpt.iterdir()) == before


def test_start_from_checkpoint_in_another_layout_gives_the_same_numbers(llama_checkpoint, tmp_path: Path,
                                                                        quick_env: dict) -> None:
    ckpt, saved = llama_checkpoint
    roots = [tmp_path / "tp1", tmp_path / "tp2"]  # one seed twice: two folders (a set's runs need their own seeds)
    for root, flags in zip(roots, ([], ["--nproc-per-node", "2", "--tp", "2"]), strict=True):
        proc = _run(root, "llama31_405b", "--init-checkpoint", str(ckpt), *flags, env=quick_env)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        out = " ".join(proc.stdout.split())
        assert "started from checkpoint" in out and "with its optimizer state" in out
    [one], [two] = (_records(root, "llama31_405b") for root in roots)
    for rec in (one, two):
        loaded = rec["init_checkpoint"]
        assert loaded["path"] == str(ckpt) and loaded["optimizer_state"] is True
        assert loaded["saved_by"]["step"] == saved["steps"][-1]["step"]
        # The trained weights are there: the first step starts near where the saved run stopped.
        assert rec["steps"][0]["loss"] < saved["steps"][-1]["loss"] + 0.1
    assert two["layout"]["tp"] == 2
    # Same seed, same data: TP 2 resharded from a TP 1 checkpoint computes what TP 1 does.
    for a, b in zip(one["steps"][:5], two["steps"][:5], strict=True):
        assert abs(a["loss"] - b["loss"]) < 1e-4, (a, b)


def test_checkpoint_of_another_model_is_refused_before_launch(llama_checkpoint, tmp_path: Path, cli) -> None:
    """A real run checks the checkpoint against its model before launching (as a dry run does): bad input, exit 2,
    nothing published."""
    ckpt, _ = llama_checkpoint
    proc = _run(tmp_path / "results", "gpt3", "--init-checkpoint", str(ckpt), via=cli)
    _assert_refused(proc, f"--init-checkpoint {ckpt}", "not in the checkpoint", "embedding.position_embeddings.weight",
                    "; it was saved by mlbench's llama31_405b (tiny) run")  # (common.pt says so)
    assert not (tmp_path / "results").exists()


def _assert_refused(proc, *needles: str) -> None:
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "Traceback" not in out, out
    for n in needles:
        assert n in out, out


@pytest.mark.parametrize("make, needles", [
    (lambda p: None, ["no such folder"]),
    (lambda p: p.mkdir(), ["not a megatron-core distributed checkpoint", "no metadata.json"]),
    (lambda p: (p / "iter_0004000").mkdir(parents=True), ["legacy per-rank Megatron checkpoint"]),
    (lambda p: (p.mkdir(), (p / "metadata.json").write_text('{"sharded_backend": "tensorstore"}')),
     ["sharded backend 'tensorstore'", "'torch_dist'", "'zarr'"]),
    (lambda p: (p.mkdir(), (p / "metadata.json").write_bytes(b"\xff\xfe{")), ["cannot read metadata.json"]),
    (lambda p: (p.mkdir(), (p / "metadata.json").write_text("[1]")), ["metadata.json is not a JSON object"]),
    (lambda p: (p.mkdir(), (p / "metadata.json").write_text('{"sharded_backend": "torch_dist"}')),
     ["no .metadata and no common.pt: a torch_dist checkpoint holds its tensor index"]),
    # a FIFO blocked the check (and a run) for ever
    (lambda p: (p.mkdir(), (p / "metadata.json").write_text('{"sharded_backend": "torch_dist"}'),
                os.mkfifo(p / "common.pt")), ["common.pt is not a regular file or a folder (a FIFO"]),
    # versions megatron-core does not read, and a backend the files contradict: the index was blamed ('cannot read
    # its tensor index (CheckpointingException: Cannot find a default strategy ...)'), or every tensor was missing
    (lambda p: (p.mkdir(), (p / "metadata.json").write_text('{"sharded_backend": "torch_dist", '
                                                            '"sharded_backend_version": "1"}')),
     ['metadata.json says sharded_backend_version "1"; this megatron-core reads 1 (a checkpoint of another']),
    (lambda p: (p.mkdir(), (p / "metadata.json").write_text('{"sharded_backend": "torch_dist", '
                                                            '"common_backend_version": null}')),
     ["metadata.json says common_backend_version null; this megatron-core reads 1"]),
    (lambda p: (p.mkdir(), (p / "metadata.json").write_text('{"sharded_backend": "zarr"}'),
                (p / ".metadata").write_bytes(b"")),
     ["metadata.json says sharded backend 'zarr', and the folder holds no zarr array (a folder with .zarray) but a "
      "torch_dist tensor index (.metadata): its metadata.json would say 'torch_dist'"]),
])
def test_unusable_checkpoint_folder_is_refused_before_launch(tmp_path: Path, make, needles, cli) -> None:
    ckpt = tmp_path / "ckpt"
    make(ckpt)
    proc = _run(tmp_path / "results", "gpt3", "--init-checkpoint", str(ckpt), via=cli)
    _assert_refused(proc, f"--init-checkpoint {ckpt}", *needles)
    assert not (tmp_path / "results").exists()


def _damaged(ckpt: Path, to: Path, damage) -> Path:
    shutil.copytree(ckpt, to)
    damage(to)
    return to


def test_a_damaged_checkpoint_is_refused_before_launch(llama_checkpoint, tmp_path: Path, cli) -> None:
    """A data file cut short or missing, or garbage in the index or common.pt: named before launch (they failed only
    as the run loaded them, outside its abort handler, or as a traceback of the check)."""
    from mlbench.train import cpu_compat

    cpu_compat.enable()  # before megatron-core's import here
    from mlbench.train.checkpoint import CheckpointError, common_state, store

    ckpt, _ = llama_checkpoint
    data = next(ckpt.glob("*.distcp")).name
    size = (ckpt / data).stat().st_size
    cut = _damaged(ckpt, tmp_path / "cut", lambda c: os.truncate(c / data, 1000))
    proc = _run(tmp_path / "results", "llama31_405b", "--init-checkpoint", str(cut), via=cli)
    _assert_refused(proc, f"{data} is 1,000 bytes; the checkpoint's index needs {size:,} (a damaged or partly copied")
    assert not (tmp_path / "results").exists()
    gone = _damaged(ckpt, tmp_path / "gone", lambda c: (c / data).unlink())
    with pytest.raises(CheckpointError, match=f"{data} is missing; the checkpoint's index needs {size:,}"):
        store._check_data_files(gone)
    junk = _damaged(ckpt, tmp_path / "junk", lambda c: ((c / "common.pt").write_text("garbage"),
                                                         (c / ".metadata").write_text("garbage")))
    with pytest.raises(CheckpointError, match=r"cannot read common.pt \(UnpicklingError: Unsupported operand") as e:
        common_state(junk)
    assert "weights_only" not in str(e.value)
    with pytest.raises(CheckpointError, match=r"cannot read its tensor index \(UnpicklingError"):
        store.match(junk, {}, 32)
    # a layer's byte record (its _extra_state) garbled: read by the check too (it failed only as the run loaded it)
    record = _damaged(ckpt, tmp_path / "record", lambda c: (c / data).write_bytes(b"\xff" * size))
    with pytest.raises(CheckpointError, match=rf"{data}: the record of decoder.layers.\S+_extra_state/shard_\S+ "
                                              r"cannot be read \(UnpicklingError: .*\); a damaged checkpoint$"):
        store._check_data_files(record)


def test_a_checkpoint_that_fails_as_it_loads_aborts_the_run_with_the_reason(llama_checkpoint, tmp_path: Path,
                                                                              quick_env: dict) -> None:
    """Bytes garbled in a data file (its size intact) pass every check and fail in torch's reader with a
    CheckpointException, which is no Exception: the rank died outside its abort handler, with a traceback, and
    the log had no run_stop. (A checkpoint without mlbench's checksums, as the reference checkpoints are: with
    them, the check before launch refuses it.)"""
    from mlbench.train.checkpoint import integrity

    ckpt, _ = llama_checkpoint

    def garble(c: Path) -> None:
        (c / integrity.MANIFEST).unlink()
        from torch.distributed.checkpoint import FileSystemReader
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        index = FileSystemReader(str(c)).read_metadata()
        first = min((info for i, info in index.storage_data.items()  # (a byte record's is refused before launch)
                     if isinstance(index.state_dict_metadata[i.fqn], TensorStorageMetadata)), key=lambda s: s.offset)
        with open(c / first.relative_path, "r+b") as out:  # the first tensor's header: its bytes are a zip archive's
            out.seek(first.offset)
            out.write(b"\xff" * 64)

    bad = _damaged(ckpt, tmp_path / "garbled", garble)
    proc = _run(tmp_path / "results", "llama31_405b", "--init-checkpoint", str(bad), env=quick_env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    record = _records(tmp_path / "results", "llama31_405b")[0]
    assert record["status"] == "aborted"
    # named as the checkpoint's, in one line (torch's text for 200 KB of such bytes was its advice to load with
    # weights_only=False, cut short at 300 characters)
    assert record["reason"].startswith(f"CheckpointError: --init-checkpoint {bad}: its tensors could not be read ("
                                       "CheckpointException: Unsupported operand 255)"), record
    assert record["reason"].endswith("a damaged checkpoint: save or copy it again"), record
    log = (result_dir(tmp_path / "results", "llama31_405b") / "result_0.txt").read_text().splitlines()
    stop = json.loads(log[-1].split(":::MLLOG ", 1)[1])
    assert stop["key"] == "run_stop" and stop["metadata"]["status"] == "aborted"
    assert stop["metadata"]["reason"] == record["reason"]


def test_save_destination_is_never_overwritten_and_one_run_only(tmp_path: Path, cli) -> None:
    (tmp_path / "taken").mkdir()
    _assert_refused(_run(tmp_path / "r", "gpt3", "--save-checkpoint", str(tmp_path / "taken"), via=cli),
                    "exists; a checkpoint is never overwritten")
    _assert_refused(_run(tmp_path / "r", "gpt3", "--save-checkpoint", str(tmp_path / "new"), "--runs", "2", via=cli),
                    "one run's state", "--runs 2")
    (tmp_path / "file").write_text("")
    _assert_refused(_run(tmp_path / "r", "gpt3", "--save-checkpoint", str(tmp_path / "file" / "ck"), via=cli),
                    f"{tmp_path / 'file'} is not a folder")
    # inside the results tree, or holding it: the save refused the folder the run made, after the whole run
    for save, results in (("r", "r"), ("r/ci/gpt3/result_0.txt", "r"), ("ck", "ck/r")):
        _assert_refused(_run(tmp_path / results, "gpt3", "--save-checkpoint", str(tmp_path / save), via=cli),
                        f"--save-checkpoint {tmp_path / save} and --results {tmp_path / results} overlap")
    assert not (tmp_path / "r").exists()


def test_a_save_whose_destination_appears_meanwhile_is_kept_where_it_says(tmp_path: Path, monkeypatch) -> None:
    """Another run saving to the same --save-checkpoint while this one saved: the whole save was said to be 'left
    in' its staging folder, which the runner then removed as a dead rank's partial save (and the note of the room
    left on the disk followed a reason that is not the disk's). Now it is kept under a name no cleaning removes."""
    import torch.distributed as dist
    from megatron.core import dist_checkpointing

    from mlbench import owners
    from mlbench.train.checkpoint import CheckpointError, store
    from mlbench.train.checkpoint.folder import remove_dead_partials

    dest = tmp_path / "ckpt"

    def save(state: dict, staging: str, **_: object) -> None:
        (Path(staging) / "common.pt").write_text("saved")
        dest.mkdir()  # the other run's save, placed first

    monkeypatch.setattr(dist_checkpointing, "save", save)
    monkeypatch.setattr(store, "model_state", lambda model: {})
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        with pytest.raises(CheckpointError) as e:
            store.save(dest, [], None, {})
    finally:
        dist.destroy_process_group()
    assert str(e.value).startswith(f"--save-checkpoint {dest}: appeared meanwhile; the saved checkpoint is kept in "
                                   f"{dest}.unplaced-"), e.value
    kept = Path(str(e.value).rsplit(" ", 1)[1])
    monkeypatch.setattr(owners, "gone", lambda tag: True)  # the saving rank has ended: the runner cleans up
    remove_dead_partials(dest)
    assert (kept / "common.pt").read_text() == "saved"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["ckpt", kept.name, "store"])


def test_a_save_whose_folder_cannot_be_written_names_the_option_not_its_staging_folder(tmp_path: Path) -> None:
    """A --save-checkpoint whose folder became unwritable while the run trained (remounted read-only) ended
    'OSError: [Errno 30] Read-only file system: '.../.ck.partial-<pid>-...'', naming a folder the user never gave.
    (A path through a file stands in for the read-only folder: root writes into read-only folders.)"""
    from mlbench.train.checkpoint import CheckpointError, store

    (tmp_path / "file").write_text("")
    dest = tmp_path / "file" / "ck"
    with pytest.raises(CheckpointError) as e:
        store.begin_save(dest)
    assert str(e.value) == f"--save-checkpoint {dest}: cannot be written (Not a directory); the folder it goes in " \
                           "must be writable when the run ends"
    assert os.listdir(tmp_path) == ["file"]


def test_names_are_found_under_a_prefix_or_through_the_benchmarks_renames() -> None:
    needed = ["embedding.word_embeddings.weight", "decoder.layers.mlp.linear_fc1.weight"]
    assert resolve_names(needed, dict.fromkeys(needed), {})("x.y") == "x.y"
    nemo = resolve_names(needed, {f"model.{k}": None for k in needed}, {})
    assert nemo("decoder.layers.mlp.linear_fc1.weight") == "model.decoder.layers.mlp.linear_fc1.weight"
    rules = {"other": ("embedding. -> emb.",), "nemo": ("mlp.linear_fc1.weight -> layernorm_mlp.fc1_weight",)}
    stored = {"model.embedding.word_embeddings.weight": None, "model.decoder.layers.layernorm_mlp.fc1_weight": None}
    assert resolve_names(needed, stored, {}) is None
    assert resolve_names(needed, stored, rules)(needed[1]) == "model.decoder.layers.layernorm_mlp.fc1_weight"
    assert resolve_names(needed, {"model.embedding.word_embeddings.weight": None}, rules) is None  # partial


def test_dry_run_checks_the_checkpoint_against_the_model_without_building_it(llama_checkpoint,
                                                                              tmp_path: Path, cli) -> None:
    ckpt, _ = llama_checkpoint
    ok = cli("run", "llama31_405b", "--tiny", "--dry-run", "--results", str(tmp_path / "a"),
                 "--init-checkpoint", str(ckpt))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ("all 9 model tensors present with the model's shapes; with Adam moments and megatron-core's optimizer "
            "metadata: the run loads them") in " ".join(ok.stdout.split())
    # The full-size model (405B, built on the meta device) against the tiny checkpoint: refused, nothing written.
    full = cli("run", "llama31_405b", "--dry-run", "--nodes", "1024", "--nproc-per-node", "4", "--results",
                   str(tmp_path / "b"), "--init-checkpoint", str(ckpt))
    _assert_refused(full, "tensors differ in shape from this model", "embedding.word_embeddings.weight",
                    "model [32000, 16384]")
    assert not (tmp_path / "b").exists()


def test_optimizer_metadata_is_found_for_fp32_and_bf16_optimizers() -> None:
    groups = {"param_groups": [{"lr": 1.0}]}
    assert has_optimizer_metadata({"optimizer": groups})  # FP32Optimizer: torch's state dict
    assert has_optimizer_metadata({"optimizer": {"optimizer": groups, "fp32_from_fp16_params": []}})  # bf16
    assert not has_optimizer_metadata({"optimizer": {"state": {}}})
    assert not has_optimizer_metadata({})


def test_a_load_error_is_the_unpicklers_reason_not_torchs_advice() -> None:
    """Torch's text for a file that is no pickle is a page of advice to load with weights_only=False (unsafe); in a
    CheckpointException it comes wrapped in each rank's traceback."""
    import io

    import torch
    from torch.distributed.checkpoint.api import CheckpointException

    from mlbench.train.checkpoint.folder import load_error

    with pytest.raises(Exception) as e:
        torch.load(io.BytesIO(b"\x80\x02\xff\xff\xff\xff"), weights_only=True)
    assert load_error(e.value) == "UnpicklingError: Unsupported operand 255"
    unpickled = CheckpointException("load", {0: (e.value, None)})
    assert load_error(unpickled) == "CheckpointException: Unsupported operand 255"
    wrapped = CheckpointException("load", {0: (RuntimeError("size mismatch"), None)})
    assert load_error(wrapped) == "CheckpointException: RuntimeError: size mismatch"
    # torch's zip reader's advice after its reason cut the run's reason (300 characters) before its own end
    zipped = CheckpointException("load", {0: (RuntimeError(
        "PytorchStreamReader failed reading zip archive: failed finding central directory. This is an internal "
        "miniz error. If you are seeing this error, there is a high likelihood that your checkpoint file is "
        "corrupted."), None)})
    assert load_error(zipped) == ("CheckpointException: RuntimeError: PytorchStreamReader failed reading zip archive: "
                                  "failed finding central directory")


class _RunsCode:
    """What a hostile checkpoint's pickle holds: loading it calls os.system, which leaves MARKER."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _hostile(folder: Path, marker: Path, where: str) -> Path:
    """A torch_dist checkpoint folder whose WHERE (.metadata, common.pt or a .distcp byte record) runs code as it
    is read, or ("outside") whose index names its data file by a path through '..', or whose one chunk of the
    tensor covers half of it ("partial") or reaches past it ("beyond"); the rest is a genuine index of one tensor
    and one byte record."""
    import io
    import pickle

    import torch
    from torch.distributed.checkpoint import metadata as md
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    folder.mkdir()
    (folder / "metadata.json").write_text('{"sharded_backend": "torch_dist", "sharded_backend_version": 1, '
                                          '"common_backend": "torch", "common_backend_version": 1}')
    record = io.BytesIO()
    torch.save([_RunsCode(marker)] if where == "record" else [None], record)
    (folder / "__0_0.distcp").write_bytes(record.getvalue() + bytes(24))
    data = f"../{folder.name}/__0_0.distcp" if where == "outside" else "__0_0.distcp"  # (the same file, by '..')
    sizes = {"partial": [1, 3], "beyond": [3, 3]}.get(where, [2, 3])  # (the tensor is [2, 3])
    chunk = md.ChunkStorageMetadata(offsets=torch.Size([0, 0]), sizes=torch.Size(sizes))
    index = md.Metadata(
        state_dict_metadata={"w": md.TensorStorageMetadata(md.TensorProperties(torch.float32), torch.Size([2, 3]),
                                                           [chunk]),
                             "x/shard_0_1": md.BytesStorageMetadata()},
        storage_data={md.MetadataIndex("x/shard_0_1"): _StorageInfo("__0_0.distcp", 0, len(record.getvalue())),
                      md.MetadataIndex("w", torch.Size([0, 0])): _StorageInfo(data, len(record.getvalue()), 24)})
    (folder / ".metadata").write_bytes(pickle.dumps(_RunsCode(marker) if where == ".metadata" else index))
    torch.save({"x": _RunsCode(marker)} if where == "common.pt" else {}, folder / "common.pt")
    return folder


def test_a_checkpoint_whose_index_would_run_code_is_refused_and_nothing_runs(tmp_path: Path, cli) -> None:
    """torch reads `.metadata` with pickle.load: a hostile checkpoint's index ran os.system in the pre-launch check
    (and then in every rank), and the check went on to complain of an 'int' that had no storage_meta."""
    marker = tmp_path / "MARKER"
    ckpt = _hostile(tmp_path / "ckpt", marker, ".metadata")
    proc = _run(tmp_path / "results", "gpt3", "--init-checkpoint", str(ckpt), via=cli)
    _assert_refused(proc, f"--init-checkpoint {ckpt}: .metadata would import posix.system as it is read", "refused")
    assert len((proc.stdout + proc.stderr).strip().splitlines()) == 1, proc.stdout + proc.stderr
    assert not marker.exists() and not (tmp_path / "results").exists()


def test_common_state_and_byte_records_are_read_as_weights_only(tmp_path: Path, monkeypatch) -> None:
    """common.pt (megatron-core's torch.load, weights_only unless TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD is set) and the
    .distcp byte records (torch's planner: torch.load(weights_only=False), whatever the environment) ran a hostile
    checkpoint's code: the latter in every rank of a run that then trained as if nothing had happened."""
    import io

    import torch

    from mlbench.train import cpu_compat

    cpu_compat.enable()  # before megatron-core's import here
    from mlbench.train.checkpoint import CheckpointError, common_state, store, unpickle

    marker = tmp_path / "MARKER"
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    with pytest.raises(CheckpointError, match=r"common.pt would import posix.system as it is read"):
        common_state(_hostile(tmp_path / "common", marker, "common.pt"))
    record = _hostile(tmp_path / "record", marker, "record")
    with pytest.raises(CheckpointError, match=r"__0_0.distcp \(the record of x/shard_0_1\) would import posix"):
        store._check_data_files(record)
    store._check_data_files(_hostile(tmp_path / "plain", marker, "none"))  # a genuine index and record read
    # torch's reader joins a data file's name to the folder: '../x.distcp' loaded a run's tensors from outside it
    with pytest.raises(CheckpointError, match=r"its index points at '\.\./outside/__0_0.distcp', outside the "
                                              r"checkpoint's folder"):
        store._check_data_files(_hostile(tmp_path / "outside", marker, "outside"))
    # while a checkpoint loads, torch's planner's own torch.load(weights_only=False) is refused too
    with unpickle.no_code_run(), pytest.raises(Exception, match="GLOBAL posix.system"):
        torch.load(io.BytesIO((record / "__0_0.distcp").read_bytes()), weights_only=False)
    assert os.environ["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] == "1" and "TORCH_FORCE_WEIGHTS_ONLY_LOAD" not in os.environ
    assert unpickle._index_global("torch.distributed.checkpoint.filesystem", "os.system") is None
    assert not marker.exists()


def test_a_checkpoint_holding_nan_is_refused_as_it_loads_before_run_start() -> None:
    """Bytes damaged inside a tensor's record (its zip archive intact) loaded as NaN: the run started, and aborted
    at its first step with 'the training loss is nan', after run_start."""
    import types

    import torch

    from mlbench.train import cpu_compat

    cpu_compat.enable()  # before megatron-core's import here
    from mlbench.train.checkpoint import CheckpointError, store

    layer = torch.nn.Linear(2, 2)
    chunk = types.SimpleNamespace(module=layer)  # DDP's wrapper: the model under .module
    adam = torch.optim.Adam(layer.parameters())
    member = types.SimpleNamespace(optimizer=adam)
    adam.state[layer.weight] = {"step": torch.tensor(1.0), "exp_avg_sq": torch.full((2, 2), math.inf)}
    store._check_finite("ckpt", [chunk], [])  # fresh moments: not the checkpoint's
    with pytest.raises(CheckpointError, match=r"ckpt: its optimizer state \(exp_avg_sq\) holds NaN or infinite"):
        store._check_finite("ckpt", [chunk], [member])
    with torch.no_grad():
        layer.weight[0, 1] = math.nan
    with pytest.raises(CheckpointError, match=r"--init-checkpoint ckpt: its weight weight holds NaN or infinite values "
                                              r"\(a damaged checkpoint, or one saved from a run that diverged\)"):
        store._check_finite("ckpt", [chunk], [])


def test_a_file_of_the_checkpoint_that_cannot_be_read_is_named_before_launch(tmp_path: Path) -> None:
    """A data file without read permission passed every check before launch; the run failed as it loaded it, told
    'a damaged checkpoint: save or copy it again' (the pre-launch check, since it reads the byte records: 'could not
    be checked: [rank0]: PermissionError'); a folder without search permission was '<path>/metadata.json:
    Permission denied' alone. Root reads any file: the check runs without the capabilities that allow it."""
    import shutil as sh
    import sys

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "metadata.json").write_text('{"sharded_backend": "torch_dist"}')
    for name in (".metadata", "common.pt", "__0_0.distcp"):
        (ckpt / name).write_bytes(b"x")
    drop = []
    if os.geteuid() == 0:
        if sh.which("setpriv") is None:
            pytest.skip("root reads every file, and setpriv (util-linux) is not here to drop that capability")
        caps = "-dac_override,-dac_read_search"
        drop = ["setpriv", "--bounding-set", caps, "--inh-caps", caps]

    def check() -> str:
        code = f"from mlbench.train.checkpoint import folder; folder.check_readable({str(ckpt)!r})"
        proc = subprocess.run([*drop, sys.executable, "-c", code], capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
        return proc.stderr.strip().splitlines()[-1] if proc.returncode else ""

    os.chmod(ckpt / "__0_0.distcp", 0)
    assert check() == (f"mlbench.train.checkpoint.folder.CheckpointError: --init-checkpoint {ckpt}: __0_0.distcp: "
                       f"Permission denied; a checkpoint's folder and files must be readable by the user running "
                       f"mlbench")
    os.chmod(ckpt / "__0_0.distcp", 0o644)
    assert check() == ""
    os.chmod(ckpt, 0o644)  # listed, not searched
    try:
        assert check().endswith(f"--init-checkpoint {ckpt}: metadata.json: Permission denied; a checkpoint's folder "
                                f"and files must be readable by the user running mlbench")
    finally:
        os.chmod(ckpt, 0o755)


def test_an_index_that_leaves_part_of_a_tensor_out_is_refused_before_launch(tmp_path: Path) -> None:
    """A tensor whose index lacked chunks (a damaged or hand-merged .metadata) loaded silently: the part it lacked
    kept the model's random initialisation, and the run went on, exit 0."""
    from mlbench.train import cpu_compat

    cpu_compat.enable()  # before megatron-core's import here
    from mlbench.train.checkpoint import CheckpointError, store

    marker = tmp_path / "MARKER"
    with pytest.raises(CheckpointError, match=r"its index covers 3 of the 6 values of w \(the rest would keep the "
                                              r"model's random initialisation\); a damaged index"):
        store._check_data_files(_hostile(tmp_path / "partial", marker, "partial"))
    with pytest.raises(CheckpointError, match=r"a chunk of w lies outside its shape \(offsets \[0, 0\], sizes "
                                              r"\[3, 3\], tensor \[2, 3\]\)"):
        store._check_data_files(_hostile(tmp_path / "beyond", marker, "beyond"))


def _flip_finite(c: Path) -> str:
    """One bit of the middle of the largest tensor's record flipped (bit 0 of a float's byte: still a finite
    number): the index, the sizes and the byte records intact. Returns the data file's name."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    index = FileSystemReader(str(c)).read_metadata()
    big = max((info for i, info in index.storage_data.items()
               if isinstance(index.state_dict_metadata[i.fqn], TensorStorageMetadata)), key=lambda s: s.length)
    with open(c / big.relative_path, "r+b") as f:
        f.seek(big.offset + big.length // 2)
        byte = f.read(1)[0]
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte ^ 1]))
    return big.relative_path


def test_a_checkpoint_whose_bytes_changed_is_refused_before_launch(llama_checkpoint, tmp_path: Path, cli) -> None:
    """Bytes flipped inside a tensor (finite values, every structure intact) loaded silently and the run trained
    from them, exit 0: the checksums saved with the checkpoint are verified, one line naming the file. A dry run
    reads every byte (exit 2); a real run's check before launch reads the listing alone (the launching node read
    a 405B checkpoint's ~5 TB, ~30 min, the ranks waiting) and each rank its share before it loads, which aborts
    the run as any rank's CheckpointError does (test_a_checkpoint_that_fails_as_it_loads_aborts_the_run_...)."""
    from mlbench.train import cpu_compat
    from mlbench.train.checkpoint import integrity

    ckpt, _ = llama_checkpoint
    flipped: list[str] = []
    bad = _damaged(ckpt, tmp_path / "flipped", lambda c: flipped.append(_flip_finite(c)))
    said = f"--init-checkpoint {bad}: {flipped[0]}: its bytes differ from those saved (CRC32-C"
    proc = _run(tmp_path / "results", "llama31_405b", "--dry-run", "--init-checkpoint", str(bad), via=cli)
    _assert_refused(proc, said, "a damaged checkpoint, or a file replaced by another checkpoint's")
    assert not (tmp_path / "results").exists()
    assert integrity.check_listing(bad) == integrity.verify(ckpt)  # the launching node's check: no byte read
    cpu_compat.enable()  # before megatron-core's import here
    from mlbench.train.checkpoint import CheckpointError, store

    with pytest.raises(CheckpointError, match=re.escape(said)):  # the rank's, before it reads anything
        store.load(bad, [], None, 2, checked=integrity.file_stamps(bad))
    # its checksums cut short; a file added; none at all (a reference checkpoint's case: loads, said unverified)
    cut = _damaged(ckpt, tmp_path / "cut", lambda c: os.truncate(c / integrity.MANIFEST, 40))
    with pytest.raises(integrity.CheckpointError, match=rf"{integrity.MANIFEST} cannot be read \(JSONDecodeError"):
        integrity.verify(cut)
    extra = _damaged(ckpt, tmp_path / "extra", lambda c: shutil.copy(c / flipped[0], c / "__9_0.distcp"))
    with pytest.raises(integrity.CheckpointError, match=r"__9_0.distcp was not saved with the checkpoint"):
        integrity.verify(extra)
    bare = _damaged(ckpt, tmp_path / "bare", lambda c: (c / integrity.MANIFEST).unlink())
    ok = _run(tmp_path / "r2", "llama31_405b", "--dry-run", "--init-checkpoint", str(bare), via=cli)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "no checksums (not saved by mlbench): its bytes are not verified" in " ".join(ok.stdout.split())


def test_checksums_name_the_file_whose_bytes_size_or_presence_differ(tmp_path: Path) -> None:
    """The manifest against the folder: a file of the same size from elsewhere (another checkpoint's shard of the
    same shape), cut short, missing; and a folder that changes under a reader (a stat an entry, no byte read)."""
    from mlbench.train.checkpoint import integrity

    c = tmp_path / "c"
    c.mkdir()
    for name, data in (("metadata.json", b"{}"), ("__0_0.distcp", b"a" * 1000), ("__1_0.distcp", b"b" * 1000)):
        (c / name).write_bytes(data)
    integrity.write(c, integrity.sums(c, ["__0_0.distcp"]))
    assert integrity.verify(c) == 2002
    before = integrity.stamp(c)
    assert integrity.changed(c, before) is None
    (c / "other").write_bytes(b"a" * 999 + b"c")
    os.replace(c / "other", c / "__1_0.distcp")  # same size, other bytes
    assert integrity.changed(c, before) == "__1_0.distcp"
    with pytest.raises(integrity.CheckpointError, match=r"__1_0.distcp: its bytes differ from those saved"):
        integrity.verify(c)
    os.truncate(c / "__1_0.distcp", 10)
    with pytest.raises(integrity.CheckpointError, match=r"__1_0.distcp is 10 bytes; it was saved with 1,000"):
        integrity.verify(c)
    (c / "__1_0.distcp").unlink()
    with pytest.raises(integrity.CheckpointError, match=r"__1_0.distcp is missing; the checkpoint was saved with it"):
        integrity.verify(c)
    (c / integrity.MANIFEST).write_text('{"algorithm": "crc32c", "files": {"../x": {"bytes": 1, "crc32c": "0"}}}')
    with pytest.raises(integrity.CheckpointError, match=r"is not the manifest mlbench writes"):
        integrity.verify(c)


def test_the_ranks_share_the_checksum_read_balanced_by_bytes(tmp_path: Path) -> None:
    """Each file's bytes are read by one rank, the ranks' shares balanced by bytes; a file whose bytes differ is
    refused by the rank whose share holds it, and the listing (what the launching node checks) passes it."""
    from mlbench.train.checkpoint import integrity

    files = {f"__{i}_0.distcp": {"bytes": b, "crc32c": "0"} for i, b in enumerate([900, 500, 400, 300, 200, 100])}
    shares = [integrity.share(files, r, 3) for r in range(3)]
    assert sorted(n for s in shares for n in s) == sorted(files)  # every file once
    assert [sum(files[n]["bytes"] for n in s) for s in shares] == [900, 800, 700]
    assert integrity.share(files, 0, 1) == sorted(files) and integrity.share(files, 7, 8) == []
    c = tmp_path / "c"
    c.mkdir()
    for name, data in (("metadata.json", b"{}"), ("__0_0.distcp", b"a" * 1000), ("__1_0.distcp", b"b" * 10)):
        (c / name).write_bytes(data)
    integrity.write(c)
    (c / "__0_0.distcp").write_bytes(b"a" * 999 + b"c")  # same size, other bytes
    assert integrity.check_listing(c) == 1012
    owner = next(r for r in range(2) if "__0_0.distcp" in integrity.share(integrity._read(c, c), r, 2))
    assert integrity.verify_share(c, 1 - owner, 2) is not None
    with pytest.raises(integrity.CheckpointError, match=r"__0_0.distcp: its bytes differ from those saved"):
        integrity.verify_share(c, owner, 2)


def test_a_checkpoint_changed_between_the_check_and_the_load_is_refused_by_the_rank(tmp_path: Path,
                                                                                   monkeypatch) -> None:
    """A checkpoint changed after the check before launch read it (a save or copy into it going on, a shard
    replaced by another of the same size) was loaded unchecked: the ranks compared it only with itself as they read
    it. The check's files (size, mtime, inode: a stat a file, no byte read again) now go into the run plan, and each
    rank refuses files that are not those, naming the first."""
    from mlbench import preflight
    from mlbench.layout import resolve
    from mlbench.registry import load
    from mlbench.run_plan import RunPlan
    from mlbench.runner import RunOptions
    from mlbench.train import cpu_compat
    from mlbench.train.checkpoint import integrity

    c = tmp_path / "c"
    (c / "zarr.weight").mkdir(parents=True)
    for name, data in (("metadata.json", b"{}"), ("__0_0.distcp", b"a" * 1000), ("zarr.weight/0.0", b"z" * 10)):
        (c / name).write_bytes(data)
    integrity.write(c)
    checked = integrity.file_stamps(c)
    assert sorted(checked) == sorted(["__0_0.distcp", integrity.MANIFEST, "metadata.json", "zarr.weight/0.0"])
    assert integrity.changed_since_check(c, checked) is None
    (c / "other").write_bytes(b"b" * 1000)
    os.replace(c / "other", c / "__0_0.distcp")  # same size, another file
    assert integrity.changed_since_check(c, checked) == "__0_0.distcp replaced (1,000 bytes, was 1,000)"
    stale = checked
    checked = integrity.file_stamps(c)
    with open(c / "zarr.weight" / "0.0", "ab") as f:  # a chunk in a folder, rewritten in place
        f.write(b"z")
    assert integrity.changed_since_check(c, checked) == "zarr.weight/0.0 rewritten (11 bytes, was 10)"
    checked = integrity.file_stamps(c)
    (c / "__1_0.distcp").write_bytes(b"c")
    assert integrity.changed_since_check(c, checked) == "__1_0.distcp added"
    (c / "__1_0.distcp").unlink()
    (c / "metadata.json").unlink()
    assert integrity.changed_since_check(c, checked) == "metadata.json removed"

    cpu_compat.enable()  # before megatron-core's import here
    from mlbench.train.checkpoint import CheckpointError, store

    with pytest.raises(CheckpointError, match=r"^--init-checkpoint .*/c: __0_0.distcp replaced \(1,000 bytes, was "
                                              r"1,000\) since the check before launch: a checkpoint being saved or "
                                              r"copied into; start the run again once it is complete$"):
        store.load(c, [], None, 2, checked=stale)  # (before the rank reads anything)

    # carried: the check's stamps into the run's options (a SLURM job's spec takes them whole), then its plan
    monkeypatch.setattr("mlbench.dry_run.check_checkpoint", lambda plan, console, checksums=True: checked)
    bench = load("llama31_405b", tiny=True)
    layout = resolve(bench)
    opts = RunOptions(results=tmp_path, system="s", init_checkpoint=str(c))
    preflight.check_checkpoint_fits(bench, layout, opts, None)
    assert opts.init_checkpoint_stamps == checked
    plan = RunPlan(benchmark=bench, layout=layout.as_dict(), seed=1, run_dir="", system="s",
                   init_checkpoint=str(c), init_checkpoint_stamps=opts.init_checkpoint_stamps)
    plan.save(tmp_path / "plan.json")
    assert RunPlan.load(tmp_path / "plan.json").init_checkpoint_stamps == checked
