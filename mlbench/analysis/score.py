"""Score a set of MLPerf result logs the way MLCommons does, using the official mlperf_logging tools.

Compliance and RCP come from `mlperf_logging` itself (compliance_checker, rcp_checker); the olympic mean
and the scaling.json factor from `result_summarizer`'s own functions. Where the official tools are known
to be wrong (docs/analysis.md) the score here does the right thing and a note says what
the official summarizer would have printed instead (`official_score_min`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NamedTuple

from mlbench import compliance, mlperf_tools
from mlbench.analysis.logs import ResultSet, RunLog, find_sets, holds_no_log, passed_over
from mlbench.errors import UserError, printable
from mlbench.logfile import TOKEN, check_json_file
from mlbench.schema import versioned


def infer_ruleset(folder: Path, benchmark: str | None) -> str:
    """As `check` infers it (compliance.default_ruleset: the path's round, else the benchmark definition's); for a
    benchmark mlbench does not define, the newest ruleset holding it."""
    if (r := compliance.default_ruleset(folder, benchmark)) is not None:
        return r
    known = mlperf_tools.rulesets_with(benchmark)
    if known:
        return known[-1]
    return mlperf_tools.rulesets()[-1]


@dataclass
class RunScore:
    file: str
    status: str
    ttt_min: float | None
    compliant: bool | None  # None: not checked (the checker gave no verdict: compliance.Verdict)
    samples_to_converge: int | float | None  # a count (logs.LogFile.samples_to_converge)
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
    # The official summarizer's RCP column for the set ('Pass', 'Fail', 'Interp. Fail', 'Missing', 'No RCP',
    # 'Unknown state'); None where it computes none: a division not closed, a checker that stops on a file, a tiny
    # set (no reference), or a check not run here.
    official: str | None = None


class RcpCheck(NamedTuple):
    ok: bool
    message: str
    factor: float
    official: str | None  # the summarizer's RCP column (`official_rcp`), before any correction made here


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
    # the set's global batch: the one its runs of its benchmark log (None where none does, or they differ), as the
    # official summarizer's GBS column
    global_batch: int | None = None

    def to_json(self) -> dict:
        """The set as `score --json` gives it (docs/output.md): named as the run record and `plan` name the same
        things (time to train in minutes as time_to_train_min, global_batch_size, runs_required)."""
        d = _renamed(asdict(self), _SET_NAMES)
        d["runs"] = [_renamed(r, _RUN_NAMES) for r in d["runs"]]
        # the official summarizer's RCP column (null where it gives none); `rcp.status` is the verdict here
        d["rcp_status"] = self.rcp.official
        return versioned(d)


# score --json's names for fields named otherwise in the code (schema_version 1 used the code's names)
_RUN_NAMES = {"ttt_min": "time_to_train_min", "global_batch": "global_batch_size"}
_SET_NAMES = {"required_runs": "runs_required", "global_batch": "global_batch_size"}


def _renamed(d: dict, names: dict[str, str]) -> dict:
    return {names.get(k, k): v for k, v in d.items()}


def _compliance_all(paths: list[str], ruleset: str, jobs: int | None,
                    smoke: bool = False) -> list[tuple[bool | None, list[str]]]:
    """The official checker's verdicts for PATHS, as the summarizer asks for them (no warnings; a file judged before
    is not checked again: mlbench.verdicts): (compliant, messages each on one line); compliant None where the
    checker gave none."""
    got = compliance.check_all([(Path(p), ruleset, smoke) for p in paths], quiet=True, jobs=jobs)
    return [(v.ok, [" ".join(m.split())[:300] for m in v.messages]) for v in got]


def rcp_check(files: list[Path], benchmark: str, ruleset: str, notes: list[str]) -> RcpCheck:
    """The official RCP check on exactly FILES (copied into a temp folder, so nothing is written beside them).
    Not run where a file's long lines would keep it past the checker's limit: it runs in this process, without
    one (a 3.5 MB line kept `score` busy for hours)."""
    for f in files:
        if (why := compliance.tools_cannot_read(f)) is not None:
            return RcpCheck(False, f"RCP checker not run, as it could not read {f.name} in time: {why}", 1.0, None)
    with tempfile.TemporaryDirectory(prefix="mlbench-rcp-") as td:
        try:
            ok, msg, factor, per_file = mlperf_tools.rcp_check_files(files, ruleset, Path(td))
        except mlperf_tools.ToolsChanged:
            raise
        except Exception as e:  # the RCP checker on input it does not expect (it validates nothing)
            return RcpCheck(False, f"RCP checker failed{_stopped_on(files, ruleset)}: {type(e).__name__}: {e}"
                            f"{_key_spelled_otherwise(files)}", 1.0, None)  # (the summarizer gives no RCP column)
    # Trap: a non-converged run is marked 1e9; gpt3 counts tokens (~1.2e9), so the marker sorts as the fastest
    # run. Redo the comparison with the marker as +inf (the slowest), same references.
    official = official_rcp(ok, msg)
    failed = [i for i, (conv, *_rest) in enumerate(per_file) if not conv]
    real = [e for conv, e, _ in per_file if conv]
    if len(failed) == 1 and real and min(real) > 1e9 and msg != "Could not detect global_batch_size":
        epochs = [float(e) if conv else math.inf for conv, e, _ in per_file]
        try:
            ok2, msg2, f2 = mlperf_tools.Rcp(benchmark, ruleset).dispatch(per_file[0][2], epochs)
        except ValueError:
            return RcpCheck(ok, msg, factor, official)
        notes.append(
            f"{files[failed[0]].name} did not converge: the official RCP checker marks it 1e9 samples, "
            f"below {benchmark}'s real counts (~{min(real):.3g} tokens), so it sorts as the fastest run "
            f"(official: {'Pass' if ok else 'Fail'}, factor {factor:.4f}); here it sorts as the slowest "
            f"({'Pass' if ok2 else 'Fail'}, factor {f2:.4f}).")
        return RcpCheck(ok2, msg2, f2, official)
    return RcpCheck(ok, msg, factor, official)


def _left_out_of_rcp(left: list[RunLog], every: list[Path], ruleset: str) -> tuple[str, str | None]:
    """The note for runs LEFT out of the set's RCP check (naming no benchmark, or another's), with what the official
    RCP checker makes of EVERY result file of the folder, as the summarizer runs it: in the folder's own order, since
    a file naming no benchmark is passed over where it comes first and stops the checker elsewhere (KeyError: None).
    With the summarizer's RCP column for the folder (`official_rcp`; None where the checker stops, or was not run)."""
    nameless = [r.name for r in left if r.benchmark is None]
    foreign = [f"{r.name} ({r.benchmark})" for r in left if r.benchmark is not None]
    what = "; ".join([*([f"{', '.join(nameless)}: no submission_benchmark read"] if nameless else []),
                      *([f"{', '.join(foreign)}: another benchmark's log"] if foreign else [])])
    every = mlperf_tools.listing_order(every)
    official, column = "is not run here (a file it could not read in time)", None
    if all(compliance.tools_cannot_read(f) is None for f in every):
        with tempfile.TemporaryDirectory(prefix="mlbench-rcp-") as td:
            try:
                ok, msg, factor, _ = mlperf_tools.rcp_check_files(every, ruleset, Path(td))
                official, column = f"gives {_rcp_status(ok, msg)} ({msg}, factor {factor:.4f})", official_rcp(ok, msg)
            except mlperf_tools.ToolsChanged:
                raise
            except Exception as e:  # (as in rcp_check: it validates nothing)
                official = f"stops on such a file ({type(e).__name__}: {e}) and the summarizer gives no RCP verdict " \
                           f"for the set"
    return (f"{what}, so left out of the RCP check here; the official RCP checker, reading every result_*.txt of "
            f"the folder in its order ({', '.join(f.name for f in every)}), {official}"), column


