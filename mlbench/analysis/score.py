"""Score a set of MLPerf result logs the way MLCommons does, using the official mlperf_logging tools.

Compliance and RCP come from `mlperf_logging` itself (compliance_checker, rcp_checker); the olympic mean
and the scaling.json factor from `result_summarizer`'s own functions. Where the official tools are known
to be wrong (shared/reference/mlperf-rules.md) the score here does the right thing and a note says what
the official summarizer would have printed instead (`official_score_min`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import tempfile
import warnings
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from mlperf_logging import benchmark_meta
from mlperf_logging.compliance_checker import mlp_compliance
from mlperf_logging.rcp_checker import rcp_checker
from mlperf_logging.result_summarizer import result_summarizer as summarizer

from mlbench.analysis.logs import ResultSet, RunLog, find_sets
from mlbench.compliance import SMOKE_RULES
from mlbench.errors import UserError

USAGE = "training"
_PKG = Path(mlp_compliance.__file__).parent


@contextlib.contextmanager
def _quiet_official():
    """The official tools log to the root logger; keep their chatter out of our output."""
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        yield
    finally:
        logging.disable(previous)


def rulesets_for(benchmark: str | None) -> list[str]:
    """Rulesets whose closed rules file for BENCHMARK exists in the installed package, oldest first."""
    found = []
    for d in _PKG.glob(f"{USAGE}_*"):
        if benchmark and (d / f"closed_{benchmark}.yaml").exists():
            found.append(d.name.split("_", 1)[1])
    return sorted(found, key=lambda r: tuple(int(x) for x in r.split(".")))


def infer_ruleset(folder: Path, benchmark: str | None) -> str:
    """training_results_vX.Y in the path names the round; else the newest ruleset holding the benchmark."""
    known = rulesets_for(benchmark)
    m = re.search(r"training_results_v(\d+)\.(\d+)", str(folder))
    if m:
        r = f"{m.group(1)}.{m.group(2)}.0"
        if r in known:
            return r
    if known:
        return known[-1]
    return "6.0.0"


_VERDICTS: dict[tuple, tuple[bool, list[str]]] = {}


def _verdict_key(path: str, ruleset: str, smoke: bool) -> tuple:
    st = os.stat(path)
    return (os.path.realpath(path), st.st_size, st.st_mtime_ns, ruleset, smoke)


def check_compliance(path: str, ruleset: str, smoke: bool = False) -> tuple[bool, list[str]]:
    """The official compliance checker on one file, as the summarizer calls it (quiet, no werror).

    smoke: our tiny runs, judged by the structural smoke rules (mlbench/rules/smoke.yaml) instead.
    """
    config = str(SMOKE_RULES) if smoke else f"{USAGE}_{ruleset}/common.yaml"
    with _quiet_official():
        try:
            checker = mlp_compliance.make_checker(usage=USAGE, ruleset=ruleset, quiet=True, werror=False)
            valid, _, _, _ = mlp_compliance.main(path, config, checker)
        except Exception as e:  # the checker crashes (e.g. a missing rules file) rather than failing
            return False, [f"compliance checker crashed: {type(e).__name__}: {e}"]
    msgs = [*checker.overwritable.values(), *checker.not_overwritable]
    return bool(valid), [" ".join(str(m).split())[:300] for m in msgs]


@dataclass
class RunScore:
    file: str
    status: str
    ttt_min: float | None
    compliant: bool
    samples_to_converge: float | None
    global_batch: int | None
    benchmark: str | None
    counted: bool = False
    problems: list[str] = field(default_factory=list)
    compliance: list[str] = field(default_factory=list)


@dataclass
class RcpResult:
    status: str  # Pass, Fail, Skipped, Error
    message: str
    factor_computed: float
    scaling_json: float | None


@dataclass
class SetScore:
    benchmark: str | None
    ruleset: str
    folder: str
    label: str
    system: str
    division: str | None
    devices: int | None
    devices_from: str
    runs: list[RunScore]
    required_runs: int | None
    olympic_min: float | None
    rcp: RcpResult
    rcp_factor: float
    score_min: float | None
    official_score_min: float | None
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        d = asdict(self)
        d["rcp_status"] = self.rcp.status
        return d


def _compliance_all(paths: list[str], ruleset: str, jobs: int | None,
                    smoke: bool = False) -> list[tuple[bool, list[str]]]:
    """Verdicts for PATHS, checked in parallel processes (about 1.5 s per large log), remembered per file."""
    keys = [_verdict_key(p, ruleset, smoke) if os.path.exists(p) else None for p in paths]
    todo = [p for p, k in zip(paths, keys, strict=True) if k is None or k not in _VERDICTS]
    jobs = min(len(todo), os.cpu_count() or 1, 8) if jobs is None else jobs
    if jobs > 1 and len(todo) > 1:
        with ProcessPoolExecutor(max_workers=jobs) as ex:
            got = list(ex.map(check_compliance, todo, [ruleset] * len(todo), [smoke] * len(todo)))
    else:
        got = [check_compliance(p, ruleset, smoke) for p in todo]
    fresh = dict(zip(todo, got, strict=True))
    out = []
    for p, k in zip(paths, keys, strict=True):
        v = fresh[p] if p in fresh else _VERDICTS[k]
        if k is not None:
            _VERDICTS[k] = v
        out.append(v)
    return out


def _max_dropped(benchmark: str | None) -> int:
    return 4 if benchmark == "unet3d" else 1  # as in result_summarizer._compute_strong_score_standalone


def _rcp_dispatch(checker, bs: int, epochs: list[float], rcp_pass: str) -> tuple[bool, str, float]:
    """rcp_checker.check_directory's choice of reference, with our own list of convergence points."""
    rec = checker._find_rcp(bs, rcp_pass)
    if rec is not None:
        ok, f = checker._eval_submission_record(rec, epochs, "")
        return ok, "RCP found", f
    lo, hi = checker._find_top_min_rcp(bs, rcp_pass), checker._find_bottom_max_rcp(bs, rcp_pass)
    if lo is not None and hi is not None:
        _, rec = checker._create_interp_rcp(bs, lo, hi)
        ok, f = checker._eval_submission_record(rec, epochs, "")
        return ok, "RCP Interpolation", f
    if lo is not None:
        return False, f"Missing RCP, please submit RCP with BS = {bs}", 1.0
    if hi is not None:
        ok, f = checker._eval_submission_record(checker._find_min_rcp(rcp_pass), epochs, "")
        return ok, ("RCP not found but slower convergence on smaller batch size" if ok
                    else f"Missing RCP, please submit RCP with BS = {bs}"), f
    return False, "Cannot find any RCPs", 1.0


