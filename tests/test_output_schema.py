"""The machine-readable output (docs/output.md): the fields each document holds are the ones its tables list, in
both directions, so the two cannot drift; every document is strict JSON, versioned, and names the same thing the
same way in every command."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import orjson
import pytest

from mlbench import registry, results, runner, schema
from mlbench.analysis.score import RcpResult, RunScore, SetScore
from mlbench.launch.events import Steps
from mlbench.launch.supervise import Outcome
from mlbench.planner import devices
from mlbench.planner import plan as planner
from mlbench.preflight import LayoutRequest, resolve_layout

DOC = Path(__file__).resolve().parents[1] / "docs" / "output.md"
_ROW = re.compile(r"^\| `([^`]+)` \| ([^|]*)\|")


def _tables() -> dict[str, list[tuple[str, str]]]:
    """Each heading of docs/output.md and its table's rows: (field, type)."""
    out: dict[str, list[tuple[str, str]]] = {}
    heading = ""
    for line in DOC.read_text().splitlines():
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
            out[heading] = []
        elif m := _ROW.match(line):
            out[heading].append((m[1], m[2].strip()))
    return out


def documented(section: str) -> tuple[set[str], set[str]]:
    """The fields SECTION lists, its → and ⇒ references expanded: (all, optional)."""
    tables = _tables()

    def expand(name: str) -> list[tuple[str, bool]]:
        rows: list[tuple[str, bool]] = []
        for path, kind in tables[name]:
            optional = "optional" in kind
            if ref := re.search(r"([→⇒]) \[([^]]+)\]", kind):
                parent = path.rpartition(".")[0] if "." in path else ""
                parent = parent if ref[1] == "⇒" else path
                if ref[1] == "→":
                    rows.append((path, optional))
                prefix = f"{parent}." if parent else ""
                rows += [(prefix + p, optional or o) for p, o in expand(ref[2])]
            else:
                rows.append((path, optional))
        return rows

    rows = expand(section)
    return {p for p, _ in rows}, {p for p, o in rows if o}


def emitted(doc: object, open_maps: set[str]) -> tuple[set[str], set[str]]:
    """DOC's field paths as docs/output.md writes them (`a.b`, `a[].b`, `a.*` for an open map), and the paths at
    which an object was found (whose documented fields must then be there)."""
    paths: set[str] = set()
    objects: set[str] = {""}

    def walk(v: object, p: str) -> None:
        if p in open_maps or (p and f"{p}.*" in open_maps):
            paths.add(f"{p}.*" if f"{p}.*" in open_maps else p)
            return
        if p:
            paths.add(p)
        if isinstance(v, dict):
            objects.add(p)
            for k, x in v.items():
                walk(x, f"{p}.{k}" if p else k)
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            if f"{p}[].*" in open_maps:
                paths.add(f"{p}[].*")
                return
            objects.add(f"{p}[]")
            for x in v:
                for k, y in x.items():
                    walk(y, f"{p}[].{k}")

    walk(doc, "")
    return paths, objects


def assert_agree(section: str, docs: list[object]) -> None:
    """Every field DOCS hold is documented in SECTION, and every field documented is there wherever its
    object is (unless optional)."""
    listed, optional = documented(section)
    open_maps = {p for p in listed if p.endswith(".*")}
    paths, objects = set(), set()
    for d in docs:
        p, o = emitted(d, open_maps)
        paths |= p
        objects |= o
    undocumented = paths - listed
    assert not undocumented, f"{section}: fields not in docs/output.md: {sorted(undocumented)}"
    parent = {p: (p.rpartition(".")[0]) for p in listed}
    missing = {p for p in listed - optional - paths if parent[p] in objects}
    assert not missing, f"{section}: docs/output.md lists fields not written: {sorted(missing)}"