def _stopped_on(files: list[Path], ruleset: str) -> str:
    """' on <file>' for the first of FILES that the RCP checker's reader stops on (its KeyError alone names a key,
    not the file: a run_stop without metadata.status), or '' where each reads."""
    for f in files:
        try:
            mlperf_tools.read_convergence(f, ruleset)
        except Exception:  # (as above: whatever the reader raises)
            return f" on {f.name}"
    return ""


def _key_spelled_otherwise(files: list[Path]) -> str:
    """What the RCP checker's failure means where a record of FILES spells its key otherwise than as written (a \\u
    escape: "submission\\u005fbenchmark" is JSON's submission_benchmark, read so here): the checker finds keys as
    substrings of the line, misses it, and stops (KeyError: None, a benchmark it never read). '' where none does."""
    for f in files:
        with contextlib.suppress(OSError), f.open(encoding="latin-1") as lines:  # (the checker's reading)
            for line in lines:
                text = line.rpartition(TOKEN)[2]  # (the checker's: after the line's last token)
                try:
                    key = json.loads(text)["key"] if TOKEN in line else None
                except (ValueError, TypeError, KeyError, RecursionError):
                    continue
                if isinstance(key, str) and key not in text:
                    return f"; it reads key names as written, and {f.name} spells {printable(key)} otherwise"
    return ""


