"""MLPerf BERT's data path: the reference's pre-masked TFRecord samples (read without TensorFlow), trained on with
masked-LM + next-sentence loss and evaluated with the reference's masked-LM accuracy. The files are written
here (tests/tfrecord_writer.py) from a Markov source the model can learn."""

from __future__ import annotations

import json
from pathlib import Path

import google_crc32c
import numpy as np
import pytest
import yaml
from conftest import mlbench, mllog
from tfrecord_writer import example, write

from mlbench.train.data.bert_records import BertRecords, split_rows
from mlbench.train.data.markov import MarkovSource
from mlbench.train.data.tfrecord import RecordError, count_records, masked_crc, parse_example, records

SEQ, PRED, VOCAB = 32, 10, 32  # id 31 is [MASK]


def samples(n: int, seed: int) -> list[bytes]:
    return [example(f) for f in sample_features(n, seed)]


def sample_features(n: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    tokens = MarkovSource(VOCAB - 1, 4, 1.0, 1234).sample(n, SEQ, rng)
    out = []
    for t in tokens:
        length = SEQ - (4 if rng.random() < 0.3 else 0)  # some samples padded at the end
        k = int(rng.integers(PRED // 2, PRED + 1))
        pos = np.sort(rng.choice(length, k, replace=False))
        ids = t.copy()
        ids[pos] = VOCAB - 1
        ids[length:] = 0
        pad = PRED - k
        out.append({
            "input_ids": ids, "input_mask": (np.arange(SEQ) < length).astype(np.int64),
            "segment_ids": ((np.arange(SEQ) >= SEQ // 2) & (np.arange(SEQ) < length)).astype(np.int64),
            "masked_lm_positions": np.concatenate([pos, np.zeros(pad, np.int64)]),
            "masked_lm_ids": np.concatenate([t[pos], np.zeros(pad, np.int64)]),
            "masked_lm_weights": np.concatenate([np.ones(k), np.zeros(pad)]).astype(np.float32),
            "next_sentence_labels": np.array([int(rng.integers(2))]),
        })
    return out


def test_reads_examples_as_tensorflow_writes_them(tmp_path: Path) -> None:
    ids = np.array([0, 1, 127, 128, 30521, 2**40, -1])  # -1: ten bytes, as protobuf writes a negative int64
    weights = np.array([1.0, 0.5, 0.0], dtype=np.float32)
    for packed in (True, False):
        path = tmp_path / f"x{packed}.tfrecord"
        write(path, [example({"input_ids": ids, "masked_lm_weights": weights}, packed=packed)] * 3)
        got = [parse_example(r) for r in records(path)]
        assert len(got) == 3
        assert got[2]["input_ids"].tolist() == ids.tolist() and got[2]["masked_lm_weights"].tolist() == [1, .5, 0]
    good = (tmp_path / "xTrue.tfrecord").read_bytes()
    size = len(good) // 3
    bad = tmp_path / "bad.tfrecord"
    for damage, message in ((lambda b: b[:-7], "record 2 .*cut short"),
                            (lambda b: b[:size + 20] + b"?" + b[size + 21:], f"record 1 \\(byte {size}\\).*bytes fail"),
                            (lambda b: b[:size + 1] + b"\x07" + b[size + 2:], "record 1 .*length field"),
                            (lambda b: b"input_ids,masked_lm_ids\n" * 4, "record 0 .*length field"),
                            # a length of 2**40 under a sound CRC: a MemoryError naming nothing
                            (lambda b: _huge_length(b, 2**40), f"record 0 .*{2**40} bytes is cut short: the file has "
                                                               f"{len(good) - 16} left")):
        bad.write_bytes(damage(good))
        with pytest.raises(RecordError, match=message):
            list(records(bad))
        if "bytes fail" not in message:  # counted by the length fields alone: their CRCs and sizes checked too
            with pytest.raises(RecordError, match=message):
                count_records(bad, 3)
    assert [count_records(tmp_path / "xTrue.tfrecord", n) for n in (2, 3, 10)] == [2, 3, 3]


def _huge_length(good: bytes, length: int) -> bytes:
    head = length.to_bytes(8, "little")
    return head + masked_crc(head).to_bytes(4, "little") + good[12:]


def _damaged(name: str, value: object, at: int = 2) -> dict[str, np.ndarray]:
    """Sample 3's features with feature NAME's value AT set to VALUE, or NAME replaced by VALUE (an array)."""
    f = sample_features(6, seed=5)[3]
    if isinstance(value, np.ndarray):
        f[name] = value
    else:
        f[name] = f[name].copy()
        f[name][at] = value
    return f


# (feature, its damage, the reason's end): every feature the reader uses, its range and its type, one case each
DAMAGE = [
    ("input_ids", 1000, "input_ids[2] is 1000; allowed: [0, 32) (the model's vocab_size; prepared with another"),
    ("input_ids", -1, "input_ids[2] is -1; allowed: [0, 32)"),
    ("masked_lm_ids", 1000, "masked_lm_ids[2] is 1000; allowed: [0, 32)"),
    ("masked_lm_positions", 1000, "masked_lm_positions[2] is 1000; allowed: [0, 32) (max_seq_length)"),
    ("masked_lm_positions", -3, "masked_lm_positions[2] is -3; allowed: [0, 32)"),
    ("next_sentence_labels", np.array([5]), "next_sentence_labels[0] is 5; allowed: [0, 2) (the 2-way"),
    ("segment_ids", 2, "segment_ids[2] is 2; allowed: [0, 2) (segment A or B)"),
    ("input_mask", 7, "input_mask[2] is 7; allowed: [0, 2)"),
    ("masked_lm_weights", np.full(PRED, np.nan, np.float32), "masked_lm_weights[0] is nan; allowed: 1.0"),
    ("masked_lm_weights", 0.5, "masked_lm_weights[2] is 0.5; allowed: 1.0 (a masked token) or 0.0 (padding)"),
    ("masked_lm_weights", np.inf, "masked_lm_weights[2] is inf; allowed: 1.0"),
    ("input_ids", np.arange(SEQ, dtype=np.float32),
     "feature input_ids is a float list; MLPerf's records store it as an int64 list"),
    ("masked_lm_weights", np.ones(PRED, np.int64), "feature masked_lm_weights is an int64 list; MLPerf's records "
                                                   "store it as a float list"),
    ("next_sentence_labels", np.array([b"1"]), "feature next_sentence_labels is a bytes list"),
    ("masked_lm_ids", np.zeros(PRED + 1, np.int64), "feature masked_lm_ids is 11 values; this model needs 10"),
]


@pytest.mark.parametrize(("name", "value", "reason"), DAMAGE)
def test_a_bad_sample_names_its_file_record_feature_and_range(tmp_path: Path, name: str, value: object,
                                                             reason: str) -> None:
    bad = tmp_path / "bad"
    write(bad, [*samples(6, seed=5)[:3], example(_damaged(name, value)), *samples(6, seed=5)[4:]])
    reader = BertRecords([str(bad)], [str(bad)], SEQ, PRED, global_batch=6, seed=0, vocab_size=VOCAB)
    rng = np.random.default_rng(0)
    for read in (lambda: reader.train_batch(0, rng), lambda: reader.eval_set(6, rng)):
        with pytest.raises(RecordError) as e:
            read()
        assert str(e.value).startswith(f"{bad}: record 3: ") and reason in str(e.value), str(e.value)


def test_samples_read_as_written(tmp_path: Path) -> None:
    path = tmp_path / "good"
    write(path, samples(6, seed=5))
    rows = BertRecords([str(path)], [str(path)], SEQ, PRED, 6, 0, VOCAB).eval_set(6, np.random.default_rng(0))
    want = sample_features(6, seed=5)
    for name, got in split_rows(rows, SEQ, PRED).items():  # weights 1.0/0.0 become the row's 1/0
        assert got.tolist() == [f[name].astype(np.int64).tolist() for f in want], name


def test_a_record_that_is_no_example_is_named(tmp_path: Path) -> None:
    path = tmp_path / "foreign"
    write(path, [*samples(2, seed=5), b"\x0a\xff"])  # framed and CRC-checked, but a cut-short protobuf
    reader = BertRecords([str(path)], [str(path)], SEQ, PRED, 3, 0, VOCAB)
    with pytest.raises(RecordError, match=f"^{path}: record 2: not a tf.train.Example"):
        reader.eval_set(3, np.random.default_rng(0))


def test_masked_crc_is_tensorflows() -> None:
    # CRC32-C's check value (RFC 3720 test vectors), and a masked CRC published by an independent TFRecord
    # implementation's tests (tfrecord_slow: b"1234567890asdfghjkl" -> 4134599430).
    assert google_crc32c.value(b"123456789") == 0xE3069283 and google_crc32c.value(bytes(32)) == 0x8A9136AA
    assert masked_crc(b"1234567890asdfghjkl") == 4134599430


def _definitions(benchmarks_copy: Path, data: Path) -> dict:
    """bert.yaml with a small full variant on the TFRecord files (no reference checkpoint: random init)."""
    path = benchmarks_copy / "bert.yaml"
    d = yaml.safe_load(path.read_text())
    d["model"].update(num_layers=2, hidden_size=64, num_attention_heads=4, ffn_hidden_size=256, vocab_size=VOCAB,
                      seq_length=SEQ, position_embedding="rope", make_vocab_size_divisible_by=32, dropout=0.0)
    d["optimizer"].update(lr=2.0e-2, warmup_steps=20, decay_steps=580, start_warmup_step=-5)
    d["train"].update(global_batch_size=32, micro_batch_size=16, max_steps=600, init_checkpoint="", precision="fp32")
    # 250: 125 rows a rank, in two eval micro-batches of 63: a padded row a rank, which must count for nothing
    d["eval"].update(interval_samples=640, samples=250)
    # Past twice the unigram accuracy (0.118, where it stays for the first 80 steps): met at steps 120 to 160 over
    # the seeds tried; 0.5 took 200 steps and proved nothing more. One micro-batch a rank a step, not two: half the
    # per-step dispatch of a model this small, the same samples a step.
    d["quality"]["target"] = 0.25
    d["data"].update(source="tfrecord", path=str(data / "part-*"), eval_path=str(data / "eval_10k"),
                     max_predictions_per_seq=PRED)
    d["layouts"] = []
    path.write_text(yaml.safe_dump(d, sort_keys=False))
    return {"MLBENCH_BENCHMARKS": str(benchmarks_copy)}


@pytest.mark.slow  # trains bert at DP 2
def test_bert_trains_on_mlperf_tfrecord_samples(tmp_path: Path, benchmarks_copy: Path, cli) -> None:
    data = tmp_path / "data"
    data.mkdir()
    for i in range(3):
        write(data / f"part-{i:05d}-of-00003", samples(300, seed=i))
    write(data / "eval_10k", samples(256, seed=99))
    env = _definitions(benchmarks_copy, data)
    results = tmp_path / "results"
    proc = mlbench("run", "bert", "--results", str(results), "--nproc-per-node", "2", env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    log = next(results.rglob("result_0.txt"))
    record = json.loads(next(results.rglob("result_0.json")).read_text())
    # The eval scored every masked token of the first 250 eval samples, once: no more, no fewer.
    weights = [parse_example(r)["masked_lm_weights"].sum() for r in records(data / "eval_10k")][:250]
    assert record["quality"]["eval_scored"] == sum(weights)
    assert record["layout"]["dp"] == 2
    evals = [e["value"] for e in mllog(log) if e["key"] == "eval_accuracy"]
    assert evals[-1] >= 0.25 and evals[0] < 0.15, evals  # it learned the masked tokens, from unigram accuracy
    # The structural rules (the closed ones also require the full benchmark's 0.720 and hyperparameters).
    check = cli("check", str(log), "--rules", "smoke")
    assert check.returncode == 0, check.stdout
    assert record["config"]["data"]["source"] == "tfrecord"


def test_tfrecord_paths_are_checked_before_launch(tmp_path: Path, benchmarks_copy: Path, cli) -> None:
    data = tmp_path / "data"
    data.mkdir()
    env = _definitions(benchmarks_copy, data)
    results = tmp_path / "results"
    proc = cli("run", "bert", "--results", str(results), env=env)
    # the paths are the benchmark file's (data.path, data.eval_path): named so, not as flags never passed
    assert proc.returncode == 2 and "bert.yaml: data.path " in proc.stderr and "part-*" in proc.stderr, proc.stderr
    write(data / "part-00000-of-00001", samples(4, seed=0))
    proc = cli("run", "bert", "--results", str(results), env=env)
    assert proc.returncode == 2 and "bert.yaml: data.eval_path " in proc.stderr and "eval_10k" in proc.stderr, \
        proc.stderr
    # An eval file short of eval.samples (found at the first eval), a shard that is no TFRecord file at all (found
    # when the training order reached it): said before launch, counted and framed without parsing a sample
    write(data / "eval_10k", samples(100, seed=1))
    proc = cli("run", "bert", "--results", str(results), env=env)
    assert proc.returncode == 2 and proc.stderr.strip() == (
        f"error: bert.yaml: data.eval_path {data / 'eval_10k'}: 100 records; the run evaluates on 250 (eval.samples): "
        f"give the whole eval set (MLPerf's eval_10k)"), proc.stderr
    (data / "part-00001-of-00001").write_text("input_ids,masked_lm_ids\n" * 4)
    proc = cli("run", "bert", "--results", str(results), env=env)
    assert proc.returncode == 2 and proc.stderr.strip() == (
        f"error: bert.yaml: data.path {data / 'part-00001-of-00001'}: record 0 (byte 0): the length field fails its "
        f"CRC32-C (not a TFRecord file, or corrupt)"), proc.stderr
    (data / "part-00001-of-00001").unlink()
    assert not results.exists()
    # A bad sample (a masked position past the sequence; before, an IndexError mid-run naming nothing): the run
    # aborts before run_start, its log and record saying which file, record and feature, and what is allowed.
    evals = sample_features(256, seed=1)
    evals[7]["masked_lm_positions"][1] = 1000
    write(data / "eval_10k", [example(f) for f in evals])
    proc = mlbench("run", "bert", "--results", str(results), env=env)
    reason = f"{data / 'eval_10k'}: record 7: masked_lm_positions[1] is 1000; allowed: [0, 32) (max_seq_length)"
    assert proc.returncode == 1 and reason in proc.stdout + proc.stderr, proc.stdout[-2000:] + proc.stderr[-2000:]
    stops = [e for e in mllog(next(results.rglob("result_0.txt"))) if e["key"] == "run_stop"]
    assert [s["metadata"]["status"] for s in stops] == ["aborted"] and reason in stops[0]["metadata"]["reason"]
    record = json.loads(next(results.rglob("result_0.json")).read_text())
    assert record["status"] == "aborted" and reason in record["reason"], record["reason"]


def test_a_data_path_that_is_no_file_says_what_it_is(tmp_path: Path) -> None:
    """A FIFO given as --data-path said 'no such file, folder or matching files', though it is there."""
    import os

    from mlbench.errors import UserError
    from mlbench.train.data import bert_records

    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(UserError, match=r"^--data-path \S+/pipe: a named pipe, not a regular file \(MLPerf BERT's "
                                        r"TFRecord shards are regular files\)$"):
        bert_records.files(str(tmp_path / "pipe"), "--data-path")
    with pytest.raises(UserError, match=r": no such file, folder or matching files"):
        bert_records.files(str(tmp_path / "missing"), "--data-path")
    # matched by a pattern: it was taken, and the run blocked on it for ever (a folder: IsADirectoryError mid-run)
    (tmp_path / "part-0").write_bytes(b"")
    with pytest.raises(UserError, match=r"^--data-path \S+/pipe: a named pipe, not a regular file"):
        bert_records.files(f"{tmp_path}/p*", "--data-path")
    (tmp_path / "pipe").unlink()
    (tmp_path / "part-1").mkdir()
    with pytest.raises(UserError, match=r"^--data-path \S+/part-1: a folder"):
        bert_records.files(f"{tmp_path}/part-*", "--data-path")


def test_every_part_of_a_tfrecord_path_is_made_absolute(monkeypatch) -> None:
    """BERT's data.path lists files, folders or globs, space-separated: only the first was made absolute (and its ~
    expanded); the rest stayed relative to the working folder, not the benchmark file's."""
    from mlbench.train.data.paths import absolute

    monkeypatch.setenv("HOME", "/home/u")
    assert absolute("tfrecord", "shards/part-* ~/eval_10k  /abs/x", "data.path", "/base") == \
        "/base/shards/part-* /home/u/eval_10k /abs/x"
