"""Starts held while the state's disk refuses writes.

A start writes (the daemon its attempt's spec and records, the supervisor its first file)
before the job runs; on a full disk each such write fails, the job goes back to the queue
(:func:`tandem.place.run.supervisor.files.disk_trouble`), and without a hold every scheduling pass would
start it again: a supervisor process and an attempt each time, for as long as the disk is
full. After a start the disk stopped, no job starts for ``HOLD_S``; then until a probe write
in the state directory succeeds. The waiting jobs say so (``tandem ls``).
"""

from __future__ import annotations

import os
from pathlib import Path

from tandem.place import clock

HOLD_S = 5.0  # after a start the disk stopped: no start for this long, then a probe each pass
PROBE_BYTES = 1 << 16  # what a probe writes: a supervisor's first files, with room to spare


class DiskWait:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.why: str | None = None  # what the disk said, while starts are held
        self.until = 0.0  # monotonic: no probe before this

    def hold(self, why: str) -> None:
        """A start failed for the disk (``why``): hold the next ones."""
        self.why = why
        self.until = clock.monotonic() + HOLD_S

    def reason(self) -> str | None:
        """Why no job may start now (the waiting jobs' reason), or None: the disk takes writes."""
        if self.why is None:
            return None
        if clock.monotonic() >= self.until:
            problem = probe(self.dir)
            if problem is None:
                self.why = None
                return None
            self.why = problem
        return f"waits for disk space: {self.why} (tried again when {self.dir} takes writes)"


def probe(directory: Path, size: int = PROBE_BYTES) -> str | None:
    """Does ``directory`` take a write of ``size`` bytes? None if so, else what the disk said
    (the file is removed either way)."""
    path = directory / f".disk-probe.{os.getpid()}"
    try:
        with open(path, "wb") as f:
            f.write(b"\0" * size)
            f.flush()
            os.fsync(f.fileno())  # a disk that delays allocation says ENOSPC here, not at write
        return None
    except OSError as exc:
        return exc.strerror or str(exc)
    finally:
        try:
            path.unlink()
        except OSError:
            pass
