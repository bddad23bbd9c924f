"""How an attempt's supervisor is started and reached: on this machine, or as a Ray task.

Both launchers run the same supervisor (:mod:`tandem.place.run.shim`) over the same attempt
directory; they differ in how it starts, how its life is checked and how a cancel reaches
it. The daemon talks to one of them through :class:`Launcher`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tandem.place.model import GpuInfo
from tandem.place.run.proctrack import create_time, same_process


@dataclass(frozen=True)
class Launch:
    """What a launcher starts: the attempt's directory and working directory, and what it
    reserves (Ray enforces it on its node; locally it is the daemon's bookkeeping)."""

    dir: Path
    cwd: str
    cpus: float = 1.0
    mem: int = 0
    gpus: tuple[GpuInfo, ...] = ()
    gpu_mem: int | None = None
    pin_to_head: bool = False  # a share group's job: on the node its producer runs on


class Launched(Protocol):
    """What a launcher needs of a followed attempt (`Active` derives its job id: read-only here)."""

    @property
    def job_id(self) -> int: ...

    n: int
    shim_pid: int | None
    shim_ctime: float | None
    remote: bool


class Launcher(Protocol):
    def start(self, a: Launched, what: Launch) -> str: ...
    def alive(self, a: Launched) -> bool: ...
    def pending(self, a: Launched) -> bool: ...
    def cancel(self, a: Launched) -> None: ...
    def forget(self, a: Launched) -> None: ...
    def shutdown(self) -> None: ...


def signal_shim(a: Launched, sig: int) -> None:
    if same_process(a.shim_pid, a.shim_ctime):
        try:
            os.kill(a.shim_pid or 0, sig)
        except ProcessLookupError:
            pass


class LocalLauncher:
    """The supervisor as a process of this machine, in a session of its own (it outlives
    the daemon); its pid and start time identify it."""

    def start(self, a: Launched, what: Launch) -> str:
        with open(what.dir / "shim.log", "ab") as shim_log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tandem.place.run.shim", str(what.dir)],
                cwd=what.cwd if os.path.isdir(what.cwd) else "/",
                stdin=subprocess.DEVNULL,
                stdout=shim_log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        a.shim_pid, a.shim_ctime = proc.pid, create_time(proc.pid)
        return ""

    def alive(self, a: Launched) -> bool:
        return same_process(a.shim_pid, a.shim_ctime)

    def pending(self, a: Launched) -> bool:
        return False  # started directly: its pid is known at once

    def cancel(self, a: Launched) -> None:
        signal_shim(a, signal.SIGTERM)

    def forget(self, a: Launched) -> None:
        pass

    def shutdown(self) -> None:
        pass


class RayLauncher:
    """The supervisor as a Ray task (:mod:`tandem.place.run.ray_backend`)."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend

    def start(self, a: Launched, what: Launch) -> str:
        w = what
        return self.backend.launch(a.job_id, a.n, str(w.dir), w.cpus, w.mem, w.gpus, w.gpu_mem, w.pin_to_head)

    def alive(self, a: Launched) -> bool:
        """On this machine: its pid and start time. On another (a Ray node): its task has
        not returned (after a restart, when the task is gone with the old daemon, only its
        result file can tell)."""
        if not a.remote:
            return same_process(a.shim_pid, a.shim_ctime)
        if (a.job_id, a.n) in self.backend.refs:
            return self.backend.pending(a.job_id, a.n)
        return True

    def pending(self, a: Launched) -> bool:
        return self.backend.pending(a.job_id, a.n)

    def cancel(self, a: Launched) -> None:
        # Still queued in Ray: the task is dropped; running: the task passes SIGTERM on.
        self.backend.cancel(a.job_id, a.n)
        if not a.remote:
            signal_shim(a, signal.SIGTERM)

    def forget(self, a: Launched) -> None:
        self.backend.forget(a.job_id, a.n)

    def shutdown(self) -> None:
        self.backend.shutdown()


def reap_children() -> None:
    """Collect the exit of every child that ended: supervisors and producers the daemon
    started are its children until they exit, and would stay zombies otherwise."""
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