def _record() -> dict:
    """A run record as mlbench publishes it (runner.record, written by results.record_text), from a run's events."""
    bench = registry.load("gpt3", tiny=True)
    layout = resolve_layout(bench, LayoutRequest())
    device = {"type": "cpu", "name": "x86_64", "per_node": 1, "precision": "fp32", "attention": "local"}
    full = registry.load("gpt3")  # a memory plan as the rank reports it
    full_layout = resolve_layout(full, LayoutRequest(nodes=64, nproc_per_node=8, tp=8, pp=8))
    memory = planner.evaluate(full, full_layout, devices.get("h100"))["memory"]
    events = [
        {"event": "start", "device": device, "mfu_note": "MFU is not defined on CPU"},
        {"event": "checkpoint_loaded", "time": 0.0, "path": "/ckpt", "renamed": 0, "example_name": None,
         "optimizer_state": True, "optimizer_note": "", "tensors": 10, "vocab_padding_resized": False,
         "saved_by": None},
        {"event": "step", "step": 1, "loss": float("nan"), "step_time": 0.1, "tokens_per_s": 1e4,
         "tflops_per_device": 0.01, "mfu": None, "lr": 1e-3, "grad_norm": float("inf")},
        {"event": "eval", "step": 1, "samples": 16, "value": 1.0},
        {"event": "memory", "estimated": memory,
         "measured": {"params_bytes": 1, "grads_bytes": 1, "optimizer_bytes": 2,
                      "activations_per_micro_batch_bytes": 3}},
        {"event": "checkpoint_saved", "path": "/out", "seconds": 1.5},
    ]
    verdict = SimpleNamespace(ok=True, rules="smoke rules", messages=[])
    env = {"packages": {"torch": "2"}, "python": "3.11", "commit": None, "host": "h", "platform": "p",
           "slurm_job_id": None}
    steps = Steps()  # the supervisor keeps rank 0's steps apart, as columns (launch.events.EventTail)
    for e in [e for e in events if e["event"] == "step"]:
        steps.add(e)
    outcome = Outcome("success", 0, events=[e for e in events if e["event"] != "step"], steps=steps)
    rec = runner.record(bench, layout, SimpleNamespace(seed=3), outcome, verdict, 90.0, env, "")
    return orjson.loads("".join(results.record_text(rec | {"result": "result_0.txt", "index": 0})))


def test_the_run_record_holds_the_fields_the_docs_list() -> None:
    """result_<i>.json: time to train in minutes as everywhere else (it was `time_to_train_s`, seconds, beside its
    own prediction's `time_to_train_min`), step time `step_time_s`, a schema_version; strict JSON with a NaN
    loss."""
    rec = _record()
    assert rec["schema_version"] == schema.SCHEMA_VERSION
    assert rec["time_to_train_min"] == pytest.approx(1.5) and "time_to_train_s" not in rec
    assert rec["steps"][0]["step_time_s"] == 0.1 and rec["steps"][0]["loss"] is None
    assert_agree("The run record", [rec])


def _score_doc() -> dict:
    run = RunScore("result_0.txt", "success", 12.5, True, 1_000_000, 2048, "gpt3", True, [], [])
    return SetScore("gpt3", "4.1.0", "/r/gpt3", "s/gpt3", "s", "closed", 8, "run record", [run], 3, 12.5,
                    RcpResult("Pass", "RCP found", 1.0, None, "Pass"), 1.0, 12.5, 12.5, ["n"], 2048).to_json()


def test_score_json_holds_the_fields_the_docs_list_named_as_elsewhere() -> None:
    """score --json named a run's time to train `ttt_min` and its batch `global_batch`, where the record and plan
    say time_to_train_min and global_batch_size."""
    doc = _score_doc()
    assert doc["schema_version"] == schema.SCHEMA_VERSION
    assert doc["runs"][0]["time_to_train_min"] == 12.5 and doc["runs"][0]["global_batch_size"] == 2048
    assert doc["global_batch_size"] == 2048 and doc["runs_required"] == 3
    assert_agree("score --json", [doc])


def test_plan_json_holds_the_fields_the_docs_list_and_says_its_kind(cli) -> None:
    """plan --json's three documents (a layout, a search, a scaling curve) told apart only by their keys; now
    `kind` says which, and each is versioned."""
    docs = []
    for kind, args in (("layout", ["--nodes", "64", "--tp", "8", "--pp", "8"]), ("search", ["--nodes", "8"]),
                       ("scaling", ["--nodes", "8,64", "--tp", "8", "--pp", "8"])):
        proc = cli("plan", "gpt3", "--device", "h100", "--nproc-per-node", "8", "--json", *args)
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr
        doc = orjson.loads(proc.stdout)
        assert doc["kind"] == kind and doc["schema_version"] == schema.SCHEMA_VERSION
        docs.append(doc)
    cpu = cli("plan", "gpt3", "--tiny", "--device", "cpu", "--tp", "1", "--json")
    assert cpu.returncode == 0, cpu.stderr
    docs.append(orjson.loads(cpu.stdout))
    assert_agree("plan --json", docs)


