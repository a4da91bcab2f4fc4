"""Where a run's token sequences come from: one interface (`source.TokenSource`), three sources, chosen by
`data.source`:

- `markov`: the synthetic source with a known entropy rate (tiny runs), sampled on the fly (source.py, markov.py).
- `tfrecord`: MLPerf BERT's pre-masked TFRecord samples (bert_records.py, tfrecord.py).
- `indexed`: megatron-core's indexed dataset (indexed.py).

Every rank builds the same source; a step's global batch is the same on every rank, and each rank asks for
(and reads) only its data-parallel rows. Nothing heavy is imported at the top: the CLI calls `check` before
launch.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING

from mlbench.errors import UserError
from mlbench.spec import Benchmark
from mlbench.train.data.indexed import (
    absolute_blend,
    eval_shortfall,
    holdout_split,
    holdout_tokens,
    indexed_source,
    parse_blend,
    read_index,
)
from mlbench.train.data.source import PAD, MarkovTokens, TokenSource, best_value, markov_source

if TYPE_CHECKING:
    from mlbench.run_plan import RunPlan

__all__ = ["PAD", "TokenSource", "absolute_blend", "build_source", "cache_dir", "check", "check_target",
           "parse_blend"]


# ---- selection ------------------------------------------------------------------------------------------


def build_source(bench: Benchmark, plan: RunPlan) -> TokenSource:
    """The run's token source, by `bench.data.source`. Called on every rank, after the process group is up."""
    from mlbench.run_plan import max_steps

    gbs = plan.layout["global_batch_size"]
    seq = bench.model.seq_length
    if bench.data.source == "markov":
        return MarkovTokens(markov_source(bench), seq, gbs)
    if bench.data.source == "tfrecord":
        from mlbench.train.data.bert_records import BertRecords, files

        return BertRecords(files(bench.data.path, "--data-path"), files(bench.data.eval_path, "--eval-data-path"),
                           seq, bench.data.max_predictions_per_seq, gbs, plan.seed, bench.model.vocab_size)
    return indexed_source(bench, seed=plan.seed, global_batch=gbs, steps=max_steps(bench, gbs),
                          cache=cache_dir(bench, plan))


def cache_dir(bench: Benchmark, plan: RunPlan) -> Path:
    """Where megatron caches its sample indices. Rank 0 builds them and the others read them, so the folder
    must be one every rank sees: the run's staging folder on one node, next to the data across nodes."""
    if plan.layout.get("nodes", 1) == 1:
        return Path(plan.run_dir) / "data_cache"
    return Path(parse_blend(bench.data.path)[0][0]).parent / "mlbench_index_cache"


_FLAGS = {"path": "--data-path", "eval_path": "--eval-data-path"}


def named(bench: Benchmark, key: str, given: Collection[str]) -> str:
    """What set data.KEY, as an error names it: its flag where GIVEN (the keys the flags set) holds KEY, else the
    benchmark file's key (a prefix the file names was reported as '--data-path: ... not found', a flag the user
    never passed)."""
    return _FLAGS[key] if key in given else f"{bench.where}: data.{key}"


def check(bench: Benchmark, nodes: int, *, dry_run: bool, given: Collection[str] = ()) -> None:
    """Refuse, before launch, a run whose data cannot be served. `given`: the data keys the flags set ('path' for
    --data-path, 'eval_path' for --eval-data-path); the others are the benchmark file's."""
    d = bench.data  # (its source one the model's family reads: registry._validate refused another at load)
    if d.source == "markov":
        if given:
            raise UserError(f"--data-path / --eval-data-path apply to the indexed source; {bench.name}"
                            f"{' (tiny)' if bench.variant == 'tiny' else ''} trains on the synthetic Markov source")
        return
    if dry_run:
        return
    if d.source == "tfrecord":
        from mlbench.train.data.bert_records import check_files, files

        found = []
        for key, spec in (("path", d.path), ("eval_path", d.eval_path)):
            if not spec.strip():
                raise UserError(f"{bench.name} trains on MLPerf's pre-masked TFRecord samples but no {_FLAGS[key]} "
                                f"is given: pass the training shards (a folder or glob) and the eval file (eval_10k)")
            found.append(files(spec, named(bench, key, given)))
        # their records, cheaply: what the run would find mid-run
        check_files(*found, bench.eval.samples, (named(bench, "path", given), named(bench, "eval_path", given)))
        return
    _check_indexed(bench, nodes, given)