def official_rcp(ok: bool, msg: str) -> str:
    """The RCP column result_summarizer writes for a set the RCP checker gave (OK, MSG)
    (_compute_strong_scaling_scores)."""
    if ok:
        return "Pass"
    known = {"RCP found": "Fail", "RCP Interpolation": "Interp. Fail", "Cannot find any RCPs": "No RCP"}
    return known.get(msg, "Missing" if "Missing" in msg else "Unknown state")


def _rcp_status(ok: bool, msg: str) -> str:
    if ok:
        return "Pass"
    return "Fail" if msg in ("RCP found", "RCP Interpolation") else "Fail: " + msg


def _benchmark(rs: ResultSet, notes: list[str]) -> str | None:
    if (mixed := rs.mixed_note(taking="scoring ")) is not None:
        notes.append(mixed)
    return rs.benchmark


def duplicate_notes(files: list[Path]) -> list[str]:
    """A file of the set that is another one's log again (a link to it, or the same bytes): both counted as runs,
    as the official summarizer counts them, and said. Only files of one size are read to compare."""
    by_size: dict[int, list[Path]] = {}
    for f in files:
        with contextlib.suppress(OSError):
            by_size.setdefault(f.stat().st_size, []).append(f)
    notes = []
    for same_size in by_size.values():
        seen: dict[bytes, Path] = {}
        for f in same_size if len(same_size) > 1 else ():
            try:
                with open(f, "rb") as fh:
                    digest = hashlib.file_digest(fh, "sha256").digest()  # (in blocks: a log may be 250 MB)
            except OSError:
                continue
            if (first := seen.setdefault(digest, f)) is not f:
                notes.append(f"{f.name} is the same log as {first.name} (byte for byte): counted as another run, as "
                             f"the official summarizer counts it; a set's runs are distinct runs")
    return notes


def seed_notes(runs: list[RunLog]) -> list[str]:
    """Runs of the set that state one seed from one line of one file: MLPerf's package checker rejects the set
    ('already logs the same seed on the same line'), as the official summarizer scores it; said for each seed."""
    first: dict[tuple[object, object, int], str] = {}
    repeats: dict[tuple[object, object, int], list[str]] = {}
    for r in runs:
        for key in dict.fromkeys(r.seeds):
            if first.setdefault(key, r.name) != r.name:
                repeats.setdefault(key, [first[key]]).append(r.name)
    return [f"seed {key[2]} is stated by {len(names)} runs ({', '.join(names[:5])}{', ...' if len(names) > 5 else ''}) "
            f"from one line: MLPerf's package checker rejects a set whose runs repeat a seed; each run needs its own"
            for key, names in repeats.items()]


def _scaling_json(rs: ResultSet, notes: list[str]) -> tuple[float | None, bool]:
    """(scaling.json's factor or None, whether the file is usable). One that is there but no regular file (a pipe
    would block the summarizer's read, /dev/zero fill the memory) or too large is not usable, and said."""
    path = rs.folder / "scaling.json"
    try:
        if path.exists():
            check_json_file(path)
        factor = mlperf_tools.scaling_factor(rs.folder)
        if factor is not None and factor < 1:  # (an RCP pass only ever slows a set down: 1 or more)
            notes.append(f"scaling.json's factor {factor:g} is below 1, which no RCP check writes: it makes the score "
                         f"faster than the runs; applied, as the official summarizer applies it")
        return factor, True
    except OSError as e:
        notes.append(f"{path}: cannot be read ({e.strerror or e}): no score")
        return None, False
    except ValueError as e:
        notes.append(f"{e}: no score")
        return None, False