def rcp_check(files: list[Path], benchmark: str, ruleset: str, notes: list[str]) -> tuple[bool, str, float]:
    """The official RCP check on exactly FILES (linked into a temp folder, so nothing is written beside them)."""
    with tempfile.TemporaryDirectory(prefix="mlbench-rcp-") as td, _quiet_official(), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")  # numpy's "mean of empty slice" for sets too small to judge
        for i, f in enumerate(files):
            os.symlink(f, Path(td) / f"result_{i}.txt")
        try:
            ok, msg, factor = rcp_checker.check_directory(
                td, USAGE, ruleset, False, False, rcp_file=None, rcp_pass="pruned_rcps",
                rcp_bypass=False, set_scaling=False)
        except Exception as e:
            return False, f"RCP checker failed: {type(e).__name__}: {e}", 1.0
        # Trap: a non-converged run is marked 1e9; gpt3 counts tokens (~1.2e9), so the marker sorts as
        # the fastest run. Redo the comparison with the marker as +inf (the slowest), same references.
        per_file = [rcp_checker.read_submission_file(str(Path(td) / f"result_{i}.txt"), ruleset, False)
                    for i in range(len(files))]
        failed = [i for i, (nc, *_rest) in enumerate(per_file) if nc]
        real = [e for nc, e, *_rest in per_file if not nc]
        if len(failed) == 1 and real and min(real) > 1e9 and msg not in ("Could not detect global_batch_size",):
            epochs = [math.inf if nc else float(e) for nc, e, *_rest in per_file]
            try:
                checker = rcp_checker.RCP_Checker(USAGE, ruleset, benchmark, False)
                ok2, msg2, f2 = _rcp_dispatch(checker, per_file[0][2], epochs, "pruned_rcps")
            except Exception:
                return ok, msg, factor
            notes.append(
                f"{files[failed[0]].name} did not converge: the official RCP checker marks it 1e9 samples, "
                f"below {benchmark}'s real counts (~{min(real):.3g} tokens), so it sorts as the fastest run "
                f"(official: {'Pass' if ok else 'Fail'}, factor {factor:.4f}); here it sorts as the slowest "
                f"({'Pass' if ok2 else 'Fail'}, factor {f2:.4f}).")
            return ok2, msg2, f2
        return ok, msg, factor


