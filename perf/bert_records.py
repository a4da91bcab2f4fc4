"""How fast MLPerf BERT's TFRecord samples are read and parsed (mlbench/train/tfrecord.py), against reading the
same file's bytes: `python perf/bert_records.py [N]`. Writes N reference-shaped samples (512 tokens, 76
predictions) to a temporary file with the tests' writer, then prints samples/s and the ratio to the raw read.
What a step needs: every rank frames the whole global batch (8,192 samples at the reference batch) and parses
its data-parallel share (16 samples on 512 devices, 64 on 128)."""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from tfrecord_writer import example, write  # noqa: E402

from mlbench.train.data.tfrecord import parse_example, records  # noqa: E402


def main(n: int) -> None:
    rng = np.random.default_rng(0)
    ex = [example({"input_ids": rng.integers(0, 30522, 512), "input_mask": np.ones(512, np.int64),
                   "segment_ids": (np.arange(512) > 256).astype(np.int64),
                   "masked_lm_positions": np.sort(rng.choice(512, 76, replace=False)),
                   "masked_lm_ids": rng.integers(0, 30522, 76), "masked_lm_weights": np.ones(76, np.float32),
                   "next_sentence_labels": np.array([1])}) for _ in range(n)]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "part-00000"
        write(path, ex)
        t0 = time.perf_counter()
        raw = sum(len(r) for r in records(path))
        t_raw = time.perf_counter() - t0
        t0 = time.perf_counter()
        for r in records(path):
            parse_example(r)
        t_parse = time.perf_counter() - t0
    print(f"{n} samples, {raw / n:.0f} bytes each: framing only {n / t_raw:,.0f} samples/s; "
          f"framing + parse {n / t_parse:,.0f} samples/s ({t_parse / t_raw:.1f}x the framing-only read); "
          f"a step's data on a rank: {1e3 * (8192 * t_raw + 16 * t_parse) / n:.0f} ms at 512 devices, "
          f"{1e3 * (8192 * t_raw + 64 * t_parse) / n:.0f} ms at 128")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 4096)
