"""A state directory on a read-only disk is read (``ls``, ``show``, ``wait``) and refused,
in one line, by what would write (``submit``, ``daemon start``: exit 2), never called
corrupt; a database removed under a live daemon, which kept a copy of its records, is never
followed by a silent empty queue: a plain ``submit`` refuses, naming the copy and ``tandem
daemon restore``, which puts it back, and its queued and running jobs go on. Real daemons."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.place.conftest import Cli, attempt_dir
from tests.place.test_daemon import FAST
from tests.timing import until

HOLD = "while [ ! -e {go} ]; do sleep 0.05; done; echo {said}"


def _listing(path: Path) -> list[tuple[str, int, int]]:
    return sorted((str(p), p.lstat().st_size, p.lstat().st_mtime_ns) for p in path.rglob("*"))


@pytest.fixture
def read_only() -> Iterator[object]:
    """``read_only(path)``: ``path`` made read-only until the test ends (a read-only bind
    mount where the tests run as root, whom permissions do not stop; else ``chmod a-w``)."""
    undo: list[list[str]] = []

    def make(path: Path) -> None:
        if os.geteuid() == 0:
            if subprocess.run(["mount", "--bind", str(path), str(path)]).returncode:
                pytest.skip("cannot bind-mount here")
            undo.append(["umount", "-l", str(path)])
            if subprocess.run(["mount", "-o", "remount,bind,ro", str(path)]).returncode:
                pytest.skip("cannot remount read-only here")
        else:
            subprocess.run(["chmod", "-R", "a-w", str(path)], check=True)
            undo.append(["chmod", "-R", "u+w", str(path)])

    yield make
    for argv in reversed(undo):
        subprocess.run(argv, check=False)


@pytest.mark.parametrize("ended", ["stopped", "killed"])
def test_a_read_only_state_dir_is_read_and_refused_in_one_line(
    cli: Cli, tmp_path: Path, read_only, ended: str
) -> None:
    cli("daemon", "start", "--cpus", "2", *FAST)
    done = cli.submit("--", "echo", "done")
    assert cli("wait", str(done), timeout=60).returncode == 0
    if ended == "stopped":  # its write-ahead log written back and removed: no -wal, no -shm
        cli("daemon", "stop")
    else:  # its log and its index left as they were
        pid = cli.daemon_pid()
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        until(lambda: cli("daemon", "status", check=False).returncode == 3, 30, "the daemon gone")
    read_only(cli.state)
    before = _listing(cli.state)
    for args in (("ls", "--all"), ("show", str(done)), ("wait", str(done)), ("logs", str(done))):
        r = cli(*args, check=False)
        assert r.returncode == 0 and "Traceback" not in r.stderr, (args, r.returncode, r.stderr)
        assert "corrupt" not in r.stderr and "Move it away" not in r.stderr, r.stderr
    assert str(done) in cli("ls", "--all").stdout.split() and "succeeded" in cli("ls", "--all").stdout
    assert cli("logs", str(done)).stdout.strip() == "done"
    for args in (("submit", "--", "true"), ("daemon", "start"), ("daemon", "restore")):
        r = cli(*args, check=False)
        said = r.stderr.strip().splitlines()
        assert r.returncode == 2 and "Traceback" not in r.stderr and len(said) == 1, (args, r.stderr)
        assert "read-only" in said[0] and str(cli.state) in said[0], said
        assert "corrupt" not in said[0] and "mv " not in said[0], said
    assert _listing(cli.state) == before, "nothing written in a read-only state directory"


def test_a_database_lost_under_its_daemon_is_restored_never_silently_emptied(
    cli: Cli, tmp_path: Path
) -> None:
    cli("daemon", "start", "--cpus", "2", "--no-host-load", *FAST)
    go = tmp_path / "go"
    running = cli.submit("--cpus", "2", "--", "sh", "-c", HOLD.format(go=go, said="one"))
    until(lambda: attempt_dir(cli.state, running).joinpath("started.json").exists(), 60, "job 1 starts")
    queued = cli.submit("--cpus", "2", "--", "echo", "two")
    assert cli.job(queued)["state"] == "queued"
    pid = cli.daemon_pid()
    for f in cli.state.glob("place.db*"):  # deleted under it
        f.unlink()
    until(lambda: list(cli.state.glob("place.db.saved-*")), 30, "the daemon keeps a copy")
    until(lambda: cli("daemon", "status", check=False).returncode == 3, 30, "the daemon stops")
    assert pid is not None
    # Its process ends after its socket closes (it holds its lock until then): a restore
    # while it still ends is refused, as one while it serves.
    until(lambda: not _running(pid), 30, "the daemon's process ends")
    (saved,) = cli.state.glob("place.db.saved-*")

    for args in (("submit", "--", "echo", "three"), ("daemon", "start")):
        r = cli(*args, check=False)
        said = r.stderr.strip().splitlines()
        assert r.returncode == 2 and "Traceback" not in r.stderr and len(said) == 1, (args, r.stderr)
        assert str(saved) in said[0] and "tandem daemon restore" in said[0], said
    assert not (cli.state / "place.db").exists(), "no empty queue made"
    assert not list(cli.state.glob("jobs.lost-*")), "the jobs' folders were set aside"

    r = cli("daemon", "restore")
    assert "restored" in r.stderr and not saved.exists(), r.stderr
    third = cli.submit("--", "echo", "three")
    assert third == 3, "the restored queue goes on: ids go on"
    assert cli.job(running)["state"] == "running" and cli.job(queued)["state"] == "queued"
    go.touch()
    assert cli("wait", str(running), str(queued), str(third), timeout=60).returncode == 0
    assert [cli("logs", str(j)).stdout.strip() for j in (running, queued, third)] == ["one", "two", "three"]
    assert cli("daemon", "restore", check=False).returncode == 2, "nothing left to restore"


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