def require_rules_for(ruleset: str | None, benchmark: str | None, where: object) -> None:
    """UserError where RULESET, asked for (--ruleset), holds no rules for BENCHMARK (the runs at WHERE): bad input,
    as an unknown ruleset is, for tiny runs too (as `check` has it); a ruleset inferred is a note instead."""
    if ruleset and benchmark and ruleset not in (with_rules := mlperf_tools.rulesets_with(benchmark)):
        raise UserError(printable(f"--ruleset {ruleset} has no rules for {benchmark} ({where}); rulesets "
                                  f"holding it: {', '.join(with_rules) or 'none'}"))


def _judged_by_definition(ruleset: str, benchmark: str | None, with_rules: list[str]) -> str:
    """The note for a set that fails the ruleset of mlbench's definition, its path naming no round (a published
    folder copied out of its training_results_vX.Y tree is judged by another round's rules)."""
    return (f"judged by ruleset {ruleset}, {benchmark}'s in mlbench's benchmark definition: the path names no "
            f"training_results_vX.Y round; runs made under another round's rules may fail these: pass --ruleset "
            f"with theirs ({', '.join(with_rules)} hold {benchmark})")


def _no_time_min(r: RunLog) -> float:
    """The time to train the official summarizer takes for a run whose run_stop is not after its run_start."""
    return (r.run_stop_ms - r.run_start_ms) / 60_000  # type: ignore[operator]


def _judging_ruleset(rs: ResultSet, ruleset: str | None, benchmark: str | None, with_rules: list[str],
                     notes: list[str]) -> tuple[str, bool]:
    """The ruleset the set is judged by (given, else inferred: the path's round, else mlbench's definition), and
    whether it came from the definition (the path names no round), with the notes that go with it."""
    require_rules_for(ruleset, benchmark, rs.folder)
    from_definition = not ruleset and not rs.smoke and mlperf_tools.round_in_path(rs.folder) is None and \
        bool(benchmark) and compliance.default_ruleset(rs.folder, benchmark) is not None
    if not ruleset:
        ruleset = infer_ruleset(rs.folder, benchmark)
        if (note := mlperf_tools.passed_over_round(rs.folder, benchmark, ruleset)) is not None:
            notes.append(note)
    if benchmark and ruleset not in with_rules:
        notes.append(f"ruleset {ruleset} has no rules for {benchmark} (the checker crashes on it); "
                     f"rulesets holding it: {', '.join(with_rules) or 'none'}")
    return ruleset, from_definition


