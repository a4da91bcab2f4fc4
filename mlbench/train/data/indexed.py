"""megatron-core's indexed dataset (PREFIX.bin + PREFIX.idx, what megatron's preprocess_data.py writes and
MLPerf's preprocessed C4 is), served by megatron-core's own GPTDataset and BlendedMegatronDatasetBuilder: their
document shuffle, sample packing, blending and index caches. Imports nothing heavy at the top: the pre-launch
checks read `parse_blend` and `read_index` (numpy only)."""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import re
import stat
import struct
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from mlbench.ascii_numbers import is_ascii_float
from mlbench.errors import UserError
from mlbench.logfile import file_kind
from mlbench.spec import Benchmark
from mlbench.train.data.source import ALL, PAD, TokenSource

T = TypeVar("T")

Blend = tuple[list[str], list[float] | None]


class IndexedTokens(TokenSource):
    """Step i's batch = samples [i * gbs, (i + 1) * gbs) of the train dataset (already shuffled by megatron);
    the eval set = the eval dataset's first samples."""

    def __init__(self, train: Any, eval_: Any, seq_length: int, global_batch: int, vocab_size: int):
        super().__init__(seq_length, global_batch)
        self.train, self.eval = train, eval_
        self.vocab_size = vocab_size

    def _rows(self, dataset: Any, start: int, n: int, what: str) -> np.ndarray:
        if start + n > len(dataset):
            raise ValueError(f"the {what} dataset has {len(dataset)} samples; samples up to {start + n} requested")
        out = np.empty((n, self.seq_length + 1), dtype=np.int64)
        for j in range(n):
            self._check_ids(dataset, start + j, what)
            s = dataset[start + j]  # GPTDataset: tokens, and labels = the tokens shifted by one
            out[j, :-1] = s["tokens"].numpy()
            out[j, -1] = int(s["labels"][-1])
            # megatron zeroes its padding in tokens and labels and masks those labels' loss: mark them again
            out[j, 1:][s["loss_mask"].numpy() == 0] = PAD
        return out

    def _check_ids(self, dataset: Any, i: int, what: str) -> None:
        """Sample i's tokens as its .bin holds them, each a token of the vocabulary. Checked before megatron's
        __getitem__ turns its padding id (-1) into token 0 and a masked label: a -1 in the data would pass as
        padding, and an id past the embedding fails deep inside the model (on a GPU, a device assert)."""
        if hasattr(dataset, "dataset_index"):  # a BlendedDataset: the prefix's dataset and its sample
            dataset, i = dataset.datasets[dataset.dataset_index[i]], int(dataset.dataset_sample_index[i])
        text, _ = dataset._query_document_sample_shuffle_indices(i)
        real = len(text) - int(np.argmax(text[::-1] != PAD)) if (text != PAD).any() else 0  # padding: at the end
        bad = np.flatnonzero((text[:real] < 0) | (text[:real] >= self.vocab_size))
        if bad.size:
            raise ValueError(f"{dataset.dataset.path_prefix}.bin: {what} sample {i} holds token id "
                             f"{int(text[bad[0]])}, outside the model's vocabulary [0, {self.vocab_size}): "
                             f"prepared with another tokenizer?")

    def train_batch(self, step: int, rng: np.random.Generator, rows: slice = ALL) -> np.ndarray:
        start, stop, _ = rows.indices(self.global_batch)
        return self._rows(self.train, step * self.global_batch + start, stop - start, "training")

    def eval_set(self, n: int, rng: np.random.Generator, rows: slice = ALL) -> np.ndarray:
        start, stop, _ = rows.indices(n)
        return self._rows(self.eval, start, stop - start, "eval")


def parse_blend(spec: str) -> Blend:
    """megatron's --data-path syntax: "PREFIX", "P1 P2 ..." (weighted by size) or "W1 P1 W2 P2 ..."."""
    parts = spec.split()
    if not parts:
        raise UserError("empty data path")
    if odd := next((p for p in parts if not p.isascii() and _is_number(p)), None):  # '٠.٥': 0.5 to float()
        raise UserError(f"data blend {spec!r}: {odd!r} is a number in digits other than ASCII's (read as "
                        f"{float(odd)!r}); write a weight in the digits 0-9, '.' and 'e'")
    if len(parts) % 2 == 0:
        weights = [float(w) for w in parts[0::2]] if all(map(is_ascii_float, parts[0::2])) else None
        if weights is not None:
            if not all(0 < w < math.inf for w in weights):  # (NaN fails every comparison)
                raise UserError(f"data blend {spec!r}: weights must be positive finite numbers")
            _check_normalizable(spec, weights)
            return parts[1::2], weights
    if any(_is_number(p) for p in parts):
        raise UserError(f"data blend {spec!r}: give a weight before every prefix, or none at all")
    return parts, None


