"""Publishing results: never overwritten, all or nothing on a full disk, indices claimed safely by runs at once,
what dead runs left cleaned or ignored, and no empty folders left by a refused run. No training here: a staged
run is a folder with a log in it, as the runner leaves it."""

from __future__ import annotations

import contextlib
import errno
import json
import multiprocessing
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import mlbench

from mlbench import results
from mlbench.errors import UserError

LOG = ":::MLLOG {\"key\": \"run_stop\"}\n" * 40  # a few KB, as a tiny run's log


def _staged(folder: Path, log: str = LOG) -> Path:
    staging = results.stage(folder)
    (staging / "mlperf.log").write_text(log)
    (staging / "ranks" / "0").mkdir(parents=True)
    (staging / "ranks" / "0" / "stderr.log").write_text("rank output\n" * 50)
    return staging


def _assert_readable(folder: Path) -> None:
    """What a reader expects: every result complete (log and record, the record naming it) or absent, and no
    staging or temporary files."""
    names = {p.name for p in folder.iterdir()}
    assert not [n for n in names if n.startswith(".")], names
    for txt in folder.glob("result_*.txt"):
        record = json.loads(txt.with_suffix(".json").read_text())
        assert record["result"] == txt.name
        assert txt.read_text() == LOG
    for rec in folder.glob("result_*.json"):
        assert rec.with_suffix(".txt").exists(), f"{rec.name} without its log"


def test_publish_never_overwrites(tmp_path: Path) -> None:
    with results.result_folder(tmp_path, "sys", "gpt3") as folder:
        (folder / "result_0.txt").write_text("an earlier run\n")
        staging = _staged(folder)
        path = results.publish(folder, staging, {"status": "success"})
    assert path.name == "result_1.txt"
    assert (folder / "result_0.txt").read_text() == "an earlier run\n"
    assert json.loads((folder / "result_1.json").read_text())["result"] == "result_1.txt"
    assert not staging.exists()
    assert sorted(p.name for p in folder.iterdir()) == ["logs", "result_0.txt", "result_1.json", "result_1.txt"]
    assert (folder / "logs" / "result_1" / "0" / "stderr.log").is_file()


def _strict(text: str):
    """JSON as a strict parser reads it: NaN and Infinity are not JSON (jq, JSON.parse and Go refuse them)."""
    def refuse(constant: str):
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_the_record_is_strict_json_with_non_finite_numbers_as_null(tmp_path: Path) -> None:
    """A diverged run's record held "loss": NaN and "grad_norm": NaN, which strict parsers reject whole."""
    nan, inf = float("nan"), float("inf")
    record = {"status": "aborted", "quality": {"last": nan}, "mfu": -inf,
              "steps": [{"step": 1, "loss": 4.86, "grad_norm": 1.33}, {"step": 4, "loss": nan, "grad_norm": inf}],
              "layout": ({"tp": 1},)}
    with results.result_folder(tmp_path, "sys", "gpt3") as folder:
        results.publish(folder, _staged(folder), record)
    written = _strict((folder / "result_0.json").read_text())
    assert written["steps"] == [{"step": 1, "loss": 4.86, "grad_norm": 1.33}, {"step": 4, "loss": None,
                                                                               "grad_norm": None}]
    assert written["quality"] == {"last": None} and written["mfu"] is None and written["layout"] == [{"tp": 1}]
    assert record["steps"][1]["grad_norm"] == inf  # the caller's record is left as it was


def test_a_failed_runs_launcher_log_is_kept_with_the_rank_logs(tmp_path: Path) -> None:
    """A rendezvous that never formed leaves its reason in the launcher's log alone (no rank ran); it was deleted
    with the staging folder. A successful run's stays out (its logs folder holds the ranks')."""
    with results.result_folder(tmp_path, "sys", "gpt3") as folder:
        for status in ("aborted", "success"):
            staging = _staged(folder)
            (staging / "launcher.log").write_text("RendezvousConnectionError: ...\n")
            results.publish(folder, staging, {"status": status})
    assert (folder / "logs" / "result_0" / "launcher.log").read_text() == "RendezvousConnectionError: ...\n"
    assert not (folder / "logs" / "result_1" / "launcher.log").exists()


@pytest.mark.parametrize("stale", ["result_0.json", "logs/result_0"])
def test_an_index_a_dead_run_left_half_used_is_skipped(tmp_path: Path, stale: str) -> None:
    """A record without its log (or rank logs without either) from an earlier run: the next run takes the next
    index (it failed with FileExistsError and lost its record before), and the stale file is left untouched."""
    folder = tmp_path / "sys" / "gpt3"
    (folder / stale).parent.mkdir(parents=True, exist_ok=True)
    (folder / stale).mkdir() if stale.startswith("logs") else (folder / stale).write_text("{}\n")
    path = results.publish(folder, _staged(folder), {"status": "success"})
    assert path.name == "result_1.txt"
    assert json.loads((folder / "result_1.json").read_text())["index"] == 1
    assert (folder / stale).exists()


@pytest.mark.parametrize("left", ["", '{"status": "succ', '{"status": "success", "result": "result_0.txt"}\n'],
                         ids=["empty", "cut-short", "another-publishers"])
def test_a_record_a_killed_publisher_left_in_staging_is_written_anew(tmp_path: Path, left: str) -> None:
    """A publisher killed (or a disk full, a host that lost power) while it wrote the record in the staging folder,
    before linking it: the next command, publishing the dead run, linked that file as it was: an empty or cut-short
    result_0.json beside a whole log, or the first publisher's words instead of its own."""
    folder = tmp_path / "sys" / "gpt3"
    folder.mkdir(parents=True)
    staging = _staged(folder)
    (staging / "result_0.json").write_text(left)
    path = results.publish(folder, staging, {"status": "aborted", "reason": "mlbench died"})
    assert path.name == "result_0.txt"
    assert json.loads((folder / "result_0.json").read_text()) == {
        "status": "aborted", "reason": "mlbench died", "result": "result_0.txt", "index": 0}
    _assert_readable(folder)


def _publish_many(folder: str, n: int, queue) -> None:
    for _ in range(n):
        staging = _staged(Path(folder))
        queue.put(results.publish(Path(folder), staging, {"pid": os.getpid()}).name)


def test_runs_publishing_at_once_claim_distinct_indices(tmp_path: Path) -> None:
    folder = tmp_path / "sys" / "gpt3"
    folder.mkdir(parents=True)
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_publish_many, args=(str(folder), 10, queue)) for _ in range(4)]
    for p in procs:
        p.start()
    names = [queue.get(timeout=60) for _ in range(40)]
    for p in procs:
        p.join(60)
    assert sorted(names) == sorted(f"result_{i}.txt" for i in range(40))
    for i in range(40):  # each record goes with its own log
        assert json.loads((folder / f"result_{i}.json").read_text())["index"] == i
    _assert_readable(folder)


@contextlib.contextmanager
def _tmpfs(path: Path, size: str):
    """A real filesystem of `size` (tmpfs) at `path`: needs root and a kernel that lets this process mount."""
    path.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.fixture
def small_disk(tmp_path: Path):
    with _tmpfs(tmp_path / "disk", "512k") as disk:
        yield disk


def _fill(disk: Path, leave: int) -> None:
    """Fills the disk to `leave` bytes free (to the block)."""
    st = os.statvfs(disk)
    free = st.f_bavail * st.f_frsize
    with open(disk / "filler", "wb") as f, contextlib.suppress(OSError):
        f.write(b"\0" * max(0, free - leave))


def test_a_full_disk_while_publishing_leaves_each_result_complete_or_absent(small_disk: Path) -> None:
    """On a real full filesystem, for every amount of space left: publishing either places the whole result
    (log and record) or raises PublishError and places nothing of it (no half-published result_1.txt, no
    temporary files), its staging folder kept for the publisher to set aside (a rename, which a full disk allows);
    the earlier result stays intact."""
    outcomes = set()
    for leave in range(0, 48 * 1024, 2048):
        with results.result_folder(small_disk, "sys", "gpt3") as folder:
            staging = _staged(folder)
            results.publish(folder, _staged(folder), {"status": "success"})  # an earlier result, intact after
            _fill(small_disk, leave)
            try:
                results.publish(folder, staging, {"status": "success", "steps": list(range(2000))})
                outcomes.add("published")
            except results.PublishError as e:
                assert "No space left on device" in str(e), e
                outcomes.add("refused")
                assert results.set_aside(folder, staging), "a rename needs no room"
            (small_disk / "filler").unlink()
            assert not staging.exists()
            _assert_readable(folder)
            assert (folder / "result_0.txt").read_text() == LOG
        shutil.rmtree(small_disk / "sys")
    assert outcomes == {"published", "refused"}  # the sweep crossed the point where it fits