def test_plan_json_gives_the_time_to_train_once(cli) -> None:
    """plan --json gave time_to_train_min twice: at the top and inside time_to_train (schema_version 2 keeps the
    top one, the name every document uses)."""
    doc = orjson.loads(cli("plan", "gpt3", "--device", "h100", "--nproc-per-node", "8", "--nodes", "64", "--tp",
                           "8", "--pp", "8", "--json").stdout)
    assert doc["time_to_train_min"] > 0 and doc["time_to_train"]["steps"] > 0
    assert "time_to_train_min" not in doc["time_to_train"]


def test_score_json_gives_samples_to_converge_as_a_count(cli) -> None:
    """score --json wrote a run's samples_to_converge as a float (172000.0), though it is a count."""
    proc = cli("score", AMD, "--json")
    assert proc.returncode == 0, proc.stderr
    doc = orjson.loads(proc.stdout)[0]
    counts = [r["samples_to_converge"] for r in doc["runs"]]
    assert counts[0] == 172000 and all(type(c) is int for c in counts), counts


def test_show_json_holds_the_fields_the_docs_list(cli) -> None:
    docs = []
    for name in ("gpt3", "gpt_oss_20b"):
        for tiny in ([], ["--tiny"]):
            proc = cli("show", name, "--json", *tiny)
            assert proc.returncode == 0, proc.stderr
            docs.append(orjson.loads(proc.stdout))
    assert docs[0]["schema_version"] == schema.SCHEMA_VERSION
    assert_agree("show --json", docs)


def test_the_records_config_is_what_show_gives(cli) -> None:
    """The record's `config` is show --json's definition without the counts (docs/output.md says so)."""
    shown = orjson.loads(cli("show", "gpt3", "--tiny", "--json").stdout)
    config = _record()["config"]
    assert set(shown) - {"schema_version", "params_total", "flops_per_sample"} == set(config)


def test_a_name_that_is_not_utf8_is_strict_json_in_every_document(cli, tmp_path: Path, monkeypatch) -> None:
    """show --json and plan --json (and the run record) wrote a path's undecodable byte as \\udcff, which strict
    parsers refuse (orjson: 'invalid high surrogate'); score --json alone wrote \\xff. Now all of them do."""
    folder = tmp_path / "b\udcffü"
    shutil.copytree(registry.ROOT / "benchmarks", folder)
    monkeypatch.setattr(registry, "BENCHMARKS_DIR", folder)
    proc = cli("show", "gpt3", "--tiny", "--json")
    assert proc.returncode == 0, proc.stderr
    assert orjson.loads(proc.stdout)["path"].startswith(f"{tmp_path}/b\\xffü/")
    assert orjson.loads(schema.dumps({"p": "x\udcff", "n": [float("nan"), float("-inf")], 1: 2})) \
        == {"p": "x\\xff", "n": [None, None], "1": 2}


def test_huge_numbers_and_unicode_names_round_trip() -> None:
    big = {"samples": 10**30, "name": "système 🚀", "tiny": 5e-324}
    assert json.loads(schema.dumps(big)) == big == orjson.loads(schema.dumps(big)) | {"samples": 10**30}


V51 = Path(__file__).resolve().parent / "data/mlperf-results/training_results_v5.1"
AMD = V51 / "AMD/results/MI355X_EPYC_9575F_pytorch/llama31_8b"
UF = V51 / "University-of-Florida/results/hpg.dgxb200x8.n32/llama31_8b"


def _document(proc) -> dict:
    """The one document a --json command wrote on stdout, nothing on stderr."""
    assert proc.returncode == 0 and proc.stderr == "", proc.stdout + proc.stderr
    doc = orjson.loads(proc.stdout)
    assert doc["schema_version"] == schema.SCHEMA_VERSION
    return doc


