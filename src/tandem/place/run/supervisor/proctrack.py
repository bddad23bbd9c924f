"""Which processes are a job's, and stopping all of them, including those that left its
session (``setsid``, a double fork): Slurm's process tracking, in two ways.

- A **cgroup v2 of its own** per attempt, where one can be made (the cgroup2 mount is
  writable for this user, as for root or under a delegated systemd scope): the supervisor
  moves itself into it before it starts the job, so every descendant is born inside and
  cannot leave it; the end is ``cgroup.kill``. The supervisor moves itself back out first.
- Always, a **marker** in the job's environment (``TANDEM_JOB_MARKER``), which every
  descendant inherits: :func:`marked` finds them in ``/proc``. A process that clears its
  own environment escapes only this second net.

A process group or session alone is escapable; both of these are not, short of a process
that both clears its environment and leaves a cgroup it cannot leave.

:func:`wait_exit` is how the supervisor waits for its job's main process: asleep until it
ends or a signal comes, not polling.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import time
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Protocol

import psutil

from tandem.place.run.supervisor.files import SHIM_LOG

log = logging.getLogger(__name__)

MARKER_VAR = "TANDEM_JOB_MARKER"


def create_time(pid: int) -> float | None:
    """When ``pid`` started, in clock ticks since boot (``/proc/PID/stat``): unlike a wall-clock
    start time, it does not move when the system clock is stepped. None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return float(stat[stat.rindex(b")") + 2 :].split()[19])  # field 22: starttime
    except (OSError, ValueError, IndexError):
        try:
            return psutil.Process(pid).create_time()  # no /proc: wall clock, the best there is
        except psutil.Error:
            return None


