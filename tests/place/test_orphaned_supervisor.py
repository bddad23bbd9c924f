"""A supervisor under a Ray actor stops its job when the actor's process dies (its node's
Ray stopped, the actor ended): the actor names itself in the supervisor's environment, the
supervisor asks the kernel for a signal on its parent's death, and on it stops its job and
writes no result (the daemon takes the attempt for lost, and runs it again elsewhere). A
real supervisor and job here; a plain process stands in for the actor's."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import psutil

from tandem.place.run.supervisor.files import ORPHAN_PARENT, AttemptSpec, Result, Started, load, save
from tests.timing import scaled, until

# The actor's part: start the supervisor in a session of its own, naming itself, then wait.
ACTOR = (
    "import os, subprocess, sys, time\n"
    f"env = dict(os.environ, {ORPHAN_PARENT}=str(os.getpid()))\n"
    "log = open(sys.argv[1] + '/shim.log', 'ab')\n"
    "subprocess.Popen([sys.executable, '-m', 'tandem.place.run.supervisor.shim', sys.argv[1]], env=env,\n"
    "                 stdout=log, stderr=log, start_new_session=True)\n"
    "time.sleep(600)\n"
)


def _ended(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_supervisor_whose_actor_dies_stops_its_job_and_writes_no_result(tmp_path: Path) -> None:
    adir = tmp_path / "attempt"
    adir.mkdir()
    job = [sys.executable, "-c", "import time; time.sleep(300)"]
    save(adir, AttemptSpec(job, str(tmp_path), {}, job_id=7, attempt=1, track=False))
    actor = subprocess.Popen([sys.executable, "-c", ACTOR, str(adir)])
    try:
        until(lambda: load(adir, Started) is not None, 60, lambda: (adir / "shim.log").read_text())
        started = load(adir, Started)
        assert started is not None and not _ended(started.pid)
        shim = psutil.Process(started.pid).parent()
        assert shim is not None and shim.parent().pid == actor.pid  # the supervisor, the actor's child
        actor.kill()
        until(lambda: _ended(started.pid) and _ended(shim.pid), 20, lambda: "the job runs on")
        log = (adir / "shim.log").read_text()
        assert "its Ray actor died" in log, log
        assert load(adir, Result) is None, "a result would end the attempt as the job's own end"
    finally:
        actor.kill()
        actor.wait()


def test_a_supervisor_whose_attempt_folder_is_removed_ends_with_its_job(tmp_path: Path) -> None:
    """Its folder removed while its job runs (a state directory deleted after `daemon stop`,
    say): once its job ends, it ends too, saying why, instead of waiting an hour for a disk
    that would take the result (seen: a supervisor 30 minutes after its job)."""
    adir = tmp_path / "attempt"
    adir.mkdir()
    go = tmp_path / "go"
    job = [sys.executable, "-c", f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.05)"]
    save(adir, AttemptSpec(job, str(tmp_path), {}, job_id=7, attempt=1, track=False))
    log = tmp_path / "shim.log"
    with open(log, "ab") as out:
        shim = subprocess.Popen(
            [sys.executable, "-m", "tandem.place.run.supervisor.shim", str(adir)], stdout=out, stderr=out
        )
    try:
        until(lambda: load(adir, Started) is not None, 60, lambda: log.read_text())
        shutil.rmtree(adir)
        go.touch()
        assert shim.wait(timeout=scaled(30)) == 1, log.read_text()
        assert "its attempt folder was removed" in log.read_text()
    finally:
        shim.kill()
        shim.wait()
