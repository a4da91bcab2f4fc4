"""The official checker's verdicts are kept (mlbench.verdicts): a log judged before, under the same rules, is not
checked again, wherever it lies; what the checker did not finish is never kept. Each test has a cache of its own."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from mlbench import compliance, mlperf_tools, verdicts

SET = (Path(__file__).parent / "data" / "mlperf-results" / "training_results_v5.1" / "AMD" / "results"
       / "MI355X_EPYC_9575F_pytorch" / "llama31_8b")
RULESET = "6.0.0"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MLBENCH_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "verdicts"


def _no_checker(monkeypatch: pytest.MonkeyPatch) -> list:
    """The checker, replaced by one that judges every log non-compliant; returns the list of its starts."""
    started: list = []

    def command(*args, **kwargs) -> list[str]:
        started.append(args)
        return [sys.executable, "-c", "import sys; sys.stderr.write('ERROR - FAILED\\n'); sys.exit(1)"]
    monkeypatch.setattr(mlperf_tools, "checker_command", command)
    return started


def test_a_log_judged_before_is_not_checked_again_wherever_it_lies(cache, tmp_path, monkeypatch) -> None:
    first = compliance.check(SET / "result_0.txt", RULESET, smoke=False)
    assert first.ok is True and len(list(cache.glob("*.json"))) == 1
    shutil.copy(SET / "result_0.txt", tmp_path / "moved.txt")
    started = _no_checker(monkeypatch)
    again = compliance.check(tmp_path / "moved.txt", RULESET, smoke=False)
    assert not started and again.ok is True and again.messages == first.messages
    assert again.path == tmp_path / "moved.txt" and again.rules == first.rules


def test_other_bytes_or_other_rules_are_checked(cache, tmp_path, monkeypatch) -> None:
    compliance.check(SET / "result_0.txt", RULESET, smoke=False)
    started = _no_checker(monkeypatch)
    changed = tmp_path / "result_0.txt"
    changed.write_bytes((SET / "result_0.txt").read_bytes() + b"\n")
    assert compliance.check(changed, RULESET, smoke=False).ok is False and len(started) == 1
    assert compliance.check(SET / "result_0.txt", RULESET, smoke=True).ok is False and len(started) == 2
    assert compliance.check(SET / "result_0.txt", "5.1.0", smoke=False).ok is False and len(started) == 3
    assert compliance.check(SET / "result_0.txt", RULESET, smoke=False, quiet=True).ok is False and len(started) == 4


def test_a_non_compliant_verdict_is_kept_with_messages_naming_the_file_checked(cache, tmp_path, monkeypatch) -> None:
    bad = tmp_path / "a" / "result_0.txt"
    bad.parent.mkdir()
    lines = (SET / "result_0.txt").read_text().splitlines(keepends=True)
    bad.write_text("".join(ln for ln in lines if '"key": "run_stop"' not in ln))
    first = compliance.check(bad, RULESET, smoke=False)
    assert first.ok is False and first.messages
    other = tmp_path / "b" / "elsewhere.txt"
    other.parent.mkdir()
    shutil.copy(bad, other)
    started = _no_checker(monkeypatch)
    again = compliance.check(other, RULESET, smoke=False)
    assert not started and again.ok is False
    assert again.messages == [m.replace(str(bad), str(other)) for m in first.messages]
    assert str(bad) not in (cache / f"{next(cache.glob('*.json')).stem}.json").read_text()


def test_a_log_that_changed_while_it_was_checked_is_not_kept(cache, tmp_path, monkeypatch) -> None:
    """A live run's log, checked as it grows: the verdict is on bytes other than those hashed before."""
    log = tmp_path / "result_0.txt"
    shutil.copy(SET / "result_0.txt", log)
    grows = f"open({str(log)!r}, 'a').write('more\\n'); import sys; sys.stderr.write('ERROR - FAILED\\n'); sys.exit(1)"
    monkeypatch.setattr(mlperf_tools, "checker_command", lambda *a, **k: [sys.executable, "-c", grows])
    assert compliance.check(log, RULESET, smoke=False).ok is False
    assert not cache.exists() or not list(cache.iterdir())


