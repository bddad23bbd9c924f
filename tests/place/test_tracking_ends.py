"""How the MLflow helper decides, with no daemon, that a run's attempt ended: the job's
result (at once without a daemon, after a grace with one), a supervisor that died without
one (a real process, ended), whether a daemon serves (its recorded pid and start), and an end
with no run to close. Each on real files and processes; the full path, with a real daemon,
helper and MLflow store: tests/place/test_helper_ends.py."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

from tandem.place.run.metrics import tracking_ends as ends
from tandem.place.run.supervisor.files import Result, RunEnd, RunStart, ShimInfo, Usage, save, write_json
from tandem.place.run.supervisor.proctrack import create_time, host_id


def _attempt(tmp_path: Path) -> tuple[Path, RunStart]:
    adir = tmp_path / "jobs" / "7" / "1"
    adir.mkdir(parents=True)
    spool = adir / "metrics.jsonl"
    return spool, RunStart("job 7", str(spool), time.time(), job_id=7, attempt=1)


def _result(adir: Path, state: str, kind: str, code: int | None) -> None:
    save(adir, Result(kind, state, code, None, state, None, time.time() - 5, time.time(), 1 << 20, 1.5))


def test_a_result_closes_the_run_at_once_without_a_daemon_after_a_grace_with_one(tmp_path: Path) -> None:
    spool, start = _attempt(tmp_path)
    assert ends.end_without_daemon(spool, start, gone=True) is None, "no supervisor yet: it may be starting"
    never = ends.end_without_daemon(
        spool, dataclasses.replace(start, started=time.time() - ends.NEVER_STARTED_S - 1), True
    )
    assert never is not None and never.status == "KILLED" and never.tags["tandem.state"] == "lost"
    _result(spool.parent, "failed", "exit", 3)
    assert ends.end_without_daemon(spool, start, gone=False) is None, "a live daemon says it itself"
    end = ends.end_without_daemon(spool, start, gone=True)
    assert end is not None and end.status == "FAILED" and end.by_helper
    assert end.tags["tandem.state"] == "failed" and end.tags["tandem.exit_code"] == "3"
    assert end.summary["peak_mem_bytes"] == 1 << 20 and end.summary["cpu_seconds"] == 1.5
    old = time.time() - ends.RESULT_GRACE_S - 1
    os.utime(spool.parent / Result.FILE, (old, old))
    assert ends.end_without_daemon(spool, start, gone=False) is not None, "a daemon that never says it"
    _result(spool.parent, "succeeded", "ok", 0)
    finished = ends.end_without_daemon(spool, start, gone=True)
    assert finished is not None and finished.status == "FINISHED"


def test_a_supervisor_dead_without_a_result_is_a_lost_run_only_without_a_daemon(tmp_path: Path) -> None:
    spool, start = _attempt(tmp_path)
    shim = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    save(spool.parent, ShimInfo(shim.pid, create_time(shim.pid), host_id()))
    assert ends.end_without_daemon(spool, start, gone=True) is None, "it runs"
    shim.stdin.close()  # type: ignore[union-attr]
    shim.wait()
    assert ends.end_without_daemon(spool, start, gone=False) is None
    end = ends.end_without_daemon(spool, start, gone=True)
    assert end is not None and end.status == "FAILED" and end.tags["tandem.state"] == "lost"
    save(spool.parent, ShimInfo(shim.pid, create_time(shim.pid), "another-machine"))
    assert ends.end_without_daemon(spool, start, gone=True) is None, "pids elsewhere mean nothing here"
    # On another node, silent for long with no daemon (its node died with the cluster): lost.
    old = time.time() - ends.REMOTE_SILENT_S - 1
    os.utime(spool.parent / ShimInfo.FILE, (old, old))
    end = ends.end_without_daemon(spool, start, gone=True)
    assert end is not None and end.tags["tandem.state"] == "lost" and "node" in end.tags["tandem.cause"]
    save(spool.parent, Usage(time.time(), [1], 0, 0, 0.0))  # it writes again: it runs there
    assert ends.end_without_daemon(spool, start, gone=True) is None


def test_whether_a_daemon_serves(tmp_path: Path) -> None:
    q = tmp_path / "track"
    q.mkdir()
    parent = -1  # not this process's parent: the recorded daemon decides
    assert ends.daemon_gone(tmp_path, q, parent), "no daemon.json"
    write_json(tmp_path / "daemon.json", {"pid": os.getpid(), "ctime": create_time(os.getpid())})
    assert not ends.daemon_gone(tmp_path, q, parent)
    write_json(tmp_path / "daemon.json", {"pid": os.getpid(), "ctime": create_time(os.getpid()) - 1e6})
    assert ends.daemon_gone(tmp_path, q, parent), "a pid reused since the daemon started"
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    write_json(tmp_path / "daemon.json", {"pid": int(dead.stdout), "ctime": time.time()})
    assert ends.daemon_gone(tmp_path, q, parent)
    write_json(tmp_path / "daemon.json", {"pid": os.getpid(), "ctime": create_time(os.getpid())})
    assert not ends.daemon_gone(tmp_path, q, os.getppid()), "its own parent still lives"
    (q / ends.STOPPED).touch()
    assert ends.daemon_gone(tmp_path, q, os.getppid()), "it said it stopped"


def test_an_end_with_no_run_to_close_is_dropped_and_an_open_one_kept(tmp_path: Path) -> None:
    q = tmp_path / "track"
    q.mkdir()
    end = dataclasses.asdict(RunEnd("FINISHED", {}, "", {}))
    for key in ("1-1", "2-1", "3-1"):
        write_json(q / f"{key}.end.json", end)
    write_json(q / "2-1.start.json", {})  # about to be opened
    write_json(q / "old.closed.json", {"run_id": "x", "t": time.time() - ends.KEEP_CLOSED_S - 1})
    ends.late_ends(q, {"3-1"}, "sqlite:///unused.db", "tandem")
    assert sorted(p.name for p in q.iterdir()) == ["2-1.end.json", "2-1.start.json", "3-1.end.json"]