@pytest.mark.parametrize("failing", ["open", "link"])
def test_publish_is_all_or_nothing_when_any_write_fails(tmp_path: Path, monkeypatch, failing: str) -> None:
    """The same class of fault without a small filesystem: OSError(ENOSPC) injected into the n-th call of
    `open` (record and log writes) or `os.link` (placing the record, then the log), for every n."""
    real = {"open": open, "link": os.link}
    for n in range(1, 4):
        folder = tmp_path / str(n) / "sys" / "gpt3"
        folder.mkdir(parents=True)
        staging = _staged(folder)
        calls: list = []

        def failing_call(*args, n=n, calls=calls, **kwargs):
            calls.append(args)
            if len(calls) == n:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(args[0]))
            return real[failing](*args, **kwargs)

        monkeypatch.setattr("builtins.open" if failing == "open" else "os.link", failing_call)
        try:
            results.publish(folder, staging, {"status": "success"})
            assert not staging.exists()
        except results.PublishError as e:
            assert "No space left on device" in str(e)
            assert staging.exists(), "kept for its publisher to set aside"
            assert results.set_aside(folder, staging)
        finally:
            monkeypatch.undo()
        _assert_readable(folder)


def test_a_refused_run_leaves_no_empty_folders(tmp_path: Path) -> None:
    root = tmp_path / "a" / "b" / "results"
    with pytest.raises(UserError), results.result_folder(root, "sys", "gpt3"):
        raise UserError("refused after the folder was opened")
    assert not (tmp_path / "a").exists()
    (root / "sys").mkdir(parents=True)  # what was there before stays
    with results.result_folder(root, "sys", "gpt3") as folder:
        (folder / ".slurm").mkdir()  # a job folder's parent, its job refused
    assert [p.name for p in root.iterdir()] == ["sys"] and not list((root / "sys").iterdir())


def test_a_users_empty_logs_and_slurm_folders_are_left_where_a_run_made_its_own_go(tmp_path: Path) -> None:
    """An empty logs/ or .slurm/ the user made in the benchmark folder was removed at the end of a run: mlbench
    removes only the empty folders it made."""
    mine = tmp_path / "sys" / "gpt3"
    (mine / "logs").mkdir(parents=True)
    (mine / ".slurm").mkdir()
    with results.result_folder(tmp_path, "sys", "gpt3"):
        pass
    assert (mine / "logs").is_dir() and (mine / ".slurm").is_dir()
    (mine / "logs").rmdir()
    with results.result_folder(tmp_path, "sys", "gpt3") as folder:
        (folder / "logs").mkdir()  # the run's own, left empty
    assert not (mine / "logs").exists() and (mine / ".slurm").is_dir()


def test_an_unwritable_results_folder_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(UserError, match="is not writable"), results.result_folder(tmp_path / "file", "s", "b"):
        pass
    with pytest.raises(UserError, match="cannot name a folder"), results.result_folder(tmp_path, "../x", "b"):
        pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_a_results_folder_on_a_filesystem_without_hard_links_is_refused(tmp_path: Path, monkeypatch) -> None:
    """Results on a filesystem that takes no hard link (vfat, some network mounts): the run trained to its end and
    was then not published ('run not published: Operation not permitted'). Refused before it starts, leaving
    nothing behind."""
    import errno

    def no_links(src, dst, *a, **k):
        raise OSError(errno.EPERM, os.strerror(errno.EPERM), src)

    monkeypatch.setattr(os, "link", no_links)
    refused = r"results folder .*/s/gpt3 cannot take a hard link \(Operation not permitted\), which publishing"
    with pytest.raises(UserError, match=refused), results.result_folder(tmp_path / "r", "s", "gpt3"):
        pass
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    (tmp_path / "r" / "s" / "gpt3").mkdir(parents=True)
    with results.result_folder(tmp_path / "r", "s", "gpt3") as folder:
        assert list(folder.iterdir()) == []


def test_staging_folders_of_dead_runs_on_this_host_are_removed(tmp_path: Path) -> None:
    folder = tmp_path / "sys" / "gpt3"
    folder.mkdir(parents=True)
    dead = subprocess.Popen([sys.executable, "-c", "import sys, tempfile; from mlbench import results; "
                             f"print(results.stage(__import__('pathlib').Path({str(folder)!r})))"],
                            stdout=subprocess.PIPE, text=True)
    dead_staging = Path(dead.communicate()[0].strip())
    assert dead_staging.is_dir()  # its owner exited without publishing (as after kill -9)
    live = results.stage(folder)
    elsewhere = folder / f"{results.STAGING}{dead.pid}-123-{socket.gethostname()}x-abcd"  # another host's
    elsewhere.mkdir()
    unrelated = folder / f"{results.STAGING}manual"
    unrelated.mkdir()
    with results.result_folder(tmp_path, "sys", "gpt3"):
        pass
    assert not dead_staging.exists()
    assert live.is_dir() and elsewhere.is_dir() and unrelated.is_dir()


def test_what_a_dead_run_left_is_left_to_the_command_that_took_it(tmp_path: Path, monkeypatch) -> None:
    """Two commands started at once in a folder: while one finishes a dead publisher's result (its record placed,
    its log not), the other placed the log too, and the first, finding the name taken, gave its record up: a log
    left without its record. Whoever holds the dead run's folder (results.taken) finishes it; the others pass."""
    from mlbench import owners

    folder = tmp_path / "sys" / "gpt3"
    folder.mkdir(parents=True)
    staging = _staged(folder)
    (staging / "result_0.json").write_text('{"status": "success"}\n')
    os.link(staging / "result_0.json", folder / "result_0.json")  # placed; its publisher killed before the log
    monkeypatch.setattr(owners, "gone", lambda tag: True)
    with results.taken(staging) as mine:
        assert mine
        assert results.remove_stale(folder) == []
        assert not (folder / "result_0.txt").exists() and staging.is_dir()
    assert results.remove_stale(folder) == [staging]
    assert (folder / "result_0.txt").read_text() == LOG and not staging.exists()


def test_a_dead_runs_unpublished_run_is_kept_for_publishing_once_nothing_holds_it(tmp_path: Path) -> None:
    """A dead owner's staging folder that holds a run (its plan and a begun log) is not removed: it is listed for
    publishing as aborted (mlbench.dead_runs; the whole path in test_failures.py), but only once no live process
    holds a file in it (its ranks, a moment after their supervisor died). One with an empty log is removed."""
    folder = tmp_path / "sys" / "gpt3"
    folder.mkdir(parents=True)

    def dead_owner_stages() -> Path:
        dead = subprocess.Popen([sys.executable, "-c", "from pathlib import Path; from mlbench import results; "
                                 f"print(results.stage(Path({str(folder)!r})))"], stdout=subprocess.PIPE, text=True)
        return Path(dead.communicate()[0].strip())

    run, empty = dead_owner_stages(), dead_owner_stages()
    for staging, log in ((run, LOG), (empty, "")):
        (staging / "plan.json").write_text("{}\n")
        (staging / "mlperf.log").write_text(log)
    with open(run / "mlperf.log"):  # a rank still writing
        assert results.remove_stale(folder) == [empty]
        assert results.dead_runs(folder) == []
    assert run.is_dir() and not empty.exists()
    ((listed, owner),) = results.dead_runs(folder)
    assert listed == run and run.name.startswith(f"{results.STAGING}{owner}-")


def test_a_full_disk_before_launch_refuses_the_run(small_disk: Path) -> None:
    _fill(small_disk, 0)
    proc = mlbench("run", "gpt3", "--tiny", "--results", str(small_disk), "--system", "ci")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "cannot write a run's files (No space left on device)" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert [p.name for p in small_disk.iterdir()] == ["filler"]


