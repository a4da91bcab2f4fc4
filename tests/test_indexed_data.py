"""The indexed data source: megatron-core's own indexed datasets, built here with its IndexedDatasetBuilder.

Documents are drawn from the Markov source, so a tiny model can learn them and the target has a known floor.
Unit tests check the source (shapes, determinism, the same batch on every rank, a fixed eval set); an end-to-end
run through the CLI trains a full-size definition (tiny model sizes) on it to its target; bad data input is
refused before launch.
"""

from __future__ import annotations

import json
import os
import re
import socket
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from conftest import mlbench, result_dir

from mlbench import registry
from mlbench.errors import UserError
from mlbench.run_plan import RunPlan
from mlbench.spec import deep_merge
from mlbench.train import data as data_lib
from mlbench.train.data.markov import MarkovSource

ROOT = Path(__file__).resolve().parents[1]
GBS, STEPS = 16, 300
# The Markov source's entropy rate is 0.888 nats/token; a document boundary every 512 tokens adds about
# log(128) / 512 = 0.01. Target = floor + 0.17, which the tiny model reaches in about 120 steps.
TARGET = 1.06


def make_corpus(prefix: Path, docs: int, doc_len: int, seed: int) -> Path:
    """A megatron indexed dataset (PREFIX.bin/.idx) of Markov-chain documents, written by megatron-core."""
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    tokens = MarkovSource(128).sample(docs, doc_len, np.random.default_rng(seed))
    # uint16: what megatron's preprocess_data.py writes for vocabularies under 65,500
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.uint16)
    for doc in tokens:
        builder.add_document(torch.from_numpy(doc), [doc_len])
    builder.finalize(f"{prefix}.idx")
    return prefix


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("corpus")
    return {"train": make_corpus(d / "train", 300, 512, 1), "eval": make_corpus(d / "eval", 40, 512, 2)}


@pytest.fixture(scope="module")
def definitions(tmp_path_factory) -> Path:
    """A folder holding gpt3.yaml as a *full* definition with gpt3's tiny model sizes and indexed data."""
    data = yaml.safe_load((ROOT / "benchmarks" / "gpt3.yaml").read_text())
    tiny = data.pop("tiny")
    full = deep_merge(data, {k: tiny[k] for k in ("model", "optimizer", "train", "eval")})
    full["quality"] = {"metric": "log_perplexity", "target": TARGET, "direction": "min",
                       "note": "Markov floor 0.888 + document boundaries + margin"}
    full["layouts"] = []
    full["train"]["max_steps"] = STEPS
    d = tmp_path_factory.mktemp("benchmarks")
    (d / "gpt3.yaml").write_text(yaml.safe_dump(full))
    return d


def _bench(definitions: Path, path: Path, eval_path: Path | None = None):
    import dataclasses

    b = registry.load("gpt3", directory=definitions)
    assert b.variant == "full" and b.data.source == "indexed"
    return dataclasses.replace(b, data=dataclasses.replace(b.data, path=str(path),
                                                           eval_path=str(eval_path) if eval_path else ""))


@pytest.mark.parametrize("held_out", ["eval-prefix", "split"])
def test_indexed_source(definitions: Path, corpus: dict, tmp_path: Path, held_out: str) -> None:
    bench = _bench(definitions, corpus["train"], corpus["eval"] if held_out == "eval-prefix" else None)
    seq = bench.model.seq_length

    def source(seed: int, cache: str = "cache") -> data_lib.IndexedTokens:
        return data_lib.indexed_source(bench, seed=seed, global_batch=GBS, steps=STEPS, cache=tmp_path / cache)

    a, a_again, b = source(7), source(7, "cache2"), source(8)
    rng = np.random.default_rng(0)
    batch = a.train_batch(0, rng)
    assert batch.shape == (GBS, seq + 1) and batch.dtype == np.int64
    assert batch[:, :-1].min() >= 0 and batch.max() < 128
    assert (batch[:, -1] == data_lib.PAD).all()  # gpt3's windows are exactly seq_length: no label past the end
    # deterministic given the run seed and step: a fresh build (what rank 0 does) and a cache hit (what every
    # other rank does after rank 0 built the indices) give the same batch
    for step in (0, 1, STEPS - 1):
        np.testing.assert_array_equal(a.train_batch(step, rng), a_again.train_batch(step, rng))
        np.testing.assert_array_equal(a.train_batch(step, rng), source(7).train_batch(step, rng))
    assert not np.array_equal(a.train_batch(0, rng), a.train_batch(1, rng))
    assert not np.array_equal(a.train_batch(0, rng), b.train_batch(0, rng))  # the run seed shuffles
    # the eval set is fixed for every run, and held out from training
    ev = a.eval_set(bench.eval.samples, rng)
    assert ev.shape == (bench.eval.samples, seq + 1)
    np.testing.assert_array_equal(ev, b.eval_set(bench.eval.samples, rng))
    train_rows = {r.tobytes() for s in range(0, STEPS, 7) for r in a.train_batch(s, rng)}
    assert not train_rows & {r.tobytes() for r in ev}
    with pytest.raises(ValueError, match="samples"):
        a.train_batch(10**6, rng)


