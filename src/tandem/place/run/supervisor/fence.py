"""A supervisor's fence on a Ray node cut off from both the cluster and the shared state
directory.

The daemon runs a lost node's attempt again once its supervisor has been silent for
:data:`~tandem.place.attempts.SILENT_S` (15 s) after Ray called the node gone: a node cut
off from Ray whose supervisors still write to the state directory is followed to its end
instead (a partition, not a death). A node cut off from both falls silent, and its jobs run
again elsewhere, while Ray may keep the cut-off raylet, and so the old copies, running for
minutes. So each supervisor under Ray fences itself: a thread writes a heartbeat file in the
attempt's directory each second (in a thread of its own: a write to a lost network
filesystem may hang for good), and when none has gone through for :data:`FENCE_S` while
the Ray head (``TANDEM_RAY_GCS``, the actor's cluster's address) does not answer either,
it signals its own supervisor as if its actor had died (:data:`~.files.ORPHAN_SIGNAL`): the
job is stopped, within :data:`~.files.ORPHAN_GRACE_S`, before the daemon's 15 s run out,
and no result is written. A node that only lost the cluster (its writes go through) or
only the filesystem (Ray answers: the daemon does not run it again) is not fenced.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

from tandem.place.run.supervisor.files import ORPHAN_SIGNAL

FENCE_GCS = "TANDEM_RAY_GCS"  # the environment variable the actor names its cluster's head in
FENCE_S = 8.0  # no heartbeat written for this long (and no head): the job stops
HEARTBEAT = "heartbeat"  # the file, in the attempt's directory
EVERY_S = 1.0


class Fence:
    """The heartbeat writer and its watchdog (daemon threads: they end with the supervisor)."""

    def __init__(self, attempt_dir: Path, gcs: str) -> None:
        self.path, self.gcs = attempt_dir / HEARTBEAT, gcs
        self.written = time.monotonic()  # the last heartbeat that went through
        self.why: str | None = None  # why it fenced
        self._done = threading.Event()
        self._watching: threading.Thread | None = None

    def start(self) -> None:
        threading.Thread(target=self._write, name="fence-heartbeat", daemon=True).start()
        self._watching = threading.Thread(target=self._watch, name="fence-watch", daemon=True)
        self._watching.start()

    def stop(self) -> None:
        """No signal comes from it once this returns: a look at the head under way (at most
        its 2 s) is waited for, and what it finds is dropped."""
        self._done.set()
        if self._watching is not None and self._watching is not threading.current_thread():
            self._watching.join(timeout=10)

    def _write(self) -> None:
        while not self._done.is_set():
            try:
                tmp = self.path.with_suffix(".tmp")
                tmp.write_text(f"{time.time():.3f}\n")
                os.replace(tmp, self.path)
                self.written = time.monotonic()
            except OSError:
                pass  # a read-only or failing filesystem: the watchdog sees no heartbeat go through
            self._done.wait(EVERY_S)

    def _watch(self) -> None:
        while not self._done.wait(EVERY_S):
            silent = time.monotonic() - self.written
            if silent < FENCE_S:
                continue
            why = unreachable(self.gcs, 2.0)
            if why is not None and not self._done.is_set():  # stopped meanwhile: no fence
                self._done.set()
                self.why = (
                    f"cut off: no write to the state directory for {silent:.0f} s and the Ray head "
                    f"({self.gcs}) does not answer ({why})"
                )
                os.kill(os.getpid(), ORPHAN_SIGNAL)  # the supervisor stops its job as if orphaned


def start_fence(attempt_dir: Path) -> Fence | None:
    """The supervisor's fence, started, where its actor named its cluster's head (under Ray;
    taken out of the environment its job inherits); None elsewhere."""
    gcs = os.environ.pop(FENCE_GCS, "")
    if not gcs:
        return None
    fence = Fence(attempt_dir, gcs)
    fence.start()
    return fence


def unreachable(address: str, timeout: float) -> str | None:
    """Why nothing answers at ``HOST:PORT`` (a Ray head's address), or None: something
    listens there, or ``address`` is of another form (``auto``, ``ray://...``: Ray's own)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "/" in host:
        return None
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as exc:
        return str(exc)
    return None