def test_a_full_disk_refuses_a_dry_run_in_one_line(small_disk: Path) -> None:
    """The log up to run_start is written through Python's logging, which reports a failed write by printing a
    traceback and going on: the dry run judges the file instead."""
    _fill(small_disk, 0)
    proc = mlbench("run", "gpt3", "--tiny", "--dry-run", "--results", str(small_disk), "--system", "ci")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"error: results folder {small_disk}/ci/gpt3: cannot write dry-run.txt (No space left on device)"]
    assert not proc.stdout.strip(), proc.stdout
    assert [p.name for p in small_disk.iterdir()] == ["filler"]


@pytest.mark.slow
def test_a_full_disk_while_training_aborts_cleanly(tmp_path: Path) -> None:
    """64 KiB fill up while rank 0 writes its log (a run needs about 130 KiB): the rank fails, the log cannot
    be completed, so the run is not published: no result, no traceback, exit 1; its files are set aside under
    logs/ (a rename) for a person to read (they were deleted)."""
    with _tmpfs(tmp_path / "disk", "64k") as disk:
        proc = mlbench("run", "gpt3", "--tiny", "--results", str(disk), "--system", "ci", "--seed", "3")
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert "run not published" in proc.stdout and "No space left on device" in proc.stdout, proc.stdout
        assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
        folder = disk / "ci" / "gpt3"
        [kept] = (folder / "logs").iterdir()
        assert sorted(p.name for p in folder.iterdir()) == ["logs"]
        assert kept.name.startswith("unpublished-staging-") and f"its files were moved to {kept}" in proc.stdout
        assert (kept / "mlperf.log").is_file()


@pytest.mark.slow
def test_a_full_disk_while_saving_the_checkpoint_leaves_no_partial_checkpoint(tmp_path: Path,
                                                                               quick_benchmarks: Path) -> None:
    """The run's result stands (published whole, target reached) but the command fails saying the checkpoint was
    not saved, and the half-written checkpoint folder (megatron-core fails with no room) is gone."""
    with _tmpfs(tmp_path / "disk", "256k") as disk:
        root = tmp_path / "results"
        proc = mlbench("run", "gpt3", "--tiny", "--results", str(root), "--system", "ci", "--seed", "3",
                       "--save-checkpoint", str(disk / "ckpt"), env={"MLBENCH_BENCHMARKS": str(quick_benchmarks)})
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert "checkpoint not saved" in proc.stdout, proc.stdout
        record = json.loads((root / "ci" / "gpt3" / "result_0.json").read_text())
        assert record["status"] == "success" and record["checkpoint_error"]
        # torch's writer says only e.g. "unexpected pos 704 vs 598": the room left is added
        assert f"(the disk holding {disk / 'ckpt'} has 0." in record["checkpoint_error"], record
        _assert_readable_run(root / "ci" / "gpt3")
        assert not list(disk.iterdir()), list(disk.iterdir())


def _assert_readable_run(folder: Path) -> None:
    assert sorted(p.name for p in folder.iterdir()) == ["logs", "result_0.json", "result_0.txt"]


def test_a_log_with_a_line_cut_short_inside_it_is_not_whole(tmp_path: Path) -> None:
    """A disk full for a moment: a line's write was cut short and the next line ran into it, and the log was
    published with the record saying compliance ok (the checker and score skip a broken line). Only the last
    line was looked at."""
    from mlbench.mlperf_log import MLPerfLog

    path = tmp_path / "mlperf.log"
    log = MLPerfLog(path)
    for key in ("run_start", "tracked_stats", "train_samples", "run_stop"):
        log.event(key, 1)
    log.close()
    assert results.log_problem(path, "run_stop") == ""
    lines = path.read_bytes().splitlines(keepends=True)
    cut = lines[1][:40] + lines[2]  # the newline and the rest of line 2 lost
    path.write_bytes(lines[0] + cut + lines[3])
    assert results.log_problem(path, "run_stop") == "line 2 is not one whole MLPerf record (is the disk full?)"
    path.write_bytes(lines[0] + lines[1][:-1] + lines[2] + lines[3])  # only the newline lost
    assert results.log_problem(path, "run_stop") == "line 2 is not one whole MLPerf record (is the disk full?)"
    path.write_bytes(b"".join(lines) + lines[3][:30])
    assert results.log_problem(path, "run_stop") == "its last line is cut off (is the disk full?)"


def _dead_tag() -> str:
    """The owner tag of a process that has exited (as after kill -9)."""
    out = subprocess.run([sys.executable, "-c", "from mlbench import owners; print(owners.tag())"],
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_leftovers_of_a_container_on_this_host_are_left_alone(tmp_path: Path) -> None:
    """A run in another PID namespace with this host's name (a container) numbers its processes anew: its live
    staging folder looked dead from here and was deleted by any other run into the folder. Owners are judged only
    in this namespace; a real one made with `unshare` where this machine allows it."""
    folder = tmp_path / "sys" / "gpt3"
    folder.mkdir(parents=True)
    container = folder / f"{results.STAGING}1-5-{socket.gethostname()}@1-abcd"  # pid 1 of another namespace
    container.mkdir()
    dead = folder / f"{results.STAGING}{_dead_tag()}-abcd"
    dead.mkdir()
    real = None
    unshared = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c",
                                 f"import time; from pathlib import Path; from mlbench import results; "
                                 f"print(results.stage(Path({str(folder)!r})), flush=True); time.sleep(30)"],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = unshared.stdout.readline().strip()
        real = Path(line) if line else None
        assert results.remove_stale(folder) == [dead]
        assert container.is_dir() and (real is None or real.is_dir())
    finally:
        unshared.kill()
        unshared.wait()


def test_a_save_killed_with_its_run_is_removed_by_the_next_run(tmp_path: Path) -> None:
    """`kill -9` of mlbench while it saved a checkpoint left `.ckpt.partial-PID` for good: only a run whose own
    save failed removed partials. A run that saves there now removes dead owners' first; a live save's, another
    host's and another container's stay."""
    from mlbench import owners, registry
    from mlbench.layout import resolve
    from mlbench.runner import RunOptions, RunSet, local_commands

    dest = tmp_path / "ckpt"
    prefix = f".{dest.name}.partial-"
    dead, live = tmp_path / f"{prefix}{_dead_tag()}", tmp_path / f"{prefix}{owners.tag()}"
    other_host = tmp_path / f"{prefix}{os.getpid()}-1-elsewhere@1"
    for p in (dead, live, other_host):
        p.mkdir()
        (p / "common.pt").write_bytes(b"x")
    bench = registry.load("gpt3", tiny=True)
    layout = resolve(bench)
    opts = RunOptions(results=tmp_path / "r", system="s", save_checkpoint=str(dest))
    RunSet(bench, layout, opts, None, local_commands(layout, opts)).prepare(tmp_path / "r")
    assert not dead.exists() and live.is_dir() and other_host.is_dir()


@pytest.mark.parametrize("meanwhile", ["nothing", "another result took the index"])
def test_a_publisher_killed_between_its_two_links_is_finished_by_the_next_run(tmp_path: Path, meanwhile: str) -> None:
    """kill -9 between linking the record and the log left result_0.json without result_0.txt for good (the next
    run removed the staging folder and took index 1). The next run now finishes the dead run's publishing from its
    staging folder, or, where the log's name was taken meanwhile, takes the record back."""
    folder = tmp_path / "sys" / "gpt3"
    folder.mkdir(parents=True)
    staging = folder / f"{results.STAGING}{_dead_tag()}-abcd"  # as the dead publisher left it
    staging.mkdir()
    (staging / "mlperf.log").write_text(LOG)
    (staging / "ranks" / "0").mkdir(parents=True)
    (staging / "result_0.json").write_text(json.dumps({"status": "aborted", "result": "result_0.txt", "index": 0}))
    os.link(staging / "result_0.json", folder / "result_0.json")
    if meanwhile != "nothing":
        (folder / "result_0.txt").write_text("another run's log\n")
    with results.result_folder(tmp_path, "sys", "gpt3"):
        pass
    if meanwhile == "nothing":
        assert not staging.exists()
        assert (folder / "result_0.txt").read_text() == LOG
        assert json.loads((folder / "result_0.json").read_text())["status"] == "aborted"
        assert (folder / "logs" / "result_0" / "0").is_dir()
        _assert_readable(folder)
    else:  # its record taken back, the run stays for the next command to publish (dead_runs), never deleted
        assert sorted(p.name for p in folder.iterdir()) == sorted(["result_0.txt", staging.name])
        assert (folder / "result_0.txt").read_text() == "another run's log\n"
        assert [s for s, _ in results.dead_runs(folder)] == [staging]