def host_id() -> str:
    """This machine's boot id: pids and start times mean something only on the machine (and
    boot) they come from. Ray nodes on other machines have another."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return os.uname().nodename


def same_process(pid: int | None, ctime: float | None) -> bool:
    """Is ``pid`` still the process that started at ``ctime`` (:func:`create_time`), alive and
    not a zombie? A reused pid has another start time."""
    if not pid or ctime is None:
        return False
    if create_time(pid) != ctime:
        return False
    return _alive(pid)


# Its module's name now and in earlier tandems: a supervisor started before an upgrade is found.
_SUPERVISOR_MODULES = frozenset(
    {"tandem.place.run.supervisor.shim", "tandem.place.run.shim", "tandem.place.shim"}
)


# Its fork server's (:mod:`tandem.place.run.supervisor.forkserver`): a supervisor forked
# there has this command line, not the shim's.
FORKSERVER_MODULE = "tandem.place.run.supervisor.forkserver"


def forked_for(pid: int, attempt_dir: Path) -> bool:
    """Is process ``pid`` (whose command line is the fork server's) a supervisor forked for
    ``attempt_dir``? Its stdout is that folder's ``shim.log``."""
    try:
        return os.readlink(f"/proc/{pid}/fd/1") == str(attempt_dir / SHIM_LOG)
    except OSError:
        return False


def reap_children() -> None:
    """Collect the exit of every child that ended, without waiting: the daemon's (supervisors
    and producers are its children until they exit) and the fork server's (its forks), which
    would stay zombies otherwise."""
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def supervisor_runs(attempt_dir: Path, recorded: float) -> bool:
    """Is a supervisor for ``attempt_dir`` running, its pid not recorded? Only a process of
    this user started after the attempt was recorded, over this folder (no other has its name)."""
    me, target = os.getuid(), str(attempt_dir)
    for p in psutil.process_iter(["uids", "create_time", "cmdline"]):
        uids, born, cmdline = p.info.get("uids"), p.info.get("create_time"), p.info.get("cmdline") or []
        if uids is None or uids.real != me or born is None or born < recorded - 1.0:
            continue
        # A supervisor started by a tandem from before the move to place.run has the old name.
        if _SUPERVISOR_MODULES.intersection(cmdline) and target in cmdline:
            return True
        if FORKSERVER_MODULE in cmdline and forked_for(p.pid, attempt_dir):
            return True
    return False


def _cgroup2_root() -> Path | None:
    """Where the cgroup2 hierarchy is mounted, if it is."""
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                parts = line.split()
                sep = parts.index("-")
                if parts[sep + 1] == "cgroup2":
                    return Path(parts[4])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _own_cgroup() -> str | None:
    """This process's cgroup v2 path (``0::/path`` in /proc/self/cgroup)."""
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                if line.startswith("0::"):
                    return line[3:].strip()
    except OSError:
        pass
    return None


def make_cgroup(name: str) -> Path | None:
    """A new cgroup ``name`` beside this process's own, or None where none can be made."""
    root, own = _cgroup2_root(), _own_cgroup()
    if root is None or own is None:
        return None
    path = root / own.lstrip("/") / name
    try:
        path.mkdir()
        if not (path / "cgroup.procs").exists():
            raise OSError("no cgroup.procs")
        return path
    except OSError as exc:
        log.debug("no cgroup for the job (%s): the marker alone tracks it", exc)
        try:
            path.rmdir()
        except OSError:
            pass
        return None


def join(cgroup: Path, pid: int = 0) -> bool:
    """Move ``pid`` (0: this process) into ``cgroup``."""
    try:
        (cgroup / "cgroup.procs").write_text(str(pid or os.getpid()))
        return True
    except OSError as exc:
        log.debug("could not join %s: %s", cgroup, exc)
        return False


def leave(cgroup: Path) -> None:
    """Move this process back to ``cgroup``'s parent (so that a kill of it spares us)."""
    join(cgroup.parent)


def cgroup_pids(cgroup: Path | None) -> set[int]:
    if cgroup is None:
        return set()
    pids: set[int] = set()
    try:
        for procs in cgroup.rglob("cgroup.procs"):
            pids.update(int(x) for x in procs.read_text().split())
    except (OSError, ValueError):
        pass
    return pids


def marked(marker: str) -> set[int]:
    """The processes of this user whose environment carries ``marker``."""
    needle = f"{MARKER_VAR}={marker}".encode() + b"\0"
    uid = os.getuid()
    found = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != uid and uid != 0:
                continue
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if needle in env or env.endswith(needle[:-1]):
            found.add(int(entry.name))
    return found


class JobProcesses:
    """Every process of one job: its cgroup's (where there is one) and those with its marker."""

    def __init__(self, marker: str, cgroup: Path | None = None) -> None:
        self.marker = marker
        self.cgroup = cgroup

    def env(self) -> dict[str, str]:
        return {MARKER_VAR: self.marker}

    def pids(self) -> set[int]:
        pids = cgroup_pids(self.cgroup) | marked(self.marker)
        pids.discard(os.getpid())
        return {p for p in pids if _alive(p)}

    def stop(self, grace: float, exclude: AbstractSet[int] = frozenset(), first: int | None = None) -> None:
        """SIGTERM every process of the job, SIGKILL (``cgroup.kill``) what is left after
        ``grace`` seconds. ``exclude``: pids not to touch (the job's main process before it
        has been reaped, whose parent must still see how it ended). ``first``: the job's main
        process, signalled alone for up to half the grace before the others: a training
        script or a share's producer then ends its own DataLoader workers, where a SIGTERM
        to all at once killed the workers under it and torch raised "DataLoader worker (pid
        N) is killed by signal: Terminated" in it, a traceback in the job's log."""
        deadline = time.monotonic() + grace
        if first is not None and _alive(first):
            try:
                os.kill(first, signal.SIGTERM)
            except OSError:
                pass
            alone = time.monotonic() + grace / 2
            while time.monotonic() < alone and _alive(first):
                time.sleep(0.05)
        procs = self._procs(exclude)
        self._signal(procs, signal.SIGTERM)
        while time.monotonic() < deadline:
            procs = [p for p in procs if _running(p)] + self._procs(exclude, known=procs)
            if not procs:
                break
            time.sleep(0.05)
        else:
            if self.cgroup is not None:
                try:
                    (self.cgroup / "cgroup.kill").write_text("1")
                except OSError:
                    pass
            self._signal(self._procs(exclude), signal.SIGKILL)
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline and self._procs(exclude):
                time.sleep(0.05)

    def _procs(self, exclude: AbstractSet[int], known: list[psutil.Process] = ()) -> list[psutil.Process]:  # type: ignore[assignment]
        seen = {p.pid for p in known}
        out = []
        for pid in self.pids() - set(exclude) - seen:
            try:
                out.append(psutil.Process(pid))
            except psutil.Error:
                pass
        return out

    @staticmethod
    def _signal(procs: list[psutil.Process], sig: int) -> None:
        for p in procs:
            try:
                p.send_signal(sig)  # psutil refuses a process whose pid was reused
            except psutil.Error:
                pass

    def close(self) -> None:
        """Remove the cgroup (once empty)."""
        if self.cgroup is None:
            return
        for _ in range(50):
            try:
                self.cgroup.rmdir()
                return
            except OSError:
                time.sleep(0.05)


class Child(Protocol):
    """A job's main process as the supervisor waits for it: a ``Popen``, or a warm fork's."""

    pid: int

    def poll(self) -> int | None: ...


def wait_exit(proc: Child, stop: Callable[[], bool], poll_s: float = 0.1) -> None:
    """Return once ``proc`` has ended or ``stop()`` is true, asleep meanwhile: on a pidfd, which
    turns readable when the process exits, and on the signal wakeup fd, which a signal with a
    Python handler writes to (so a handler that makes ``stop()`` true wakes it at once). From
    the main thread (as for ``signal.signal``). Where there is no pidfd (Linux before 5.3),
    it looks every ``poll_s`` seconds instead."""
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        while proc.poll() is None and not stop():
            time.sleep(poll_s)
        return
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    old = signal.set_wakeup_fd(wake_w)
    waiting = select.poll()
    waiting.register(pidfd, select.POLLIN)
    waiting.register(wake_r, select.POLLIN)
    try:
        while proc.poll() is None and not stop():
            waiting.poll(60_000)
            try:
                os.read(wake_r, 512)
            except BlockingIOError:
                pass
    finally:
        signal.set_wakeup_fd(old)
        for fd in (pidfd, wake_r, wake_w):
            os.close(fd)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def signal_on_parent_death(sig: int, parent: int) -> bool:
    """Ask the kernel for ``sig`` when this process's parent dies (Linux's PR_SET_PDEATHSIG);
    whether its parent is still ``parent`` (it may have died before the ask: no signal comes
    then)."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(sig))  # 1: PR_SET_PDEATHSIG
    except (AttributeError, OSError):
        pass  # no such call here: no signal will come; the parent is checked all the same
    return os.getppid() == parent
