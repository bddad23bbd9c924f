"""The waiting jobs as the daemon keeps them between scheduling passes.

Read whole once; then, where the state changed (:meth:`State.version`: the daemon's own
commits and SQLite's ``data_version``), only the rows whose ``updated`` stamp is newer than
the last read: the daemon is the state's one writer and every write of a job stamps its row,
so an idle daemon with a sweep of 10,000 queued does not decode them every pass. The whole
queue is read again every few minutes anyway, and after the clock stepped backwards.
"""

from __future__ import annotations

from tandem.place import clock
from tandem.place.model import WAITING_STATES
from tandem.place.state import Job, State

OVERLAP_S = 1.0  # rows stamped this long before the last read are read again (clock steps)
WHOLE_S = 300.0  # the queue is read whole this often, whatever changed


class WaitingJobs:
    def __init__(self, state: State) -> None:
        self.state = state
        self._jobs: dict[int, Job] = {}  # by id, as last read
        self._version: tuple[int, int] | None = None
        self._read_at: float | None = None
        self._whole_due = 0.0

    def read(self) -> list[Job]:
        """The jobs waiting now (with what a scheduling pass needs of them), by id."""
        version = self.state.version()  # before the read: a write during it is seen next time
        if version == self._version:
            return list(self._jobs.values())
        read_at, last = clock.now(), self._read_at
        if last is None or read_at < last or clock.monotonic() > self._whole_due:
            self._whole_due = clock.monotonic() + WHOLE_S
            self._jobs = {j.id: j for j in self.state.queue(tuple(WAITING_STATES))}
        else:
            changed = self.state.changed_since(last - OVERLAP_S)
            for job in changed:
                if job.state in WAITING_STATES:
                    self._jobs[job.id] = job
                else:
                    self._jobs.pop(job.id, None)
            if changed:
                self._jobs = dict(sorted(self._jobs.items()))  # by id, as a whole read gives
        self._version, self._read_at = version, read_at
        return list(self._jobs.values())