def test_a_node_whose_torchrun_failed_before_its_ranks_keeps_its_launcher_log(tmp_path: Path) -> None:
    """Another node than node 0 keeps its rank logs and its torchrun's output; a torchrun that failed before it
    made the ranks' folder (at the rendezvous) left the one file saying why, and it was deleted with the staging
    folder."""
    folder = tmp_path / "ci" / "gpt3"
    folder.mkdir(parents=True)
    for name, ranks in (("early", False), ("late", True)):
        staging = tmp_path / name
        staging.mkdir()
        (staging / "launcher.log").write_text(f"{name}: torch.distributed.DistStoreError: timed out\n")
        if ranks:
            (staging / "ranks" / "0").mkdir(parents=True)
        kept = results.keep_node_logs(folder, staging, node_rank=1)
        assert kept is not None and not staging.exists()
        # named by node and time: the seed this node drew was not the run's (rank 0's, which every rank takes)
        assert re.fullmatch(r"node1-\d{8}-\d{6}-[0-9a-f]{6}", kept.name), kept.name
        assert (kept / "launcher.log").read_text().startswith(f"{name}: ")
        assert (kept / "0").is_dir() is ranks


def test_a_run_that_cannot_be_published_nor_set_aside_keeps_its_files(tmp_path: Path, monkeypatch) -> None:
    """No inode left for logs/ (a tmpfs of nr_inodes=13): a run that reached its target could not be published nor
    moved under logs/, and its staging folder was deleted with its log, plan and rank logs ('nothing of it was
    left'). It stays where it is now, for the next command to publish as a dead run's."""
    import io
    from types import SimpleNamespace

    from rich.console import Console

    from mlbench import results, runner
    from mlbench.launch.supervise import Outcome

    folder = tmp_path / "ci" / "gpt3"
    staging = folder / ".staging-x"
    staging.mkdir(parents=True)
    (staging / "mlperf.log").write_text("a log\n")
    monkeypatch.setattr(results, "set_aside", lambda folder, staging: None)  # (mkdir of logs/: no inode left)
    console = Console(file=io.StringIO(), width=1 << 20)
    result = runner.RunSet._not_published(SimpleNamespace(folder=folder, console=console),
                                          "run not published: No space left on device", staging,
                                          Outcome(status="success", exit_code=0))
    assert not result.published and (staging / "mlperf.log").read_text() == "a log\n"
    said = console.file.getvalue()
    assert f"its files stay in {staging}, which the next mlbench command in {folder} publishes" in said, said


def test_a_run_whose_folder_was_removed_is_not_said_to_stay_there(tmp_path: Path) -> None:
    """rm -rf of the results folder while the run trained: its files were said to 'stay in' the staging folder,
    which no longer existed, 'which the next mlbench command publishes'."""
    import io
    from types import SimpleNamespace

    from rich.console import Console

    from mlbench import runner
    from mlbench.launch.supervise import Outcome

    folder = tmp_path / "ci" / "gpt3"
    staging = folder / ".staging-x"  # (removed with the folder)
    console = Console(file=io.StringIO(), width=1 << 20)
    result = runner.RunSet._not_published(SimpleNamespace(folder=folder, console=console),
                                          "run not published: the log could not be completed: No such file or "
                                          "directory", staging, Outcome(status="aborted", exit_code=0))
    assert not result.published and not tmp_path.joinpath("ci").exists()
    said = console.file.getvalue()
    assert f"its folder {staging} was removed while the run was in progress: nothing of it is left" in said, said
    assert "stay" not in said, said


def test_a_set_that_stops_on_a_run_not_published_says_the_runs_not_started(tmp_path: Path, monkeypatch) -> None:
    """--runs 3 on a disk that fills in run 1: the set stopped there without a word of runs 2 and 3 (a stop signal
    says 'the set stops here; 2 more run(s) not started')."""
    import io

    from rich.console import Console

    from mlbench import registry, runner
    from mlbench.layout import resolve

    bench = registry.load("gpt3", tiny=True)
    console = Console(file=io.StringIO(), width=1 << 20)
    opts = runner.RunOptions(results=tmp_path, system="ci", runs=3, seed=1)
    run_set = runner.RunSet(bench, resolve(bench), opts, console, runner.local_commands(resolve(bench), opts))
    run_set.folder, run_set.seeds = tmp_path, [1, 2, 3]
    monkeypatch.setattr(run_set, "_run", lambda i, seed, env: runner.RunResult(
        tmp_path, "aborted", None, None, False, "run not published: No space left on device", published=False))
    run_set.supervise()
    assert run_set.collect() == 1 and len(run_set.results) == 1
    said = console.file.getvalue()
    assert said == "the run could not be published: the set stops here; 2 more run(s) not started\nset of 3 runs: " \
        "0 reached the target, 1 not published, 2 not started (the run could not be published)\n", said


def test_a_set_ends_with_a_line_counting_its_runs(tmp_path: Path, monkeypatch) -> None:
    """--runs 4: run 1 reached its target, run 2 did not, run 3 was stopped by Ctrl-C. The set ended on run 3's own
    line, nothing saying how the set went (how many reached the target, which did not, how many were not started)."""
    import io

    from rich.console import Console

    from mlbench import registry, runner
    from mlbench.layout import resolve

    bench = registry.load("gpt3", tiny=True)
    console = Console(file=io.StringIO(), width=1 << 20)
    opts = runner.RunOptions(results=tmp_path, system="ci", runs=4, seed=1)
    run_set = runner.RunSet(bench, resolve(bench), opts, console, runner.local_commands(resolve(bench), opts))
    run_set.folder, run_set.seeds = tmp_path, [1, 2, 3, 4]
    ends = iter([("success", ""), ("aborted", ""), ("aborted", "SIGINT")])

    def run(i: int, seed: int, env: dict) -> runner.RunResult:
        status, stop = next(ends)
        return runner.RunResult(tmp_path / f"result_{i}.txt", status, 1.0, 1.0, True, "", stopped_by=stop)

    monkeypatch.setattr(run_set, "_run", run)
    run_set.supervise()
    assert run_set.collect() == 130
    said = console.file.getvalue().splitlines()
    assert said[-1] == "set of 4 runs: 1 reached the target, 2 did not (result_1.txt, result_2.txt), 1 not started " \
        "(SIGINT)", said


_FAILS_AT_START = r"""
import json, sys, time
from mlbench.run_plan import RunPlan
plan = RunPlan.load(sys.argv[1])
if sys.argv[2] == "after":  # run_start reached: the run's own failure
    with open(plan.events_path, "a") as f:
        f.write(json.dumps({"event": "start", "time": time.time(), "budget": 8, "target": 1.0, "metric": "m",
                            "direction": "min"}) + "\n")
sys.stderr.write(f"FileNotFoundError: [Errno 2] No such file or directory: '{plan.run_dir}/gone.bin'\n")
sys.exit(1)
"""


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_set_whose_runs_fail_alike_before_run_start_stops(tmp_path: Path, when: str) -> None:
    """--runs 4 with the data file removed after run 1: every later run failed before run_start the same way, and
    the set tried them all, each published aborted (1000 of them for --runs 1000). Two alike in a row now stop the
    set, the rest counted as not started (exit 1); a failure after run_start is the run's own: the set goes on."""
    import io

    from rich.console import Console

    from mlbench import rcp_schedule, registry, runner
    from mlbench.launch.supervise import Command
    from mlbench.layout import resolve

    bench = registry.load("gpt3", tiny=True)
    layout = resolve(bench)
    bench = rcp_schedule.for_run(bench, layout.global_batch_size)
    folder = tmp_path / "ci" / "gpt3"
    folder.mkdir(parents=True)
    console = Console(file=io.StringIO(), width=1 << 20)
    opts = runner.RunOptions(results=tmp_path, system="ci", runs=4, seed=1)
    run_set = runner.RunSet(bench, layout, opts, console, lambda plan, staging, i, env: Command(
        [sys.executable, "-c", _FAILS_AT_START, str(plan), when], env, stdout=staging / "launcher.log"))
    run_set.prepare(folder)
    run_set.supervise()
    assert run_set.collect() == 1
    said = console.file.getvalue().splitlines()
    if when == "after":
        assert len(run_set.results) == 4 and said[-1].startswith("set of 4 runs: 0 reached the target, 4 did not"), said
        return
    assert len(run_set.results) == 2 and sorted(p.name for p in folder.glob("result_*.txt")) == ["result_0.txt",
                                                                                                "result_1.txt"]
    assert said[-2:] == ["runs 1 and 2 failed the same way before run_start: the set stops here; 2 more run(s) not "
                         "started",
                         "set of 4 runs: 0 reached the target, 2 did not (result_0.txt, result_1.txt), 2 not started "
                         "(runs 1 and 2 failed the same way before run_start)"], said


