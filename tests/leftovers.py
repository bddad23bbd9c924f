"""What a test session started ends with it, however the session ends: its last test done,
Ctrl-C, SIGTERM or SIGHUP (an interrupted ``make test``, a CI job cancelled).

The session (the controller, where tests run in xdist's workers) names itself in
``$TANDEM_TEST_SESSION``, a directory of its own, before any test runs: its workers inherit
it, and so does everything they start (daemons and their jobs, producers, MLflow servers,
Ray heads, the Ray nodes of ``tandem.bench.ray_nodes``). SIGTERM and SIGHUP are turned into
the KeyboardInterrupt of a Ctrl-C in every pytest process of the session (the controller
passes them on to its workers), so that the fixtures' own teardowns run, as they do after
Ctrl-C. Then, as the controller ends (:func:`end_session`), what is still left is ended:
every process whose environment names the session, and the Ray node clusters noted in it
(:func:`note_cluster`), whose network namespaces and bridge outlive their processes.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import tempfile
from pathlib import Path
from typing import Any

import psutil

SESSION = "TANDEM_TEST_SESSION"
_STOPPING: list[int] = []  # the signal that stopped this process, once one has


def start_session(controller: bool) -> None:
    """Name the session (in its controller, or where there are no workers) and turn this
    process's SIGTERM and SIGHUP into a KeyboardInterrupt."""
    if controller:  # a fresh one, even inside another session (a test that runs pytest)
        os.environ[SESSION] = tempfile.mkdtemp(prefix="tandem-tests-")
    for signum in (signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(ValueError):  # not the main thread: left as it is
            signal.signal(signum, _interrupt)


def _interrupt(signum: int, _frame: Any) -> None:
    if _STOPPING:  # ending already: its teardown is not cut short
        return
    _STOPPING.append(signum)
    for child in psutil.Process().children():  # the workers (and what a test started itself)
        with contextlib.suppress(psutil.Error):
            if child.environ().get(SESSION) == os.environ.get(SESSION):
                child.send_signal(signum)
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def note_cluster(root: Path) -> None:
    """Let the session undo the Ray node cluster made in ``root`` if its process cannot."""
    session = os.environ.get(SESSION)
    if session and os.path.isdir(session):
        (Path(session) / f"cluster-{secrets.token_hex(4)}").write_text(str(root))


def mine(session: str) -> list[psutil.Process]:
    """The processes started in ``session`` (by its environment), but this one."""
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.pid != os.getpid() and proc.environ().get(SESSION) == session:
                found.append(proc)
    return found


def end_session() -> None:
    """End what the session left: its Ray node clusters, then its processes (SIGKILL);
    Ctrl-C or SIGTERM wait until it is done."""
    session = os.environ.get(SESSION)
    if not session:
        return
    signals = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        if os.path.isdir(session):
            from tandem.bench.ray_nodes import remove_made

            for noted in Path(session).glob("cluster-*"):
                remove_made(Path(noted.read_text()))
        left = mine(session)
        for proc in left:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(left, timeout=30)
        shutil.rmtree(session, ignore_errors=True)
    finally:
        _STOPPING.append(0)  # a signal that came meanwhile: nothing more to stop
        with contextlib.suppress(KeyboardInterrupt):
            signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)
