"""A daemon's supervisors are forked by its fork server
(:mod:`tandem.place.run.supervisor.forkserver`): each job's supervisor is a fork of one
process that imported it once, leaves its session, and goes on when the daemon dies; a dead
fork server costs no job (the next start makes another, or starts a supervisor of its own);
a restarted daemon finds a forked supervisor whose pid it lost by the ``shim.log`` it writes
to. A real daemon, fork server, supervisors and jobs."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from tandem.place.run.supervisor.files import ShimInfo, load
from tandem.place.run.supervisor.proctrack import FORKSERVER_MODULE, supervisor_runs
from tests.place.conftest import Cli, attempt_dir
from tests.timing import scaled, until

FAST = ("--settle", "0.3", "--grace", "1", "--no-host-load", "--no-track")
HELD = "while [ ! -e release ]; do sleep 0.1; done; echo done $TANDEM_JOB_ID"


def _supervisor(cli: Cli, job: int) -> psutil.Process:
    """Job ``job``'s supervisor, once it has said who it is (``shim.json``)."""
    shim = until(lambda: load(attempt_dir(cli.state, job), ShimInfo), 30, f"job {job}: no shim.json")
    return psutil.Process(shim.pid)


def test_supervisors_are_forks_of_one_server_that_the_daemon_s_death_leaves_running(cli: Cli) -> None:
    cli("daemon", "start", "--cpus", "2", *FAST)
    jobs = [cli.submit("--cpus", "0.5", "--", "sh", "-c", HELD) for _ in range(3)]
    for j in jobs:
        cli.wait_state(j, {"running"})
    supervisors = [_supervisor(cli, j) for j in jobs]
    servers = {s.ppid() for s in supervisors}
    assert len(servers) == 1, "one fork server for every supervisor of the daemon"
    server = psutil.Process(servers.pop())
    assert FORKSERVER_MODULE in server.cmdline() and server.ppid() == cli.daemon_pid()
    for s in supervisors:
        assert os.getsid(s.pid) == s.pid != os.getsid(server.pid), "each in a session of its own"
        assert os.readlink(f"/proc/{s.pid}/fd/1").endswith("/shim.log")
    # The daemon dies: its fork server ends with it (its stdin closed); the supervisors go on.
    os.kill(cli.daemon_pid() or 0, signal.SIGKILL)
    psutil.wait_procs([server], timeout=scaled(30))
    assert not server.is_running() or server.status() == psutil.STATUS_ZOMBIE
    assert all(s.is_running() and s.status() != psutil.STATUS_ZOMBIE for s in supervisors)
    (cli.tmp / "release").write_text("")
    cli("daemon", "start", "--cpus", "2", *FAST)  # adopts them, by pid and start time
    assert cli("wait", *map(str, jobs)).returncode == 0
    for j in jobs:
        assert cli.job(j)["state"] == "succeeded" and len(cli.job(j)["attempts"]) == 1
        assert cli("logs", str(j)).stdout == f"done {j}\n"


def test_a_dead_fork_server_costs_no_job(cli: Cli) -> None:
    cli("daemon", "start", "--cpus", "2", *FAST)
    first = cli.submit("--cpus", "0.5", "--", "echo", "one")
    assert cli("wait", str(first)).returncode == 0
    servers = [
        p for p in psutil.Process(cli.daemon_pid() or 0).children() if FORKSERVER_MODULE in p.cmdline()
    ]
    assert len(servers) == 1
    servers[0].kill()
    psutil.wait_procs(servers, timeout=scaled(30))
    after = [cli.submit("--cpus", "0.5", "--", "echo", str(k)) for k in range(3)]
    assert cli("wait", *map(str, after)).returncode == 0, cli("ls").stdout
    assert [cli("logs", str(j)).stdout for j in after] == ["0\n", "1\n", "2\n"]
    again = [p for p in psutil.Process(cli.daemon_pid() or 0).children() if FORKSERVER_MODULE in p.cmdline()]
    assert len(again) == 1 and again[0].pid != servers[0].pid, "a new fork server serves the next"


def test_a_forked_supervisor_is_found_by_its_shim_log_not_its_command_line(tmp_path: Path) -> None:
    folder = tmp_path / "jobs" / "1" / "1.abc"
    folder.mkdir(parents=True)
    other = tmp_path / "jobs" / "2" / "1.def"
    other.mkdir(parents=True)
    recorded = time.time()
    # As a fork of the server shows: the server's command line, stdout the attempt's shim.log.
    with open(folder / "shim.log", "ab") as log:
        forked = subprocess.Popen(["sh", "-c", "sleep 60; :", FORKSERVER_MODULE], stdout=log)
    try:
        assert until(lambda: supervisor_runs(folder, recorded), 10, "found")
        assert not supervisor_runs(other, recorded), "another attempt's supervisor is not this one's"
        assert not supervisor_runs(folder, recorded + 60), "started before the attempt: not its supervisor"
    finally:
        forked.kill()
        forked.wait()


def test_a_fork_server_that_cannot_answer_is_left_alone_for_a_while(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request never waits for its answer. One the server could not answer (here: it
    cannot start, no such module) is *failed* once it is seen to have ended, for the caller
    to start a supervisor of its own; the next requests do not go to a server until its
    back-off has passed (each would wait for it). A working server's answer is read as it
    comes: the fork's pid."""
    from tandem.place.run.launchers import launch

    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    monkeypatch.setattr(launch, "FORKSERVER_MODULE", "tandem.no_such_fork_server")
    forks = launch.SupervisorForks()
    assert forks.ask(first, "/"), "taken: its answer is read later"

    def failed() -> bool:
        forks.collect()
        return first in forks.failed

    until(failed, 30, "the server that could not start was not seen to end")
    assert forks.proc is None and forks.failed_at is not None and not forks.waiting
    monkeypatch.setattr(launch, "FORKSERVER_MODULE", FORKSERVER_MODULE)
    assert not forks.ask(second, "/") and forks.proc is None, "within its back-off: not tried"
    assert forks.failed_at is not None
    forks.failed_at -= forks.BACKOFF_S
    assert forks.ask(second, "/")  # no spec there: the fork starts, says so in shim.log and ends
    try:

        def forked() -> bool:
            forks.collect()
            return second in forks.forked

        until(forked, 30, "no pid read from the server")
        log = second / "shim.log"
        until(lambda: log.exists() and "no readable spec.json" in log.read_text(), 30, "the fork's word")
    finally:
        forks.close()
