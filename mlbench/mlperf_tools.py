"""The one place mlbench reaches into mlperf-logging's internals.

MLCommons' tools (the compliance checker, the RCP checker, the result summarizer) offer command lines, not a
library: scoring exactly as they score means calling their private functions (`_compute_olympic_average`,
`RCP_Checker._find_rcp`, ...). Every such call is here, behind a function of ours, and the package is pinned
to the version this was written against (pyproject.toml). An upgrade that renames or drops one of them fails
with `ToolsChanged` naming the call, and tests/test_mlperf_tools.py checks each call's result on known input.

The compliance checker itself is run as a command (`checker_command`), never in-process: it keeps state at
module level (`mlp_compliance.enqueued_configs`, left full when a rules file crashes it) and holds the whole
log in memory (1.8 GB for a 250 MB log), which a process of its own gives back when it ends.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import json
import logging
import os
import re
import sys
import types
import warnings
from importlib import metadata
from pathlib import Path
from typing import Any

from mlperf_logging import benchmark_meta

PINNED = "4.1.68"  # the version every call here was written against; pyproject.toml pins it
USAGE = "training"
# The checker's folder, found without importing it (its import, 0.05 s, is the checker process's to pay): the
# registry asks which rulesets hold a benchmark's rules on every command.
_PKG = Path(benchmark_meta.__file__).parent / "compliance_checker"


def _rcp_checker() -> Any:
    from mlperf_logging.rcp_checker import rcp_checker  # imports scipy: only where used (seconds a process)

    return rcp_checker


def _result_summarizer() -> Any:
    from mlperf_logging.result_summarizer import result_summarizer  # imports pandas: only where used

    return result_summarizer


class ToolsChanged(RuntimeError):
    """The installed mlperf-logging no longer has an internal mlbench calls."""


def _internal(owner: Any, name: str, where: str) -> Any:
    try:
        return getattr(owner, name)
    except AttributeError:
        raise ToolsChanged(f"mlperf-logging {installed_version()} has no {where}.{name}, which mlbench calls "
                           f"(written against {PINNED}): update mlbench/mlperf_tools.py") from None


def installed_version() -> str:
    try:
        return metadata.version("mlperf-logging")
    except metadata.PackageNotFoundError:
        return "unknown"


@contextlib.contextmanager
def quiet():
    """The official tools log to the root logger and warn through numpy; keep that out of our output."""
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(previous)


# --- rulesets and run counts ---------------------------------------------------------------------------------

def rulesets() -> list[str]:
    """Training rulesets the installed checker knows, oldest first."""
    found = [d.name.split("_", 1)[1] for d in _PKG.glob(f"{USAGE}_*") if re.fullmatch(r"\d+\.\d+\.\d+", d.name[9:])]
    return sorted(found, key=lambda r: tuple(int(x) for x in r.split(".")))


def rulesets_with(benchmark: str | None) -> list[str]:
    """Rulesets whose closed rules take BENCHMARK, oldest first: its rules file exists in the installed package and
    the ruleset's common rules accept its name (5.1.0 keeps closed_bert.yaml, but its submission_benchmark check
    lists no bert: every BERT log judged by it FAILs)."""
    return [r for r in rulesets() if benchmark and (_PKG / f"{USAGE}_{r}" / f"closed_{benchmark}.yaml").exists()
            and benchmark in _benchmarks_accepted(r, benchmark)]


_ACCEPTED = re.compile(r"NAME:\s*submission_benchmark\b.*?CHECK:\s*\"([^\"]*)\"", re.S)


@functools.cache
def _benchmarks_accepted(ruleset: str, benchmark: str) -> frozenset[str]:
    """The benchmark names RULESET's closed common rules accept (their submission_benchmark check's list); where
    that check is not found, BENCHMARK (as its rules file stands)."""
    try:
        text = (_PKG / f"{USAGE}_{ruleset}" / "closed_common.yaml").read_text()
    except OSError:
        return frozenset({benchmark})
    m = _ACCEPTED.search(text)
    if m is None or "in [" not in m.group(1):
        return frozenset({benchmark})
    return frozenset(re.findall(r"'([^']+)'", m.group(1).split("in [", 1)[1]))


def round_in_path(path: Path) -> str | None:
    """The round a published results tree names (training_results_vX.Y in PATH) as a ruleset, X.Y.0; None. Where
    the path names two, the innermost: the tree the files belong to (a copy kept under another round's folder)."""
    found = re.findall(r"training_results_v(\d+)\.(\d+)", str(path))
    return f"{found[-1][0]}.{found[-1][1]}.0" if found else None


def ruleset_in_path(path: Path, benchmark: str | None) -> str | None:
    """The round a published results tree names (`round_in_path`), where the installed package has rules for
    BENCHMARK in it; None otherwise. score and check both start from it (check took the benchmark definition's
    ruleset, 6.0.0, and passed a v5.1 log score judged against 5.1.0)."""
    r = round_in_path(path)
    return r if r is not None and r in rulesets_with(benchmark) else None


def passed_over_round(path: Path, benchmark: str | None, ruleset: str) -> str | None:
    """A note where PATH names a round (training_results_vX.Y) that RULESET, inferred, is not: the installed
    package has no rules for BENCHMARK in it (a gpt3 log under training_results_v5.0 is judged by 4.1.0)."""
    r = round_in_path(path)
    if r is None or r == ruleset or not benchmark:
        return None
    return f"the path names round {r.rsplit('.', 1)[0]}, which has no rules for {benchmark}: judged by {ruleset}"


# The fields result_summarizer reads from a systems json to make a row (summarize_results): one missing is its
# FieldError, the system skipped (in 4.1.68, then a NameError that stops it); a count its int() refuses stops it
# (ValueError).
_SYSTEM_FIELDS = ("division", "status", "submitter", "system_name", "host_processor_model_name", "number_of_nodes",
                  "host_processor_core_count", "host_processors_per_node", "accelerator_model_name",
                  "accelerators_per_node", "framework", "hw_notes", "sw_notes")
_SYSTEM_COUNTS = ("host_processors_per_node", "number_of_nodes", "accelerators_per_node")


def system_desc_problem(desc: dict) -> str | None:
    """What in a systems json keeps result_summarizer from making its row; None if nothing."""
    if missing := [k for k in _SYSTEM_FIELDS if k not in desc]:
        return f"no {', '.join(missing)} field"
    for k in _SYSTEM_COUNTS:
        try:
            int(desc[k])
        except (TypeError, ValueError, OverflowError):
            shown = repr(desc[k])  # cut: a reason is one line, whatever the file holds (100,000 characters)
            return f"{k} {shown if len(shown) <= 40 else shown[:37] + '...'} is no whole number"
    return None


# --- where result_summarizer stops ---------------------------------------------------------------------------
# An exception out of summarize_results loses every system's row, not only the one it stopped on: run over an
# organisation folder, the summarizer then prints no figure for any set of it.

def summarizer_stops(org: Path, ruleset: str) -> str | None:
    """Why result_summarizer, run over the organisation folder ORG with RULESET, stops before it prints a row; None
    where its walk of the folder goes through. It is run over the tree mlbench scores: ORG without its hidden
    folders (`R/sys/.old`, runs put aside; mlbench passes over them with a note), as on a view of ORG that links
    all but those. Over ORG as it is, such a folder under results/<system>/ stopped it (no benchmark of RULESET),
    and `score` showed no official figure for any set of the tree. It walks results/<system>/ as summarize_results
    does: a system
    without systems/<system>.json is skipped (FileNotFoundError, caught: that set's own note); a systems json (or
    results/<system>/privateid.json) its JSON reader refuses, one that is no object or lacks a field or count,
    a result_*.txt that is no file to read, and a folder under results/<system>/ that is no benchmark of RULESET
    (Summary.push asserts its column) each stop it."""
    from mlbench.logfile import why_not_a_file

    accepted = set(benchmark_meta.get_allowed_benchmarks(USAGE, ruleset))
    try:
        for system in _sub_folders(org / "results"):
            if (why := _system_stops(org, system)) is not None:
                return why
            for bench in _sub_folders(system):
                where = f"results/{system.name}/{bench.name}"
                for f in sorted(bench.glob("result_*.txt")):
                    if (not_file := why_not_a_file(f)) is not None:
                        return f"{where}/{f.name} is {not_file}"
                if _BENCHMARK_ALIASES.get(bench.name, bench.name) not in accepted:
                    return (f"{where}: {bench.name!r} is no benchmark of training {ruleset} (AssertionError): a folder "
                            f"under results/{system.name}/ is named as one ({', '.join(sorted(accepted))})")
    except OSError as e:  # (a folder it lists and cannot read stops it as well)
        return f"{e.filename}: cannot be read ({e.strerror or e})"
    return None


_BENCHMARK_ALIASES = {"mask": "maskrcnn"}  # result_summarizer._benchmark_alias: a folder 'mask' is maskrcnn


def _sub_folders(folder: Path) -> list[Path]:
    """result_summarizer._get_sub_folders on the tree mlbench scores: every folder in FOLDER (links to folders too),
    by name, but hidden ones (summarizer_stops)."""
    return [folder / n for n in sorted(os.listdir(folder)) if not n.startswith(".") and (folder / n).is_dir()]


def _system_stops(org: Path, system: Path) -> str | None:
    """Why the summarizer stops on SYSTEM's description; None where it reads it, or skips the system (no json)."""
    name = f"systems/{system.name}.json"
    if not os.path.exists(org / name):
        return None
    desc, why = summarizer_json(org / name)
    if why is not None:
        return f"{name} {why}"
    if (system / "privateid.json").exists():
        private, why = summarizer_json(system / "privateid.json")
        if why is not None or not isinstance(private, dict):
            return f"results/{system.name}/privateid.json {why or 'is not a JSON object'}"
    if not isinstance(desc, dict):
        return f"{name} is not a JSON object"
    if (problem := system_desc_problem(desc)) is not None:
        return f"{name}: {problem}"
    # (its row's text: 'TensorFlow' in framework, ';'.join of the notes)
    if not isinstance(desc["framework"], str):
        return f"{name}: framework {str(desc['framework'])[:40]!r} is no text (TypeError)"
    if bad := [k for k in ("hw_notes", "sw_notes") if desc[k] and not isinstance(desc[k], str)]:
        return f"{name}: {', '.join(bad)} no text (TypeError)"
    return None


def summarizer_json(path: Path) -> tuple[object, str | None]:
    """PATH as result_summarizer._read_json_file reads it (open in text mode, UTF-8, json.load): (the value, None), or
    (None, why it stops there: its own error on a file that is not JSON is a TypeError; a byte order mark, which
    mlbench's reader takes, is not JSON to it)."""
    from mlbench.logfile import read_capped

    try:
        text = read_capped(path).decode("utf-8")
    except OSError as e:
        return None, f"cannot be read ({e.strerror or e})"
    except UnicodeDecodeError:
        return None, "is not UTF-8 text"
    if text.startswith("\ufeff"):
        return None, "begins with a UTF-8 byte order mark, which the summarizer's JSON reader refuses"
    try:
        return json.loads(text), None
    except (ValueError, RecursionError) as e:
        return None, f"is not JSON ({str(e).splitlines()[0][:80] if str(e) else type(e).__name__})"


def checker_crash_stops_summarizer(exception: str) -> bool:
    """Whether the compliance checker's crash, EXCEPTION its traceback's last line ('FileNotFoundError: ...'), stops
    result_summarizer, which runs the checker in its own process: it catches ValueError (the run dropped), nothing
    else."""
    name = exception.split(":", 1)[0].strip().rsplit(".", 1)[-1]
    cls = getattr(builtins, name, None)
    return name != "JSONDecodeError" and not (isinstance(cls, type) and issubclass(cls, ValueError))


def has_rules(ruleset: str, benchmark: str) -> bool:
    """Whether the installed package has RULESET's closed rules and RCPs for BENCHMARK (the files the checker and
    the RCP checker read)."""
    return bool(re.fullmatch(r"\d+\.\d+\.\d+", ruleset)) and \
        (_PKG / f"{USAGE}_{ruleset}" / f"closed_{benchmark}.yaml").is_file() and rcp_file(benchmark, ruleset).is_file()


def required_runs(benchmark: str | None) -> int | None:
    """How many result files MLCommons requires for BENCHMARK (None for one it does not know)."""
    return benchmark_meta.get_result_file_counts(USAGE).get(benchmark) if benchmark else None


# --- the compliance checker, as a command ---------------------------------------------------------------------

def checker_command(path: Path, ruleset: str, config: Path | None, log_output: Path, quiet_: bool = False) -> list[str]:
    """`python -m mlperf_logging.compliance_checker` on one file (config: a rules file of our own)."""
    return [sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage", USAGE, "--ruleset", ruleset,
            str(Path(path).resolve()), "--log_output", str(log_output),
            *(["--config", str(config)] if config else []), *(["--quiet"] if quiet_ else [])]


# --- the result summarizer's private functions ----------------------------------------------------------------

def olympic_average(times: list[float], dropped: int, max_dropped: int) -> float | None:
    """result_summarizer._compute_olympic_average: drop the fastest and slowest (less those already dropped)."""
    f = _internal(_result_summarizer(), "_compute_olympic_average", "result_summarizer")
    return f(list(times), dropped, max_dropped)


def scaling_factor(folder: Path) -> float | None:
    """result_summarizer._get_scaling_factor: the review's factor from FOLDER/scaling.json (None: no file).
    ValueError naming the file when it does not hold a finite positive number."""
    from mlbench.logfile import load_json, shown

    path = Path(folder) / "scaling.json"
    if not path.is_file():
        return None
    try:  # read here first, for the reason: the summarizer's own error on a file that is not JSON was its TypeError
        data = load_json(path)
    except ValueError as e:
        raise ValueError(f"{path}: not JSON ({e})") from None
    if not isinstance(data, dict) or "scaling_factor" not in data:
        raise ValueError(f"{path}: no scaling_factor in it (a JSON object {{\"scaling_factor\": N}} is expected)")
    f = _internal(_result_summarizer(), "_get_scaling_factor", "result_summarizer")
    try:
        v = f(str(folder))
    except (ValueError, KeyError, TypeError, OSError, RecursionError) as e:  # deep nesting: RecursionError
        if path.read_bytes()[:3] == b"\xef\xbb\xbf":  # (JSON with a BOM: its reader fails in its own TypeError)
            raise ValueError(f"{path}: begins with a UTF-8 byte order mark, which the official summarizer's JSON "
                             f"reader refuses; remove it") from None
        raise ValueError(f"{path}: the official summarizer cannot read its scaling_factor "
                         f"({type(e).__name__}: {str(e)[:120]})") from None
    # (a 400-digit int is below float('inf') as a Python int, and float() of it an OverflowError)
    if not isinstance(v, int | float) or isinstance(v, bool) or not (0 < v <= MAX_SCALING_FACTOR):
        raise ValueError(f"{path}: scaling_factor is {shown(v, 40)}, expected a positive number at most "
                         f"{MAX_SCALING_FACTOR:g} (the RCP check's factor, samples to converge against the "
                         f"reference's: 1.0 to 1.17 in published results)")
    return float(v)


# The most a scaling factor may be: a thousand times the reference's samples to converge is no converged run, and
# past it a score could overflow (1e308 printed a score of inf).
MAX_SCALING_FACTOR = 1000.0


def max_dropped(benchmark: str | None) -> int:
    return 4 if benchmark == "unet3d" else 1  # as in result_summarizer._compute_strong_score_standalone


# --- the RCP checker ------------------------------------------------------------------------------------------

def rcp_file(benchmark: str, ruleset: str) -> Path:
    """The RCP checker's data file for a benchmark and ruleset (its reference convergence points, raw)."""
    return _PKG.parent / "rcp_checker" / f"{USAGE}_{ruleset}" / f"rcps_{benchmark}.json"


# What rcp_checker.read_submission_file acts on: a line holding none of these strings changes nothing it returns.
_RCP_READS = (b"global_batch_size", b"submission_benchmark", b"eval_accuracy", b"eval_error", b"train_samples",
              b"run_stop")


def rcp_relevant_copy(src: Path, dst: Path) -> None:
    """DST: the lines of SRC that the RCP checker's reader acts on, byte for byte. It reads a whole file with
    readlines and a regular expression a line (about a minute for 50 MB); on this copy it returns the same."""
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        for raw in fin:
            if b":::MLLOG" in raw and any(k in raw for k in _RCP_READS):
                fout.write(raw)


def rcp_check_files(files: list[Path], ruleset: str, scratch: Path) -> tuple[bool, str, float, list[tuple]]:
    """rcp_checker.check_directory on FILES with the summarizer's arguments (pruned RCPs, nothing written beside the
    logs), on copies in SCRATCH that hold only the lines its reader acts on: (pass, message, normalisation factor,
    per file (converged, samples or epochs to converge (1e9 if not), global batch))."""
    copies = [Path(scratch) / f"result_{i}.txt" for i in range(len(files))]
    for f, copy in zip(files, copies, strict=True):
        rcp_relevant_copy(f, copy)
    checker = _rcp_checker()
    _internal(checker, "glob", "rcp_checker")
    # Its reading depends on the order its glob lists the files (a file logging no global_batch_size or benchmark is
    # passed over where it comes first, and fails or stops the set elsewhere): it lists the copies in FILES' order,
    # not in the scratch folder's own.
    listed = types.SimpleNamespace(glob=lambda pattern, recursive=False: [str(c) for c in copies])
    with quiet(), _replaced(checker, "glob", listed):
        verdict = checker.check_directory(str(scratch), USAGE, ruleset, False, False, rcp_file=None,
                                          rcp_pass="pruned_rcps", rcp_bypass=False, set_scaling=False)
    return (*verdict, [read_convergence(c, ruleset) for c in copies])


@contextlib.contextmanager
def _replaced(owner: Any, name: str, value: Any):
    before = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, before)