def _check_normalizable(spec: str, weights: list[float]) -> None:
    """megatron divides the weights by their float64 sum (datasets.utils.normalize), then asserts each is
    positive and they sum to 1: a sum past float64 (1e308 twice) or a weight that vanishes beside it (1e-300 with
    1e300) failed there, mid-run, as a bare AssertionError."""
    total = float(np.sum(np.array(weights, dtype=np.float64)))
    if not total < math.inf:
        raise UserError(f"data blend {spec!r}: the weights sum past float64's range ({total}); only their ratios "
                        f"matter: give smaller ones, e.g. fractions that sum to 1")
    if vanish := next((w for w in weights if not w / total > 0), None):
        raise UserError(f"data blend {spec!r}: weight {vanish!r} is 0 beside their sum {total!r} (float64); only "
                        f"their ratios matter: give weights within a factor of 1e300 of each other")


def _is_number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def absolute_blend(spec: str, flag: str, base: str = "") -> str:
    """`spec` with every prefix absolute, a relative one read from folder BASE (default: the working folder),
    weights kept: the run record then says which data was used, wherever the run was started from. A prefix
    holding a space, which the blend syntax would split, is refused."""
    if not spec.strip():
        return spec  # no data path: `check` says what to pass
    parts = spec.split()
    spaced = _spaced_prefix(spec, base)
    if spaced:
        plain = spaced.isprintable()  # spaces alone; a newline or tab is shown escaped, on the one line
        raise UserError(f"{flag} {spec!r}: {spaced if plain else repr(spaced)} is a dataset prefix holding "
                        f"{'a space' if plain else 'white space'}, but a blend's prefixes "
                        f"and weights are separated by white space; link or move the data to a path without it")
    prefixes, weights = parse_blend(spec)
    absolute = [os.path.abspath(os.path.join(base, p)) for p in prefixes]
    if weights is None:
        return " ".join(absolute)
    parts[1::2] = absolute  # the weights as the user wrote them
    return " ".join(parts)


def _spaced_prefix(spec: str, base: str = "", longest: int = 8) -> str | None:
    """Consecutive parts of SPEC that, joined by the white space between them in SPEC (a space, a tab, a
    newline), name an existing prefix (a relative one in folder BASE) no part names on its own."""
    def exists(prefix: str) -> bool:
        return any(os.path.lexists(os.path.join(base, f"{prefix}{ext}")) for ext in (".bin", ".idx"))

    spans = [m.span() for m in re.finditer(r"\S+", spec)]
    for i, (start, end) in enumerate(spans):
        if _is_number(spec[start:end]) or exists(spec[start:end]):
            continue
        for j in range(i + 1, min(len(spans), i + longest)):
            if exists(joined := spec[start:spans[j][1]]):
                return joined
    return None


# ---- the files, checked before launch -------------------------------------------------------------------

# megatron-core's .idx (megatron/core/datasets/indexed_dataset.py, _IndexWriter and _IndexReader): the magic,
# version 1 (<Q), the token dtype code (<B), the sequence and document counts (<Q each), then the sequence
# lengths (int32), sequence pointers (int64, byte offsets into .bin) and document indices (int64).
_MAGIC = b"MMIDIDX\x00\x00"
_HEADER = struct.Struct("<9sQBQQ")
# megatron's DType codes (its DType enum; a test holds the two equal): read here without importing megatron
DTYPES: dict[int, type[np.number]] = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64,
                                      6: np.float64, 7: np.float32, 8: np.uint16}
_FORMAT = "PREFIX.bin and PREFIX.idx as megatron's preprocess_data.py writes them"