@pytest.mark.parametrize("bad_id", [-1, -3, 128])
def test_a_token_id_outside_the_vocabulary_is_named_with_its_file(definitions: Path, corpus: dict, tmp_path: Path,
                                                                  bad_id: int) -> None:
    """-1 (megatron's padding id) passed as padding: megatron made it token 0 with its label masked, and the run
    trained on; -3 was reported as 'token id 127 outside the model's vocabulary'; no reason named the file."""
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    prefix = tmp_path / "signed"
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.int16)
    for d in MarkovSource(128).sample(300, 512, np.random.default_rng(1)):
        builder.add_document(torch.from_numpy(d), [512])
    builder.finalize(f"{prefix}.idx")
    raw = np.memmap(f"{prefix}.bin", dtype=np.int16, mode="r+")
    raw[::1000] = bad_id  # in every sample
    raw.flush()
    src = data_lib.indexed_source(_bench(definitions, prefix, corpus["eval"]), seed=7, global_batch=GBS, steps=STEPS,
                                  cache=tmp_path / "cache")
    with pytest.raises(ValueError, match=rf"^{prefix}.bin: training sample \d+ holds token id {bad_id}, outside the "
                                         r"model's vocabulary \[0, 128\): prepared with another tokenizer\?$"):
        src.train_batch(0, np.random.default_rng(0))


