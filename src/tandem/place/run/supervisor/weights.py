"""CPU weights: what a job attempt and a share's producer weigh when the cores run short.

Cores are shared, not hoarded: when processes want more CPU than the host has, the kernel
divides it by weight. Each job attempt and each producer runs in a CPU cgroup of its own,
where the cpu controller can be written:

- cgroup v1 (a ``cpu`` hierarchy, writable as root): a cgroup ``tandem-w-...`` beside the
  supervisor's own, whose ``cpu.shares`` is :data:`DEFAULT_SHARES` times the weight;
- cgroup v2: the attempt's own cgroup (:func:`tandem.place.run.supervisor.proctrack.make_cgroup`), where
  the cpu controller is delegated to it (a ``cpu.weight`` file), :data:`DEFAULT_WEIGHT` times
  the weight.

A job weighs 1 (the default a process has); a producer weighs as much as the jobs it feeds
together (the daemon sets it with :func:`set_weight` as they come and go, at least 1): its
loader workers then keep up with the jobs that wait on them, where under ``nice 10`` they
lost the cores to the jobs' own threads. Where no cgroup can be weighted, ``nice`` stands in
(jobs and producers' workers at the default, 0). Nothing here raises: a job never fails for
want of a weight; :func:`available` says why none is set, once, for the daemon's log.

The supervisor makes its attempt's cgroup, enters it before starting the job (every
descendant is born inside) and removes it at the end (:class:`Weighted`); :func:`sweep`
removes those a killed supervisor left, empty, when a daemon starts.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from tandem.place.run.supervisor.cgroups import Cgroups

log = logging.getLogger(__name__)

DEFAULT_SHARES = 1024  # v1 cpu.shares of a process that nobody weighted
DEFAULT_WEIGHT = 100  # v2 cpu.weight, the same
PREFIX = "tandem-w-"


def _v1_parent(root: Path = Path("/")) -> Path | None:
    """Where this process's v1 ``cpu`` cgroup is, if the cpu controller is mounted as v1 and
    a cgroup can be made there (writable)."""
    groups = Cgroups("self", root)
    for mount in groups.mounts:
        if mount.v2 or "cpu" not in mount.controllers:
            continue
        here = groups._own(mount, "cpu")
        if here is not None and (here / "cpu.shares").exists() and os.access(here, os.W_OK):
            return here
    return None


def available(job_cgroup: Path | None = None) -> tuple[bool, str]:
    """Whether weights can be set here, and how (or why not)."""
    if job_cgroup is not None and (job_cgroup / "cpu.weight").exists():
        return True, "cgroup v2 cpu.weight"
    parent = _v1_parent()
    if parent is not None:
        return True, f"cgroup v1 cpu.shares under {parent}"
    return False, (
        "no writable cpu cgroup (v1 cpu hierarchy not writable, v2 cpu controller not delegated): "
        "jobs and producers' workers run at the default nice 0 instead"
    )


def _write(path: Path, value: int) -> bool:
    try:
        path.write_text(str(value))
        return True
    except OSError as exc:
        log.debug("could not write %s: %s", path, exc)
        return False


def _set(cgroup: Path, weight: float) -> bool:
    if (cgroup / "cpu.weight").exists():
        return _write(cgroup / "cpu.weight", max(1, min(10000, round(DEFAULT_WEIGHT * weight))))
    return _write(cgroup / "cpu.shares", max(2, min(262144, round(DEFAULT_SHARES * weight))))


@dataclass(frozen=True)
class Weighted:
    """The CPU cgroup an attempt runs in, with its weight."""

    path: Path
    made: bool  # a v1 cgroup of its own, removed at the end (v2: the attempt's own, not ours)

    def close(self) -> None:
        """The attempt ended: back to the parent, and its cgroup removed (if ours). A
        process of the job still inside keeps it; :func:`sweep` removes it later."""
        if not self.made:
            return
        _write(self.path.parent / "cgroup.procs", os.getpid())
        try:
            self.path.rmdir()
        except OSError as exc:
            log.debug("could not remove %s: %s", self.path, exc)


def enter(name: str, weight: float = 1.0, job_cgroup: Path | None = None) -> Weighted | None:
    """Put this process (the supervisor, before it starts the job) in a CPU cgroup that
    weighs ``weight``: the attempt's own v2 cgroup where it has the cpu controller, else a
    new v1 cgroup ``tandem-w-NAME``. None where neither can be done."""
    if job_cgroup is not None and (job_cgroup / "cpu.weight").exists():
        return Weighted(job_cgroup, made=False) if _set(job_cgroup, weight) else None
    parent = _v1_parent()
    if parent is None:
        return None
    path = parent / f"{PREFIX}{name}"
    try:
        path.mkdir(exist_ok=True)
    except OSError as exc:
        log.debug("no cpu cgroup for %s: %s", name, exc)
        return None
    group = Weighted(path, made=True)
    if _set(path, weight) and _write(path / "cgroup.procs", os.getpid()):
        return group
    group.close()
    return None


def set_weight(pid: int, weight: float) -> bool:
    """Weigh the CPU cgroup that supervisor ``pid`` made for its attempt (a producer's, as
    its consumers come and go). False where it has none (it runs under nice instead)."""
    groups = Cgroups(pid)
    for mount in groups.mounts:
        if not (mount.v2 or "cpu" in mount.controllers):
            continue
        here = groups._own(mount, "cpu")
        ours = here is not None and here != mount.point and (mount.v2 or here.name.startswith(PREFIX))
        if ours and here is not None and ((here / "cpu.weight").exists() or (here / "cpu.shares").exists()):
            return _set(here, weight)
    return False


def sweep() -> int:
    """Remove the empty ``tandem-w-*`` cgroups of this user that supervisors left (a killed
    daemon's host, say); those with processes in them are kept. Returns how many went."""
    parent = _v1_parent()
    if parent is None:
        return 0
    removed = 0
    for path in parent.glob(f"{PREFIX}{os.getuid()}-*"):
        try:
            if not (path / "cgroup.procs").read_text().split():
                path.rmdir()
                removed += 1
        except OSError:
            continue
    return removed
