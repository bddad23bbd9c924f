"""The state read through the host's system manager (``tandem daemon start --system``): its
file is root's, so each user's ``ls``, ``show``, ``logs`` and ``wait`` ask the manager, which
answers with what that user may see (:func:`tandem.place.requests.read_jobs`: their own jobs
whole, others' without what they ran). :class:`RemoteState` answers the reads those commands
make of a :class:`~tandem.place.reads.StateReader`, from the manager's replies."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

from tandem.place import protocol
from tandem.place.client import DaemonRefused, request_at
from tandem.place.reads import LogPart
from tandem.place.records import Attempt, Job, Share
from tandem.place.schema import decode, decode_all


class RemoteState:
    """What ``ls``, ``show``, ``logs``, ``wait``, a group's report and the dashboard read,
    asked of the manager at ``socket``."""

    def __init__(self, socket: Path, timeout: float = 30.0) -> None:
        self.socket, self.timeout = socket, timeout
        self.dir = socket.parent  # what messages name
        self._shares: list[Share] = []
        self._older = False
        self._events: tuple[int | None, list[dict[str, Any]]] = (None, [])  # of the job last read

    def _ask(self, message: protocol.ReadJobs) -> protocol.JobRows:
        reply: protocol.JobRows = request_at(self.socket, message, self.timeout)
        self._shares = decode_all(Share, reply.shares)
        self._older = reply.older
        return reply

    @staticmethod
    def _job(row: dict[str, Any]) -> Job:
        attempts = row.pop("attempts", [])
        job: Job = decode(Job, row)
        job.attempts = decode_all(Attempt, attempts)
        return job

    def job(self, job_id: int, attempts: bool = True) -> Job | None:
        """``job_id``, or None where there is none. Another user's: ``DaemonRefused``."""
        reply = self._ask(protocol.ReadJobs(job_id=job_id))
        self._events = (job_id, reply.events)
        return self._job(dict(reply.jobs[0])) if reply.jobs else None

    def jobs(
        self,
        states: tuple[str, ...] | None = None,
        attempts: bool = False,
        last: int | None = None,
        before: int | None = None,
        group: str | None = None,
        shares: tuple[str, ...] | None = None,
        changed_since: float | None = None,
    ) -> list[Job]:
        """As :meth:`~tandem.place.reads.StateReads.jobs`; of a ``group`` or ``shares``,
        this user's only."""
        asked = protocol.ReadJobs(
            list(states or ()),
            last,
            before,
            group=group,
            changed_since=changed_since,
            shares=None if shares is None else list(shares),
        )
        return [self._job(dict(row)) for row in self._ask(asked).jobs]

    def private_runs(self, job_keys: list[str]) -> dict[str, Job]:
        """As :meth:`~tandem.place.reads.StateReads.private_runs`, of this user's jobs."""
        if not job_keys:
            return {}
        reply = self._ask(protocol.ReadJobs(last=0, private_of=list(job_keys)))
        found = [self._job(dict(row)) for row in reply.private]
        return {job.job_key: job for job in found}

    def counts(self) -> dict[str, int]:
        """How many of the host's jobs are in each state."""
        return dict(self._ask(protocol.ReadJobs(last=1, counts=True)).counts)

    def any_before(self, _job_id: int) -> bool:
        """Whether the last listing (of ``--all``) left older jobs out."""
        return self._older

    def attempts(self, job_id: int) -> list[Attempt]:
        job = self.job(job_id)
        return job.attempts if job is not None else []

    def events(self, job_id: int) -> list[dict[str, Any]]:
        """Its events, as the job's last read brought them (``show`` reads the job first)."""
        if self._events[0] != job_id:
            self.job(job_id)
        return list(self._events[1])

    def share(self, name: str) -> Share | None:
        return next((s for s in self._shares if s.name == name), None)

    def shares(self) -> list[Share]:
        return list(self._shares)

    def log_parts(self, job_id: int, seen: dict[int, tuple[int, int]]) -> list[LogPart]:
        """As :meth:`~tandem.place.reads.StateReads.log_parts`, read by the manager for the
        job's owner."""
        asked = protocol.ReadLog(job_id, [[n, inode, end] for n, (inode, end) in seen.items()])
        reply: protocol.LogParts = request_at(self.socket, asked, self.timeout)
        return [
            LogPart(
                a["n"],
                a["inode"],
                a["offset"],
                base64.b64decode(a["data"]),
                None if a["older"] is None else base64.b64decode(a["older"]),
            )
            for a in reply.attempts
        ]

    def close(self) -> None:
        pass

    def __enter__(self) -> RemoteState:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


__all__ = ["DaemonRefused", "RemoteState"]
