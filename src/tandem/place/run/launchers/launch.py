"""How an attempt's supervisor is started and reached: on this machine, or under a Ray actor.

Both launchers run the same supervisor (:mod:`tandem.place.run.supervisor.shim`) over the same attempt
directory; they differ in how it starts, how its life is checked and how a cancel reaches
it. The daemon talks to one of them through :class:`Launcher`.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from tandem._safepath import module_command
from tandem.place.model import Capacity, GpuInfo
from tandem.place.run.launchers.programs import missing_program
from tandem.place.run.launchers.ray_backend import PENDING, RUNNING, actor_name
from tandem.place.run.supervisor import forkserver
from tandem.place.run.supervisor.files import SHIM_LOG, ShimInfo, Started, load
from tandem.place.run.supervisor.proctrack import (
    FORKSERVER_MODULE,
    JobProcesses,
    create_time,
    same_process,
    supervisor_runs,
)

if TYPE_CHECKING:
    from tandem.place.devices import NodeSample
    from tandem.place.resources import Reservation

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Launch:
    """What a launcher starts: the attempt's directory and working directory, and what it
    reserves (Ray enforces it on its node; locally it is the daemon's bookkeeping)."""

    dir: Path
    cwd: str
    reservation: Reservation
    gpus: tuple[GpuInfo, ...] = ()
    node: str = ""  # under Ray: the node it runs on (its share group's, if it has one)
    ray_cores: float | None = None  # of its cores, those its node's Ray holds (None: all of them)


class Launched(Protocol):
    """What a launcher needs of a followed attempt (`Active` derives its job id: read-only here)."""

    @property
    def job_id(self) -> int: ...

    @property
    def node(self) -> str: ...

    n: int
    dir: Path
    started: float
    shim_pid: int | None
    shim_ctime: float | None
    remote: bool


class Launcher(Protocol):
    trouble: str | None  # why the machines it starts on do not answer (a Ray cluster's head gone)

    def start(self, a: Launched, what: Launch) -> str: ...
    def missing(self, command: list[str], cwd: str, env: dict[str, str]) -> str | None: ...
    def alive(self, a: Launched) -> bool: ...
    def pending(self, a: Launched) -> bool: ...
    def cancel(self, a: Launched) -> None: ...
    def lost(self, a: Launched) -> str | None: ...
    def forget(self, a: Launched) -> None: ...
    def refresh(self, capacity: Capacity) -> bool: ...
    def samples(self) -> dict[str, NodeSample]: ...
    def shutdown(self) -> None: ...


def signal_shim(a: Launched, sig: int) -> None:
    if same_process(a.shim_pid, a.shim_ctime):
        try:
            os.kill(a.shim_pid or 0, sig)
        except ProcessLookupError:
            pass


class SupervisorForks:
    """The daemon's end of :mod:`~tandem.place.run.supervisor.forkserver`, started on the
    first supervisor asked of it and again after it has died. A request never waits: the
    server answers each with its request's folder and its fork's pid, read as it comes
    (:meth:`collect`), and the supervisor shows itself in its ``shim.json`` as any does. The
    server may take seconds for its first Python job (it imports what those jobs import:
    warm.py), meanwhile the daemon goes on. A request it did not answer (it died, or took :data:`ANSWER_S`) is
    *failed*: the server is ended first, so that no fork of it comes after, and the caller
    starts a supervisor of its own where none runs (:class:`LocalLauncher`)."""

    ANSWER_S = 30.0  # how long a request may wait for its fork (the server's imports, a busy host)
    # After a failure, supervisors start on their own this long: a machine too loaded for the
    # server to answer in ANSWER_S does not have each start wait that long.
    BACKOFF_S = 60.0

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.failed_at: float | None = None
        self.waiting: dict[Path, tuple[float, str]] = {}  # attempt dir -> when asked, its cwd (in order)
        self.forked: dict[Path, tuple[int, float | None]] = {}  # attempt dir -> its fork's pid, start
        self.failed: dict[Path, str] = {}  # asked, never forked (the server was ended) -> its cwd
        self._buffer = b""

    def ask(self, attempt_dir: Path, cwd: str) -> bool:
        """Ask for a supervisor of ``attempt_dir`` in ``cwd``; False where the server cannot
        take it (start one of its own)."""
        self.collect()
        if self.failed_at is not None and time.monotonic() - self.failed_at < self.BACKOFF_S:
            return False
        try:
            if self.proc is None:
                self.proc = subprocess.Popen(
                    module_command(FORKSERVER_MODULE),
                    cwd="/",
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                )
                assert self.proc.stdout is not None
                os.set_blocking(self.proc.stdout.fileno(), False)
                assert self.proc.stdin is not None
                os.set_blocking(self.proc.stdin.fileno(), False)
            assert self.proc.stdin is not None
            # One write of one line (under PIPE_BUF: whole or not at all), never waited on: a
            # server whose pipe is full (busy importing) leaves this start to the caller.
            line = forkserver.request_line(attempt_dir, cwd)
            if os.write(self.proc.stdin.fileno(), line) != len(line):  # a folder of 4 KiB: cut
                raise ValueError("a request written in part")
        except BlockingIOError:
            return False
        except (OSError, ValueError) as exc:
            self._fail(f"{type(exc).__name__}: {exc}")
            return False
        self.waiting[attempt_dir] = (time.monotonic(), cwd)
        return True

    def collect(self) -> None:
        """Read the answers that came; a server that died, or left its oldest request
        unanswered :data:`ANSWER_S`, is ended and its unanswered requests failed."""
        proc = self.proc
        if proc is None:
            return
        self._read(proc)
        if proc.poll() is not None:
            self._read(proc)  # what it said before it ended
            if self.waiting:
                self._fail(f"it ended (exit {proc.returncode})")
            else:
                self.close()
        elif self.waiting and time.monotonic() - next(iter(self.waiting.values()))[0] > self.ANSWER_S:
            self._fail(f"no answer in {self.ANSWER_S:g} s")

    def _read(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        while True:
            try:
                chunk = os.read(proc.stdout.fileno(), 65536)
            except (BlockingIOError, OSError, ValueError):
                break
            if not chunk:
                break
            self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            said = forkserver.answer(line)
            if said is None or Path(said[0]) not in self.waiting:
                continue  # not an answer, or one for an attempt forgotten since
            attempt_dir, pid = Path(said[0]), said[1]
            del self.waiting[attempt_dir]
            self.forked[attempt_dir] = (pid, create_time(pid))

    def _fail(self, why: str) -> None:
        said = "the supervisors' fork server failed (%s): supervisors start on their own for %g s"
        log.warning(said, why, self.BACKOFF_S)
        self.failed_at = time.monotonic()
        proc, self.proc = self.proc, None
        if proc is not None:
            proc.kill()  # no fork of it comes after this: what it did not answer is ours now
            proc.wait()
            self._read(proc)
        self.failed.update((folder, cwd) for folder, (_, cwd) in self.waiting.items())
        self.waiting.clear()
        self._buffer = b""

    def forget(self, attempt_dir: Path) -> None:
        self.waiting.pop(attempt_dir, None)
        self.forked.pop(attempt_dir, None)
        self.failed.pop(attempt_dir, None)

    def close(self) -> None:
        """End the fork server (its stdin closed: it forks what it was asked, then ends);
        the supervisors it started go on."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(self.ANSWER_S if self.waiting else 5)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()


class LocalLauncher:
    """The supervisor as a process of this machine, in a session of its own (it outlives
    the daemon); its pid and start time identify it. It is forked from the daemon's fork
    server (:class:`SupervisorForks`), or else started as an interpreter of its own."""

    trouble: str | None = None  # this machine always answers

    def __init__(self) -> None:
        self.forks = SupervisorForks()

    def start(self, a: Launched, what: Launch) -> str:
        cwd = what.cwd if os.path.isdir(what.cwd) else "/"
        if not self.forks.ask(what.dir, cwd):  # its pid comes in its shim.json (pending, below)
            self._start_own(a, cwd)
        return ""

    def _start_own(self, a: Launched, cwd: str) -> None:
        """A supervisor as an interpreter of its own (no fork server to ask)."""
        with open(a.dir / SHIM_LOG, "ab") as shim_log:
            pid = subprocess.Popen(
                module_command("tandem.place.run.supervisor.shim", str(a.dir)),
                cwd=cwd if os.path.isdir(cwd) else "/",
                stdin=subprocess.DEVNULL,
                stdout=shim_log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            ).pid
        a.shim_pid, a.shim_ctime = pid, create_time(pid)

    def missing(self, command: list[str], cwd: str, env: dict[str, str]) -> str | None:
        """Why the job's program cannot run here (:mod:`.programs`): said at submit."""
        return missing_program(command, cwd, env)

    def alive(self, a: Launched) -> bool:
        return same_process(a.shim_pid, a.shim_ctime)

    def pending(self, a: Launched) -> bool:
        """Its supervisor may yet show itself: the fork server has its request, or forked it
        and it runs. A request the server failed gets a supervisor of its own now, unless
        one runs (forked just before the server was ended)."""
        self.forks.collect()
        cwd = self.forks.failed.pop(a.dir, None)
        if cwd is not None:
            if not supervisor_runs(a.dir, a.started):
                self._start_own(a, cwd)
            return True
        pid, born = self.forks.forked.get(a.dir, (None, None))
        return a.dir in self.forks.waiting or same_process(pid, born)

    def cancel(self, a: Launched) -> None:
        signal_shim(a, signal.SIGTERM)

    def lost(self, a: Launched) -> str | None:
        return None  # this machine runs it: it is never lost with another

    def refresh(self, capacity: Capacity) -> bool:
        return False  # this machine's capacity is what the daemon started with

    def samples(self) -> dict[str, NodeSample]:
        return {}  # this machine is the daemon's: its Monitor measures it

    def forget(self, a: Launched) -> None:
        self.forks.forget(a.dir)

    def shutdown(self) -> None:
        self.forks.close()


class RayLauncher:
    """The supervisor under a detached Ray actor on its node (:mod:`.ray_backend`), found
    by the name its attempt's directory gives it, by this daemon or the next."""

    def __init__(
        self,
        backend: Any,
        trouble_file: Path | None = None,
        address: str | None = None,
        window_s: float = 30.0,
    ) -> None:
        self.backend, self.trouble_file, self.address = backend, trouble_file, address
        self.window_s = window_s  # the agents' window of GPU activity (the daemon's --window)
        self.trouble: str | None = None  # why Ray does not answer, said until it does again

    def start(self, a: Launched, what: Launch) -> str:
        r = what.reservation
        gpu_mem = {g.local or 0: (r.gpu_mem or 0) >> 20 for g in what.gpus if r.gpu_mem}
        cores = r.resources.cores if what.ray_cores is None else what.ray_cores
        self.backend.launch(str(what.dir), what.cwd, what.node, cores, r.resources.ram, gpu_mem)
        return what.node

    def missing(self, command: list[str], cwd: str, env: dict[str, str]) -> str | None:
        """As on one server: the nodes share the jobs' directories (as they share the state)."""
        return missing_program(command, cwd, env)

    def _status(self, a: Launched) -> str:
        return str(self.backend.status(actor_name(a.dir), a.node))

    def alive(self, a: Launched) -> bool:
        return self._status(a) in (PENDING, RUNNING)

    def pending(self, a: Launched) -> bool:
        """Its supervisor may yet show itself: Ray has not placed its actor, or the actor
        runs (its supervisor's first file not seen yet: a slow start, a shared filesystem's
        cache). Only an actor that ended or is gone leaves an attempt never started."""
        return self._status(a) in (PENDING, RUNNING)

    def cancel(self, a: Launched) -> None:
        self.backend.stop(actor_name(a.dir))

    def lost(self, a: Launched) -> str | None:
        self._status(a)  # a node that died is noticed here
        return self.backend.lost.get(actor_name(a.dir))

    def forget(self, a: Launched) -> None:
        self.backend.forget(actor_name(a.dir))

    def refresh(self, capacity: Capacity) -> bool:
        """The cluster's nodes as they are now. Where Ray does not answer (its head is gone),
        the last ones are kept and why is written beside the state, where every command
        says it (:func:`tandem.cli.main`); Ray ends a driver that lost its head for good."""
        try:
            changed = capacity.refresh(self.backend.cluster())
        except Exception as exc:
            if self.trouble is None:
                when = time.strftime("%H:%M:%S")
                again = (
                    f"tandem daemon start --backend ray{f' --address {self.address}' if self.address else ''}"
                )
                self.trouble = (
                    f"the Ray cluster does not answer (since {when}: {str(exc)[:300]}); its jobs are "
                    f"not followed, and Ray ends the daemon if it stays so; once it is back: {again}"
                )
                if self.trouble_file is not None:
                    self.trouble_file.write_text(self.trouble + "\n")
            return False
        if self.trouble is not None or (self.trouble_file is not None and self.trouble_file.exists()):
            self.trouble = None
            if self.trouble_file is not None:
                self.trouble_file.unlink(missing_ok=True)
        return changed

    def samples(self) -> dict[str, NodeSample]:
        """What each node's agent measured (nothing while Ray does not answer)."""
        from tandem.place.decide import HOST_WINDOW_S

        if self.trouble is not None:
            return {}
        try:
            return dict(self.backend.samples(self.window_s, HOST_WINDOW_S))
        except Exception as exc:  # a measurement's trouble never stops the tick
            log.warning("the nodes' agents: %s", exc)
            return {}

    def shutdown(self) -> None:
        self.backend.shutdown()


def stop_orphaned_job(attempt_dir: Path, grace_s: float) -> bool:
    """Stop the job of a supervisor that died without a result, found by the marker and
    cgroup it wrote when it started it (or just before: should it be killed between); whether
    any of its processes were there to stop."""
    found = load(attempt_dir, Started) or load(attempt_dir, ShimInfo)
    if found is None or found.marker is None:
        return False
    procs = JobProcesses(found.marker, Path(found.cgroup) if found.cgroup else None)
    stopped = bool(procs.pids())
    if stopped:
        procs.stop(grace_s)
    procs.close()  # its cgroup, which the supervisor could not remove
    return stopped