def _rcp_status(ok: bool, msg: str) -> str:
    if ok:
        return "Pass"
    return "Fail" if msg in ("RCP found", "RCP Interpolation") else "Fail: " + msg


def score_set(rs: ResultSet, ruleset: str | None = None, devices: int | None = None,
              jobs: int | None = None) -> SetScore:
    runs = rs.runs
    notes: list[str] = []
    # The set's benchmark: the folder's name when runs log it, else the most common one logged.
    logged = [r.benchmark for r in runs if r.benchmark]
    benchmark = rs.folder.name if rs.folder.name in logged else (
        max(set(logged), key=logged.count) if logged else None)
    if len(set(logged)) > 1:
        others = sorted({f"{r.name} ({r.benchmark})" for r in runs if r.benchmark and r.benchmark != benchmark})
        notes.append(f"mixed benchmarks in one folder: scoring {benchmark}; left out {', '.join(others)}")
    ruleset = ruleset or infer_ruleset(rs.folder, benchmark)
    if benchmark and ruleset not in rulesets_for(benchmark):
        notes.append(f"ruleset {ruleset} has no rules for {benchmark} (the checker crashes on it); "
                     f"rulesets holding it: {', '.join(rulesets_for(benchmark)) or 'none'}")

    if rs.smoke:
        notes.append("tiny (smoke) runs: compliance by the structural smoke rules, and no RCP (no reference "
                     "convergence points exist for tiny models); the score is the olympic mean, unnormalised")
    checks = _compliance_all([str(r.path) for r in runs], ruleset, jobs, smoke=rs.smoke)

    scored: list[RunScore] = []
    for r, (ok, msgs) in zip(runs, checks, strict=True):
        scored.append(RunScore(
            file=r.name, status=r.status, ttt_min=r.ttt_min, compliant=ok,
            samples_to_converge=r.samples_to_converge, global_batch=r.gbs, benchmark=r.benchmark,
            problems=list(r.problems), compliance=msgs))

    official = _official_score(rs, runs, scored)
    # Files of another benchmark are left out; unreadable ones count as failed runs of this set.
    same = [(r, s) for r, s in zip(runs, scored, strict=True) if r.benchmark in (benchmark, None)]
    for _, s in same:
        s.counted = s.compliant and s.status == "success" and s.ttt_min is not None
        if s.compliant and s.status == "aborted" and s.ttt_min is not None:
            notes.append(f"{s.file}: run_stop status 'aborted'; the official summarizer still scores its "
                         f"time ({s.ttt_min:.4f} min), here it counts as a run that did not converge")
    required = benchmark_meta.get_result_file_counts(USAGE).get(benchmark) if benchmark else None
    max_dropped = _max_dropped(benchmark)
    times = [s.ttt_min for _, s in same if s.counted]
    dropped = len(same) - len(times)
    olympic = None
    if required is not None and len(same) < required:
        notes.append(f"too few runs: {len(same)} of the {required} that {benchmark} requires, so no score "
                     "(the official summarizer's olympic mean is empty or meaningless here)")
    elif dropped > max_dropped:
        notes.append(f"{dropped} runs failed or did not converge (at most {max_dropped} may be dropped): no score")
    else:
        olympic = summarizer._compute_olympic_average(list(times), dropped, max_dropped)

    division = (rs.system_desc or {}).get("division") or next((r.division for r in runs if r.division), None)
    scaling_json = summarizer._get_scaling_factor(str(rs.folder)) if (rs.folder / "scaling.json").exists() else None
    if rs.smoke:
        ok, computed = False, 1.0
        rcp = RcpResult("Skipped", "tiny runs have no reference convergence points", 1.0, scaling_json)
    elif division == "closed" and benchmark:
        files = [r.path for r, _ in same if r.benchmark == benchmark]
        ok, msg, computed = rcp_check(files, benchmark, ruleset, notes)
        rcp = RcpResult(_rcp_status(ok, msg), msg, float(computed), scaling_json)
    else:
        ok, computed = False, 1.0
        rcp = RcpResult("Skipped", f"no RCP check for division {division!r}", 1.0, scaling_json)
    # The factor applied: scaling.json when present (in a published folder, the MLCommons review's factor;
    # it is what the official summarizer applies), else what the RCP pass would write.
    if scaling_json is not None:
        factor = scaling_json
        if rcp.status == "Pass" and abs(scaling_json - computed) > 1e-9:
            notes.append(f"scaling.json says {scaling_json:.6f} but the RCP check computes {computed:.6f}; "
                         "applying scaling.json (the review's factor, as the official summarizer does)")
    else:
        factor = computed if ok else 1.0
        if olympic is not None and factor != 1.0:
            notes.append(f"no scaling.json: the official summarizer's first pass reports {olympic:.4f} min "
                         f"unscaled (it reads scaling.json before its RCP pass writes it) and a second pass "
                         f"{olympic * factor:.4f}; the score here applies the RCP factor {factor:.4f}")
    if rcp.status not in ("Pass", "Skipped"):
        notes.append(f"RCP check failed ({rcp.message}): not a valid closed-division result")
    score = olympic * factor if olympic is not None else None
    n_dev, dev_from = rs.devices(devices)
    return SetScore(
        benchmark=benchmark, ruleset=ruleset, folder=str(rs.folder), label=rs.label, system=rs.system,
        division=division, devices=n_dev, devices_from=dev_from, runs=scored, required_runs=required,
        olympic_min=olympic, rcp=rcp, rcp_factor=factor, score_min=score, official_score_min=official,
        notes=notes)


def _official_score(rs: ResultSet, runs: list[RunLog], scored: list[RunScore]) -> float | None:
    """What result_summarizer prints for this folder on a first pass, from its own functions:
    every compliant, parseable file counts (aborted ones too), times scaled by an existing scaling.json."""
    times = [s.ttt_min for r, s in zip(runs, scored, strict=True)
             if s.compliant and s.ttt_min is not None and not r.problems]
    dropped = len(runs) - len(times)
    benchmark = rs.folder.name
    if dropped > _max_dropped(benchmark):
        return None
    avg = summarizer._compute_olympic_average(list(times), dropped, _max_dropped(benchmark))
    return avg * summarizer._get_scaling_factor(str(rs.folder)) if avg is not None else None


def score_path(path: Path, ruleset: str | None = None, devices: int | None = None,
               jobs: int | None = None) -> list[SetScore]:
    sets = find_sets(Path(path))
    if ruleset is not None and ruleset not in mlp_compliance.rule_choices():
        raise UserError(f"unknown ruleset {ruleset!r}; the installed mlperf-logging knows "
                        f"{', '.join(sorted(mlp_compliance.rule_choices()))}")
    return [score_set(s, ruleset, devices, jobs) for s in sets]