def read_index(prefix: str, flag: str) -> np.ndarray:
    """The token count of each of a prefix's sequences (a read-only map of its .idx), after checking what
    megatron reads mid-run, where it fails without naming the file: two regular files, the .idx header and
    length, and the .bin's size against the index."""
    idx, bin_ = f"{prefix}.idx", f"{prefix}.bin"
    problems = [(path, _file_problem(path)) for path in (bin_, idx)]
    if all(p == "not found" for _, p in problems):
        raise UserError(f"{flag}: {bin_} and {idx} not found (a prefix names PREFIX.bin and PREFIX.idx)")
    for path, problem in problems:
        if problem:
            raise UserError(f"{flag}: {path} {problem}; a prefix names {_FORMAT}")
    size = os.path.getsize(idx)
    with open(idx, "rb") as f:
        head = f.read(_HEADER.size)
    if len(head) < _HEADER.size:
        raise UserError(f"{flag}: {idx} is {size} bytes, shorter than a megatron index's {_HEADER.size}-byte "
                        f"header: truncated, or not an index ({_FORMAT})")
    magic, version, code, sequences, documents = _HEADER.unpack(head)
    if magic != _MAGIC:
        raise UserError(f"{flag}: {idx} is not a megatron index: it starts {magic!r}, not {_MAGIC!r} ({_FORMAT})")
    if version != 1:
        raise UserError(f"{flag}: {idx} is index version {version}; megatron-core reads version 1")
    if code not in DTYPES:
        raise UserError(f"{flag}: {idx} gives token dtype code {code}; megatron's codes are "
                        + ", ".join(f"{c} ({t.__name__})" for c, t in DTYPES.items()))
    needed = _HEADER.size + sequences * (4 + 8) + documents * 8
    if size < needed:
        raise UserError(f"{flag}: {idx} is {size} bytes, but its header counts {sequences} sequences and "
                        f"{documents} document indices, {needed} bytes: truncated?")
    if sequences == 0:
        raise UserError(f"{flag}: {idx} indexes no sequences; a prefix must hold tokens")
    if not np.issubdtype(DTYPES[code], np.integer):
        raise UserError(f"{flag}: {idx} gives {DTYPES[code].__name__} tokens; token ids are integers (megatron's "
                        f"preprocess_data.py writes uint16, or int32 for vocabularies over 65,500)")
    lengths = np.memmap(idx, dtype=np.int32, mode="r", offset=_HEADER.size, shape=(sequences,))
    pointers = np.memmap(idx, dtype=np.int64, mode="r", offset=_HEADER.size + 4 * sequences, shape=(sequences,))
    starts = np.memmap(idx, dtype=np.int64, mode="r", offset=_HEADER.size + 12 * sequences,
                       shape=(documents,)) if documents else np.zeros(0, np.int64)
    if lie := _index_lie(lengths, pointers, starts, np.dtype(DTYPES[code]).itemsize):
        raise UserError(f"{flag}: {idx} is damaged: {lie} (an index megatron's IndexedDatasetBuilder writes has "
                        f"none of these; write the dataset again)")
    expected, bin_size = int(pointers[-1]) + int(lengths[-1]) * np.dtype(DTYPES[code]).itemsize, os.path.getsize(bin_)
    if bin_size != expected:
        raise UserError(f"{flag}: {bin_} is {bin_size} bytes, but its index {idx} says {expected} "
                        f"({sequences} sequences of {DTYPES[code].__name__} tokens): truncated, or the .bin and "
                        f".idx of different datasets?")
    if tokens(lengths) == 0:
        raise UserError(f"{flag}: {idx} indexes {sequences} sequences of 0 tokens; a prefix must hold tokens")
    return lengths


def _index_lie(lengths: np.ndarray, pointers: np.ndarray, starts: np.ndarray, itemsize: int,
               chunk: int = 1 << 22) -> str:
    """What in an index megatron's writer never writes ('' if nothing), read in chunks (an .idx of C4 holds tens
    of millions of sequences): a negative length, a sequence that does not start where the one before it ends
    (megatron reads each at its pointer: past the .bin it fails mid-run, inside it trains on the wrong tokens),
    or document starts that do not run from 0 up to the sequence count (megatron asserts the last)."""
    if not len(starts) or starts[0] != 0 or starts[-1] != len(lengths):
        got = f"{int(starts[0])} .. {int(starts[-1])}" if len(starts) else "none"
        return f"its document starts run {got}, not 0 .. {len(lengths)} (the sequence count)"
    end = 0  # where the sequence before the chunk ends, in bytes
    for at in range(0, len(lengths), chunk):
        n = lengths[at:at + chunk].astype(np.int64)
        if (bad := np.flatnonzero(n < 0)).size:
            return f"sequence {at + bad[0]} has length {n[bad[0]]}"
        ends = end + np.cumsum(n * itemsize)
        expected = np.concatenate(([end], ends[:-1]))
        if (bad := np.flatnonzero(pointers[at:at + chunk] != expected)).size:
            i = bad[0]
            return f"sequence {at + i} starts at byte {int(pointers[at + i])} of the .bin, not {int(expected[i])}"
        end = int(ends[-1])
    for at in range(0, len(starts) - 1, chunk):
        s = starts[at:at + chunk + 1]
        if (bad := np.flatnonzero(np.diff(s) < 0)).size:
            return f"document {at + bad[0] + 1} starts at sequence {int(s[bad[0] + 1])}, before the one before it"
    return ""


