"""The supervisor's copy of its job's output: a thread that reads the job's pipe into
``output.log``, capped by rotation, and loses output, never the job, when the disk refuses it
(:mod:`tandem.place.run.supervisor.shim`)."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any


class LogPump(threading.Thread):
    """Copies the job's output from a pipe into ``output.log``, rotating at ``max_bytes / 2``
    (one older part kept). A write that fails drops that output (counted, said once)."""

    def __init__(self, fd: int, path: Path, max_bytes: int, note: Any) -> None:
        super().__init__(name="tandem-log", daemon=True)
        self.fd, self.path, self.part = fd, path, max(1 << 16, max_bytes // 2)
        self.note = note
        self.dropped = 0
        self._failing = False

    def run(self) -> None:
        out = self._open()
        size = out.tell() if out else 0
        while True:
            try:
                data = os.read(self.fd, 1 << 16)
            except OSError:
                break
            if not data:
                break
            if out is not None and size + len(data) > self.part and size > 0:
                out.close()
                try:
                    os.replace(self.path, self.path.with_name(self.path.name + ".1"))
                except OSError:
                    pass
                out, size = self._open(), 0
            if out is None:
                out = self._open()
            try:
                assert out is not None
                out.write(data)
                out.flush()
                size += len(data)
                self._failing = False
            except (OSError, AssertionError) as exc:
                self.dropped += len(data)
                if not self._failing:
                    self._failing = True
                    self.note(f"output not kept while {self.path} cannot be written ({exc})")
        os.close(self.fd)
        if out is not None:
            out.close()

    def _open(self) -> Any:
        try:
            return open(self.path, "ab")  # noqa: SIM115 (kept open across reads, closed in run)
        except OSError:
            return None
