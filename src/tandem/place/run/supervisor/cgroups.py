"""What the cgroup a process runs in allows it, and its out-of-memory kills, read from files.

A container, a Slurm allocation or a systemd slice gives the job manager less than the
host has: a CPU quota (cgroup v2 ``cpu.max``; v1 ``cpu.cfs_quota_us`` over
``cpu.cfs_period_us``), a memory limit (v2 ``memory.max``; v1 ``memory.limit_in_bytes``),
and a cpuset (which ``os.sched_getaffinity`` already reflects). :func:`limits` reads the
first two for the cgroup of a process and every ancestor up to the hierarchy's mount
(a limit set on a slice binds every cgroup below it), both hierarchies where a host mounts
both (hybrid): the tightest wins. Free memory under a limit is the limit less the cgroup's
usage, not counting the page cache the kernel reclaims first (``inactive_file``), as
``docker stats`` counts it.

:class:`OomWatch` tells an out-of-memory SIGKILL from any other without root (the kernel
log, ``/dev/kmsg``, is often closed to users): the ``oom_kill`` counter of the job's own
cgroup v2 (``memory.events``) where one could be made with the memory controller, else of
the memory cgroup the supervisor and its job share (v2 ``memory.events``, v1
``memory.oom_control``), else the host's (``/proc/vmstat``), each compared with its value at
the job's start. The host's counter counts any process's kill: it is the evidence of last
resort, used only for a job that ended by SIGKILL.

Every path is read under ``root`` (``/`` on a real machine), so tests read recorded files.
Nothing here raises on a missing or odd file: what cannot be read is None.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tandem.place.resources import Cap

UNLIMITED = 1 << 62  # v1 writes "no limit" as 9223372036854771712 (page counter max); above this: none
_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")  # mountinfo writes a space in a path as "\040"


@dataclass(frozen=True)
class _Mount:
    point: Path  # where it is mounted (under the root)
    root: str  # which cgroup is the mount's top ("/", or the container's own in a v1 container)
    v2: bool
    controllers: frozenset[str]  # v1: those of this hierarchy; v2: empty (each directory says)


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def _int(text: str | None) -> int | None:
    try:
        return int(text.strip()) if text is not None else None
    except ValueError:
        return None


def _keyed(text: str | None, key: str) -> int | None:
    """The value of ``key`` in a ``key value`` per line file (memory.events, memory.stat)."""
    for line in (text or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return _int(value)
    return None


class Cgroups:
    """The cgroups of process ``pid`` (``self``) as the files under ``root`` show them."""

    def __init__(self, pid: int | str = "self", root: Path = Path("/")) -> None:
        self.root = Path(root)
        self.mounts = self._mounts(pid)
        self.paths = self._membership(pid)  # controller ("" for v2) -> cgroup path

    def _mounts(self, pid: int | str) -> list[_Mount]:
        found = []
        for entry in (_read(self.root / f"proc/{pid}/mountinfo") or "").splitlines():
            left, sep, right = entry.partition(" - ")
            fields, kind = left.split(), right.split()
            if not sep or len(fields) < 5 or len(kind) < 3 or kind[0] not in ("cgroup", "cgroup2"):
                continue
            point = _OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), fields[4])
            controllers = frozenset(kind[2].split(",")) if kind[0] == "cgroup" else frozenset()
            found.append(_Mount(self.root / point.lstrip("/"), fields[3], kind[0] == "cgroup2", controllers))
        return found

    def _membership(self, pid: int | str) -> dict[str, str]:
        paths: dict[str, str] = {}
        for entry in (_read(self.root / f"proc/{pid}/cgroup") or "").splitlines():
            parts = entry.split(":", 2)
            if len(parts) != 3:
                continue
            path = parts[2].removesuffix(" (deleted)")
            for controller in parts[1].split(",") if parts[0] != "0" else [""]:
                paths[controller] = path
        return paths

    def _own(self, mount: _Mount, controller: str) -> Path | None:
        """The process's cgroup directory in ``mount`` for ``controller`` (None: not there)."""
        path = self.paths.get("" if mount.v2 else controller)
        if path is None or (not mount.v2 and controller not in mount.controllers):
            return None
        if mount.root != "/" and (path == mount.root or path.startswith(mount.root + "/")):
            path = path[len(mount.root) :]
        here = mount.point / path.lstrip("/")
        return here if here.is_dir() else mount.point  # a namespace showing another path: the top

    def dirs(self, controller: str) -> list[Path]:
        """The process's cgroup directories for ``controller`` (v1 and v2), each followed by its
        ancestors up to its mount: where that controller's limits can bind it."""
        out: list[Path] = []
        for mount in self.mounts:
            here = self._own(mount, controller)
            while here is not None:
                out.append(here)
                if here == mount.point or mount.point not in here.parents:
                    break
                here = here.parent
        return out

    def cpu_quota(self) -> float | None:
        """The tightest CPU quota over the process's cgroups, in cores (None: none)."""
        quotas = []
        for d in self.dirs("cpu"):
            v2 = _read(d / "cpu.max")
            if v2 is not None:
                quota, _, period = v2.strip().partition(" ")
                q, p = _int(quota), _int(period or "100000")
            else:
                q, p = _int(_read(d / "cpu.cfs_quota_us")), _int(_read(d / "cpu.cfs_period_us"))
            if q is not None and q > 0 and p:
                quotas.append(q / p)
        return min(quotas, default=None)

    def cpu_seconds(self) -> float | None:
        """CPU time used so far by the process's cgroup, descendants included (v1
        ``cpuacct.usage``; v2 ``cpu.stat`` ``usage_usec``), or None: also where it is at the top
        of the host's hierarchy, which counts the whole host."""
        for mount in self.mounts:
            here = self._own(mount, "cpuacct")
            if here is None or (here == mount.point and mount.root == "/"):
                continue
            if mount.v2:
                usec = _keyed(_read(here / "cpu.stat"), "usage_usec")
                seconds = None if usec is None else usec / 1e6
            else:
                ns = _int(_read(here / "cpuacct.usage"))
                seconds = None if ns is None else ns / 1e9
            if seconds is not None:
                return seconds
        return None

    def memory(self) -> tuple[int | None, int | None]:
        """The tightest memory limit over the process's cgroups, and the least free under any
        limit (limit less usage without the reclaimable page cache); None, None: no limit."""
        limits, free = [], []
        for d in self.dirs("memory"):
            v2 = _read(d / "memory.max")
            limit = _int(v2 if v2 is not None else _read(d / "memory.limit_in_bytes"))
            if limit is None or limit >= UNLIMITED:  # "max" reads as None
                continue
            limits.append(limit)
            stat = _read(d / "memory.stat")
            if v2 is not None:
                usage, cache = _int(_read(d / "memory.current")), _keyed(stat, "inactive_file")
            else:
                usage, cache = _int(_read(d / "memory.usage_in_bytes")), _keyed(stat, "total_inactive_file")
            if usage is not None:
                free.append(max(0, limit - max(0, usage - (cache or 0))))
        return min(limits, default=None), min(free, default=None)

    def oom_kill_file(self) -> Path | None:
        """The file with the ``oom_kill`` counter of the process's own memory cgroup (v2
        ``memory.events``, v1 ``memory.oom_control``), or None (no memory controller, or the
        host's root cgroup v2, which has no counter: ``/proc/vmstat`` is read instead)."""
        for mount in self.mounts:
            here = self._own(mount, "memory")
            if here is None:
                continue
            for name in ("memory.events", "memory.oom_control"):
                if _keyed(_read(here / name), "oom_kill") is not None:
                    return here / name
        return None