def score_set(rs: ResultSet, ruleset: str | None = None, devices: int | None = None,
              jobs: int | None = None) -> SetScore:
    runs = rs.runs
    notes: list[str] = [*rs.left_out, *duplicate_notes(rs.files), *seed_notes(runs)]
    benchmark = _benchmark(rs, notes)
    with_rules = mlperf_tools.rulesets_with(benchmark)
    ruleset, from_definition = _judging_ruleset(rs, ruleset, benchmark, with_rules, notes)
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

    if from_definition and any(s.compliant is False for s in scored):
        notes.append(_judged_by_definition(ruleset, benchmark, with_rules))
    scaling_json, scaling_ok = _scaling_json(rs, notes)
    unknown = any(s.compliant is None for s in scored)  # (the official summarizer would drop it as non-compliant)
    # (a result_*.txt that is no file to read, a dangling link, stops the summarizer: it prints nothing)
    official = _official_score(rs, runs, scored, scaling_json) if scaling_ok and not unknown and not rs.not_files \
        else None
    if official is not None and (skips := rs.summarizer_skips()) is not None:
        official = None
        notes.append(f"the official summarizer makes no row for this set (or stops): {skips}")
    if official is not None and (stops := _summarizer_stops(rs, ruleset, scored)) is not None:
        official = None
        notes.append(stops)
    # A file of another benchmark, as an unreadable one, is a failed run of this set: never counted, and dropped
    # as the official summarizer drops it (left out, a set of 3 with one was 'too few runs' while the summarizer
    # scored it).
    same = list(zip(runs, scored, strict=True))
    olympic = _olympic([s for _, s in same], benchmark, notes)
    notes += [f"{s.file}: the official summarizer scores its time as any run's, {_no_time_min(r):.4f} min (here "
              f"it cannot count)" for r, s in same if r.no_time and s.compliant]

    division = _division(rs, runs)
    if (each := _differ(runs, lambda r: r.division)) is not None:  # (the RCP check would hang on the file order)
        source = "the systems json" if (rs.system_desc or {}).get("division") == division else "the first run"
        notes.append(f"the runs log different submission_division values ({each}): judged as {division}, from "
                     f"{source}")
    batches = {r.gbs for r, _ in same if r.benchmark in (benchmark, None)}
    if (each := _differ([r for r, _ in same if r.benchmark in (benchmark, None)], lambda r: r.gbs)) is not None:
        notes.append(f"the runs log different global_batch_size values ({each}): a set is one batch (the RCP "
                     f"checker compares it with the RCP at one, and fails a set of several)")
    ok, computed, rcp = _rcp_verdict(rs, same, benchmark, ruleset, division, scaling_json, notes)
    # The factor applied: scaling.json when present (in a published folder, the MLCommons review's factor;
    # it is what the official summarizer applies), else what the RCP pass would write.
    if scaling_json is not None:
        factor = scaling_json
        if rcp.status == "Pass" and abs(scaling_json - computed) > 1e-9:
            notes.append(f"scaling.json says {scaling_json:.6f} but the RCP check computes {computed:.6f}; "
                         "applying scaling.json (the review's factor, as the official summarizer does)")
    else:
        factor = computed if ok else 1.0
        if olympic is not None and factor != 1.0 and scaling_ok:  # (not where scaling.json is there but unusable)
            notes.append(f"no scaling.json: the official summarizer's first pass reports {olympic:.4f} min "
                         f"unscaled (it reads scaling.json before its RCP pass writes it) and a second pass "
                         f"{olympic * factor:.4f}; the score here applies the RCP factor {factor:.4f}")
    if rcp.status not in ("Pass", "Skipped"):
        notes.append(f"RCP check failed ({rcp.message}): not a valid closed-division result")
    score = olympic * factor if olympic is not None and scaling_ok and math.isfinite(factor) else None
    n_dev, dev_from = rs.devices(devices)
    where, why = passed_over(dev_from)
    if why:  # the table shows the count alone
        whence = "given" if where == "given" else f"from the {where}"
        notes.append(f"device count {f'{n_dev}, {whence}' if n_dev else 'unknown'}: {why}")
    return SetScore(
        benchmark=benchmark, ruleset=ruleset, folder=str(rs.folder), label=rs.label, system=rs.system,
        division=division, devices=n_dev, devices_from=dev_from, runs=scored,
        required_runs=mlperf_tools.required_runs(benchmark),
        olympic_min=olympic, rcp=rcp, rcp_factor=factor, score_min=score, official_score_min=official,
        notes=notes, global_batch=next(iter(batches)) if len(batches) == 1 else None)


def _rcp_verdict(rs: ResultSet, same: list[tuple[RunLog, RunScore]], benchmark: str | None, ruleset: str,
                 division: str | None, scaling_json: float | None,
                 notes: list[str]) -> tuple[bool, float, RcpResult]:
    """The set's RCP check (closed division only; none for tiny runs): (passed, the factor it computes, its result),
    on the runs of the set's benchmark, read in the folder's order as the official checker reads them."""
    if rs.smoke:
        ok, computed = False, 1.0
        rcp = RcpResult("Skipped", "tiny runs have no reference convergence points", 1.0, scaling_json)
    elif division == "closed" and benchmark:
        files = mlperf_tools.listing_order([r.path for r, _ in same if r.benchmark == benchmark])
        left = [r for r, _ in same if r.benchmark != benchmark]
        if left:
            note, column = _left_out_of_rcp(left, [r.path for r, _ in same], ruleset)
            notes.append(note)
        if batchless := [f.name for f in files if f.name in {r.name for r, _ in same if r.gbs is None}]:
            notes.append(f"{', '.join(batchless)}: no global_batch_size logged; the official RCP checker reads the "
                         f"set in the folder's order ({', '.join(f.name for f in files)}) and passes over such a file "
                         f"only where it comes first (elsewhere: KeyError: None), so its verdict, and this one, hangs "
                         f"on that order")
        ok, msg, computed, official = rcp_check(files, benchmark, ruleset, notes)
        # (the summarizer's column is its checker's on every file of the folder, these left out or not)
        rcp = RcpResult(_rcp_status(ok, msg), msg, float(computed), scaling_json, column if left else official)
    else:
        ok, computed = False, 1.0
        why = f"for division {division!r}" if division else "(the logs state no submission_division)"
        rcp = RcpResult("Skipped", f"no RCP check {why}", 1.0, scaling_json)
    return ok, computed, rcp


