"""An ``auto`` share (a drop-in loader's data) that a producer outside the job manager already
serves on this host: a hand-started run of the same script, whose loader started a producer
of its own, claimed the share's name before the manager's producer job could.

The manager's producer job is then not needed, and never a failure: it finds the name taken
before it would serve, says who serves it (:func:`report`, beside the spec it was given) and
ends with exit 0, recorded as succeeded with :func:`cause` ("not needed: ..."). Its share's
jobs read the live producer; while that one lives (:func:`serving`) no other producer job is
made for them (the daemon's admission), and ``ls``, ``show`` and the dashboard name it
(:func:`tandem.place.producers.status`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tandem.place.model import PRODUCER_ROLE, RUNNING, SUCCEEDED, WAITING_STATES
from tandem.place.run.supervisor.proctrack import create_time, same_process
from tandem.place.state import Job

REPORT = "served-by.json"  # beside a producer job's share.json: who served its share instead
NOT_NEEDED = "not needed"  # how the cause of such a producer job starts


def _report_of(command: list[str]) -> Path | None:
    """Where producer job ``command`` (``... share serve-spec SPEC``) reports: beside SPEC."""
    if "serve-spec" not in command[:-1]:
        return None
    return Path(command[command.index("serve-spec") + 1]).with_name(REPORT)


def report(spec_file: Path, name: str, pid: int | None) -> str:
    """Said by the manager's producer of ``name`` (spec ``spec_file``) that found the name
    served by process ``pid``: kept beside its spec for the daemon and the views; its cause."""
    found = {"name": name, "pid": pid, "started": create_time(pid) if pid else None}
    spec_file.with_name(REPORT).write_text(json.dumps(found))
    return _cause(name, pid)


def _cause(name: str, pid: int | None) -> str:
    by = f" (pid {pid})" if pid else ""
    return f"{NOT_NEEDED}: share {name!r} is already served by a producer outside the manager{by}"


def _read(job: Job) -> dict[str, Any] | None:
    path = _report_of(job.command) if job.role == PRODUCER_ROLE else None
    if path is None:
        return None
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def cause(job: Job, ended: str | None) -> str | None:
    """``job``'s cause, its attempt having ended with cause ``ended``: a producer job that
    ended by itself (exit 0: ``succeeded``) because another process served its share, not
    needed; else ``ended``."""
    found = _read(job) if ended == SUCCEEDED else None
    if found is None:
        return ended
    pid = found.get("pid")
    return _cause(str(found.get("name") or job.share), pid if isinstance(pid, int) else None)


def serving(share: str, newest: Job | None) -> int | None:
    """The pid of the producer outside the manager that serves ``share`` now, or None:
    ``newest``, the share's newest producer job (the running or waiting one first), ended as
    not needed, and the process it found serving is still that one (not a reused pid)."""
    if newest is None or newest.share != share or newest.state in (RUNNING, *WAITING_STATES):
        return None
    if newest.state != SUCCEEDED or not (newest.cause or "").startswith(NOT_NEEDED):
        return None
    found = _read(newest)
    pid, started = (found.get("pid"), found.get("started")) if found is not None else (None, None)
    if not isinstance(pid, int) or not isinstance(started, (int, float)):
        return None
    return pid if same_process(pid, float(started)) else None