def _file_problem(path: str) -> str:
    """What keeps `path` from being a readable regular file ('' if nothing): megatron memory-maps it."""
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        if e.errno == errno.ELOOP:
            return "is a symbolic link loop, not a file"
        if os.path.islink(path):
            return f"is a broken symbolic link (to {os.readlink(path)}), not a file"
        return "not found" if e.errno == errno.ENOENT else f"cannot be read ({e.strerror})"
    if stat.S_ISDIR(mode):
        return "is a folder, not a file"
    if not stat.S_ISREG(mode):
        return f"is {file_kind(mode)}, not a regular file"
    if not os.access(path, os.R_OK):
        return "cannot be read by this user"
    return ""


def tokens(lengths: np.ndarray) -> int:
    return int(lengths.sum(dtype=np.int64))


def holdout_tokens(bench: Benchmark) -> int:
    """The eval tokens held out of a single training prefix given without an eval set."""
    return bench.eval.samples * bench.model.seq_length + 1


def holdout_split(prefix: str, lengths: np.ndarray, tokens_needed: int, named: str = "--data-path") -> str:
    """megatron's split string for one prefix: the last documents holding `tokens_needed` tokens are the
    validation split, the rest is training (split by whole documents, as megatron splits). NAMED: what gave the
    prefix, for the error."""
    n = len(lengths)
    k = int(np.searchsorted(np.cumsum(lengths[::-1], dtype=np.int64), tokens_needed)) + 1
    if k >= n:
        raise UserError(f"{named}: {prefix}.idx indexes {n} documents, {tokens(lengths)} tokens: too few to "
                        f"hold out {tokens_needed} eval tokens and still train; pass --eval-data-path, or more data")
    return f"{n - k},{k},0"