def test_a_set_goes_on_after_failures_before_run_start_that_differ() -> None:
    """Only two failures alike in a row, both before run_start and neither stopped by a signal, stop a set: a
    transient one (a port taken) followed by another reason, or one after run_start, lets it go on."""
    from mlbench.runner import RunResult, failed_alike_before_start

    def run(reason: str, started: bool = False, stop: str = "") -> RunResult:
        return RunResult(Path("r.txt"), "aborted", None, None, False, reason, stopped_by=stop, started=started)

    gone = "rank 0 exited with code 1: FileNotFoundError: '/r/.staging-{}/x' (see the rank logs: /r/.staging-{}/ranks)"
    assert failed_alike_before_start([run(gone.format(1, 1)), run(gone.format(2, 2))]) == \
        "runs 1 and 2 failed the same way before run_start"
    assert not failed_alike_before_start([run(gone.format(1, 1))])
    assert not failed_alike_before_start([run("EADDRINUSE: port 29500"), run(gone.format(2, 2))])
    assert not failed_alike_before_start([run(gone), run(gone, started=True)])
    assert not failed_alike_before_start([run(gone), run(gone, stop="SIGINT")])
    assert not failed_alike_before_start([run(""), run("")])


def _prepare_set(folder: str, first: int | None, start, queue) -> None:
    """A set of 3 runs prepared in FOLDER (what `mlbench run` does once preflight passed), once START is set."""
    import io

    from rich.console import Console

    from mlbench import registry, runner
    from mlbench.layout import resolve

    bench = registry.load("gpt3", tiny=True)
    opts = runner.RunOptions(results=Path(folder), system="ci", runs=3, seed=first)
    run_set = runner.RunSet(bench, resolve(bench), opts, Console(file=io.StringIO()),
                            runner.local_commands(resolve(bench), opts))
    start.wait(30)
    try:
        run_set.prepare(Path(folder))
        queue.put(run_set.seeds)
        time.sleep(3)  # its set in progress, as the other prepares
    except UserError as e:
        queue.put(str(e))


