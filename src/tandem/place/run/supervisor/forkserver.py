"""Supervisors started by fork from one process that has imported them:
``python -m tandem.place.run.supervisor.forkserver``, a child of the daemon.

A supervisor started as an interpreter of its own (``python -m
tandem.place.run.supervisor.shim DIR``) spends about 0.15 CPU-s importing what it runs
before its job starts: on a sweep of short trials that was a third of the manager's CPU
(issue 49). This process imports it once; for each attempt the daemon writes one line on its
stdin, ``{"dir": ATTEMPT_DIR, "cwd": CWD}``, and it forks a supervisor that leaves this
process's session (it outlives the daemon as one started on its own does), writes to the
attempt's ``shim.log``, runs in ``CWD`` (``/`` where that is gone) and runs the shim's
``main`` as its interpreter would; it answers on stdout with one line naming the request's
folder and the fork's pid (the daemon reads it when it comes: it never waits for it, and
matches it by the folder).

At the first attempt whose Python script imports torch (or MLflow, tandem, a library on
torch: :func:`.warm.worth_warming`), it first imports what such jobs import (:mod:`.warm`),
once: the supervisors forked after it start their Python jobs by fork, warm, rather than as
interpreters that import it all again. What it has imported is frozen out of its collections
(``gc.freeze``), so that a fork's collections neither walk nor write those objects' pages.
``TANDEM_WARM=0`` in the daemon's environment: nothing is imported ahead.

It never starts a thread: a fork copies only the thread that forks, and locks another thread
held would stay held in the supervisor. It reaps the supervisors that end before it does; the
others are reparented, as the daemon's were. It ends when its stdin closes (its daemon
stopped: what it was asked before is forked first), and is killed with its daemon (what it
was asked and had not forked, the next daemon puts back in the queue): the supervisors it
started go on.

A supervisor forked here has this module's command line, so a daemon that lost its pid finds
it by the ``shim.log`` it writes to (:func:`~tandem.place.run.supervisor.proctrack.forked_for`),
not by its arguments.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
import traceback
from pathlib import Path

from tandem.place.run.supervisor import warm
from tandem.place.run.supervisor.files import SHIM_LOG, AttemptSpec, load
from tandem.place.run.supervisor.proctrack import reap_children, signal_on_parent_death


def request_line(attempt_dir: Path, cwd: str) -> bytes:
    """What the daemon writes to start a supervisor for ``attempt_dir`` in ``cwd``."""
    return (json.dumps({"dir": str(attempt_dir), "cwd": cwd}) + "\n").encode()


def answer(line: bytes) -> tuple[str, int] | None:
    """The attempt folder and fork's pid of one of the server's answer lines; None for a
    line that is not one (what an import printed, say)."""
    try:
        said = json.loads(line)
        folder, pid = str(said["dir"]), int(said["pid"])
    except (ValueError, KeyError, TypeError):
        return None
    return (folder, pid) if pid > 0 else None


def _say(attempt_dir: str, pid: int) -> None:
    print(json.dumps({"dir": attempt_dir, "pid": pid}), flush=True)


def _supervise(attempt_dir: str, cwd: str) -> int:
    """In the fork: become a supervisor as ``python -m ...shim attempt_dir`` would be."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the shim waits for its job
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.setsid()
    log = os.open(os.path.join(attempt_dir, SHIM_LOG), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(null)
    os.close(log)
    os.chdir(cwd if os.path.isdir(cwd) else "/")
    from tandem.place.run.supervisor import shim  # imported already, by main

    sys.argv = [shim.__file__, attempt_dir]
    try:
        return shim.main([attempt_dir])
    except SystemExit as exc:  # as the interpreter ends on it: a message is said, then exit 1
        return warm.exit_code(exc)
    except BaseException:
        traceback.print_exc()
        return 1


def _worth_warming(attempt_dir: str) -> bool:
    spec = load(Path(attempt_dir), AttemptSpec)
    # (a job that runs as another user never runs warm: its files are not read here)
    return spec is not None and spec.user is None and warm.worth_warming(spec.command, spec.cwd)


def main() -> int:
    # What a supervisor runs, imported once here rather than once per supervisor: the shim,
    # and the tracking it starts beside its job. Here, not at the top: the daemon imports
    # this module for :func:`request_line` and runs none of it.
    from tandem.place.run.supervisor import shim  # noqa: F401
    from tandem.watch.stores.spool import SpoolStore  # noqa: F401
    from tandem.watch.tracker import Run  # noqa: F401

    try:  # what its GPU sampler loads (guarded there too: a machine may have no NVML)
        import pynvml  # noqa: F401
    except ImportError:
        pass
    # Never collected here, so never written by a collection in a fork: a supervisor's and a
    # warm job's collections skip them (they went over torch's objects, copying their pages)
    gc.freeze()
    warming = os.environ.get(warm.OFF) != "0"

    signal.signal(signal.SIGCHLD, lambda _signum, _frame: reap_children())
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the daemon's to handle
    # Killed with its daemon: the requests it had not forked yet are never forked (the next
    # daemon takes their attempts for never started, and puts them back in the queue)
    daemon = os.getppid()
    if not signal_on_parent_death(signal.SIGKILL, daemon):
        return 0
    for line in sys.stdin:
        try:
            asked = json.loads(line)
            attempt_dir, cwd = str(asked["dir"]), str(asked["cwd"])
        except (ValueError, KeyError, TypeError):
            continue  # not a request: no answer (an answer names its request's folder)
        if warming and _worth_warming(attempt_dir):
            # At the first job of a script that imports torch (or MLflow, tandem): what such
            # jobs import first, so that their supervisors fork them warm (warm.py). Seconds,
            # once; the daemon does not wait.
            warming = False
            warm.preimport()
            gc.freeze()
        if os.getppid() != daemon:  # its daemon died (before the signal came)
            return 0
        pid = os.fork()
        if pid == 0:
            # The fork ends as an interpreter does (its threads joined, atexit run, its output
            # flushed), never back in this loop; but without taking apart every module it has
            # (torch's, MLflow's: a fifth of a second a supervisor), which the kernel frees.
            os._exit(warm.end_as_interpreter(_supervise(attempt_dir, cwd)))
        _say(attempt_dir, pid)
    return 0


if __name__ == "__main__":
    sys.exit(main())