def listing_order(files: list[Path]) -> list[Path]:
    """FILES (of one folder) in the order the official tools' glob lists them: the folder's own order (os.scandir),
    which is no order by name. Files the listing does not hold go last, as given."""
    try:
        listed = {n: i for i, n in enumerate(os.listdir(files[0].parent))} if files else {}
    except OSError:
        return list(files)
    return sorted(files, key=lambda f: listed.get(f.name, len(listed)))


def read_convergence(path: Path, ruleset: str) -> tuple[bool, float, int]:
    """rcp_checker.read_submission_file: (converged, samples or epochs to converge (1e9 if not), global batch)."""
    f = _internal(_rcp_checker(), "read_submission_file", "rcp_checker")
    with quiet():
        not_converged, epochs, bs, _ = f(str(path), ruleset, False)
    return not bool(not_converged), epochs, bs


class Rcp:
    """The RCP checker's references for one benchmark and ruleset, through its private look-ups.
    ValueError when the ruleset holds no RCPs for the benchmark."""

    PASS = "pruned_rcps"  # the summarizer's pass: RCPs that converge in more samples than a larger batch's dropped

    def __init__(self, benchmark: str, ruleset: str):
        try:
            with quiet():
                self._c = _rcp_checker().RCP_Checker(USAGE, ruleset, benchmark, False)
        except Exception as e:  # the checker raises bare Exception / KeyError / OSError for "none here"
            raise ValueError(f"no RCPs for {benchmark} in training {ruleset} ({type(e).__name__})") from None

    def _call(self, name: str, *args: Any) -> Any:
        with quiet():
            return _internal(self._c, name, "RCP_Checker")(*args)

    def batch_sizes(self, pruned: bool = True) -> list[int]:
        data = _internal(self._c, "pruned_rcp_data" if pruned else "rcp_data", "RCP_Checker")
        return sorted(r["BS"] for r in data.values())

    def at(self, bs: int) -> dict | None:
        return self._call("_find_rcp", bs, self.PASS)

    def below(self, bs: int) -> dict | None:
        """The largest RCP below BS."""
        return self._call("_find_top_min_rcp", bs, self.PASS)

    def above(self, bs: int) -> dict | None:
        """The smallest RCP above BS."""
        return self._call("_find_bottom_max_rcp", bs, self.PASS)

    def smallest(self) -> dict | None:
        return self._call("_find_min_rcp", self.PASS)

    def interpolated(self, bs: int, lo: dict, hi: dict) -> dict:
        return self._call("_create_interp_rcp", bs, lo, hi)[1]

    def judge(self, record: dict, epochs: list[float]) -> tuple[bool, float]:
        """(pass, normalisation factor) of a set's convergence points against one RCP record."""
        return self._call("_eval_submission_record", record, epochs, "")

    def dispatch(self, bs: int, epochs: list[float]) -> tuple[bool, str, float]:
        """check_directory's choice of reference and its verdict, for our own list of convergence points."""
        rec = self.at(bs)
        if rec is not None:
            ok, f = self.judge(rec, epochs)
            return ok, "RCP found", f
        lo, hi = self.below(bs), self.above(bs)
        if lo is not None and hi is not None:
            ok, f = self.judge(self.interpolated(bs, lo, hi), epochs)
            return ok, "RCP Interpolation", f
        if lo is not None:
            return False, f"Missing RCP, please submit RCP with BS = {bs}", 1.0
        if hi is not None:
            ok, f = self.judge(self.smallest(), epochs)
            return ok, ("RCP not found but slower convergence on smaller batch size" if ok
                        else f"Missing RCP, please submit RCP with BS = {bs}"), f
        return False, "Cannot find any RCPs", 1.0
