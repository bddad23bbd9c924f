"""The dashboard of the host's system manager (``tandem daemon start --system``), read through
its socket: its state is root's, so the page asks the manager, which answers with what the
user who serves the page may see (:func:`tandem.place.requests.read_jobs`): their own jobs in
full, the others' as owner, state, times and resources; root (or its admin group) every job
in full. Their runs' metrics are read from their own MLflow store
(:func:`tandem.place.system_user_store`), which they may read.

:class:`RemoteReader` answers what the page asks of a :class:`~tandem.web.data.Reader` from the
manager's replies: a page of jobs, one job, the jobs changed since a time (asked each second:
no file to watch), the queue, the timeline, a log from an offset.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tandem.place import (
    PRODUCER_ROLE,
    RUNNING,
    WAITING_STATES,
    DaemonRefused,
    RemoteState,
    job_json,
    read_store,
    system_user_store,
)
from tandem.watch.stores.mlflow_store import sqlite_path
from tandem.web.data import LOG_CHUNK, PAGE, NotFound, Reader, attempt_span, share_row

THEIRS_READ_S = 2.0  # root's read of a user's store (theirs to make slow) is stopped past this


class RemoteReader(Reader):
    """The reads of :class:`Reader`, asked of the manager listening at ``socket``."""

    remote = True

    def __init__(self, socket: Path, mlflow_db: Path | None) -> None:
        super().__init__(socket.parent, mlflow_db)
        self.socket = socket
        self._remote = threading.local()
        self._inodes: dict[tuple[int, int], int] = {}  # each attempt's log file, as last read

    @property
    def state(self) -> RemoteState:  # type: ignore[override]  # the reads the page makes
        state = getattr(self._remote, "state", None)
        if state is None:
            state = self._remote.state = RemoteState(self.socket)  # the CLI's time limit
        return state

    @contextlib.contextmanager
    def _store(self, owner: int | None) -> Iterator[sqlite3.Connection | None]:
        """This user's runs from their own store; to root, another user's from theirs, read
        as them (:func:`tandem.place.read_store`: a plain file of theirs, its schema untrusted,
        its values and time bounded); to anyone else, none of another's (an admin group's
        member sees their jobs whole, but may not read their files)."""
        me = os.getuid()
        if owner is None or owner == me:
            yield self._runs()
            return
        with contextlib.ExitStack() as opened:
            db = None
            if me == 0:
                try:
                    gid = pwd.getpwuid(owner).pw_gid
                    path = sqlite_path(system_user_store(owner))
                    if path is not None:
                        db = opened.enter_context(read_store(path, (owner, gid), THEIRS_READ_S))
                except (KeyError, OSError):  # a user gone; no run of theirs yet; not a file of theirs
                    db = None
            yield db

    def job(self, job_id: int) -> dict[str, Any]:
        try:
            return super().job(job_id)
        except DaemonRefused as exc:  # none, or another user's: the manager says so
            raise NotFound(str(exc).removeprefix("refused: ")) from None

    def changed(self, since: float) -> list[dict[str, Any]]:
        now = time.time()
        return [job_json(j, now) for j in self.state.jobs(attempts=True, changed_since=since)]

    def waiting(self, limit: int = PAGE) -> dict[str, Any]:
        now = time.time()
        jobs = self.state.jobs(tuple(WAITING_STATES), attempts=True, last=limit)
        counts = self.counts()
        return {
            "waiting": sum(counts.get(s, 0) for s in WAITING_STATES),
            "jobs": [job_json(j, now) for j in jobs],
        }

    def counts(self) -> dict[str, int]:
        return self.state.counts()

    def version(self) -> tuple[int, ...]:
        """No file of the manager's to watch: a new version each second (its changes asked)."""
        return (int(time.time()),)

    def timeline(self, window_s: float = 3600.0) -> list[dict[str, Any]]:
        since = time.time() - window_s
        jobs = {j.id: j for j in self.state.jobs((RUNNING,), attempts=True)}
        jobs.update({j.id: j for j in self.state.jobs(attempts=True, changed_since=since)})
        return [
            attempt_span(a)
            for job in sorted(jobs.values(), key=lambda j: j.id)
            for a in job.attempts
            if a.started is not None and (a.ended is None or a.ended >= since)
        ]

    def shares(self) -> list[dict[str, Any]]:
        """This user's share groups, with their producers now (their running producer jobs)."""
        # The reply carries this user's shares too.
        running = {j.share: j for j in self.state.jobs((RUNNING,), attempts=True) if j.role == PRODUCER_ROLE}
        out = []
        for share in self.state.shares():
            producer = running.get(share.name)
            out.append(
                share_row(
                    share,
                    producer_job=producer.id if producer is not None else None,
                    outside_pid=None,
                    producer_pid=None,
                    cpus=producer.cpus if producer is not None else None,
                    started=producer.started if producer is not None else None,
                    error=None,
                    jobs=[],
                )
            )
        return out

    def selections_of(self, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return []  # a system manager serves no share of a selection yet

    def log(self, job_id: int, offset: int = 0, attempt: int | None = None) -> dict[str, Any]:
        job = self.job(job_id)
        if not job["attempts"]:
            return {"job": job_id, "attempt": None, "offset": 0, "text": "", "more": False}
        n = attempt if attempt is not None else job["attempts"][-1]["n"]
        if not any(a["n"] == n for a in job["attempts"]):
            raise NotFound(f"job {job_id} has no attempt {n}")
        inode = self._inodes.get((job_id, n))
        try:  # from the offset, where the file is the one read last (else from its start)
            parts = self.state.log_parts(job_id, {} if inode is None else {n: (inode, offset)})
        except DaemonRefused as exc:  # not theirs (a manager that does not answer: a 503)
            raise NotFound(str(exc).removeprefix("refused: ")) from None
        part = next((p for p in parts if p.n == n), None)
        if part is None:
            return {"job": job_id, "attempt": n, "offset": 0, "text": "", "more": False}
        self._inodes[(job_id, n)] = part.inode
        data = part.data
        if part.offset != offset:  # read from its start: the first read, or rotated since
            offset = min(offset, len(data)) if inode is None else 0
            data = data[offset:]
        chunk = data[:LOG_CHUNK]
        end = offset + len(chunk)
        more = len(data) > len(chunk)
        return {
            "job": job_id,
            "attempt": n,
            "offset": end,
            "text": chunk.decode(errors="replace"),
            "more": more,
        }