def test_a_checker_that_did_not_finish_is_not_kept(cache, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(mlperf_tools, "checker_command",
                        lambda *a, **k: [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), 9)"])
    assert compliance.check(SET / "result_0.txt", RULESET, smoke=False).ok is None
    monkeypatch.setattr(mlperf_tools, "checker_command",
                        lambda *a, **k: [sys.executable, "-c", "import time; time.sleep(30)"])
    assert compliance.check(SET / "result_0.txt", RULESET, smoke=False, time_limit=0.5).ok is False
    assert not cache.exists() or not list(cache.iterdir())


@pytest.mark.parametrize("garbage", [b"", b"{", b"[1]", b'{"ok": "yes", "messages": []}', b'{"ok": true}',
                                     b'{"ok": true, "messages": [1]}'])
def test_a_garbled_verdict_file_is_checked_again_and_replaced(cache, monkeypatch, garbage: bytes) -> None:
    compliance.check(SET / "result_0.txt", RULESET, smoke=False)
    [kept] = cache.glob("*.json")
    kept.write_bytes(garbage)
    started = []
    real = mlperf_tools.checker_command
    monkeypatch.setattr(mlperf_tools, "checker_command", lambda *a, **k: started.append(a) or real(*a, **k))
    assert compliance.check(SET / "result_0.txt", RULESET, smoke=False).ok is True and len(started) == 1
    assert json.loads(kept.read_text()) == {"ok": True, "messages": []}


def test_a_pipe_in_place_of_a_verdict_is_checked_again_never_waited_on(cache, monkeypatch) -> None:
    import os

    compliance.check(SET / "result_0.txt", RULESET, smoke=False)
    [kept] = cache.glob("*.json")
    kept.unlink()
    os.mkfifo(kept)  # read as a file, it would block for ever
    assert verdicts.load(kept.stem, SET / "result_0.txt") is None
    assert compliance.check(SET / "result_0.txt", RULESET, smoke=False).ok is True
    assert kept.is_file()  # replaced by the new verdict


def test_a_cache_that_cannot_be_written_is_done_without(tmp_path, monkeypatch) -> None:
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("MLBENCH_CACHE", str(tmp_path / "file"))  # a file where the folder should be
    assert compliance.check(SET / "result_0.txt", RULESET, smoke=False).ok is True
    assert verdicts.key(tmp_path / "missing.txt", RULESET, None, False) is None


def test_score_of_a_set_scored_before_runs_no_checker(cache, monkeypatch) -> None:
    from mlbench.analysis import score

    first = score.score_path(SET, RULESET, jobs=2)[0]
    assert len(list(cache.glob("*.json"))) == len(list(SET.glob("result_*.txt")))
    started = _no_checker(monkeypatch)
    again = score.score_path(SET, RULESET, jobs=2)[0]
    assert not started and again.to_json() == first.to_json()


def test_the_cache_keeps_the_most_recently_used_verdicts(cache, tmp_path, monkeypatch) -> None:
    """It grew without bound (a file a log ever checked); now the least recently used go past KEEP, and the
    temporary files of writes killed long ago."""
    import os
    import time

    _no_checker(monkeypatch)
    monkeypatch.setattr(verdicts, "KEEP", 3)
    logs = []
    for i in range(4):
        log = tmp_path / f"{i}" / "result_0.txt"
        log.parent.mkdir()
        log.write_text(f":::MLLOG {{\"key\": \"x{i}\"}}\n")
        logs.append(log)
    for log in logs[:3]:
        compliance.check(log, RULESET, smoke=False)
    kept = sorted(cache.glob("*.json"), key=lambda p: p.stat().st_mtime)
    long_ago = time.time() - 7200
    for n, p in enumerate(kept):  # their ages: the first log's oldest
        os.utime(p, (long_ago + n, long_ago + n))
    left = cache / ".abc.json-x1"
    left.write_text("{")
    os.utime(left, (long_ago, long_ago))
    started = _no_checker(monkeypatch)
    compliance.check(logs[0], RULESET, smoke=False)  # read: now the most recently used
    assert not started
    compliance.check(logs[3], RULESET, smoke=False)  # a fourth: the least recently used (the second log's) goes
    assert len(list(cache.glob("*.json"))) == 3 and not left.exists()
    for log, checked in ((logs[0], 0), (logs[2], 0), (logs[3], 0), (logs[1], 1)):
        compliance.check(log, RULESET, smoke=False)
        assert len(started) == 1 + checked, log