@pytest.mark.parametrize("damage", ["cut-short", "empty"])
def test_an_index_cache_a_killed_run_left_is_built_again(definitions: Path, corpus: dict, tmp_path: Path,
                                                         damage: str) -> None:
    """Across nodes the cache outlives a run, and megatron writes it in place: a file a kill cut short was taken as
    a hit, and every later run aborted ('mmap length is greater than file size', 'No data left in file')."""
    bench = _bench(definitions, corpus["train"], corpus["eval"])

    def batch() -> np.ndarray:
        src = data_lib.indexed_source(bench, seed=7, global_batch=GBS, steps=STEPS, cache=tmp_path / "cache")
        return src.train_batch(3, np.random.default_rng(0))

    first = batch()
    shuffle = next((tmp_path / "cache").glob("*-train-shuffle_index.npy"))
    shuffle.write_bytes(shuffle.read_bytes()[:len(shuffle.read_bytes()) // 2] if damage == "cut-short" else b"")
    np.testing.assert_array_equal(batch(), first)


@pytest.mark.parametrize("damage", ["zeroed", "zeroed-after-header", "unstamped", "data-rewritten"])
def test_an_index_cache_damaged_in_place_is_built_again_with_a_note(definitions: Path, corpus: dict, tmp_path: Path,
                                                                    damage: str, capfd) -> None:
    """A cache file zeroed in place (same size: a crash, a full disk) opened as an array and was used silently,
    every training sample the same; so was a cache of data rewritten since under the same path. Each cache is
    stamped with its files' CRC32-C and the data's size and mtime: one that does not hold is built again, said."""
    bench = _bench(definitions, corpus["train"], corpus["eval"])
    cache = tmp_path / "cache"

    def batch() -> np.ndarray:
        src = data_lib.indexed_source(bench, seed=7, global_batch=GBS, steps=STEPS, cache=cache)
        return src.train_batch(3, np.random.default_rng(0))

    first = batch()
    capfd.readouterr()
    shuffle = next(cache.glob("*-train-shuffle_index.npy"))
    key = shuffle.name.split("-", 1)[0]
    if damage == "zeroed":
        shuffle.write_bytes(bytes(shuffle.stat().st_size))
    elif damage == "zeroed-after-header":  # np.load still opens it
        raw = shuffle.read_bytes()
        shuffle.write_bytes(raw[:128] + bytes(len(raw) - 128))
    elif damage == "unstamped":  # a run killed after megatron built it, before the stamp
        (cache / f"{key}-mlbench.json").unlink()
    else:
        bin_file = Path(f"{corpus['train']}.bin")
        os.utime(bin_file, ns=(bin_file.stat().st_atime_ns, bin_file.stat().st_mtime_ns + 10**9))
    np.testing.assert_array_equal(batch(), first)
    err = capfd.readouterr().err
    why = {"zeroed": "is not what was built", "zeroed-after-header": "is not what was built",
           "unstamped": "has no mlbench stamp", "data-rewritten": "changed since it was built"}[damage]
    assert f"index cache {cache}/{key}-*: " in err and why in err and "built again" in err, err
    batch()  # rebuilt and stamped: a hit, nothing said
    assert "built again" not in capfd.readouterr().err


def test_two_runs_building_one_index_cache_at_once_build_it_once(tmp_path: Path, capfd) -> None:
    """Two runs sharing an index cache at once: the second found the first's files not yet stamped, dropped them
    as a killed run's ('has no mlbench stamp') and built them again. Now rank 0 holds a lock on the cache from the
    check to the stamp: the second waits, then finds the cache built and stamped, a hit. (megatron's builder
    here: a cache whose files are there is a hit, as megatron takes it.)"""
    from concurrent.futures import ThreadPoolExecutor
    from threading import Event

    from mlbench.train.data import indexed

    cache, src = tmp_path / "cache", tmp_path / "d.bin"
    src.write_bytes(b"x")
    built: list[str] = []
    writing = Event()

    def megatron(run: str) -> Callable[[], str]:
        def build() -> str:
            if (cache / "abc-train-shuffle_index.npy").exists():
                return "hit"
            built.append(run)
            cache.mkdir(exist_ok=True)
            (cache / "abc-train-shuffle_index.npy").write_bytes(b"1" * 100)
            writing.set()
            Event().wait(0.5)  # the other run starts meanwhile
            (cache / "abc-train-sample_index.npy").write_bytes(b"2" * 100)
            return "built"
        return build

    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(indexed.build_cached, cache, [str(src)], megatron("first"))
        assert writing.wait(10)
        second = pool.submit(indexed.build_cached, cache, [str(src)], megatron("second"))
        assert (first.result(), second.result()) == ("built", "hit")
    assert built == ["first"]
    assert indexed._cache_fault(indexed._groups(cache)["abc"]) is None
    err = capfd.readouterr().err
    assert "built again" not in err and f"index cache {cache}: another run is building it; waiting" in err, err


def test_an_index_cache_on_a_filesystem_without_locks_is_built_unlocked(tmp_path: Path, monkeypatch) -> None:
    """flock refused with ENOLCK (NFS without its lock daemon) ended the run with an OSError before megatron built
    anything, where the cache lock's docstring says such a cache is built unlocked, as before there was a lock."""
    import errno
    import fcntl

    from mlbench.train.data import indexed

    cache, src = tmp_path / "cache", tmp_path / "d.bin"
    src.write_bytes(b"x")

    def no_locks(fd: int, op: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    def build() -> str:
        (cache / "abc-train-shuffle_index.npy").write_bytes(b"1" * 100)
        return "built"

    monkeypatch.setattr(fcntl, "flock", no_locks)
    assert indexed.build_cached(cache, [str(src)], build) == "built"
    assert indexed._cache_fault(indexed._groups(cache)["abc"]) is None  # stamped


def test_a_shared_index_cache_that_is_no_folder_is_refused_before_launch(definitions: Path, corpus: dict,
                                                                         tmp_path: Path) -> None:
    """Rank 0 found it mid-run (FileExistsError from makedirs), naming nothing."""
    prefix = _copy(corpus["train"], tmp_path / "train")
    (tmp_path / "mlbench_index_cache").write_text("")
    with pytest.raises(UserError, match=f"in {tmp_path}/mlbench_index_cache, but something other than a folder"):
        data_lib.check(_bench(definitions, prefix, corpus["eval"]), 2, dry_run=False, given={"path", "eval_path"})
    # one node: unused
    data_lib.check(_bench(definitions, prefix, corpus["eval"]), 1, dry_run=False, given={"path", "eval_path"})


@pytest.mark.parametrize("keep", [True, False])
def test_eval_split_packed_whole_keeps_its_partial_sequence(definitions: Path, corpus: dict, tmp_path: Path,
                                                            keep: bool) -> None:
    """gpt3's eval set as the reference packs it (--no-seq-len-plus-one-tokens, whole-set eval): 3 documents of
    100 tokens are ceil(300 / 64) = 5 sequences of 64 tokens, the last one 44 tokens then padding; each
    sequence's last position predicts nothing, so 4 x 63 + 43 = 295 predictions, each made once."""
    import dataclasses

    from mlbench.train.objectives import CausalLM

    bench = _bench(definitions, corpus["train"], make_corpus(tmp_path / "small_eval", 3, 100, 4))
    shipped = registry.load("gpt3")  # what the shipped definition asks for
    assert shipped.eval.keep_partial_sequence and not shipped.data.add_extra_token_to_sequence
    assert not bench.data.add_extra_token_to_sequence
    bench = dataclasses.replace(bench, eval=dataclasses.replace(bench.eval, samples=5, keep_partial_sequence=keep))
    src = data_lib.indexed_source(bench, seed=7, global_batch=GBS, steps=STEPS, cache=tmp_path / "cache")
    ev = src.eval_set(5, np.random.default_rng(0))
    assert ev.shape == (5, 65) and (ev[:, -1] == data_lib.PAD).all()  # the label past each window's end
    mask = CausalLM().make_batch(ev, np.random.default_rng(0))["loss_mask"]
    if not keep:  # megatron-core's default: 4 full sequences, and a 5th wrapped into a second epoch
        assert (ev[:, :-1] >= 0).all() and mask.sum() == 5 * 63
        return
    partial = [r for r in ev if (r[:-1] == data_lib.PAD).any()]
    assert len(partial) == 1 and (partial[0][44:] == data_lib.PAD).all() and (partial[0][:44] >= 0).all()
    assert mask.sum() == 295


def _rank_worker(rank: int, world: int, port: int, bench_dict: dict, run_dir: str, out: str) -> None:
    import os

    import torch.distributed as dist

    from mlbench.run_plan import benchmark_from_dict

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    bench = benchmark_from_dict(bench_dict)
    plan = RunPlan(benchmark=bench, layout={"nodes": 1, "global_batch_size": GBS}, seed=11, run_dir=run_dir,
                   system="test")
    src = data_lib.build_source(bench, plan)  # rank 0 builds megatron's indices, the other rank reads them
    rng = np.random.default_rng(0)
    np.savez(f"{out}/rank{rank}.npz", step5=src.train_batch(5, rng), eval=src.eval_set(32, rng))
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.slow  # two processes importing megatron-core: about 15 s on one core
def test_every_rank_gets_the_same_batch(definitions: Path, corpus: dict, tmp_path: Path) -> None:
    import dataclasses

    import torch.multiprocessing as mp

    bench = _bench(definitions, corpus["train"], corpus["eval"])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank_worker, args=(2, port, dataclasses.asdict(bench), str(tmp_path / "run"), str(tmp_path)),
             nprocs=2)
    r0, r1 = np.load(tmp_path / "rank0.npz"), np.load(tmp_path / "rank1.npz")
    np.testing.assert_array_equal(r0["step5"], r1["step5"])
    np.testing.assert_array_equal(r0["eval"], r1["eval"])
    assert any((tmp_path / "run" / "data_cache").iterdir())  # the indices went to the run's staging folder


def test_markov_source_is_the_loops_old_sampling() -> None:
    """The Markov source behind the interface draws exactly what the loop drew before."""
    bench = registry.load("gpt3", tiny=True)
    plan = RunPlan(benchmark=bench, layout={"nodes": 1, "global_batch_size": 16}, seed=5, run_dir="", system="t")
    src = data_lib.build_source(bench, plan)
    m = MarkovSource(128, 4, 0.5, 1234)
    r1, r2 = np.random.default_rng([5, 3]), np.random.default_rng([5, 3])
    np.testing.assert_array_equal(src.train_batch(3, r1), m.sample(16, 65, r2))
    assert r1.random() == r2.random()  # the generator is left where the loop expects it (masking draws next)
    e1, e2 = np.random.default_rng([1234, 2**31 - 1]), np.random.default_rng([1234, 2**31 - 1])
    np.testing.assert_array_equal(src.eval_set(32, e1), m.sample(32, 65, e2))


@pytest.mark.slow
def test_full_definition_on_indexed_data_reaches_target(definitions: Path, corpus: dict, tmp_path: Path,
                                                         cli) -> None:
    env = {"MLBENCH_BENCHMARKS": str(definitions)}
    results = tmp_path / "results"
    args = ("run", "gpt3", "--seed", "3", "--results", str(results), "--data-path", str(corpus["train"]),
            "--eval-data-path", str(corpus["eval"]))
    # A small model under gpt3's name is not the closed benchmark: refused before launch, naming the rules broken.
    refused = cli(*args, env=env)
    _refused(refused, "closed gpt3 rules (training 4.1.0) reject", "max_sequence_length (needs v['value'] == 2048)",
             "opt_base_learning_rate (needs", "--ignore-closed-rules")
    assert not results.exists()
    proc = mlbench(*args, "--ignore-closed-rules", env=env, timeout=200)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    folder = result_dir(results, "gpt3")
    record = json.loads((folder / "result_0.json").read_text())
    assert record["variant"] == "full" and record["status"] == "success"
    assert record["quality"]["last"] <= TARGET
    assert record["config"]["data"]["path"] == str(corpus["train"])
    assert record["config"]["data"]["eval_path"] == str(corpus["eval"])
    check = cli("check", "--rules", "smoke", str(folder / "result_0.txt"), env=env)
    assert check.returncode == 0, check.stdout + check.stderr
    assert not list(folder.glob(".staging-*"))  # the index cache went with the staging folder


def _refused(proc, *needles: str) -> None:
    out = proc.stderr
    assert proc.returncode == 2 and proc.stdout == "", (proc.stdout, out)
    assert "Traceback" not in out and len([ln for ln in out.splitlines() if ln.strip()]) == 1, out
    for n in needles:
        assert n in out, out


def test_bad_data_input_is_refused_before_launch(definitions: Path, corpus: dict, tmp_path: Path, cli) -> None:
    results = tmp_path / "results"
    env = {"MLBENCH_BENCHMARKS": str(definitions)}
    readme = "retired_benchmarks/gpt3/megatron-lm/README.md"
    _refused(cli("run", "gpt3", "--results", str(results)), "no data path", "--data-path PREFIX",
             "PREFIX.bin and PREFIX.idx", readme)
    _refused(cli("run", "gpt3", "--results", str(results), "--data-path", str(tmp_path / "nope"), env=env),
             "--data-path", f"{tmp_path / 'nope'}.bin", "not found")
    _refused(cli("run", "gpt3", "--results", str(results), "--data-path", str(corpus["train"]),
                     "--eval-data-path", str(tmp_path / "nope"), env=env), "--eval-data-path", "not found")
    _refused(cli("run", "gpt3", "--results", str(results), "--data-path",
                     f"0.5 {corpus['train']} 0.5 {corpus['eval']}", env=env), "--eval-data-path")
    _refused(cli("run", "gpt3", "--tiny", "--results", str(results), "--data-path", str(corpus["train"])),
             "--data-path", "Markov")
    _refused(cli("run", "bert", "--results", str(results)), "bert", "TFRecord", "no --data-path")
    assert not results.exists()


@pytest.mark.parametrize(("flag", "bad", "shown"), [("--data-path", "\n", "\\n"),
                                                    ("--eval-data-path", "\x1b[31m", "\\x1b")])
def test_a_data_path_flag_with_a_control_character_is_refused(definitions: Path, corpus: dict, tmp_path: Path, cli,
                                                                flag: str, bad: str, shown: str) -> None:
    """--data-path / --eval-data-path took a newline or an escape sequence that a benchmark file's data.path
    refuses (its split the blend in two, its ESC reached the terminal through the run's lines): refused alike,
    naming the flag, for the indexed source and BERT's records (train.data.paths.absolute)."""
    results = tmp_path / "results"
    env = {"MLBENCH_BENCHMARKS": str(definitions)}
    given = {"--data-path": str(corpus["train"]), "--eval-data-path": str(corpus["eval"])}
    given[flag] = f"{given[flag]}{bad}x"
    _refused(cli("run", "gpt3", "--results", str(results), *(a for kv in given.items() for a in kv), env=env),
             f"{flag} ", f"holds {shown}, a character that is not printable")
    _refused(cli("run", "bert", "--dry-run", "--results", str(results), flag, f"/data{bad}x"),
             f"{flag} ", f"holds {shown}, a character that is not printable")
    assert not results.exists()


def test_dry_run_needs_no_data(tmp_path: Path, cli) -> None:
    proc = cli("run", "gpt3", "--dry-run", "--nodes", "32", "--nproc-per-node", "8", "--launcher", "torchrun",
                   "--rdzv-endpoint", "localhost:29500", "--global-batch-size", "2048", "--results", str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("spec", ["-1 /a", "0 /a 1 /b", "nan /a", "inf /a 1 /b"])
def test_a_blend_weight_must_be_positive_and_finite(spec: str) -> None:
    from mlbench.train.data.indexed import parse_blend

    with pytest.raises(UserError, match="weights must be positive finite numbers"):  # NaN and inf passed
        parse_blend(spec)
    assert parse_blend("0.25 /a 0.75 /b") == (["/a", "/b"], [0.25, 0.75])


@pytest.mark.parametrize(("spec", "says"), [("1e308 /a 1e308 /b", "the weights sum past float64's range (inf)"),
                                           ("1e300 /a 1e-300 /b", "weight 1e-300 is 0 beside their sum 1e+300")])
def test_blend_weights_megatron_cannot_normalize_are_refused(spec: str, says: str) -> None:
    """megatron divides the weights by their sum and asserts each is positive: both failed mid-run as a bare
    AssertionError."""
    from mlbench.train.data.indexed import parse_blend

    with pytest.raises(UserError, match=re.escape(f"data blend {spec!r}: {says}")):
        parse_blend(spec)
    assert parse_blend("1e-300 /a 1 /b")[1] == [1e-300, 1.0]  # tiny beside its sum, but not 0: megatron takes it


def test_a_blend_weight_in_unicode_digits_is_refused() -> None:
    """float() reads '٠.٥' (Arabic-Indic digits) as 0.5: such a weight was taken."""
    from mlbench.train.data.indexed import parse_blend

    with pytest.raises(UserError, match="'\u0660.\u0665' is a number in digits other than ASCII's"):
        parse_blend("\u0660.\u0665 /a 0.5 /b")


# ---- damaged or unsuitable data, refused before launch ---------------------------------------------------


def _copy(src: Path, dest: Path) -> Path:
    for ext in (".bin", ".idx"):
        Path(f"{dest}{ext}").write_bytes(Path(f"{src}{ext}").read_bytes())
    return dest


Damage = Callable[[Path], None]
_LENGTHS = 34  # where a megatron index's arrays start: the lengths (int32), then the pointers (int64)
_POINTERS = _LENGTHS + 4 * 300  # the training corpus: 300 sequences


def _patch_idx(offset: int, data: bytes) -> Damage:
    def damage(prefix: Path) -> None:
        idx = Path(f"{prefix}.idx")
        raw = bytearray(idx.read_bytes())
        raw[offset:offset + len(data)] = data
        idx.write_bytes(bytes(raw))
    return damage


def _truncate(ext: str, size: int) -> Damage:
    def damage(prefix: Path) -> None:
        path = Path(f"{prefix}{ext}")
        path.write_bytes(path.read_bytes()[:size])
    return damage


def _replace_bin(make: Callable[[Path], object]) -> Damage:
    def damage(prefix: Path) -> None:
        Path(f"{prefix}.bin").unlink()
        make(Path(f"{prefix}.bin"))
    return damage


def _loop(path: Path) -> None:
    path.symlink_to(path.name)


# (damage to a copy of the training prefix, what the one line says besides the file's name, the file named)
DAMAGED = {
    "bin-truncated": (_truncate(".bin", 1000), "bytes, but its index", ".bin"),
    "both-empty": (lambda p: [_truncate(ext, 0)(p) for ext in (".bin", ".idx")], "header", ".idx"),
    "idx-version-2": (_patch_idx(9, (2).to_bytes(8, "little")), "index version 2; megatron-core reads version 1",
                      ".idx"),
    "dtype-code-99": (_patch_idx(17, bytes([99])), "dtype code 99; megatron's codes are 1 (uint8)", ".idx"),
    "bad-magic": (_patch_idx(0, b"XXIDIDX"), "is not a megatron index", ".idx"),
    "idx-30-bytes": (_truncate(".idx", 30), "is 30 bytes, shorter than a megatron index's 34-byte header", ".idx"),
    "idx-arrays-cut": (_truncate(".idx", 100), "truncated?", ".idx"),
    "bin-folder": (_replace_bin(Path.mkdir), "is a folder, not a file", ".bin"),
    "bin-fifo": (_replace_bin(os.mkfifo), "is a named pipe, not a regular file", ".bin"),
    "bin-link-loop": (_replace_bin(_loop), "is a symbolic link loop", ".bin"),
    # An index whose header lies: each passed, and megatron failed mid-run naming no file ('offset must be
    # non-negative', a bare AssertionError, 'cannot mmap an empty file') or trained on the wrong tokens.
    "negative-length": (_patch_idx(_LENGTHS + 4 * 150, (-512).to_bytes(4, "little", signed=True)),
                        "is damaged: sequence 150 has length -512", ".idx"),
    "pointer-past-the-bin": (_patch_idx(_POINTERS + 8 * 150, (10**12).to_bytes(8, "little")),
                             "is damaged: sequence 150 starts at byte 1000000000000 of the .bin, not 153600", ".idx"),
    "documents-short-of-the-sequences": (_patch_idx(_POINTERS + 8 * 300 + 8 * 300, (299).to_bytes(8, "little")),
                                         "its document starts run 0 .. 299, not 0 .. 300", ".idx"),
    "float-tokens": (_patch_idx(17, bytes([7])), "gives float32 tokens; token ids are integers", ".idx"),
    "no-tokens": (lambda p: [_patch_idx(_LENGTHS, bytes(12 * 300))(p), _truncate(".bin", 0)(p)],
                  "indexes 300 sequences of 0 tokens", ".idx"),
}


def _run_cli(args: list[str], definitions: Path, monkeypatch, capsys) -> tuple[int, tuple[str, str], dict]:
    """`mlbench run gpt3 ARGS` in-process, as the console script runs it, with launching replaced by a probe:
    a refusal exits 2 before it, and an accepted run hands the probe its benchmark (exit 0). Its output: (stdout,
    stderr)."""
    import sys

    from mlbench import cli
    from mlbench.launch import launcher

    launched: dict = {}
    monkeypatch.setattr(registry, "BENCHMARKS_DIR", definitions)
    monkeypatch.setattr(launcher, "start", lambda bench, *a, **k: launched.update(bench=bench) or 0)
    monkeypatch.setattr(sys, "argv", ["mlbench", "run", "gpt3", "--system", "ci", "--ignore-closed-rules", *args])
    saved = sys.stdout  # put back after: an error points it at stderr, and a later call's stdout went there
    try:
        with pytest.raises(SystemExit) as e:
            cli.main()
    finally:
        sys.stdout = saved
    out = capsys.readouterr()
    return e.value.code, (out.out, out.err), launched


def _assert_refused(code: int, said: tuple[str, str], launched: dict, results: Path, *needles: str) -> None:
    """A refusal: exit 2, nothing launched or written, nothing on stdout and its one error line on stderr."""
    stdout, out = said
    assert code == 2 and not launched and stdout == "", said
    assert "Traceback" not in out and len([ln for ln in out.splitlines() if ln.strip()]) == 1, out
    assert out.startswith("error: "), out
    for n in needles:
        assert n in " ".join(out.split()), out  # (rich may wrap a long line on a narrow terminal)
    assert not results.exists()


@pytest.mark.parametrize("case", DAMAGED)
def test_a_damaged_prefix_is_refused_naming_its_file(definitions: Path, corpus: dict, tmp_path: Path, monkeypatch,
                                                     capsys, case: str) -> None:
    """Each launched a run that aborted after run_start with megatron's reason and no file named ('cannot mmap
    an empty file', 'bad version', '99 is not a valid DType', 'X.bin not found' for a folder...)."""
    damage, says, ext = DAMAGED[case]
    prefix = _copy(corpus["train"], tmp_path / "train")
    damage(prefix)
    results = tmp_path / "results"
    code, out, launched = _run_cli(["--results", str(results), "--data-path", str(prefix), "--eval-data-path",
                                    str(corpus["eval"])], definitions, monkeypatch, capsys)
    _assert_refused(code, out, launched, results, "--data-path", f"{prefix}{ext}", says)


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    return make_corpus(tmp_path_factory.mktemp("small") / "small", 3, 100, 4)


def test_too_little_data_is_refused_before_launch(definitions: Path, corpus: dict, small: Path, tmp_path: Path,
                                                  monkeypatch, capsys) -> None:
    """Both were found after run_start: 'too few to hold out 8193 eval tokens' and 'the eval data provides 5
    sequences of 64; the run needs 128'; a weighted eval blend kept whole failed inside megatron."""
    results = tmp_path / "results"
    run = ["--results", str(results), "--data-path"]
    _assert_refused(*_run_cli([*run, str(small)], definitions, monkeypatch, capsys), results,
                    "--data-path", f"{small}.idx", "3 documents, 300 tokens: too few to hold out 8193 eval tokens")
    _assert_refused(*_run_cli([*run, str(corpus["train"]), "--eval-data-path", str(small)], definitions,
                              monkeypatch, capsys), results,
                    "--eval-data-path", f"{small}.idx", "make 5 eval sequences of 64; the run evaluates on 128")
    _assert_refused(*_run_cli([*run, str(corpus["train"]), "--eval-data-path", f"1 {corpus['eval']} 1 {small}"],
                              definitions, monkeypatch, capsys), results,
                    "--eval-data-path", "a weighted eval blend cannot be evaluated whole")


def test_a_prefix_holding_a_space_is_named(definitions: Path, corpus: dict, tmp_path: Path, monkeypatch,
                                          capsys) -> None:
    """It was split as a blend: '.../sp.bin and .../sp.idx not found'."""
    (tmp_path / "sp ace").mkdir()
    prefix = _copy(corpus["train"], tmp_path / "sp ace" / "train")
    results = tmp_path / "results"
    code, out, launched = _run_cli(["--results", str(results), "--data-path", str(prefix)], definitions,
                                   monkeypatch, capsys)
    _assert_refused(code, out, launched, results, f"{prefix} is a dataset prefix holding a space")
    # a newline or tab: split too, and was refused as '.../nl.bin and .../nl.idx not found'; not printable, as in a
    # benchmark file's data.path
    (tmp_path / "nl\tx").mkdir()
    prefix = _copy(corpus["train"], tmp_path / "nl\tx" / "train")
    code, out, launched = _run_cli(["--results", str(results), "--data-path", str(prefix)], definitions,
                                   monkeypatch, capsys)
    _assert_refused(code, out, launched, results, f"--data-path {str(prefix)!r}: holds \\t, a character that is not "
                    "printable; a data path is one line of printable text: link or move the data to a path without it")


def test_a_relative_prefix_is_recorded_absolute(definitions: Path, corpus: dict, monkeypatch, capsys,
                                               tmp_path: Path) -> None:
    """The run record stored --data-path train as given: it did not say which data the run used."""
    monkeypatch.chdir(corpus["train"].parent)
    code, out, launched = _run_cli(["--results", str(tmp_path / "results"), "--data-path", "0.5 train 0.5 ./eval",
                                    "--eval-data-path", "eval"], definitions, monkeypatch, capsys)
    assert code == 0, out
    data = launched["bench"].data
    assert data.path == f"0.5 {corpus['train']} 0.5 {corpus['eval']}" and data.eval_path == str(corpus["eval"])


def test_a_relative_path_in_the_file_is_read_from_the_files_folder(definitions: Path, corpus: dict, monkeypatch,
                                                                  capsys, tmp_path: Path) -> None:
    """A benchmark file's relative data.path was read from the working folder (the data a run used depended on
    where it was started), and kept relative in the run record; it is the file's folder's, made absolute."""
    own = tmp_path / "own"
    own.mkdir()
    data = yaml.safe_load((definitions / "gpt3.yaml").read_text())
    train, held_out = (os.path.relpath(corpus[k], own) for k in ("train", "eval"))
    data["data"] |= {"path": f"0.5 {train} 0.5 {held_out}", "eval_path": held_out}
    (own / "gpt3.yaml").write_text(yaml.safe_dump(data))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    code, out, launched = _run_cli(["--results", str(tmp_path / "results")], own, monkeypatch, capsys)
    assert code == 0, out
    d = launched["bench"].data
    assert d.path == f"0.5 {corpus['train']} 0.5 {corpus['eval']}" and d.eval_path == str(corpus["eval"])


def test_the_dtype_codes_are_megatrons() -> None:
    from megatron.core.datasets.indexed_dataset import DType

    from mlbench.train.data.indexed import DTYPES

    assert {d.value: getattr(np, d.name) for d in DType} == DTYPES


@pytest.mark.parametrize("given", [(), ("path",), ("path", "eval_path")])
def test_a_missing_prefix_is_named_by_what_gave_it(definitions: Path, corpus: dict, tmp_path: Path,
                                                   given: tuple[str, ...]) -> None:
    """A prefix the benchmark file names (data.path, data.eval_path) was reported as '--data-path: ... not found',
    a flag the user had not passed; the flag is named where it gave the prefix, the file's key elsewhere."""
    bench = _bench(definitions, tmp_path / "nowhere")
    said = "--data-path" if "path" in given else "gpt3.yaml: data.path"
    with pytest.raises(UserError, match=f"^{said}: {tmp_path}/nowhere.bin and {tmp_path}/nowhere.idx not found"):
        data_lib.check(bench, 1, dry_run=False, given=given)
    bench = _bench(definitions, corpus["train"], tmp_path / "no_eval")
    said = "--eval-data-path" if "eval_path" in given else "gpt3.yaml: data.eval_path"
    with pytest.raises(UserError, match=f"^{said}: {tmp_path}/no_eval.bin and {tmp_path}/no_eval.idx not found"):
        data_lib.check(bench, 1, dry_run=False, given=given)