def _olympic(same: list[RunScore], benchmark: str | None, notes: list[str]) -> float | None:
    """The olympic mean of the set's runs (those of its benchmark), marking each counted; None, said in NOTES, where
    there is none: too few runs, too many dropped, or one whose compliance is unknown (the checker gave no verdict:
    unknown is not non-compliant, so the set is not scored at all rather than scored without that run)."""
    unchecked = [s for s in same if s.compliant is None]
    for s in unchecked:
        notes.append(f"{s.file}: {s.compliance[0] if s.compliance else 'not checked'}: its compliance is unknown, "
                     "so the set has no score; score it again")
    for s in same:
        s.counted = s.compliant is True and s.status == "success" and s.ttt_min is not None \
            and s.benchmark in (benchmark, None)
        if s.compliant and s.status == "aborted" and s.ttt_min is not None:
            notes.append(f"{s.file}: run_stop status 'aborted'; the official summarizer still scores its "
                         f"time ({s.ttt_min:.4f} min), here it counts as a run that did not converge")
        elif s.compliant and s.benchmark not in (benchmark, None) and s.ttt_min is not None:
            notes.append(f"{s.file}: a {s.benchmark} run; the official summarizer scores its time ({s.ttt_min:.4f} "
                         f"min) as one of this {benchmark} set's, here it counts as a failed run of it")
    required = mlperf_tools.required_runs(benchmark)
    max_dropped = mlperf_tools.max_dropped(benchmark)
    times = [s.ttt_min for s in same if s.counted]
    dropped = len(same) - len(times)
    if unchecked:
        return None
    if required is not None and len(same) < required:
        notes.append(f"too few runs: {len(same)} of the {required} that {benchmark} requires, so no score "
                     "(the official summarizer averages what there is: its figure, where it makes one, is no valid "
                     "result)")
        return None
    if dropped > max_dropped:
        notes.append(f"{dropped} runs failed or did not converge (at most {max_dropped} may be dropped): no score")
        return None
    if required is not None and len(same) > required:  # (the summarizer's olympic mean takes them all)
        notes.append(f"too many runs: {len(same)} where {benchmark} takes exactly {required}; MLPerf's package "
                     f"checker rejects the folder ('Incorrect number of files'), and the olympic mean here, as the "
                     f"official summarizer's, is over all {len(same)}")
    return mlperf_tools.olympic_average(times, dropped, max_dropped)


def _differ(runs: list[RunLog], of: Callable[[RunLog], object]) -> str | None:
    """Each value OF a run the RUNS log and the files that log it ('1152: result_0.txt; 1536: result_2.txt'),
    where they log more than one; None otherwise."""
    logged = {v for r in runs if (v := of(r)) is not None and v != ""}
    if len(logged) < 2:
        return None
    return "; ".join(f"{v}: {', '.join(r.name for r in runs if of(r) == v)}" for v in sorted(logged))


def _checker_stop(scored: list[RunScore]) -> str | None:
    """'<file>: its compliance checker raises <exception>' for the first run whose checker crashed with an exception
    that stops the official summarizer (it runs the checker in its own process); None where none did."""
    for s in scored:
        for m in s.compliance:
            if m.startswith(compliance.CRASHED) and \
                    mlperf_tools.checker_crash_stops_summarizer(exc := m[len(compliance.CRASHED):]):
                return f"{s.file}: the compliance checker raises {exc}"
    return None