def test_compare_json_holds_the_fields_the_docs_list(cli) -> None:
    """compare had only its tables: a script scraped them. Now --json: two scored sets (their RCP), and a set, a
    run and a published row unscored; named as score and plan name the same things."""
    scored = _document(cli("compare", AMD, UF, "--json"))
    mixed = _document(cli("compare", AMD, UF / "result_1.txt", "published:nvidia-eos-gpt3-v3.1", "--no-score",
                          "--json"))
    amd, uf = scored["entries"]
    assert amd["time_to_train_from"] == "score" and amd["rcp"]["status"] == "Pass" and amd["devices"] == 8
    assert amd["global_batch_size"] == 32 and amd["time_to_train_min"] == pytest.approx(99.7085, abs=1e-3)
    assert uf["step_times_from"] == "tracked_stats" and "global_batch_size" in scored["differing_hyperparameters"]
    assert [e["kind"] for e in mixed["entries"]] == ["set", "run", "published"]
    assert mixed["entries"][0]["rcp"] is None and mixed["entries"][2]["time_to_train_min"] == pytest.approx(3.92)
    assert_agree("compare --json", [scored, mixed])


def test_scaling_json_holds_the_fields_the_docs_list(cli, tmp_path: Path) -> None:
    """scaling --json: AMD's set at 8 and (a copy) at 16 devices share a global batch (a per-step curve), and at 8
    it shares a per-device batch with Florida's at 32 (a weak curve)."""
    copy = tmp_path / "copy" / "AMD"
    shutil.copytree(V51 / "AMD", copy)
    doc = _document(cli("scaling", AMD, copy / AMD.relative_to(V51 / "AMD"), UF,
                        "--devices", "8", "--devices", "16", "--devices", "32", "--json"))
    assert [p["devices"] for p in doc["points"]] == [8, 16, 32] and doc["benchmark"] == "llama31_8b"
    (step,), (weak,) = doc["strong_per_step"], doc["weak"]
    assert step["global_batch_size"] == 32 and step["points"][0]["efficiency"] == 1.0
    assert weak["per_device_batch_size"] == 4 and [p["devices"] for p in weak["points"]] == [8, 32]
    strong = doc["strong_time_to_train"]["points"]
    assert strong[2]["speedup"] == pytest.approx(99.3101 / 10.0044, abs=1e-3) and strong[2]["ideal_speedup"] == 4
    assert_agree("scaling --json", [doc])


def test_check_json_holds_the_fields_the_docs_list_and_exits_as_check(cli, tmp_path: Path) -> None:
    """check --json: every verdict whole, and the exit code check gives (1: a file failed), the document
    written."""
    passed = _document(cli("check", AMD / "result_0.txt", "--json"))
    assert passed["ok"] is True and passed["files"][0]["rules"] == "training 5.1.0 rules"
    bad = tmp_path / "training_results_v5.1" / "result_0.txt"
    bad.parent.mkdir()
    bad.write_text("".join(ln for ln in (AMD / "result_0.txt").read_text().splitlines(True) if "run_stop" not in ln))
    proc = cli("check", bad, "--json")
    assert proc.returncode == 1 and proc.stderr == "", proc.stderr
    failed = orjson.loads(proc.stdout)
    assert failed["ok"] is False and failed["files"][0]["ok"] is False
    assert any("run_stop" in m for m in failed["files"][0]["messages"])
    assert_agree("check --json", [passed, failed])


def test_analysis_json_errors_go_to_stderr_and_reports_beside_it(cli, tmp_path: Path) -> None:
    """As score --json: an error is one line on stderr, exit 2, no document. With --html the report is written
    and its 'wrote' line goes to stderr, the document alone on stdout."""
    for args in (("compare", AMD, tmp_path / "none"), ("scaling", AMD, tmp_path / "none"),
                 ("check", tmp_path / "none")):
        proc = cli(*args, "--json")
        assert (proc.returncode, proc.stdout) == (2, ""), proc.stdout
        assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
    html = tmp_path / "s.html"
    proc = cli("scaling", AMD, UF, "--json", "--html", html)
    assert proc.returncode == 0 and proc.stderr == f"wrote {html}\n", proc.stderr
    assert orjson.loads(proc.stdout)["benchmark"] == "llama31_8b" and html.stat().st_size > 0
