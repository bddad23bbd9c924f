"""How the MLflow helper (:mod:`tandem.place.run.metrics.tracking`) ends what no daemon will end: the
runs of attempts that ended while no daemon ran, and itself.

A run is closed by its daemon's record (``<key>.end.json``). A daemon stopped while a job
ran, or killed between its commit and that record, never writes it: without more, its run
stays ``RUNNING`` and the helper (about 230 MB) waits for it for ever. So the helper also
reads what the job's supervisor left (:mod:`tandem.place.run.supervisor.files`): the attempt's
``result.json`` closes the run with the job's status; a supervisor that died without one
(same machine only: pids mean nothing elsewhere) closes it as lost. A result is taken at
once when no daemon serves (it said it stopped, or its process is gone), else after
``RESULT_GRACE_S`` (a daemon that does not write what it read: killed, restarted).

Such a run keeps ``<key>.closed.json`` (its id): if a daemon later writes the attempt's end
(a restarted one adopting it), the run is amended with it (the manager's own figures, a
retry) rather than that record waiting for ever; it is forgotten after ``KEEP_CLOSED_S``. An
end with no run to close is dropped.

With nothing open the helper ends: at once where no daemon serves, else after
``idle_exit_s()`` (``TANDEM_TRACKING_IDLE_S``, default 60 s: the first job of a daemon just
started then finds MLflow imported). :func:`open_runs` says what keeps it going (``tandem
daemon stop`` does not wait for those), :func:`helper_serves` whether one runs (a new daemon
starts none while its predecessor's serves).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import psutil

from tandem.place.identity import serving_daemon
from tandem.place.model import mlflow_status
from tandem.place.run.supervisor.files import (
    Result,
    RunClosed,
    RunEnd,
    RunStart,
    ShimInfo,
    Usage,
    load,
    open_plain,
    queued,
    queued_keys,
    read_record,
    write_record,
)
from tandem.place.run.supervisor.proctrack import host_id, same_process

log = logging.getLogger(__name__)

IDLE_EXIT_S = 60.0
RESULT_GRACE_S = 30.0  # a live daemon writes the end within a tick of the result
NEVER_STARTED_S = 60.0  # no supervisor after this, and no daemon: the attempt never ran
# A supervisor on another node (Ray) that wrote nothing for this long, with no daemon to say how
# it ended: its node is gone (a dead cluster), and its run is closed as lost, not left open.
REMOTE_SILENT_S = 600.0
KEEP_CLOSED_S = 7 * 86400.0  # a daemon killed after its commit never writes the end: forgotten then
STOPPED = "daemon-stopped"  # in the queue: its daemon has stopped


def idle_exit_s() -> float:
    """Seconds the helper waits with nothing open (while a daemon serves) before it ends."""
    try:
        return float(os.environ.get("TANDEM_TRACKING_IDLE_S", IDLE_EXIT_S))
    except ValueError:
        return IDLE_EXIT_S


def daemon_gone(state_dir: Path, q: Path, parent: int) -> bool:
    """Does no daemon serve ``state_dir``: it said it stopped, or both the daemon that started
    this helper (``parent``, still its parent while it lives) and the one recorded in
    ``daemon.json`` (:func:`tandem.place.identity.serving_daemon`: its pid, start time and
    user; a later daemon) are gone?"""
    if (q / STOPPED).exists():
        return True
    if os.getppid() == parent:
        return False
    return serving_daemon(state_dir) is None


def end_without_daemon(spool: Path, start: RunStart, gone: bool) -> RunEnd | None:
    """The end record (as the daemon's ``end.json``) for an open run whose attempt ended with
    no daemon to say so, or None while it runs (or a daemon may yet say it)."""
    adir = spool.parent
    result_file = adir / Result.FILE
    try:
        age = time.time() - result_file.stat().st_mtime
    except OSError:
        age = None
    if age is not None:
        result = load(adir, Result)
        if result is None or not (gone or age >= RESULT_GRACE_S):
            return None
        tags: dict[str, Any] = {"tandem.state": result.state, "tandem.cause": result.cause}
        tags["tandem.exit_code"] = result.exit_code
        summary = {
            "run_s": result.ended - result.started,
            "peak_mem_bytes": result.peak_mem,
            "cpu_seconds": result.cpu_seconds,
        }
        return _end(mlflow_status(result.state), tags, summary, adir, result.ended)
    if not gone:
        return None
    shim = load(adir, ShimInfo)
    if shim is None:
        if time.time() - start.started < NEVER_STARTED_S:
            return None
        tags = {"tandem.state": "lost", "tandem.cause": "its supervisor never started"}
        return _end("KILLED", tags, {}, adir)
    if shim.host != host_id():  # on another node: its pids mean nothing here, its files do
        if _silent_for(adir) < REMOTE_SILENT_S:
            return None  # it runs there (its usage written each second): its result will come
        tags = {"tandem.state": "lost", "tandem.cause": "its node stopped writing its files (no daemon)"}
        return _end("FAILED", tags, {}, adir)
    if same_process(shim.pid, shim.ctime):
        return None  # it runs
    if load(adir, Result) is not None:
        return None  # written as it ended: taken at the next look
    tags = {"tandem.state": "lost", "tandem.cause": "its supervisor died without a result"}
    return _end("FAILED", tags, {}, adir)


def _silent_for(adir: Path) -> float:
    """Seconds since the attempt's supervisor last wrote its usage (each second while it runs)."""
    try:
        return time.time() - (adir / Usage.FILE).stat().st_mtime
    except OSError:
        return time.time() - (adir / ShimInfo.FILE).stat().st_mtime


def _end(
    status: str, tags: dict[str, Any], summary: dict[str, Any], adir: Path, ended: float | None = None
) -> RunEnd:
    tags = {**tags, "tandem.closed_by": "mlflow-helper"}
    return RunEnd(
        status=status,
        tags={k: str(v) for k, v in tags.items() if v is not None},
        log_file=str(adir / "output.log"),
        summary={k: v for k, v in summary.items() if v is not None},
        ended=ended,
        by_helper=True,
    )


def closed_by_helper(q: Path, key: str, run_id: str) -> None:
    """Remember the run the helper closed, for an end a daemon may write later."""
    write_record(queued(q, key, RunClosed), RunClosed(run_id, time.time()))


def late_ends(q: Path, open_keys: set[str], uri: str, experiment: str) -> None:
    """The ends no open run waits for: each amends the run the helper closed (the daemon's
    status, tags and figures win), or, with no such run, is dropped."""
    from tandem.watch.point import Point
    from tandem.watch.stores.mlflow_store import MlflowStore

    for key in queued_keys(q, RunEnd):
        if key in open_keys or queued(q, key, RunStart).exists():
            continue  # its run is open, or about to be
        path = queued(q, key, RunEnd)
        closed, end = read_record(queued(q, key, RunClosed), RunClosed), read_record(path, RunEnd)
        if closed is not None and closed.run_id and end is not None:
            try:
                store = MlflowStore(uri, experiment)
                store.resume(closed.run_id)
                ms = int(time.time() * 1000)
                store.log([Point(f"summary/{k}", float(v), ms, 0) for k, v in end.summary.items()])
                store.set_tags(end.tags)
                store.close(end.status)
            except Exception:
                log.exception("job %s: could not amend its run with its daemon's end; trying again", key)
                continue
            log.info("job %s: its run %s amended with its daemon's end", key, closed.run_id)
        else:
            log.warning("job %s: an end with no run to close; dropped", key)
        path.unlink(missing_ok=True)
        queued(q, key, RunClosed).unlink(missing_ok=True)
    for key in queued_keys(q, RunClosed):
        closed = read_record(queued(q, key, RunClosed), RunClosed)
        if closed is None or time.time() - closed.t > KEEP_CLOSED_S:
            queued(q, key, RunClosed).unlink(missing_ok=True)


def open_runs(state_dir: Path) -> list[str]:
    """The runs of ``state_dir`` that no daemon has ended yet (those of jobs still running)."""
    q = state_dir / "track"
    return [k for k in queued_keys(q, RunStart) if not queued(q, k, RunEnd).exists()]


# The helper's module now and before the split of run/: one started before an upgrade is found.
_HELPER_MODULES = frozenset({"tandem.place.run.metrics.tracking_helper", "tandem.place.run.tracking_helper"})


def helper_serves(state_dir: Path) -> bool:
    """Does a helper of ``state_dir`` run (by the pid file it keeps while it runs, and its
    command line: a helper killed leaves the file, and its pid may be another's by now)?"""
    try:
        with os.fdopen(open_plain(state_dir / "track" / "helper.pid", os.O_RDONLY), "rb") as f:
            proc = psutil.Process(int(f.read(32)))
        cmdline = proc.cmdline()
        return (
            proc.status() != psutil.STATUS_ZOMBIE
            and bool(_HELPER_MODULES & set(cmdline))
            and str(state_dir) in cmdline
        )
    except (OSError, ValueError, psutil.Error):
        return False
