"""One writer, and a job's files are its own: readers (``tandem ls|show``, :mod:`tandem.jobs`)
open ``place.db`` read-only and never make, migrate or move anything; a database removed or
replaced under a live daemon is said by every reader, and the daemon stops keeping a copy of
its records; a lost database's supervisor, still running, writes only into its own attempt's
folder (set aside), never into the new job of the same id; a process is the daemon's or a
supervisor only by its user and its start time, never by its command line alone. Real
daemons, real supervisors, real jobs."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from tests.place.conftest import Cli, attempt_dir
from tests.place.test_daemon import FAST
from tests.timing import until


def _held(until: Path, then: str = "") -> list[str]:
    """A job that runs until ``until`` exists, then runs ``then`` (the test says when it ends)."""
    return ["sh", "-c", f"while [ ! -e {until} ]; do sleep 0.05; done; {then}"]


def _started(state: Path, job_id: int) -> Path:
    folder = until(
        lambda: (a := attempt_dir(state, job_id)).joinpath("started.json").exists() and a, 60, "start"
    )
    return folder  # type: ignore[return-value]


def _db_files(state: Path) -> list[str]:
    return sorted(p.name for p in state.glob("place.db*"))


def test_a_lost_database_with_the_old_supervisor_alive_never_gives_the_new_job_its_result(
    cli: Cli, tmp_path: Path
) -> None:
    cli("daemon", "start", "--cpus", "2", *FAST)
    old_go, new_go = tmp_path / "old-go", tmp_path / "new-go"
    old = cli.submit("--", *_held(old_go, "echo OLD; exit 3"))
    old_folder = _started(cli.state, old)
    cli("daemon", "stop")  # its job and supervisor go on
    for f in cli.state.glob("place.db*"):  # lost: deleted, or never reached the disk
        f.unlink()
    new = cli.submit("--", *_held(new_go, "echo fresh"))
    assert new == old == 1, "ids start again: the same job id as the old job"
    new_folder = _started(cli.state, new)
    assert new_folder.name != old_folder.name, "a new attempt never has an old one's folder name"
    (aside,) = cli.state.glob("jobs.lost-*")
    log = (cli.state / "daemon.log").read_text()
    assert "1 of those jobs still run" in log, log  # the daemon said the old job runs on, and where

    old_go.touch()  # the old job ends (exit 3) while the new job 1 runs
    moved = aside / "1" / old_folder.name
    result = json.loads(
        until(
            lambda: (moved / "result.json").exists() and (moved / "result.json"), 60, "old result"
        ).read_text()
    )
    assert result["exit_code"] == 3, result  # written into its own folder, where it was moved
    assert not (new_folder / "result.json").exists(), "the old supervisor wrote into the new job's folder"
    seen = time.time()  # the daemon follows the new job a few ticks with the old result there
    usage = new_folder / "usage.json"
    until(lambda: usage.exists() and json.loads(usage.read_text())["t"] > seen + 2, 30, "two more samples")
    assert cli.job(new)["state"] == "running"
    new_go.touch()
    assert cli("wait", str(new), timeout=60, check=False).returncode == 0, cli.job(new)
    job = cli.job(new)
    assert (job["state"], job["exit_code"]) == ("succeeded", 0)
    assert cli("logs", str(new)).stdout.strip() == "fresh"
    assert (moved / "output.log").read_text().strip() == "OLD"
    shim_log = (moved / "shim.log").read_text()
    assert f"its folder {old_folder} is now {moved}" in shim_log, shim_log


def test_a_database_removed_under_a_live_daemon_is_said_never_made_anew_and_its_records_kept(
    cli: Cli, tmp_path: Path
) -> None:
    from tandem.place.identity import StateLost
    from tandem.place.state import StateReader

    cli("daemon", "start", "--cpus", "2", *FAST)
    go = tmp_path / "go"
    job = cli.submit("--", *_held(go, "echo done"))
    _started(cli.state, job)
    pid = cli.daemon_pid()
    for f in cli.state.glob("place.db*"):
        f.unlink()
    for args in (("ls",), ("show", str(job)), ("wait", str(job))):
        r = cli(*args, check=False)
        said = r.stderr.strip()
        assert r.returncode == 1 and "Traceback" not in said, (args, r.returncode, said)
        assert "state database" in said and ("removed" in said or "missing" in said), said
        made = [f for f in _db_files(cli.state) if not f.startswith("place.db.saved-")]
        assert made == [], f"a reader made {made}"
        assert not list(cli.state.glob("jobs.lost-*")), "a reader moved the jobs' folders"
    with pytest.raises(StateLost):
        StateReader(cli.state)
    # The daemon sees it too, keeps its records beside it, says so, and stops.
    until(lambda: pid is not None and not _alive(pid), 30, "the daemon stops")
    log = (cli.state / "daemon.log").read_text()
    assert "was removed while the daemon served it" in log, log
    (saved,) = cli.state.glob("place.db.saved-*")
    assert not (cli.state / "place.db").exists() and not list(cli.state.glob("jobs.lost-*"))
    r = cli("ls", check=False)
    assert r.returncode == 1 and str(saved) in r.stderr and "jobs.lost" in r.stderr, r.stderr
    # Nothing lost: its copy put back, the next daemon adopts the job, which ends as its own.
    saved.rename(cli.state / "place.db")
    cli("daemon", "start", "--cpus", "2", *FAST)
    assert cli.job(job)["state"] == "running"
    go.touch()
    assert cli("wait", str(job), timeout=60).returncode == 0
    assert cli("logs", str(job)).stdout.strip() == "done"
    assert not list(cli.state.glob("jobs.lost-*"))


def test_a_database_replaced_under_a_live_daemon_stops_it_and_a_submit_is_never_lost(cli: Cli) -> None:
    cli("daemon", "start", "--cpus", "2", *FAST)
    first = cli.submit("--", "true")
    assert cli("wait", str(first), timeout=60).returncode == 0
    pid = cli.daemon_pid()
    copy = cli.state / "other.db"
    with sqlite3.connect(cli.state / "place.db") as src, sqlite3.connect(copy) as dst:
        src.backup(dst)
    copy.rename(cli.state / "place.db")  # another file in its place (a backup put back, say)
    r = cli("submit", "--", "echo", "after", check=False)
    if r.returncode == 0:  # after the daemon stopped: a new one took it, and it is found
        assert cli.job(int(r.stdout))["state"] in ("queued", "running", "succeeded")
    else:  # refused by the daemon that saw it: said, never an id no one finds
        assert "replaced" in r.stderr and "Traceback" not in r.stderr, r.stderr
    until(lambda: pid is not None and not _alive(pid), 30, "the daemon stops")
    assert "was replaced by another file while the daemon served it" in (cli.state / "daemon.log").read_text()
    assert len(list(cli.state.glob("place.db.saved-*"))) == 1


def test_a_reader_never_makes_or_migrates_the_database(cli: Cli, tmp_path: Path) -> None:
    from tandem.place.state import State

    assert "no jobs" in cli("ls").stdout
    assert cli("show", "1", check=False).returncode == 2
    assert _db_files(cli.state) == [], "a reader made the database"
    # A file of an older schema: said, left as it is; the daemon brings it up to date.
    State(cli.state).close()
    db = sqlite3.connect(cli.state / "place.db", isolation_level=None)
    db.execute("ALTER TABLE attempts DROP COLUMN folder")
    db.execute("UPDATE meta SET v = '4' WHERE k = 'schema'")
    db.close()  # its write-ahead log written back into the file
    before = (cli.state / "place.db").read_bytes()
    r = cli("ls", check=False)
    assert r.returncode == 1 and "schema 4" in r.stderr and "tandem daemon start" in r.stderr, r.stderr
    assert (cli.state / "place.db").read_bytes() == before, "a reader changed the file"
    cli("daemon", "start", "--cpus", "2", *FAST)
    job = cli.submit("--", "true")
    assert cli("wait", str(job), timeout=60).returncode == 0
    assert "no jobs" not in cli("ls").stdout


def test_a_replaced_database_and_a_dead_or_foreign_daemon_are_told_apart(tmp_path: Path) -> None:
    """What a reader concludes from ``daemon.json``: only a live process of this user, started
    when it says, is the daemon; the file it serves must be the one there."""
    from tandem.place.identity import StateLost, file_id
    from tandem.place.run.supervisor.proctrack import create_time
    from tandem.place.state import State, StateReader

    d = tmp_path / "s"
    d.mkdir(mode=0o700)
    writer = State(d)
    me = {"pid": os.getpid(), "ctime": create_time(os.getpid()), "db_id": writer.id, "db_file": writer.file}
    (d / "daemon.json").write_text(json.dumps(me))
    assert StateReader(d).jobs() == []  # the file its live daemon serves
    (d / "daemon.json").write_text(json.dumps({**me, "db_file": "0:1"}))
    with pytest.raises(StateLost, match="replaced while the daemon"):
        StateReader(d)
    foreign = _foreign()
    try:
        others = {**me, "pid": foreign.pid, "ctime": create_time(foreign.pid)}
        for dead in ({**me, "ctime": me["ctime"] - 1}, others):
            (d / "daemon.json").write_text(json.dumps({**dead, "db_file": "0:1"}))
            assert StateReader(d).jobs() == [], dead  # no daemon of ours: the file there is the state
    finally:
        foreign.kill()
        foreign.wait()
    assert file_id(d / "place.db") == writer.file
    writer.close()


def test_a_supervisor_is_found_by_its_user_and_start_time_not_its_command_line(tmp_path: Path) -> None:
    from tandem.place.run.supervisor.proctrack import supervisor_runs

    folder = tmp_path / "jobs" / "1" / "1.abc"
    folder.mkdir(parents=True)
    recorded = time.time()
    looks_like = [
        "sh",
        "-c",
        "sleep 60; :",
        "tandem.place.run.supervisor.shim",
        str(folder),
    ]  # as a supervisor's shows
    mine = subprocess.Popen(looks_like)
    try:
        assert until(lambda: supervisor_runs(folder, recorded), 10, "found")
        assert not supervisor_runs(folder, recorded + 60), (
            "a process started before the attempt is not its supervisor"
        )
    finally:
        mine.kill()
        mine.wait()
    if os.getuid() != 0:
        return
    other = subprocess.Popen(looks_like, user=65534, group=65534, cwd="/")
    try:
        until(lambda: _cmdline(other.pid)[-1:] == [str(folder)], 10, "it runs")
        assert not supervisor_runs(folder, recorded), "another user's process is never a supervisor of ours"
    finally:
        other.kill()
        other.wait()


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
    except OSError:
        return []


def _foreign() -> subprocess.Popen:
    """A live process not of this user (run as nobody; skipped where we may not)."""
    if os.getuid() != 0:
        pytest.skip("running a process as another user needs root")
    proc = subprocess.Popen(["sleep", "60"], user=65534, group=65534, cwd="/")
    until(lambda: _cmdline(proc.pid)[:1] == ["sleep"], 10, "it runs")
    return proc


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def test_the_dashboard_says_a_lost_database_and_reads_the_one_a_daemon_makes_since(tmp_path: Path) -> None:
    from tandem.place.identity import StateLost
    from tandem.place.model import JobSpec
    from tandem.place.state import State
    from tandem.web.data import Reader

    d = tmp_path / "s"
    d.mkdir(mode=0o700)
    writer = State(d)
    writer.add_job(JobSpec(["true"], "/"), 0, time.time())
    (d / "jobs" / "1" / "1.abc").mkdir(parents=True)
    reader = Reader(d, None)
    assert [j["id"] for j in reader.jobs()["jobs"]] == [1]
    writer.close()
    for f in d.glob("place.db*"):
        f.unlink()
    with pytest.raises(StateLost, match="jobs' folders: it was lost"):
        reader.jobs()  # its open connection still reads the removed file: never shown as the state
    assert _db_files(d) == []
    State(d).close()  # a daemon makes a new one, the old folders set aside
    assert reader.jobs()["jobs"] == [] and list(d.glob("jobs.lost-*"))