@pytest.mark.parametrize("first", [5, None], ids=["same-seed", "random-seeds"])
def test_two_sets_started_at_once_never_share_a_seed(tmp_path: Path, monkeypatch, first: int | None) -> None:
    """Two `run --seed 5 --runs 3` into one folder at the same moment both passed the seed check (preflight, before
    either had logged a seed) and ran seeds 5, 6, 7 twice. A set now claims its seeds in the folder under its lock:
    the second is refused, naming the set in progress; two random sets draw apart."""
    from mlbench import environment, runner, seed_claims

    monkeypatch.setattr(environment, "collect", lambda root: {})  # (pip's view of the install: not the point)
    folder = tmp_path / "ci" / "gpt3"
    folder.mkdir(parents=True)
    ctx = multiprocessing.get_context("fork")
    start, queue = ctx.Event(), ctx.Queue()
    if first is None:  # the worst draw: both sets draw the same first seed
        draws = iter([7, 7, 1000])  # (each process draws from its own copy)
        monkeypatch.setattr(runner.secrets, "randbelow", lambda n: next(draws))
    procs = [ctx.Process(target=_prepare_set, args=(str(folder), first, start, queue)) for _ in range(2)]
    for p in procs:
        p.start()
    start.set()
    got = [queue.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(60)
    claimed = [g for g in got if isinstance(g, list)]
    if first is None:
        assert len(claimed) == 2 and not set(claimed[0]) & set(claimed[1]), got
    else:
        assert claimed == [[5, 6, 7]], got
        refusal = next(g for g in got if isinstance(g, str))
        pids = {p.pid for p in procs}
        assert any(refusal.startswith(f"--seed 5: this set's seeds 5 to 7 would repeat seed 5 of a set in progress "
                                      f"(pid {pid}; its claim .seeds-{pid}-") for pid in pids), refusal
        assert "give --seed 8 (past every seed the folder holds)" in refusal, refusal
    assert not seed_claims.held(folder) and not list(folder.iterdir()), "a set's claim goes with its process"


def test_a_set_in_progress_holds_all_its_seeds_and_lets_them_go_as_it_ends(tmp_path: Path, cli, monkeypatch) -> None:
    """`run --seed 5 --runs 3` in progress, its first run logged: `run --seed 7` into the folder passed the check
    (seed 7 not logged yet) and repeated run 3's seed. The set's claim covers its runs to come; once it has ended,
    the seeds of runs it never started are free again."""
    from mlbench import runner, seed_claims

    folder = tmp_path / "ci" / "gpt3"
    folder.mkdir(parents=True)
    assert seed_claims.claim(folder, 5, 3, runner.seeds) == [5, 6, 7]  # (this process: a live owner)
    proc = cli("run", "gpt3", "--tiny", "--seed", "7", "--results", str(tmp_path), "--system", "ci")
    assert proc.returncode == 2 and f"would repeat seed 7 of a set in progress (pid {os.getpid()}; its claim " \
        ".seeds-" in proc.stderr and "to remove if that set is no longer running) in " in proc.stderr, proc.stderr
    seed_claims.release(folder)
    assert not seed_claims.held(folder) and not list(folder.iterdir())
    dead = folder / f"{seed_claims.CLAIM}{_dead_tag()}-abcd"  # its set killed with -9: no claim any more
    dead.write_text(json.dumps({"first": 5, "runs": 3}))
    assert not seed_claims.held(folder) and not dead.exists()


def test_a_claim_from_another_host_lapses_when_its_lease_is_not_renewed(tmp_path: Path) -> None:
    """A set that crashed on another host, its claim left in a shared results folder: its pid cannot be checked from
    here, so the claim held its seeds for ever. A claim's owner renews its lease (the file's mtime) while it runs;
    another host's not renewed for LEASE_S is judged dead, removed with a note. A same-host claim is judged by its
    pid, as before."""
    from mlbench import runner, seed_claims

    threads = threading.active_count()
    folder = tmp_path / "ci" / "gpt3"
    folder.mkdir(parents=True)
    other = folder / f"{seed_claims.CLAIM}4242-123456-otherhost@4026531836-abcd"
    other.write_text(json.dumps({"first": 5, "runs": 3}))
    notes: list[str] = []
    assert sorted(seed_claims.held(folder, notes.append)) == [5, 6, 7] and not notes  # (renewed: held)
    old = time.time() - seed_claims.LEASE_S - 60
    os.utime(other, (old, old))
    assert seed_claims.claim(folder, 5, 3, runner.seeds, say=notes.append) == [5, 6, 7]
    assert not other.exists() and notes == [
        f"note: seed claim {other} removed: its owner (pid 4242 on otherhost) has not renewed it for 11 min (a claim's "
        f"lease is 10 min): its set is judged to have died"], notes
    # this process's own claim: renewed while it runs (same host: judged by its pid, whatever its age)
    [mine] = folder.glob(f"{seed_claims.CLAIM}*")
    os.utime(mine, (old, old))
    assert sorted(seed_claims.held(folder)) == [5, 6, 7]
    seed_claims.renew()
    assert time.time() - mine.stat().st_mtime < 60
    # renewed from the loops that wait on a run, at most every RENEW_S, and by no thread of its own: the supervisor
    # starts ranks with preexec_fn, which may deadlock a child forked while another thread runs
    assert threading.active_count() == threads
    os.utime(mine, (old, old))
    seed_claims._renewer.renewed = time.monotonic()
    seed_claims.renew_due()
    assert mine.stat().st_mtime == old
    seed_claims._renewer.renewed -= seed_claims.RENEW_S
    seed_claims.renew_due()
    assert time.time() - mine.stat().st_mtime < 60
    seed_claims.release(folder)
    assert not list(folder.iterdir())


def test_a_pending_jobs_claim_outlives_its_submitters_error(tmp_path: Path, monkeypatch) -> None:
    """A SLURM submitter that raised (not killed) while its job was PENDING removed the claim it had handed to the
    job (seed_claims.released), so another set could take the pending job's seeds. The claim is left now while SLURM
    says the job has not ended (squeue, faked), and removed as any once the job has ended."""
    from mlbench import seed_claims

    folder = tmp_path / "ci" / "gpt3"
    folder.mkdir(parents=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    squeue = bin_dir / "squeue"
    squeue.write_text("#!/bin/sh\necho PENDING\n")
    squeue.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    with pytest.raises(RuntimeError), seed_claims.released(folder):
        assert seed_claims.claim(folder, None, 2, lambda first, runs, used: [40, 41]) == [40, 41]
        seed_claims.hand_to_job(folder, seed_claims.mine(folder), "17")
        raise RuntimeError("the follower failed")
    assert sorted(seed_claims.held(folder)) == [40, 41]
    with pytest.raises(UserError, match="would repeat seed 40 of a set in progress"):
        seed_claims.check_free(folder, 40, 1)
    # a claim not handed to a job goes with its set, as before
    other = tmp_path / "ci" / "bert"
    other.mkdir()
    with seed_claims.released(other):
        seed_claims.claim(other, None, 1, lambda first, runs, used: [7])
    assert not list(other.iterdir())
    with monkeypatch.context() as m:  # the job's driver (in job 17), having taken the claim over, ends its set
        m.setenv("SLURM_JOB_ID", "17")
        m.setattr(seed_claims, "_job_active", lambda job: pytest.fail("the job's own driver asked squeue of its job"))
        shutil.copy(next(folder.iterdir()), other / next(folder.iterdir()).name)
        seed_claims.release(other)
    assert not list(other.iterdir())
    squeue.write_text("#!/bin/sh\necho 'slurm_load_jobs error: Invalid job id specified' >&2\nexit 1\n")
    seed_claims.release(folder)  # the job has ended: its claim goes
    assert not list(folder.iterdir())


def test_a_slurm_jobs_claim_holds_while_the_job_is_pending(tmp_path: Path, monkeypatch) -> None:
    """`mlbench run --launcher slurm --seed 5`: the job claimed its seeds as its driver started, so while it was
    PENDING another set took them and the job was refused at its start (exit 2 in job.out). The submitting process
    claims them now and hands the claim to the job (seed_claims.hand_to_job): its submitter gone, the claim holds
    while SLURM says the job is pending, and goes once the job has ended without taking it; the job's driver takes it
    over (seed_claims.adopt) as it starts."""
    from mlbench import runner, seed_claims

    folder = tmp_path / "ci" / "gpt3"
    folder.mkdir(parents=True)
    submitter = folder / f"{seed_claims.CLAIM}{_dead_tag()}-abcd"  # the submitting mlbench, gone (kill -9)
    submitter.write_text(json.dumps({"first": 5, "runs": 3}))
    monkeypatch.setattr(seed_claims, "_job_active", lambda job: {"17": True, "18": False}.get(job))
    for job, holds in [("17", True), ("99", True), ("18", False)]:  # pending; SLURM does not answer; ended
        submitter.write_text(json.dumps({"first": 5, "runs": 3, "slurm_job": job}))
        assert bool(seed_claims.held(folder)) == holds, job
    assert not submitter.exists()
    # a live submitter (this process) hands its claim to the job it submitted
    assert seed_claims.claim(folder, None, 2, lambda first, runs, used: [40, 41]) == [40, 41]
    name = seed_claims.mine(folder)
    seed_claims.hand_to_job(folder, name, "17")
    assert json.loads((folder / name).read_text()) == {"first": 40, "runs": 2, "slurm_job": "17"}

    def disk_full(*args: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as m:  # the disk full as it hands the claim over: no stray file in the results
        m.setattr(seed_claims.os, "replace", disk_full)
        seed_claims.hand_to_job(folder, name, "18")
    assert sorted(p.name for p in folder.iterdir()) == [name]
    assert json.loads((folder / name).read_text())["slurm_job"] == "17"
    with pytest.raises(UserError, match="would repeat seed 40 of a set in progress"):
        seed_claims.check_free(folder, 39, 2)
    seed_claims.release(folder)  # (job 17 pending: its claim holds; test_a_pending_jobs_claim_outlives_...)
    monkeypatch.setattr(seed_claims, "_job_active", lambda job: False)
    seed_claims.release(folder)
    assert not list(folder.iterdir())
    # the job's driver (this process) takes over the claim its submitter (on another host) handed it
    handed = folder / f"{seed_claims.CLAIM}4242-123456-otherhost@4026531836-wxyz"
    handed.write_text(json.dumps({"first": 40, "runs": 2, "slurm_job": "17"}))
    assert seed_claims.adopt(folder, handed.name, 40, 3) is None  # (not its seeds: claimed as any set's)
    from mlbench import environment, registry
    from mlbench.layout import resolve

    monkeypatch.setattr(environment, "collect", lambda root: {})
    bench = registry.load("gpt3", tiny=True)
    opts = runner.RunOptions(results=tmp_path, system="ci", runs=2, seed=40, seed_claim=handed.name)
    run_set = runner.RunSet(bench, resolve(bench), opts, None, runner.local_commands(resolve(bench), opts))
    run_set.prepare(folder)  # (as the job's driver does)
    assert run_set.seeds == [40, 41]
    assert not handed.exists() and seed_claims.mine(folder).endswith("-wxyz")  # its own now, renamed to its tag
    seed_claims.release(folder)
    assert not list(folder.iterdir())


@pytest.mark.parametrize("stop", ["SIGTERM", "SIGQUIT", "SIGUSR1", "SIGINT"])
def test_a_stop_before_the_first_run_releases_the_sets_claim(tmp_path: Path, cli, monkeypatch, stop: str) -> None:
    """A stop signal between a set claiming its seeds and starting its first run (here as it reads its
    environment) left its .seeds-* claim behind until the next command in the folder found its owner gone (SIGTERM,
    Ctrl-C), or killed mlbench at once, the claim with its folders left behind (SIGQUIT, SIGUSR1: their default).
    Every way out now removes it, and the folders the run made."""
    import signal

    from mlbench import environment, seed_claims

    folder = tmp_path / "ci" / "gpt3"
    seen: list[list[str]] = []

    def stopped(root: Path) -> dict:
        seen.append([p.name for p in folder.glob(f"{seed_claims.CLAIM}*")])
        if signal.getsignal(signal.Signals[stop]) is signal.SIG_DFL:  # (sent, it would kill pytest)
            raise AssertionError(f"{stop} would kill mlbench here, its claim left behind")
        os.kill(os.getpid(), signal.Signals[stop])
        time.sleep(5)  # (the handler raises at once)
        return {}

    monkeypatch.setattr(environment, "collect", stopped)
    proc = cli("run", "gpt3", "--tiny", "--seed", "5", "--runs", "2", "--results", str(tmp_path), "--system", "ci")
    assert len(seen) == 1 and len(seen[0]) == 1, seen  # it was stopped with its claim made
    assert proc.returncode == 128 + signal.Signals[stop].value, proc.stdout + proc.stderr
    assert not list(tmp_path.iterdir()), sorted(tmp_path.rglob("*"))


@pytest.mark.parametrize("logged", [True, False], ids=["its-log-began", "killed-before-its-log"])
def test_a_killed_runs_seed_counts_before_it_is_published(tmp_path: Path, cli, logged: bool) -> None:
    """`kill -9` of a run with --seed 5: its staging folder, not yet published (the next run publishes it), held
    seed 5, but the seed check (before dead runs are published) read only published logs, and `run --seed 5` ran
    it again. The seeds of runs in staging folders count: their log's, or their plan's before the log began."""
    folder = tmp_path / "ci" / "gpt3"
    folder.mkdir(parents=True)
    staging = folder / f"{results.STAGING}{_dead_tag()}-abcd"
    staging.mkdir()
    (staging / "plan.json").write_text(json.dumps({"seed": 5, "layout": {"nodes": 1}, "dry_run": False}))
    if logged:
        (staging / "mlperf.log").write_text(
            ':::MLLOG {"namespace": "", "time_ms": 1, "event_type": "POINT_IN_TIME", "key": "seed", "value": 5, '
            '"metadata": {"file": "x.py", "lineno": 1}}\n')
    proc = cli("run", "gpt3", "--tiny", "--seed", "4", "--runs", "2", "--results", str(tmp_path), "--system", "ci")
    assert proc.returncode == 2 and f"--seed 4: this set's seeds 4 to 5 would repeat seed 5 of a run whose mlbench " \
        f"died, not yet published ({staging.name}: the next run in the folder publishes it) in {folder}" in \
        proc.stderr, proc.stderr
    assert sorted(folder.iterdir()) == [staging]
    # another node of a run, into a folder the nodes share: its plan holds that node's own draw, not the run's seed
    (staging / "mlperf.log").unlink(missing_ok=True)
    (staging / "plan.json").write_text(json.dumps({"seed": 5, "layout": {"nodes": 2}, "dry_run": False}))
    from mlbench import seed_claims

    assert not seed_claims.held(folder)


def test_a_dead_nodes_rank_logs_are_kept_not_removed(tmp_path: Path) -> None:
    """Node 1 of a torchrun run whose mlbench was killed (kill -9) left a staging folder with its rank logs and no
    MLPerf log (node 0 holds that): the next command in its folder deleted it without a word, the only account of
    why that node's ranks ended. It is set aside under logs/ now; an empty one still goes."""
    folder = tmp_path / "sys" / "gpt3"
    folder.mkdir(parents=True)
    node = folder / f"{results.STAGING}{_dead_tag()}-node"
    (node / "ranks" / "attempt_0" / "0").mkdir(parents=True)
    (node / "ranks" / "attempt_0" / "0" / "stderr.log").write_text("RuntimeError: Connection reset by peer\n")
    empty = folder / f"{results.STAGING}{_dead_tag()}-empt"
    empty.mkdir()
    assert sorted(results.remove_stale(folder)) == sorted([node, empty])
    kept = folder / "logs" / f"unpublished-{node.name.lstrip('.')}"
    assert (kept / "ranks" / "attempt_0" / "0" / "stderr.log").is_file() and not empty.exists()


def test_a_disk_without_a_free_inode_is_said_so(tmp_path: Path) -> None:
    """'No space left on device' with no inode left: the reason said 'the disk has 21.0 MB free', pointing away
    from the cause."""
    from mlbench.errors import disk_free

    (tmp_path / "disk").mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,nr_inodes=2", "tmpfs",
                                            str(tmp_path / "disk")]).returncode != 0:
        pytest.skip("mounting a small tmpfs needs root")
    try:
        with contextlib.suppress(OSError):
            for i in range(4):
                (tmp_path / "disk" / f"f{i}").touch()
        assert disk_free(tmp_path / "disk" / "x").startswith(f"the disk holding {tmp_path / 'disk' / 'x'} has no "
                                                             "free inode left (")
    finally:
        subprocess.run(["umount", "-l", str(tmp_path / "disk")], check=False)
    assert "MB free" in disk_free(tmp_path) and "inode" not in disk_free(tmp_path)


def test_a_saves_error_of_another_cause_than_room_gets_no_room_note(tmp_path: Path) -> None:
    """--save-checkpoint D whose parent was made a file meanwhile: the reason was 'NotADirectoryError: ...' and '(the
    disk holding D has N MB free)', pointing away from the cause. The note stays for a writer's words that may hide
    a full disk."""
    import errno as errnos

    from mlbench.train.loop import room_note

    dest = str(tmp_path / "ckpt")
    assert room_note(NotADirectoryError(errnos.ENOTDIR, "Not a directory"), dest) == ""
    assert room_note(PermissionError(errnos.EACCES, "Permission denied"), dest) == ""
    assert room_note(OSError(errnos.ENOSPC, "No space left on device"), dest).startswith("the disk holding")
    assert room_note(RuntimeError("unexpected pos 704 vs 598"), dest).startswith("the disk holding")


def test_a_results_folder_removed_as_a_run_stages_is_made_again(tmp_path: Path) -> None:
    """Two commands at once: one refused removes the empty benchmark folder it made, just as the other stages its
    run there; the other was refused, 'cannot write a run's files (No such file or directory)'."""
    folder = tmp_path / "ci" / "gpt3"
    staging = results.stage(folder)  # (as the other command's clean-up left it: gone)
    assert staging.parent == folder and staging.is_dir()


def test_a_set_whose_next_run_cannot_be_staged_stops_with_exit_1(tmp_path: Path, monkeypatch) -> None:
    """--runs 3 on a disk that fills after run 1 was published: run 2's staging folder could not be made, and the
    set ended as bad input (a UserError out of the set: exit 2, run 1 published, no word of runs 2 and 3). Now the
    set stops there as for a run not published (exit 1), the reason said; before its first run it is still
    refused (exit 2, nothing of it written)."""
    import errno
    import io

    from rich.console import Console

    from mlbench import registry, runner
    from mlbench.layout import resolve

    def full(folder: Path) -> Path:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(results, "stage", full)
    bench = registry.load("gpt3", tiny=True)
    for done in (1, 0):
        console = Console(file=io.StringIO(), width=1 << 20)
        opts = runner.RunOptions(results=tmp_path, system="ci", runs=3, seed=1)
        run_set = runner.RunSet(bench, resolve(bench), opts, console, runner.local_commands(resolve(bench), opts))
        run_set.folder, run_set.seeds = tmp_path, [1, 2, 3]
        real = run_set._run
        monkeypatch.setattr(run_set, "_run", lambda i, seed, env, real=real, done=done: runner.RunResult(
            tmp_path / "result_0.txt", "success", 1.0, 1.0, True, "") if i < done else real(i, seed, env))
        if not done:
            with pytest.raises(runner.NotStaged, match="cannot write a run's files"):
                run_set.supervise()
            continue
        run_set.supervise()
        assert run_set.collect() == 1
        said = console.file.getvalue().splitlines()
        assert said == [f"results folder {tmp_path}: cannot write a run's files (No space left on device); free space "
                        "or pass --results DIR elsewhere",
                        "the next run's files could not be written: the set stops here; 2 more run(s) not started",
                        "set of 3 runs: 1 reached the target, 2 not started (the next run's files could not be "
                        "written)"], said


# ---- the bookkeeping of a long run (perf/long_run_bookkeeping.py: 100,000 steps, 500 evals) --------------------

def _step_event(step: int) -> dict:
    return {"event": "step", "time": 1.5, "step": step, "loss": 1.0 / step, "step_time": 0.25, "tokens_per_s": 4096,
            "mfu": None, "tflops_per_device": 0.5, "lr": 1e-4, "grad_norm": 0.75}


def test_the_supervisor_keeps_a_long_run_s_steps_as_numbers_and_reads_each_byte_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The supervisor kept every event rank 0 wrote as a dict until the run was published: 387 MiB at 100,000
    steps (4 GB for llama31_8b's 1.2M-step budget). It keeps the steps as columns of numbers, every other event
    whole, and each poll reads only what was appended since the last."""
    from mlbench.launch import events as events_module

    path = tmp_path / "events.jsonl"
    read = [0]
    real_open = open

    class Counted:
        def __init__(self, f):
            self.f = f

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def read(self, n=-1):
            data = self.f.read(n)
            read[0] += len(data)
            return data
    monkeypatch.setattr(events_module, "open", lambda *a, **k: Counted(real_open(*a, **k)), raising=False)
    tail = events_module.EventTail(path)
    with open(path, "w") as f:
        f.write(json.dumps({"event": "start", "budget": 4000}) + "\n")
        for step in range(1, 4001):
            f.write(json.dumps(_step_event(step)) + "\n")
            if step % 400 == 0:
                f.write(json.dumps({"event": "eval", "step": step, "value": 2.0}) + "\n")
                f.flush()
                assert tail.poll()[-1] == {"event": "eval", "step": step, "value": 2.0}
    assert read[0] == path.stat().st_size  # each byte read once, whatever the number of polls
    assert [e["event"] for e in tail.events] == ["start"] + ["eval"] * 10  # no step event held as a dict
    assert len(tail.steps) == 4000 and tail.seen == 4011
    event = _step_event(4000)  # the record's names: step_time_s for the event's step_time
    assert tail.steps[-1] == {("step_time_s" if k == "step_time" else k): v for k, v in event.items()
                              if k not in ("event", "time")}
    assert tail.steps.median("mfu") is None and (tail.steps.total, tail.steps.stride) == (4000, 1)


@pytest.mark.parametrize("steps", [1, 18, 19, 20, 21, 22, 1000, 1001])
def test_a_long_run_s_step_rows_are_thinned_past_a_bound_and_its_mfu_is_over_every_step(
        steps: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The record kept a row for every step, about 190 bytes each: 230 MB at llama31_8b's 1.2M-step budget, which
    jq or pandas needed gigabytes to read. Past WHOLE_ROWS rows one in a stride (doubling) is kept, and the last:
    the record's size is bounded; its median MFU is still over every step."""
    from mlbench.launch import events as events_module

    monkeypatch.setattr(events_module, "WHOLE_ROWS", 10)
    monkeypatch.setattr(events_module, "THINNED_ROWS", 8)
    kept = events_module.Steps()
    for step in range(1, steps + 1):
        kept.add(_step_event(step) | {"mfu": step / 1000})
    rows = [r["step"] for r in kept]
    stride = kept.stride
    past = [s for s in range(11, steps + 1, stride)]
    assert rows == list(range(1, min(steps, 10) + 1)) + past + ([steps] if steps > 10 and past[-1] != steps else [])
    assert kept.total == steps and len(rows) <= 10 + 8 + 1 and stride == 1 << max(0, (steps - 11) // 8).bit_length()
    assert kept[-1] == {("step_time_s" if k == "step_time" else k): v for k, v in _step_event(steps).items()
                        if k not in ("event", "time")} | {"mfu": steps / 1000}
    assert kept.median("mfu") == (steps // 2 + 1) / 1000  # the upper median of every step's, kept or not


def test_a_poll_that_finds_a_long_run_s_events_reads_a_bounded_part_of_them(tmp_path: Path) -> None:
    """A supervisor that polled after minutes (stopped, then continued) read and returned the whole file at once,
    every event a dict; one poll now reads about POLL_BYTES, the next polls (drain, at the end) the rest."""
    from mlbench.launch import events as events_module

    path = tmp_path / "events.jsonl"
    line = json.dumps(_step_event(1)) + "\n"
    path.write_text(line * (3 * events_module.POLL_BYTES // len(line)))
    tail = events_module.EventTail(path)
    first = tail.poll()
    assert 0 < len(first) * len(line) <= events_module.POLL_BYTES + (1 << 20)
    assert sum(len(new) for new in tail.drain()) + len(first) == tail.steps.total == path.stat().st_size // len(line)


def test_a_long_run_s_log_is_closed_without_reading_it_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The supervisor completed every run's log by reading all of it as dicts (to find run_stop and the last
    step's samples): 260 MiB at 200,000 steps as the run ended. It streams the three keys it needs."""
    from mlbench import logfile, mlperf_log

    log = tmp_path / "mlperf.log"
    lines = [f':::MLLOG {{"namespace": "", "time_ms": {t}, "event_type": "POINT_IN_TIME", "key": "tracked_stats", '
             f'"value": {{"reduced_train_loss": 2.5}}, "metadata": {{"step": {t}, "samples_count": {16 * t}}}}}'
             for t in range(1, 3001)]
    log.write_text("\n".join(lines) + "\n")
    made = [0]
    as_dict = logfile.Event.as_dict
    monkeypatch.setattr(logfile.Event, "as_dict", lambda self: made.__setitem__(0, made[0] + 1) or as_dict(self))
    assert mlperf_log.finalize_aborted(log, "hang: no progress for 300 s")
    assert made[0] == 0
    monkeypatch.undo()
    tail = mlperf_log.read(log)[-2:]
    assert [(e["key"], e["value"]) for e in tail] == [("train_samples", 48000), ("run_stop", None)]
    assert not mlperf_log.finalize_aborted(log, "again")  # run_stop there: left alone


def test_a_long_run_s_record_is_written_a_step_a_line(tmp_path: Path) -> None:
    """The record was one json.dumps of every step as a dict, a line a field (21 MiB at 100,000 steps, and the
    whole text in memory at once): its steps are written as they are read back, one line each."""
    from mlbench.launch.events import EventTail

    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(_step_event(s) | ({"loss": float("nan")} if s == 2 else {})) + "\n"
                            for s in range(1, 1001)))
    tail = EventTail(path)
    tail.read_all()
    record = {"status": "success", "mfu": None, "steps": tail.steps, "evals": [{"step": 1000, "value": 2.0}]}
    pieces = list(results.record_text(record))
    assert len(pieces) == 1000 + 2  # the head, a step a piece, the tail: never all of it at once
    text = "".join(pieces)
    back = json.loads(text)  # strict JSON: the NaN loss is null
    assert back["steps"][1]["loss"] is None and back["steps"][999]["step"] == 1000 and back["evals"] == record["evals"]
    assert back["steps"] == [{**s, "loss": None if s["step"] == 2 else s["loss"]} for s in tail.steps]
    assert len(text.splitlines()) < 1000 + 20
    empty = json.loads("".join(results.record_text(record | {"steps": []})))
    assert empty["steps"] == [] and json.loads("".join(results.record_text({"a": 1}))) == {"a": 1}


@pytest.mark.parametrize("tail", [b"", b':::MLLOG {"key": "cut', b"x" * 200_000])
def test_a_dead_run_s_cut_line_is_dropped_from_its_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       tail: bytes) -> None:
    """A dead run's log was read whole into memory to drop a line the kill cut short (36 MiB at 100,000 steps):
    it is read back from its end, as far as its last newline."""
    from mlbench import dead_runs

    log = tmp_path / "mlperf.log"
    whole = b"".join(b':::MLLOG {"key": "tracked_stats", "n": %d}\n' % i for i in range(20_000))
    log.write_bytes(whole + tail)
    read = [0]
    real_open = open

    def counted(*a, **k):
        f = real_open(*a, **k)
        real_read = f.read
        f.read = lambda n=-1: read.__setitem__(0, read[0] + len(data := real_read(n))) or data
        return f
    monkeypatch.setattr(dead_runs, "open", counted, raising=False)
    dead_runs._drop_cut_line(log)
    assert log.read_bytes() == whole and read[0] <= len(tail) + (1 << 16)
    log.write_bytes(b"no newline at all")
    dead_runs._drop_cut_line(log)
    assert log.read_bytes() == b""


def test_a_long_run_s_record_over_the_json_limit_is_still_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run record over logfile.MAX_JSON_BYTES (a long run's per-step rows: 64 MiB at about 345,000 steps) could
    not be read: compare read its run as one without a record (judged by the closed rules), scaling stopped with
    'device count unknown'. It is read without its rows, which no reader uses; a record that holds more than them,
    or not in the row-a-line form, is still refused."""
    from mlbench import logfile
    from mlbench.analysis import logs
    from mlbench.launch.events import EventTail

    events = tmp_path / "events.jsonl"
    events.write_text("".join(json.dumps(_step_event(s)) + "\n" for s in range(1, 2001)))
    tail = EventTail(events)
    tail.read_all()
    record = {"variant": "tiny", "devices": 8, "steps": tail.steps, "quality": {"target": 3.3, "direction": "min"},
              "result": "result_0.txt"}
    path = tmp_path / "result_0.json"
    path.write_text("".join(results.record_text(record)))
    monkeypatch.setattr(logfile, "MAX_JSON_BYTES", 4096)  # the record is ~370 KB: over it
    with pytest.raises(OSError, match="over the"):
        logfile.load_json(path)
    back = logs.run_record(tmp_path / "result_0.txt")
    assert back == {**record, "steps": []}
    assert logs._unusable(path) is None
    path.write_text(json.dumps({**record, "steps": list(tail.steps)}, indent=1))  # a line a field: not skipped
    assert logs.run_record(tmp_path / "result_0.txt") == {}
    path.write_text("".join(results.record_text({**record, "note": "x" * 5000})))  # more than the rows
    assert logs.run_record(tmp_path / "result_0.txt") == {}