def limits(pid: int | str = "self", root: Path = Path("/")) -> Cap:
    """What the cgroups of ``pid`` allow it, its CPU quota and memory limit (see the module
    docstring); what the memory limit leaves free now is :meth:`Cgroups.memory`'s."""
    groups = Cgroups(pid, root)
    return Cap(groups.cpu_quota(), groups.memory()[0])


def vmstat_oom_kills(root: Path = Path("/")) -> int | None:
    """The host's count of OOM kills since boot (``/proc/vmstat``, Linux 4.13+), or None."""
    for line in (_read(root / "proc/vmstat") or "").splitlines():
        name, _, value = line.partition(" ")
        if name == "oom_kill":
            return _int(value)
    return None


class OomWatch:
    """The OOM-kill counters that can tell how a job's SIGKILL came (see the module docstring):
    made before the job starts, asked once it has ended, before its own cgroup is removed."""

    def __init__(self, pid: int | str = "self", root: Path = Path("/")) -> None:
        self.root = root
        shared = Cgroups(pid, root).oom_kill_file()
        self._files: dict[str, Path] = {} if shared is None else {"in its memory cgroup": shared}
        self.before = self._counts()

    def add_job_cgroup(self, cgroup: Path) -> None:
        """The job's own cgroup v2, made for it (its count starts at 0): the best evidence,
        where its memory controller is enabled."""
        if _keyed(_read(cgroup / "memory.events"), "oom_kill") is not None:
            self._files["in its own cgroup"] = cgroup / "memory.events"
            self.before["in its own cgroup"] = 0

    def _counts(self) -> dict[str, int]:
        counts = {w: n for w, f in self._files.items() if (n := _keyed(_read(f), "oom_kill")) is not None}
        host = vmstat_oom_kills(self.root)
        if host is not None:
            counts["on the host"] = host
        return counts

    def kills(self) -> tuple[int, str] | None:
        """OOM kills since the start, by the most precise counter readable both times, and
        where it counted (``in its own cgroup``, ``in its memory cgroup``, ``on the host``); None:
        none readable."""
        after = self._counts()
        for where in ("in its own cgroup", "in its memory cgroup", "on the host"):
            if where in self.before and where in after:
                return max(0, after[where] - self.before[where]), where
        return None
