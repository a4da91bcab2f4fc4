"""What a hostile user does around a run rather than to its input: closes its stdout, kills mlbench at the worst
moment and leaves a dead run's staging folder unreadable. Each is cheap: in-process, or a command that trains
nothing."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import MLBENCH, mllog

from mlbench import terminal
from mlbench.progress import Progress

# ---- stdout closed (`>&-`): what nobody can read is dropped, the run goes on --------------------------------

_START = {"event": "start", "budget": 10, "target": 3.0, "metric": "log_perplexity", "direction": "min",
          "device": {"type": "cpu", "name": "x86", "precision": "fp32", "attention": "local"}}


def test_a_console_prints_nothing_and_fails_nothing_without_a_stdout(monkeypatch: pytest.MonkeyPatch) -> None:
    """Python sets sys.stdout to None when the command starts with fd 1 closed; the progress lines of a run crashed
    the supervisor (AttributeError: 'NoneType' object has no attribute 'write') right after run_start, its ranks
    were SIGTERMed and nothing was published."""
    monkeypatch.setattr(sys, "stdout", None)
    console = terminal.console()
    console.print("a line nobody reads")
    with Progress("gpt3 run 1/1", console) as progress:
        progress.on_events([_START, {"event": "eval", "value": 2.5, "step": 4}])
    console.file.flush()


def test_a_run_of_a_set_is_named_without_a_terminal() -> None:
    """`mlbench run --runs 3 | tee log` (CI, a SLURM output file): the runs' lines followed one another with
    nothing saying which run or seed each block was (the live panel's title, on a terminal only). A run of a set
    now begins with its title line; a set of one run prints none (its one block is the run)."""
    import io

    from rich.console import Console

    plain = "training on cpu x (fp32, local attention)"
    for announce, first in ((True, "gpt3 (tiny) run 2/3, seed 6"), (False, plain)):
        console = Console(file=io.StringIO(), width=1 << 20)
        with Progress("gpt3 (tiny) run 2/3, seed 6", console, announce=announce) as progress:
            progress.on_events([{**_START, "device": {"type": "cpu", "name": "x", "precision": "fp32",
                                                      "attention": "local"}}])
        assert console.file.getvalue().splitlines()[0] == first, console.file.getvalue()


def test_a_save_stopped_by_another_ranks_failure_is_not_shown_as_its_own_reason() -> None:
    """kill -9 of rank 1 while the checkpoint was saved: the live line said 'checkpoint NOT saved to X: Aborted:
    signal SIGTERM' (rank 0's words, stopped by its launcher), and the summary below it 'rank 1 killed by SIGKILL'."""
    import io

    from rich.console import Console

    console = Console(file=io.StringIO(), width=1 << 20)
    with Progress("gpt3 run 1/1", console) as progress:
        progress.on_events([{"event": "checkpoint_failed", "path": "/c", "reason": "Aborted: signal SIGTERM",
                             "consequent": True},
                            {"event": "checkpoint_failed", "path": "/d", "reason": "OSError: no room"}])
    assert console.file.getvalue() == ("checkpoint NOT saved to /c: another process of the run failed (named below)\n"
                                       "checkpoint NOT saved to /d: OSError: no room\n"), console.file.getvalue()


def _closed_stdout() -> None:
    os.close(1)


@pytest.mark.parametrize("args", [["list"], ["show", "gpt3"], ["run", "gpt3", "--tiny", "--dry-run", "--results",
                                                               "{tmp}"]], ids=["list", "show", "run-dry-run"])
def test_commands_run_to_their_end_with_stdout_closed(args: list[str], tmp_path) -> None:
    args = [a.format(tmp=tmp_path) for a in args]
    proc = subprocess.run([*MLBENCH, *args], stdout=None, stderr=subprocess.PIPE, text=True, timeout=120,
                          preexec_fn=_closed_stdout)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr


def test_a_closed_standard_stream_is_held_on_dev_null() -> None:
    """With fd 1 closed, the first file mlbench opened took number 1, and a process started after (without its own
    stdout) wrote its output into that file: mlbench holds the number on /dev/null first."""
    code = ("import contextlib, os, sys\nfrom mlbench import cli\nsys.argv = ['mlbench', 'list']\n"
            "with contextlib.suppress(SystemExit):\n    cli.main()\n"
            "sys.stderr.write(f\"{os.open(os.devnull, os.O_RDONLY)} {os.readlink('/proc/self/fd/1')}\")")
    proc = subprocess.run([sys.executable, "-c", code], stdout=None, stderr=subprocess.PIPE, text=True, timeout=60,
                          preexec_fn=_closed_stdout)
    fd, held = proc.stderr.split()
    assert int(fd) > 2 and held == os.devnull, proc.stderr


# ---- a dead run's staging folder: published from what can be read, never in the next run's way -------------


def _not_published_yet(staging: Path) -> str:
    """What analysis says of the one run in STAGING that its mlbench did not publish."""
    return (f"1 run(s) whose mlbench process died or could not publish them are not published yet ({staging.name}): "
            f"not read until the next `mlbench run` in this folder publishes them")


def _dead_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_stop: str | None,
              plan_json: str | None = None) -> tuple[Path, Path]:
    """(results folder, staging folder) of a tiny gpt3 run whose mlbench died (kill -9) with its log at run_start,
    or at run_stop with status RUN_STOP; PLAN_JSON in place of its plan where given."""
    from mlbench import layout as layout_lib
    from mlbench import mlperf_log, owners, rcp_schedule, registry, results
    from mlbench.mlperf_log import C
    from mlbench.run_plan import RunPlan

    folder = tmp_path / "vm" / "gpt3"
    folder.mkdir(parents=True)
    staging = results.stage(folder)
    bench = registry.load("gpt3", tiny=True)
    layout = layout_lib.resolve(bench)
    bench = rcp_schedule.for_run(bench, layout.global_batch_size)
    plan = RunPlan(benchmark=bench, layout=layout.as_dict(), seed=7, run_dir=str(staging), system="vm")
    plan.save(staging / "plan.json")
    log = mlperf_log.write_preamble(plan)
    log.end(C.INIT_STOP)
    log.start(C.RUN_START)
    if run_stop:
        log.event(C.TRAIN_SAMPLES, value=1024)
        log.end(C.RUN_STOP, metadata={"status": run_stop})
    log.close()
    (staging / "events.jsonl").write_text(json.dumps({"event": "step", "step": 1, "loss": 4.8}) + "\n")
    if plan_json is not None:
        (staging / "plan.json").write_text(plan_json)
    monkeypatch.setattr(owners, "gone", lambda tag: True)  # its owner is dead (as after kill -9)
    # every owner is played dead here: the temp folder is the test's own, so other processes' checks in /tmp keep
    # their scratch folders (compliance._remove_dead_scratch)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)
    return folder, staging


def _publish_dead(folder: Path) -> tuple[str, dict, Path]:
    """What the next command in FOLDER says of the dead run, its record and its result."""
    from rich.console import Console

    from mlbench import dead_runs

    console = Console(record=True, width=1 << 20, file=io.StringIO())
    (placed,) = dead_runs.publish(folder, console)
    return console.export_text(), json.loads(placed.with_suffix(".json").read_text()), placed


def test_a_run_killed_after_run_stop_success_is_published_as_the_success_its_log_says(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """kill -9 of mlbench after rank 0 wrote run_stop success: the record said aborted ('died before the run
    ended', exit_code null) while the log said success and `score` counted it as one. The log's status stands, and
    error_after_run_stop says apart that mlbench died after the run ended."""
    folder, _ = _dead_run(tmp_path, monkeypatch, run_stop="success")
    said, record, placed = _publish_dead(folder)
    assert record["status"] == "success" and record["reason"] == "" and record["exit_code"] is None, record
    assert "died after the run ended (run_stop success)" in record["error_after_run_stop"], record
    assert "after the run ended" in said, said
    stops = [e for e in mllog(placed) if e["key"] == "run_stop"]
    assert [s["metadata"]["status"] for s in stops] == ["success"]  # the log left as it was


@pytest.mark.parametrize("status", ["success", "aborted", None])
def test_a_run_kept_because_it_could_not_be_published_is_not_said_to_have_died(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, status: str) -> None:
    """A run whose mlbench lived to its end but could not publish it nor set it aside (no inode left) keeps its
    staging folder for the next command: that one published it as one 'whose mlbench process had died', and the
    record said mlbench died. It says why the run was not published when it ended."""
    from types import SimpleNamespace

    from rich.console import Console

    from mlbench import results, runner
    from mlbench.launch.supervise import Outcome

    folder, staging = _dead_run(tmp_path, monkeypatch, run_stop=status)
    with monkeypatch.context() as m:
        m.setattr(results, "set_aside", lambda folder, staging: None)  # (mkdir of logs/: no inode left)
        runner.RunSet._not_published(SimpleNamespace(folder=folder, console=Console(file=io.StringIO())),
                                     "run not published: No space left on device", staging,
                                     Outcome(status=status, exit_code=0))
    said, record, placed = _publish_dead(folder)
    why = "could not publish the run when it ended (run not published: No space left on device)"
    # (no run_stop: the supervisor could not close the log either, the disk full; closed now, as aborted)
    how = f"its log: run_stop {status}" if status else "its log had no run_stop: as aborted"
    assert "died" not in said and "its mlbench could not publish when it ended (run not published: No space " \
        f"left on device; {how})" in said, said
    assert record["status"] == (status or "aborted"), record
    assert why in (record["error_after_run_stop"] if status == "success" else record["reason"]), record
    assert "died" not in json.dumps(record), record
    stops = [e for e in mllog(placed) if e["key"] == "run_stop"]
    assert len(stops) == 1 and stops[0]["metadata"]["status"] == (status or "aborted"), stops


def test_a_run_not_published_in_a_folder_made_read_only_is_not_said_to_have_died(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The results folder remounted read-only as a run ended: its mlbench could not publish it, set it aside, nor
    append why to its events ('Read-only file system'), so once the folder was writable again the next command
    published it as a run whose 'mlbench (pid N) died after the run ended'. Its reason is kept in the user's cache
    for that command, which then says it (and drops it)."""
    import builtins
    from types import SimpleNamespace

    from rich.console import Console

    from mlbench import results, runner
    from mlbench.launch.supervise import Outcome

    folder, staging = _dead_run(tmp_path, monkeypatch, run_stop="success")
    monkeypatch.setenv("MLBENCH_CACHE", str(tmp_path / "cache"))
    real_open = builtins.open

    def read_only(file, mode="r", *args, **kwargs):
        if str(file).startswith(str(folder)) and mode != "r" and mode != "rb":
            raise OSError(30, "Read-only file system", str(file))
        return real_open(file, mode, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(results, "set_aside", lambda folder, staging: None)  # (a rename on a read-only folder)
        m.setattr(builtins, "open", read_only)
        runner.RunSet._not_published(SimpleNamespace(folder=folder, console=Console(file=io.StringIO())),
                                     "run not published: Read-only file system (mlperf.log)", staging,
                                     Outcome(status="success", exit_code=0))
    said, record, _ = _publish_dead(folder)
    assert "died" not in said and "could not publish when it ended (run not published: Read-only file system" \
        in said, said
    assert "could not publish the run when it ended (run not published: Read-only file system (mlperf.log))" in \
        record["error_after_run_stop"] and "died" not in json.dumps(record), record
    assert not list((tmp_path / "cache" / "not-published").iterdir())  # said once: dropped with the run published


@pytest.mark.parametrize("reason", [None, "", {"x": 1}])
def test_a_not_published_event_without_a_reason_still_says_the_run_was_not_published(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reason: object) -> None:
    """A garbled event (a null, empty or non-string reason) was passed over ('had died') or its repr printed."""
    folder, staging = _dead_run(tmp_path, monkeypatch, run_stop="success")
    with open(staging / "events.jsonl", "a") as f:
        f.write(json.dumps({"event": "not_published", "reason": reason}) + "\n")
    said, record, _ = _publish_dead(folder)
    assert "died" not in said and "could not publish when it ended (its reason not recorded; " in said, said
    assert "(its reason not recorded)" in record["error_after_run_stop"], record


def test_a_run_killed_after_rank_0_logged_it_aborted_keeps_the_logs_reason(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder, _ = _dead_run(tmp_path, monkeypatch, run_stop="aborted")
    _, record, placed = _publish_dead(folder)
    assert record["status"] == "aborted" and "died before the run ended" in record["reason"], record
    assert [e["metadata"]["status"] for e in mllog(placed) if e["key"] == "run_stop"] == ["aborted"]


@pytest.mark.parametrize("log", ["missing", "empty"])
def test_a_run_killed_before_rank_0_began_its_log_is_published_as_aborted(
        log: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """kill -9 of mlbench while its ranks imported: the staging folder held the plan and the rank logs but no
    MLPerf log yet, and the next command deleted it without a word (SIGTERM at the same moment publishes an aborted
    run). The log is begun from the plan and closed as aborted, as the supervisor does for a rank that dies
    importing; a node of a multi-node run and a dry run, whose logs are not theirs to begin, are still removed."""
    from mlbench import results

    folder, staging = _dead_run(tmp_path, monkeypatch, run_stop=None)
    (staging / "mlperf.log").unlink()
    (staging / "events.jsonl").unlink()
    if log == "empty":
        (staging / "mlperf.log").write_text("")
    said, record, placed = _publish_dead(folder)
    assert "as aborted" in said and record["status"] == "aborted" and record["exit_code"] is None, said
    assert "died before the run ended" in record["reason"] and record["seed"] == 7, record
    events = mllog(placed)
    assert events[0]["key"] == "cache_clear" and [e["key"] for e in events][-2:] == ["train_samples", "run_stop"]
    assert {"global_batch_size", "seed", "submission_benchmark"} <= {e["key"] for e in events}
    assert not staging.exists()
    for change in ({"dry_run": True}, {"layout": {"nodes": 2}}):  # not this folder's log to begin
        folder, staging = _dead_run(tmp_path / str(change), monkeypatch, run_stop=None)
        (staging / "mlperf.log").unlink()
        plan = json.loads((staging / "plan.json").read_text())
        plan |= {k: plan[k] | v if isinstance(v, dict) else v for k, v in change.items()}
        (staging / "plan.json").write_text(json.dumps(plan))
        assert results.dead_runs(folder) == [] and results.remove_stale(folder) == [staging], change


_BAD_PLANS = {
    "unknown-key": lambda p: p | {"benchmark": p["benchmark"] | {"model": p["benchmark"]["model"] | {"new": 1}}},
    "missing-key": lambda p: {k: v for k, v in p.items() if k != "seed"},
    "layout-not-an-object": lambda p: p | {"layout": "x"},
    "layout-size-not-a-count": lambda p: p | {"layout": p["layout"] | {"tp": "x"}},
    "deeply-nested": lambda p: "[" * 100_000 + "]" * 100_000,
    "not-json": lambda p: "{plan",
    # read whole before (3 GB: a MemoryError), a valid plan of 65 MiB was taken as it was
    "over-64-MiB": lambda p: p | {"system": "x" * (65 << 20)},
}


@pytest.mark.parametrize("bad", list(_BAD_PLANS))
def test_a_dead_run_whose_plan_cannot_be_read_is_published_from_its_log(
        bad: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan.json another version of mlbench wrote, or a garbled one, blocked every later run in the folder: an
    error naming neither the staging folder nor what to do (spec's unknown or missing key), or a traceback
    (AttributeError in Layout.from_dict, RecursionError). The log is the source of truth: the run is published as
    aborted with the benchmark and layout its log states, and the line says the plan could not be read."""
    folder, staging = _dead_run(tmp_path, monkeypatch, run_stop=None)
    plan = json.loads((staging / "plan.json").read_text())
    changed = _BAD_PLANS[bad](plan)
    (staging / "plan.json").write_text(changed if isinstance(changed, str) else json.dumps(changed))
    said, record, _ = _publish_dead(folder)
    assert "its plan.json could not be read" in said and "\n" not in said.strip(), said
    assert record["status"] == "aborted" and record["variant"] == "tiny" and record["seed"] == 7, record
    assert record["layout"]["global_batch_size"] == plan["layout"]["global_batch_size"], record["layout"]
    assert record["layout"]["source"].startswith("its MLPerf log"), record["layout"]
    assert not staging.exists()


def test_a_dead_run_that_cannot_be_published_is_set_aside_and_the_next_run_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither its plan nor its log says what run it was: set aside under logs/ in one line naming it, not a
    traceback or an error that stops the run that found it."""
    from rich.console import Console

    from mlbench import dead_runs

    folder, staging = _dead_run(tmp_path, monkeypatch, run_stop=None, plan_json="{")
    (staging / "mlperf.log").write_text(':::MLLOG {"key": "run_start", "value": ' + "[" * 100_000 + "]" * 100_000
                                        + "}\n")
    console = Console(record=True, width=1 << 20, file=io.StringIO())
    assert dead_runs.publish(folder, console) == []
    said = console.export_text()
    kept = folder / "logs" / f"unpublished-{staging.name.lstrip('.')}"
    assert f"({staging.name}) could not be published" in said and str(kept) in said, said
    assert (kept / "mlperf.log").is_file() and not staging.exists()
    assert dead_runs.publish(folder, console) == []  # never found again


@pytest.mark.parametrize("text", ["{garbled", "[1, 2]", "[" * 100_000 + "]" * 100_000])
def test_a_record_placed_by_a_killed_publisher_is_finished_whatever_it_holds(
        text: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A publisher killed between its two links left the record without its log; the next command links the log
    after it. Its status was read with json.loads(...).get: a record garbled since (not JSON, not an object,
    nested too deep) raised out of remove_stale, and no later run could start in the folder."""
    from mlbench import results

    folder, staging = _dead_run(tmp_path, monkeypatch, run_stop="success")
    (staging / "result_0.json").write_text(text)
    os.link(staging / "result_0.json", folder / "result_0.json")
    (staging / "ranks").mkdir()
    assert results.remove_stale(folder) == [staging]
    assert (folder / "result_0.txt").is_file() and (folder / "logs" / "result_0").is_dir()


def test_the_supervisor_reads_only_events_from_the_events_file(tmp_path: Path) -> None:
    """A line of the events file nested past the JSON parser's depth raised RecursionError out of the live
    supervisor's poll, and a line of JSON that is not an object became an "event" its readers call .get on."""
    from mlbench.launch.supervise import EventTail

    events = tmp_path / "events.jsonl"
    events.write_text("[" * 100_000 + "]" * 100_000 + '\n[1, 2]\n"step"\n{"event": "start"}\n{"event": "st')
    tail = EventTail(events)
    assert tail.poll() == [{"event": "start"}] and tail.events == [{"event": "start"}]


@pytest.mark.parametrize("how", ["missing", "a-folder"])
def test_a_dead_run_without_a_plan_file_is_published_from_its_log(
        how: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """plan.json removed (or a folder in its place): the dead run was taken for no run at all and deleted with its
    begun log, silently. Its log says the rest, as for a garbled plan."""
    folder, staging = _dead_run(tmp_path, monkeypatch, run_stop=None)
    (staging / "plan.json").unlink()
    if how == "a-folder":
        (staging / "plan.json").mkdir()
    said, record, _ = _publish_dead(folder)
    assert "its plan.json could not be read" in said, said
    assert record["status"] == "aborted" and record["variant"] == "tiny", record
    assert not staging.exists()


def test_a_dead_run_on_a_full_disk_is_set_aside_not_deleted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No room to place its record: the dead run was deleted ('nothing of it was left'). A rename needs no room: it
    is moved to logs/unpublished-<name>, and the line says so and how much room is left."""
    import errno

    from rich.console import Console

    from mlbench import dead_runs, results

    folder, staging = _dead_run(tmp_path, monkeypatch, run_stop=None)
    (folder / "logs").mkdir()

    def full(src, dst, *a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dst))

    monkeypatch.setattr(results.os, "link", full)
    console = Console(record=True, width=1 << 20, file=io.StringIO())
    assert dead_runs.publish(folder, console) == []
    said = console.export_text()
    kept = folder / "logs" / f"unpublished-{staging.name.lstrip('.')}"
    assert "No space left on device" in said and str(kept) in said and "MB free" in said, said
    assert (kept / "mlperf.log").is_file() and not staging.exists()


def test_a_dead_runs_partial_checkpoint_save_is_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """kill -9 while the checkpoint was saved: the run was published, its `.c1.partial-<owner>` left for ever."""
    from mlbench.train.checkpoint import folder as checkpoint_folder

    folder, staging = _dead_run(tmp_path, monkeypatch, run_stop="success")
    dest = tmp_path / "ckdir" / "c1"
    partial = dest.parent / f"{checkpoint_folder.partial_prefix(dest)}99999-1-host"
    (partial / "x").mkdir(parents=True)
    with open(staging / "events.jsonl", "a") as f:
        f.write(json.dumps({"event": "checkpoint_saving", "path": str(dest)}) + "\n")
    _, record, _ = _publish_dead(folder)
    assert "died while the checkpoint was saved" in record["checkpoint_error"], record
    assert not partial.exists()


def _publish_dead_after(barrier, folder: Path, out) -> None:
    from rich.console import Console

    from mlbench import dead_runs

    barrier.wait()
    out.put([str(p) for p in dead_runs.publish(folder, Console(file=io.StringIO()))])


def test_a_dead_run_is_published_once_by_two_commands_started_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two `mlbench run`s started at once in a folder where a run's mlbench had died: each published the dead run
    (result_0 and result_1, the same log, two run_stop lines appended to it), or one removed the staging folder
    under the other's feet. The first to claim it publishes it; the other passes it over."""
    import multiprocessing

    folder, staging = _dead_run(tmp_path, monkeypatch, run_stop=None)
    ctx = multiprocessing.get_context("fork")  # (the monkeypatched owners.gone goes with it)
    barrier, out = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_publish_dead_after, args=(barrier, folder, out)) for _ in range(2)]
    for proc in procs:
        proc.start()
    placed = sorted(p for _ in procs for p in out.get(timeout=120))
    for proc in procs:
        proc.join(30)
    assert placed == [str(folder / "result_0.txt")], placed
    assert sorted(p.name for p in folder.iterdir()) == ["result_0.json", "result_0.txt"]
    assert [e["key"] for e in mllog(folder / "result_0.txt")].count("run_stop") == 1


def test_a_dead_run_published_again_after_its_publisher_was_killed_says_why_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The publisher killed during the compliance check (after it closed the log): the next one wrote the 'died
    ... published as aborted' sentence into the record twice. Its reason is the log's."""
    from rich.console import Console

    from mlbench import dead_runs, runner

    folder, staging = _dead_run(tmp_path, monkeypatch, run_stop=None)

    class Killed(BaseException):
        pass

    def killed(*a, **k):
        raise Killed

    checker = runner.compliance_verdict
    monkeypatch.setattr(runner, "compliance_verdict", killed)
    with pytest.raises(Killed):
        dead_runs.publish(folder, Console(file=io.StringIO()))
    monkeypatch.setattr(runner, "compliance_verdict", checker)
    _, record, placed = _publish_dead(folder)
    assert record["reason"].count("died before the run ended") == 1, record["reason"]
    (stop,) = [e for e in mllog(placed) if e["key"] == "run_stop"]
    assert stop["metadata"]["reason"] == record["reason"]


def test_a_dead_runs_log_that_is_a_link_is_never_written_through(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """mlperf.log a symlink to a file outside the results: its last line was cut, run_stop appended to it, and
    result_0.txt published as the link. Set aside, the file it points to untouched."""
    from rich.console import Console

    from mlbench import dead_runs

    folder, staging = _dead_run(tmp_path, monkeypatch, run_stop=None)
    victim = tmp_path / "victim.txt"
    victim.write_text((staging / "mlperf.log").read_text() + "cut")
    (staging / "mlperf.log").unlink()
    (staging / "mlperf.log").symlink_to(victim)
    before = victim.read_text()
    console = Console(record=True, width=1 << 20, file=io.StringIO())
    assert dead_runs.publish(folder, console) == []
    said = console.export_text()
    assert "is a link" in said and "unpublished-" in said, said
    assert victim.read_text() == before and not list(folder.glob("result_*"))


def test_a_conversion_that_crashes_is_one_error_line_on_stderr(tmp_path: Path, cli, monkeypatch) -> None:
    """A converter that crashed printed 'error: conversion failed: ...' on stdout, its helper's last line raw (a
    control character in it reached the terminal). It is the command's error line now: stderr, escaped, exit 1 (a
    failure of the system, not bad input), nothing on stdout."""
    from mlbench import helper_process

    def crash(*args: str, **kw) -> dict:
        raise helper_process.HelperFailed("RuntimeError: boom\x1b[2J")

    monkeypatch.setattr(helper_process, "run_json", crash)
    (tmp_path / "src.pt").write_bytes(b"x")
    proc = cli("convert-checkpoint", "bert", tmp_path / "src.pt", tmp_path / "cv", "--tiny")
    assert (proc.returncode, proc.stdout) == (1, ""), (proc.stdout, proc.stderr)
    assert proc.stderr == "error: conversion failed: RuntimeError: boom\\x1b[2J\n", proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src.pt"]


def test_a_conversion_that_fails_to_save_removes_its_partial_folder_and_says_the_room_left(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """convert-checkpoint on a full disk: 'conversion failed: [rank0]: RuntimeError: Worker failure: [enforce fail
    at inline_container.cc:672] . unexpected pos 704 vs 598', and `.cv.partial-<pid>-...` left holding the disk.
    The partial folder goes, and the line says how much room the disk has."""
    from mlbench import owners
    from mlbench.train.checkpoint import convert_bert
    from mlbench.train.checkpoint.folder import partial_prefix

    dest = tmp_path / "cv"

    def full(path, *a, **k):
        partial = dest.with_name(f"{partial_prefix(dest)}{owners.tag()}")
        partial.mkdir()
        (partial / "__0_0.distcp").write_bytes(b"x" * 598)
        raise RuntimeError("Worker failure: [enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")

    monkeypatch.setattr(convert_bert.checkpoint, "save", full)
    with pytest.raises(convert_bert.SaveFailed, match=r"cv not saved: RuntimeError: Worker failure.* \(the disk "
                                                      r"holding .* has [\d,.]+ MB free\); nothing of it was left"):
        convert_bert.save(dest, None, {})
    assert list(tmp_path.iterdir()) == []


def test_score_says_a_dead_run_is_not_published_yet_and_leaves_it(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder whose run's mlbench was killed scored one run fewer, without a word: analysis never writes the
    folder (the next `mlbench run` there publishes the run), so score says so."""
    import shutil

    from mlbench.analysis import score

    folder, staging = _dead_run(tmp_path, monkeypatch, run_stop="success")
    published = (Path(__file__).parent / "data" / "mlperf-results" / "training_results_v5.1" / "AMD" / "results"
                 / "MI355X_EPYC_9575F_pytorch" / "llama31_8b" / "result_0.txt")
    shutil.copy(published, folder / "result_0.txt")
    [s] = score.score_path(folder, "6.0.0", jobs=1)
    said = [n for n in s.notes if "whose mlbench process died" in n]
    assert said == [_not_published_yet(staging)], s.notes
    assert staging.is_dir() and sorted(p.name for p in folder.iterdir()) == sorted([staging.name, "result_0.txt"])


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP", "SIGINT"])
def test_a_stop_signal_as_the_results_folder_is_made_leaves_no_folder(tmp_path: Path, monkeypatch, capsys,
                                                                      sig: str) -> None:
    """A signal in the first fraction of a second (before the supervisor's handlers): SIGTERM's and SIGHUP's
    default killed mlbench with its new, empty results folders left for good; Ctrl-C left them too, where it came
    before the folder's clean-up was armed. Now each ends the command with 128 + the signal, nothing left."""
    import signal

    from conftest import mlbench_in_process

    from mlbench import dead_runs

    def signalled(folder, console):
        os.kill(os.getpid(), getattr(signal, sig))  # as the folder was just made
        return []

    monkeypatch.setattr(dead_runs, "publish", signalled)
    code, out, err = mlbench_in_process(monkeypatch, capsys, "run", "gpt3", "--tiny", "--dry-run", "--results",
                                        tmp_path / "r", "--system", "ci")
    assert code == 128 + getattr(signal, sig) and "Traceback" not in out + err, out + err
    assert not (tmp_path / "r").exists()


def test_a_folder_holding_only_a_dead_run_says_it_is_not_published_yet(tmp_path: Path, monkeypatch) -> None:
    """score of a folder whose one run's mlbench was killed said only 'no result_*.txt files here'."""
    from mlbench.analysis.logs import find_sets
    from mlbench.errors import UserError

    folder, staging = _dead_run(tmp_path, monkeypatch, run_stop=None)
    with pytest.raises(UserError) as e:
        find_sets(folder)
    assert str(e.value).endswith(f"; {_not_published_yet(staging)}"), str(e.value)
    assert staging.is_dir()  # analysis never writes


def test_a_tree_holding_only_a_dead_run_says_where_it_is_not_published_yet(tmp_path: Path, monkeypatch) -> None:
    """`mlbench score results/` (the results root, as a user scores it) after the one run's mlbench was killed: only
    the benchmark folder itself was searched for dead runs, and it said 'no result_*.txt files here'."""
    from mlbench.analysis.logs import find_sets
    from mlbench.errors import UserError

    folder, staging = _dead_run(tmp_path, monkeypatch, run_stop=None)
    with pytest.raises(UserError) as e:
        find_sets(tmp_path)
    assert str(e.value).endswith(f"; {folder}: {_not_published_yet(staging)}"), str(e.value)
    assert staging.is_dir()
    # beside a benchmark folder with results (`score results/` of two benchmarks): it was not said at all
    other = tmp_path / "vm" / "bert"
    other.mkdir()
    (other / "result_0.txt").write_text(':::MLLOG {"key": "run_start"}\n')
    [rs] = find_sets(tmp_path)
    assert rs.folder == other.resolve()
    assert f"{folder}: {_not_published_yet(staging)}" in rs.left_out_notes, rs.left_out_notes


def test_a_process_that_ends_while_dead_runs_are_sought_is_passed_over(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Seeking a dead run's staging folder lists every process's open files under /proc. A process that ended
    between the listing of /proc and the listing of its fd/ raised FileNotFoundError out of the glob (seen once in
    the suite, with other tests' processes ending): the command that publishes a dead run failed with a traceback.
    Here one live process's fd/ is made to vanish as it is listed."""
    import subprocess

    folder, _ = _dead_run(tmp_path, monkeypatch, run_stop="aborted")
    victim = subprocess.Popen(["sleep", "30"])
    gone = f"/proc/{victim.pid}/fd"
    real_scandir, real_listdir = os.scandir, os.listdir

    def vanishing(real):
        def listing(path="."):
            if isinstance(path, (str, os.PathLike)) and os.fspath(path) == gone:  # not a descriptor (rmtree's)
                raise FileNotFoundError(2, "No such file or directory", gone)
            return real(path)
        return listing

    monkeypatch.setattr(os, "scandir", vanishing(real_scandir))
    monkeypatch.setattr(os, "listdir", vanishing(real_listdir))
    try:
        _, record, _ = _publish_dead(folder)
    finally:
        victim.kill()
        victim.wait()
    assert record["status"] == "aborted", record


_RANK_THAT_FORKS = """
import os, sys, time
from mlbench.launch import lifeline
lifeline.install_pdeathsig()
pid = os.fork()
if pid == 0:  # as megatron-core's checkpoint writer, forked mid-save
    time.sleep(60)
    os._exit(0)
print(pid, flush=True)
time.sleep(60)
"""


def test_a_process_a_rank_forks_dies_with_the_rank(tmp_path: Path) -> None:
    """kill -9 of mlbench while the final checkpoint was saved: megatron's writer, which the rank forks, kept
    sleeping for good (a fork does not inherit the parent-death signal) and held the staging folder's rank logs
    open, so no later command published the run. Here a rank forks as the writer does, and is killed."""
    import signal
    import time

    rank = subprocess.Popen([sys.executable, "-c", _RANK_THAT_FORKS], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    try:
        child = int(rank.stdout.readline())
        rank.send_signal(signal.SIGKILL)
        rank.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _running(child):
            time.sleep(0.05)
        assert not _running(child), "the forked process outlived the rank"
    finally:
        rank.kill()


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_a_new_checkpoint_folder_path_is_checked_before_any_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture) -> None:
    """`--save-checkpoint` and convert-checkpoint's DEST: a loop of links was a RuntimeError traceback; a dangling
    link, a path past PATH_MAX and a name with ESC or a newline were found only after the conversion (the output left
    in .DEST.partial-*, blamed on SRC and --save-checkpoint) or printed raw."""
    from conftest import mlbench_in_process

    from mlbench.errors import UserError
    from mlbench.preflight import check_new_folder

    monkeypatch.chdir(tmp_path)
    os.symlink("loopB", "loopA")
    os.symlink("loopA", "loopB")
    os.symlink("nowhere", "dangling")
    room = 4070 - len(str(tmp_path)) - 1  # DEST itself within PATH_MAX (4096), the files of its save past it
    deep = ("d" * 199 + "/") * ((room - 1) // 200) + "e" * (room - 200 * ((room - 1) // 200))
    src = tmp_path / "ref.pt"
    src.write_bytes(b"not read: DEST is refused first")
    cases = {"loopA": "is a symbolic link (to loopB)", "loopA/x": "its path runs through a loop of symbolic links",
             "dangling": "is a symbolic link (to nowhere)", "cv\x1b[31mRED": "holds \\x1b, a character that is not",
             "cv\nnl": "holds \\n", deep: "too deep: the deepest file the save makes"}
    for dest, said in cases.items():
        if dest != deep:
            with pytest.raises(UserError, match=re_escape(said)):
                check_new_folder("--save-checkpoint", Path(dest))
        code, out, err = mlbench_in_process(monkeypatch, capsys, "convert-checkpoint", "bert", src, dest, "--tiny")
        assert code == 2 and said in err and out == "" and "Traceback" not in err, (dest, code, out, err)
        assert "\x1b" not in out + err and not list(tmp_path.glob(".*partial*")), (dest, out)


def re_escape(text: str) -> str:
    import re

    return re.escape(text)


def test_a_checkpoints_metadata_nested_too_deep_is_named_not_a_recursion_error(tmp_path: Path) -> None:
    from mlbench.train.checkpoint import folder

    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "metadata.json").write_text('{"sharded_backend": "torch_dist", "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(folder.CheckpointError, match=r"cannot read metadata.json \(nested too deep\)"):
        folder.check_readable(ck)


def test_a_stopped_conversion_leaves_nothing_and_the_next_one_clears_a_killed_ones_save(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """SIGTERM or SIGHUP (a closed terminal, `timeout`) during convert-checkpoint ended it at once (exit -15, no
    word), leaving /tmp/mlbench-convert-*/ and the converter's .DEST.partial-*/, which no later conversion removed.
    A stop now ends it as Ctrl-C does (the converter stopped, the scratch removed, exit 143); a partial save whose
    converter is gone is removed by the next conversion to that DEST, whatever becomes of it."""
    import signal
    import time

    from conftest import mlbench_in_process

    from mlbench import owners

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    src = tmp_path / "ref.pt"
    src.write_bytes(b"x" * 1024)  # the converter is stopped before it reads it
    proc = subprocess.Popen([*MLBENCH, "convert-checkpoint", "bert", str(src), str(tmp_path / "cv"), "--tiny"],
                            env={**os.environ, "TMPDIR": str(scratch)}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 30
    while not list(scratch.glob("mlbench-convert-*")) and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.3)  # the converter importing torch
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, (proc.returncode, out)
    assert "Traceback" not in out and not list(scratch.iterdir()), (out, list(scratch.iterdir()))
    dead = tmp_path / f".cv.partial-{owners.tag()}x"
    (dead / "sub").mkdir(parents=True)
    monkeypatch.setattr(owners, "gone", lambda tag: True)
    code, out, err = mlbench_in_process(monkeypatch, capsys, "convert-checkpoint", "bert", src, tmp_path / "cv",
                                        "--tiny")
    assert code == 2 and not dead.exists(), (code, out, err)


def test_a_stop_during_plans_cpu_measurement_ends_its_probe(tmp_path: Path) -> None:
    """SIGTERM during `plan --device cpu`'s first measurement ended plan at once (exit -15, no word): its probe
    trained on, orphaned, for 15 s at full CPU, and its scratch folder stayed. Now it ends as Ctrl-C does."""
    import signal
    import time

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch), "MLBENCH_CACHE": str(tmp_path / "cache")}
    proc = subprocess.Popen([*MLBENCH, "plan", "gpt3", "--tiny", "--device", "cpu"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 30
    while not list(scratch.iterdir()) and time.monotonic() < deadline:  # the probe's scratch: it has started
        time.sleep(0.02)
    time.sleep(0.5)
    probes = [p for p in Path("/proc").glob("[0-9]*/cmdline")
              if _reads(p).startswith(sys.executable.encode()) and b"statistics" in _reads(p)]
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, (proc.returncode, out)
    assert probes and not list(scratch.iterdir()), (probes, list(scratch.iterdir()))
    time.sleep(0.2)
    assert not [p for p in probes if _reads(p)], "the probe outlived plan"


def _reads(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def test_a_checkpoints_metadata_with_a_key_megatron_does_not_write_is_named(tmp_path: Path) -> None:
    from mlbench.train.checkpoint import folder

    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "metadata.json").write_text('{"sharded_backend": "torch_dist", "x": NaN}')
    with pytest.raises(folder.CheckpointError, match="metadata.json holds 'x', which megatron-core's checkpoints"):
        folder.check_readable(ck)


def test_a_c1_control_byte_in_a_path_is_refused_or_printed_escaped(tmp_path: Path) -> None:
    """A raw byte 0x9B (CSI: ESC [ to an 8-bit terminal) in a path from the command line reached the terminal raw
    (a run published under `q<0x9B>2J` cleared the screen naming it): an undecodable byte was let through as text.
    Bytes 0x80 to 0x9F are control codes: refused in a folder mlbench makes, escaped (\\x9b) wherever printed."""
    from mlbench.errors import printable, unprintable

    assert printable("q\udc9b2J/\udcff") == "q\\x9b2J/\\xff" and unprintable("x\udc9b") == "\udc9b"
    assert unprintable("x\udcff") is None  # a Latin-1 byte of a name is taken (and printed \xff: not UTF-8)
    env = {**os.environ, "LC_ALL": "C.UTF-8"}
    for args in ([b"run", b"gpt3", b"--tiny", b"--dry-run", b"--results", b"q\x9b2J"],
                 [b"run", b"gpt3", b"--tiny", b"--save-checkpoint", b"c\x9b2J"],
                 [b"compare", b"nx\x9b2J", b"r"], [b"check", b"nx\x9b2J/result_0.txt"]):
        proc = subprocess.run([os.fsencode(a) for a in MLBENCH] + args, capture_output=True, cwd=tmp_path, env=env,
                              timeout=120)
        out = proc.stderr
        assert proc.returncode == 2 and b"\x9b" not in out and b"\\x9b2J" in out, (args, proc.returncode, out)
        assert proc.stdout == b"", proc.stdout
    assert list(tmp_path.iterdir()) == []


def test_a_run_whose_publisher_died_between_its_two_links_is_said_not_published(tmp_path: Path,
                                                                                   monkeypatch) -> None:
    """Killed between placing its record and its log: the folder holds result_0.json alone. score said only 'no
    result_*.txt files here', and beside another result left the run out without a word."""
    import shutil

    from mlbench.analysis import score
    from mlbench.analysis.logs import find_sets
    from mlbench.errors import UserError

    folder, staging = _dead_run(tmp_path, monkeypatch, run_stop="success")
    (staging / "result_0.json").write_text(json.dumps({"status": "success"}))
    os.link(staging / "result_0.json", folder / "result_0.json")  # the first link; the log's never came
    said = (f"1 run(s) whose mlbench process died while they were published (a record placed, its log not) "
            f"({staging.name}): not read until the next `mlbench run` in this folder publishes them")
    with pytest.raises(UserError) as e:
        find_sets(folder)
    assert str(e.value).endswith(f"; {said}"), str(e.value)
    published = (Path(__file__).parent / "data" / "mlperf-results" / "training_results_v5.1" / "AMD" / "results"
                 / "MI355X_EPYC_9575F_pytorch" / "llama31_8b" / "result_0.txt")
    shutil.copy(published, folder / "result_1.txt")
    [s] = score.score_path(folder, "6.0.0", jobs=1)
    assert said in s.notes, s.notes
    assert not (folder / "result_0.txt").exists()  # analysis never writes


def test_check_says_a_dead_run_is_not_published_yet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`mlbench check results/` after the run's mlbench was killed said only 'no result_*.txt files here', and beside
    published results said nothing of it (score, compare and scaling say it): now check says it as they do."""
    import io

    from rich.console import Console

    from mlbench import compliance
    from mlbench.errors import UserError

    folder, staging = _dead_run(tmp_path, monkeypatch, run_stop=None)
    with pytest.raises(UserError) as e:
        compliance.targets(tmp_path, None, "auto")
    assert str(e.value).endswith(f"; {folder}: {_not_published_yet(staging)}"), str(e.value)
    # beside a published result: said after the verdicts (the checker's own verdict is not what is tested here)
    (folder / "result_0.txt").write_text((staging / "mlperf.log").read_text())
    monkeypatch.setattr(compliance, "check_all", lambda todo: [compliance.Verdict(path=p, ok=True, rules="smoke rules")
                                                               for p, _, _ in todo])
    console = Console(record=True, width=1 << 20, file=io.StringIO())
    assert compliance.check_paths(tmp_path, None, "auto", console) is True
    assert f"note: {folder}: {_not_published_yet(staging)}" in console.export_text()
    assert staging.is_dir()  # analysis never writes


_CTRL_C_AS_THE_CLI_LOADS = """\
import sys


class _CtrlC:  # the user's Ctrl-C lands while mlbench.cli's modules import (the first tenths of a second)
    def find_spec(self, name, path=None, target=None):
        if name == "mlbench.cli":
            raise KeyboardInterrupt


sys.meta_path.insert(0, _CtrlC())
"""


def test_ctrl_c_while_the_cli_loads_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    """Ctrl-C in the first ~0.3 s of any command, while the CLI's modules load and before it handles signals
    itself, printed Python's KeyboardInterrupt traceback. The `mlbench` script (and `python -m mlbench`) now starts
    through mlbench/__main__.py: one line, exit 130, nothing written."""
    (tmp_path / "sitecustomize.py").write_text(_CTRL_C_AS_THE_CLI_LOADS)
    proc = subprocess.run([*MLBENCH, "run", "gpt3", "--tiny", "--results", str(tmp_path / "r")], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(tmp_path)}, cwd=tmp_path)
    assert (proc.returncode, proc.stdout, proc.stderr) == \
        (130, "", "mlbench: stopped (SIGINT) while starting; nothing was written\n"), proc.stderr
    assert not (tmp_path / "r").exists()