def eval_shortfall(bench: Benchmark, blend: Blend, lengths: list[np.ndarray]) -> str:
    """Why the eval blend cannot give the run's `eval.samples` sequences as `indexed_source` builds it ('' if
    it can). Kept whole, each prefix is one epoch; otherwise megatron repeats a prefix's epochs to fill the
    size asked, except in a blend weighted by size, which takes one epoch of each. The count per epoch is
    GPTDataset.__len__'s: (tokens - the extra token) / seq_length, rounded up where the partial sequence is
    kept."""
    prefixes, weights = blend
    keep, seq, extra = bench.eval.keep_partial_sequence, bench.model.seq_length, bench.data.add_extra_token_to_sequence
    if keep and weights is not None and len(prefixes) > 1:
        return "a weighted eval blend cannot be evaluated whole (eval.keep_partial_sequence): drop its weights"
    if not keep and (len(prefixes) == 1 or weights is not None):
        return ""
    count = sum(-(-(tokens(n) - extra) // seq) if keep else (tokens(n) - extra) // seq for n in lengths)
    if count >= bench.eval.samples:
        return ""
    files = ", ".join(f"{p}.idx" for p in prefixes)
    return (f"{files}: {sum(tokens(n) for n in lengths)} tokens make {count} eval sequences of {seq}; the run "
            f"evaluates on {bench.eval.samples} (eval.samples): give a larger eval set")


_STAMP = "mlbench.json"  # a cache's stamp: {hash}-mlbench.json beside megatron's {hash}-<kind>-... files


def _groups(cache: Path) -> dict[str, list[Path]]:
    """The cache's files by megatron's hash (the prefix before the first '-'), stamps included."""
    groups: dict[str, list[Path]] = {}
    for f in sorted(cache.iterdir()):
        if f.is_file() and "-" in f.name:
            groups.setdefault(f.name.split("-", 1)[0], []).append(f)
    return groups


def _source_stamps(sources: list[str]) -> dict[str, list[int]]:
    """(size, mtime_ns) of each dataset file the cache was built from: data rewritten in place under the same
    path gives the same megatron hash, and a cache of the old data."""
    out = {}
    for f in sources:
        with contextlib.suppress(OSError):
            st = os.stat(f)
            out[f] = [st.st_size, st.st_mtime_ns]
    return out


def _cache_fault(files: list[Path]) -> str | None:
    """Why a cache group cannot be used (its stamp absent, unreadable, or not what its files or sources are now),
    or None."""
    from mlbench.train.checkpoint import integrity

    stamp = next((f for f in files if f.name.endswith(f"-{_STAMP}")), None)
    if stamp is None:
        return "has no mlbench stamp (a run killed while it built it, or an older mlbench's)"
    try:
        saved = json.loads(stamp.read_text())
        want, sources = saved["files"], saved["sources"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"its stamp {stamp.name} cannot be read ({type(e).__name__})"
    have = sorted(f.name for f in files if f is not stamp)
    if have != sorted(want):
        return f"holds {have}, built as {sorted(want)}"
    for name, got in integrity.sums(stamp.parent, have).items():  # (read in parallel)
        if got != want[name]:
            return f"{name} is not what was built (cut short, zeroed or rewritten)"
    for src, st in sources.items():
        if _source_stamps([src]).get(src) != st:
            return f"{src} changed since it was built"
    return None


def _drop_broken_cache(cache: Path) -> None:
    """Remove the index caches megatron would misread (rank 0 alone, before it builds; the other ranks read the
    cache only after it). megatron takes a cache whose files are there as a hit, and writes them in place: a run
    killed while it wrote left a file cut short (every later run across nodes aborted: 'mmap length is greater
    than file size', naming no file), and a file zeroed in place (a crash, a full disk) was used silently, every
    sample the same. Each cache is stamped (`_stamp_cache`) with its files' CRC32-C and the data's size and
    mtime; one whose stamp is absent or does not hold is dropped (all files that share its hash), with a note,
    and megatron builds it again."""
    import torch.distributed as dist

    if (dist.is_initialized() and dist.get_rank() != 0) or not cache.is_dir():
        return
    for key, files in _groups(cache).items():
        if (fault := _cache_fault(files)) is not None:
            print(f"index cache {cache}/{key}-*: {fault}: built again", file=sys.stderr, flush=True)
            for f in files:
                f.unlink(missing_ok=True)


def _stamp_cache(cache: Path, sources: list[str]) -> None:
    """Stamps each cache megatron has just built (rank 0, once the builds are done): its files' sizes and
    CRC32-C, and the size and mtime of the data it was built from."""
    import torch.distributed as dist

    from mlbench.train.checkpoint import integrity

    if (dist.is_initialized() and dist.get_rank() != 0) or not cache.is_dir():
        return
    for key, files in _groups(cache).items():
        if any(f.name.endswith(f"-{_STAMP}") for f in files):
            continue
        stamp = {"files": integrity.sums(cache, [f.name for f in files]), "sources": _source_stamps(sources)}
        tmp = cache / f".{key}-{_STAMP}.tmp"
        tmp.write_text(json.dumps(stamp))
        os.replace(tmp, cache / f"{key}-{_STAMP}")


_LOCK = ".mlbench.lock"  # no '-' in it: not a cache group of _groups'


def build_cached(cache: Path, sources: list[str], build: Callable[[], T]) -> T:
    """BUILD's result (megatron's dataset builds, which write their index caches in CACHE), the caches checked
    before (`_drop_broken_cache`) and stamped after (`_stamp_cache`), under an exclusive lock on CACHE held by
    rank 0 throughout: two runs sharing a cache (a node's mlbench_index_cache) at once dropped each other's
    freshly built cache as 'a run killed while it built it' before it was stamped, and built it again (and a
    stamp could be taken of files another run was still writing). The second run waits, then finds the cache
    built and stamped: a hit."""
    with _cache_lock(cache):
        _drop_broken_cache(cache)
        built = build()
        _stamp_cache(cache, sources)
    return built


@contextlib.contextmanager
def _cache_lock(cache: Path) -> Iterator[None]:
    """An exclusive flock on CACHE/.mlbench.lock for rank 0 (the other ranks read the cache after rank 0 built
    it, behind megatron's barrier), said on stderr when another run holds it. A cache folder where no lock can be
    made is built unlocked, as before: megatron says why it cannot write there."""
    import fcntl

    import torch.distributed as dist

    fd = None
    if not (dist.is_initialized() and dist.get_rank() != 0):
        with contextlib.suppress(OSError):
            cache.mkdir(parents=True, exist_ok=True)
            fd = os.open(cache / _LOCK, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                print(f"index cache {cache}: another run is building it; waiting for it", file=sys.stderr,
                      flush=True)
                fcntl.flock(fd, fcntl.LOCK_EX)
            except OSError:  # a filesystem without locks (ENOLCK: NFS without its lock daemon): unlocked
                pass
        yield
    finally:
        if fd is not None:
            os.close(fd)  # (the lock goes with it)


# ---- the indexed source ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class DefinitionTokenizer:
    """What megatron's GPTDatasetConfig reads of a tokenizer (vocabulary size, EOD id), from the definition:
    the corpus is already tokenized, so nothing is loaded. It has no `pad`, so megatron pads with -1."""

    vocab_size: int
    eod: int

    @property
    def unique_identifiers(self) -> dict:  # megatron hashes the config, tokenizer included, into cache names
        return {"class": type(self).__name__, "vocab_size": self.vocab_size, "eod": self.eod}


def indexed_source(bench: Benchmark, *, seed: int, global_batch: int, steps: int, cache: Path) -> IndexedTokens:
    """megatron-core GPT datasets for a run: training shuffled by the run seed, eval fixed by the data seed."""
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    d, seq = bench.data, bench.model.seq_length
    n_train, n_eval = steps * global_batch, bench.eval.samples
    keep_partial = bench.eval.keep_partial_sequence
    tokenizer = DefinitionTokenizer(bench.model.vocab_size,
                                    # EOD tokens leave the loss where data.eod_mask_loss; no position or
                                    # attention resets. Without an eod_id: one past the vocabulary (no token)
                                    d.eod_id if d.eod_id is not None else bench.model.vocab_size)
    train_blend = parse_blend(d.path)
    eval_blend = parse_blend(d.eval_path) if d.eval_path.strip() else None
    prefix = train_blend[0][0]
    split = None if eval_blend else holdout_split(prefix, read_index(prefix, "--data-path"), holdout_tokens(bench))

    def build(random_seed: int, which: int, size: int) -> Any:
        common = dict(random_seed=random_seed, sequence_length=seq, path_to_cache=str(cache), tokenizer=tokenizer,
                      reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=d.eod_mask_loss,
                      create_attention_mask=False, drop_last_partial_validation_sequence=not keep_partial,
                      add_extra_token_to_sequence=d.add_extra_token_to_sequence)
        if eval_blend is None:  # one prefix, megatron's document split
            config = GPTDatasetConfig(blend=train_blend, split=split, **common)
            # Build only the split asked for (the other one, under another seed, is the other builder's).
            config.split_matrix = [m if i == which else None for i, m in enumerate(config.split_matrix)]
        else:
            per_split: list[Blend | None] = [None, None, None]
            per_split[which] = train_blend if which == 0 else eval_blend
            config = GPTDatasetConfig(blend_per_split=per_split, **common)
        sizes: list[int | None] = [None, None, None]
        sizes[which] = size
        return BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, config).build()[which]

    # The data seed, not the run's: every run evaluates on the same set. Kept whole, the split is one epoch
    # (size None): a size would make megatron wrap into a second epoch to fill the partial sequence.
    train, eval_ = build_cached(cache, [f"{p}.{ext}" for blend in (train_blend, eval_blend) if blend
                                        for p in blend[0] for ext in ("bin", "idx")],
                                lambda: (build(seed, 0, n_train), build(d.seed, 1, None if keep_partial else n_eval)))
    for ds, n, what in ((train, n_train, "training"), (eval_, n_eval, "eval")):
        if ds is None or len(ds) < n:
            raise ValueError(f"the {what} data provides {0 if ds is None else len(ds)} sequences of {seq}; "
                             f"the run needs {n}")
    return IndexedTokens(train, eval_, seq, global_batch, bench.model.vocab_size)