def _summarizer_stops(rs: ResultSet, ruleset: str, scored: list[RunScore]) -> str | None:
    """The note where the official summarizer stops before it prints a row (so no figure for this set): on a run
    of it, or, in a submission tree, anywhere in the organisation folder it is run over."""
    where = f"run over {rs.org_root.name} " if rs.org_root is not None else ""
    why = _checker_stop(scored)
    if why is None and rs.org_root is not None:
        why = mlperf_tools.summarizer_stops(rs.org_root, ruleset)
    return None if why is None else \
        f"the official summarizer, {where}with ruleset {ruleset}, stops before it prints any row: {why}"


def _stopped_elsewhere(sets: list[ResultSet], scores: list[SetScore]) -> None:
    """A run whose checker crash stops the official summarizer stops it for its whole organisation folder: the other
    sets of that tree have no official figure either (the walk of the folder itself is each set's own)."""
    for rs, s in zip(sets, scores, strict=True):
        if rs.org_root is None or rs.summarizer_skips() is not None or (why := _checker_stop(s.runs)) is None:
            continue
        for other_rs, other in zip(sets, scores, strict=True):
            if other_rs.org_root == rs.org_root and other is not s and other.official_score_min is not None:
                other.official_score_min = None
                other.notes.append(f"the official summarizer, run over {rs.org_root.name} with ruleset {s.ruleset}, "
                                   f"stops before it prints any row: {s.label}/{why}")


def _division(rs: ResultSet, runs: list[RunLog]) -> str | None:
    d = (rs.system_desc or {}).get("division")
    return d if isinstance(d, str) else next((r.division for r in runs if r.division), None)


def _official_score(rs: ResultSet, runs: list[RunLog], scored: list[RunScore],
                    scaling_json: float | None) -> float | None:
    """What result_summarizer prints for this folder on a first pass, from its own functions:
    every compliant, parseable file counts (aborted ones too), times scaled by an existing scaling.json. None where
    a compliant run holds a field mlbench refuses (an epoch_num of 1e30, say): the summarizer reads some of those,
    so what it prints is not known here; a run_stop not after run_start it scores at its time, 0 or negative."""
    if any(s.compliant and r.invalid and not r.no_time for r, s in zip(runs, scored, strict=True)):
        return None
    times = [_no_time_min(r) if r.no_time else s.ttt_min for r, s in zip(runs, scored, strict=True)
             if s.compliant and (s.ttt_min is not None or r.no_time)]
    dropped = len(runs) - len(times)
    max_dropped = mlperf_tools.max_dropped(rs.folder.name)
    if dropped > max_dropped:
        return None
    avg = mlperf_tools.olympic_average(times, dropped, max_dropped)
    return avg * (scaling_json or 1.0) if avg is not None else None


def score_path(path: Path, ruleset: str | None = None, devices: int | None = None,
               jobs: int | None = None) -> list[SetScore]:
    if ruleset is not None:
        compliance.require_ruleset(ruleset)
    sets = find_sets(Path(path), steps=False)
    # a system is a folder of benchmark folders (two of one name, in two trees, are two)
    systems = sorted({rs.folder.parent: printable(f"{rs.org_root.name}/{rs.system}" if rs.org_root else rs.system)
                      for rs in sets}.values())
    if devices and len(systems) > 1:  # (one count for all: 8 given for a tree of 512- to 8192-device systems)
        raise UserError(f"--devices gives one system's device count, and {printable(str(path))} holds sets of "
                        f"{len(systems)} systems ({', '.join(systems[:4])}{', ...' if len(systems) > 4 else ''}); "
                        f"score each system's folder with its own --devices")
    if len(sets) == 1 and (why := holds_no_log(sets)):  # (in a tree: a note)
        files = sets[0].files
        what = f"{files[0]} is not" if len(files) == 1 else f"none of the {len(files)} result_*.txt in {path} is"
        raise UserError(printable(f"{what} an MLPerf result log ({why})"))
    scores = [score_set(s, ruleset, devices, jobs) for s in sets]
    _stopped_elsewhere(sets, scores)
    return scores