def check_target(bench: Benchmark) -> None:
    """A quality target the Markov source lets a model reach: one past the source's best value (a tiny `target:
    0.5` where the entropy rate is 0.888) was accepted, and every run trained its whole budget, then aborted.
    Before launch (a dry run too), after the cheap checks, not when the file is loaded: the best value takes
    seconds at a large vocabulary. Other sources: their best value is not known."""
    if bench.data.source != "markov":
        return
    q, d = bench.quality, bench.data
    source = markov_source(bench)
    best = best_value(source, q.metric, bench.model.seq_length, d.mask_prob)
    if bench.converged(best) and best != q.target:
        return
    chain = (f"vocabulary {source.vocab_size}, data.branching {d.branching}, data.concentration "
             f"{d.concentration:g}, data.seed {d.seed}")
    if q.metric == "log_perplexity":
        said = (f"at or below {best:.4f}, the Markov source's entropy rate ({chain}): the lowest expected eval log "
                f"perplexity any model has")
    else:
        said = (f"at or above {best:.4f}, a bound of any model's expected masked-token accuracy on the Markov source "
                f"({chain}; sequences of {bench.model.seq_length}, data.mask_prob {d.mask_prob:g})")
    better = "above" if q.direction == "min" else "below"
    raise UserError(f"{bench.where}: quality.target {q.target:g} is {said}, so every run would train its whole budget "
                    f"and abort; give a target {better} it (quality.note says how the target was chosen)")


def _check_indexed(bench: Benchmark, nodes: int, given: Collection[str]) -> None:
    d = bench.data
    if not d.path.strip():
        readme = next((s for s in bench.sources if s.endswith("README.md")), "")
        raise UserError(f"{bench.name} trains on its prepared corpus (data.source indexed) but no data path is given: "
                        f"pass --data-path PREFIX, the megatron indexed dataset prefix (PREFIX.bin and PREFIX.idx)"
                        + (f"; MLPerf's preprocessing is described in {readme}" if readme else ""))
    train = parse_blend(d.path)[0]
    evals = parse_blend(d.eval_path) if d.eval_path.strip() else None
    train_lengths = [read_index(p, named(bench, "path", given)) for p in train]
    eval_lengths = [read_index(p, named(bench, "eval_path", given)) for p in evals[0]] if evals else []
    if len(train) > 1 and not evals:
        raise UserError("a blend of training prefixes needs a held-out eval set: pass --eval-data-path PREFIX")
    # What indexed_source would find at run time, after run_start: too few tokens to hold out, or to evaluate on
    if not evals:
        holdout_split(train[0], train_lengths[0], holdout_tokens(bench), named(bench, "path", given))
    elif shortfall := eval_shortfall(bench, evals, eval_lengths):
        raise UserError(f"{named(bench, 'eval_path', given)}: {shortfall}")
    if nodes > 1:
        _check_shared_cache(Path(train[0]).parent)


def _check_shared_cache(folder: Path) -> None:
    """A run across nodes caches megatron's indices in FOLDER/mlbench_index_cache: rank 0 creates it (or adds
    to it) mid-run, where a file in its place or a folder it cannot write failed naming neither."""
    cache = folder / "mlbench_index_cache"
    if os.path.lexists(cache):
        if not cache.is_dir():
            raise UserError(f"a run across nodes caches megatron's indices in {cache}, but something other than "
                            f"a folder is there: remove it, or give the data from a folder where that name is free")
        if not os.access(cache, os.W_OK | os.X_OK):
            raise UserError(f"a run across nodes caches megatron's indices in {cache}, but it is not writable")
    elif not os.access(folder, os.W_OK):
        raise UserError(f"a run across nodes caches megatron's indices next to the data, but {folder} is not "
                        f"writable")
