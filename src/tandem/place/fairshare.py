"""Fair share between the users of one manager (a lab's server, ``tandem daemon start
--system``): which user's job goes next, and the per-user limits. Pure: the daemon, the
simulator and the views call it with figures they read.

A user's *use* is what their jobs held of the host, decayed as Slurm's fair-share factor
decays it: each core-second (and each GPU-memory-second, as the share of the host's GPU
memory it is) counts ``2 ** (-age / half_life)``. Between users, the next job is the next
one of the user with the least use; within a user, the scheduler's own order (priority,
then first submitted). Each job placed in a pass counts for its user as if it had run
:data:`PROJECTED_S` already, so that a pass interleaves users rather than giving the first
one every free core. With one user (every job's owner the same) the order is the
scheduler's, unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from tandem.place.resources import Resources
from tandem.units import format_size

HALF_LIFE_S = 3600.0  # an hour's use weighs half as much as this minute's
PROJECTED_S = 60.0  # what a job placed now counts for its user within the pass

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Held:
    """What one attempt held (or holds) of the host: its user, its share of the host's cores
    and GPU memory together (``weight``: cores / host cores + GPU memory / host GPU memory),
    from ``start`` to ``end`` (None: still running)."""

    owner: int
    weight: float
    start: float
    end: float | None


def decayed_use(held: Iterable[Held], now: float, half_life: float = HALF_LIFE_S) -> dict[int, float]:
    """Each user's decayed use in host-seconds: the integral of each attempt's weight over
    its time, each second weighed ``2 ** (-(now - t) / half_life)``."""
    k = math.log(2) / half_life
    use: dict[int, float] = {}
    for h in held:
        end = now if h.end is None else min(h.end, now)
        start = min(h.start, end)
        # ∫ w·e^{-k(now-t)} dt over [start, end]
        part = h.weight * (math.exp(-k * (now - end)) - math.exp(-k * (now - start))) / k
        use[h.owner] = use.get(h.owner, 0.0) + part
    return use


def fair_order(
    ordered: Sequence[T],
    owner_of: Callable[[T], int | None],
    weight_of: Callable[[T], float],
    use: dict[int, float],
) -> list[T]:
    """``ordered`` (the scheduler's order) interleaved by user: at each step the next job of
    the user with the least use (ties: the one whose next job comes first in ``ordered``),
    which then counts :data:`PROJECTED_S` of that job's weight more. Jobs with no owner are
    the daemon's own user's."""
    queues: dict[int | None, list[int]] = {}
    for i, job in enumerate(ordered):
        queues.setdefault(owner_of(job), []).append(i)
    if len(queues) < 2:
        return list(ordered)
    standing = {owner: use.get(owner, 0.0) if owner is not None else 0.0 for owner in queues}
    heads = dict.fromkeys(queues, 0)
    out: list[T] = []
    while len(out) < len(ordered):
        owner = min(
            (o for o in queues if heads[o] < len(queues[o])), key=lambda o: (standing[o], queues[o][heads[o]])
        )
        job = ordered[queues[owner][heads[owner]]]
        heads[owner] += 1
        standing[owner] += weight_of(job) * PROJECTED_S
        out.append(job)
    return out


@dataclass(frozen=True)
class UserLimits:
    """What one user's running jobs may hold at once (None: no limit): ``--max-jobs-per-user``,
    ``--max-cores-per-user``, ``--max-gpu-mem-per-user``."""

    jobs: int | None = None
    cores: float | None = None
    gpu_mem: int | None = None

    def any(self) -> bool:
        return any(v is not None for v in (self.jobs, self.cores, self.gpu_mem))

    def over(self, running: tuple[int, float, int], job: tuple[float, int]) -> str | None:
        """Why a job of ``job`` (cores, GPU memory) may not start beside its user's ``running``
        (jobs, cores, GPU memory), in words for ``ls``; None where it may."""
        jobs, cores, gpu_mem = running
        if self.jobs is not None and jobs + 1 > self.jobs:
            return f"user limit: {jobs} of --max-jobs-per-user {self.jobs} running"
        if self.cores is not None and cores + job[0] > self.cores + 1e-9:
            return (
                f"user limit: {cores:g} cores held, {job[0]:g} more would pass --max-cores-per-user "
                f"{self.cores:g}"
            )
        if self.gpu_mem is not None and gpu_mem + job[1] > self.gpu_mem:
            return (
                f"user limit: {format_size(gpu_mem)} of GPU memory held, {format_size(job[1])} more "
                f"would pass --max-gpu-mem-per-user {format_size(self.gpu_mem)}"
            )
        return None


def gpu_mem_held(need: Resources) -> int:
    """The GPU memory a job holds in all: per GPU (``gpu_mem``) times its GPUs."""
    return need.gpu_mem * max(need.gpus, 1) if need.gpu_mem else 0


def host_share(need: Resources, host: Resources) -> float:
    """A job's share of the host (``host.gpu_mem``: all its GPUs' memory): its cores' share
    and its GPU memory's, added."""
    cores = need.cores / host.cores if host.cores else 0.0
    return cores + (gpu_mem_held(need) / host.gpu_mem if host.gpu_mem else 0.0)


@dataclass
class Users:
    """A pass's view of a system manager's users: each one's decayed use (:func:`decayed_use`,
    host-seconds), what their running jobs hold (jobs, cores, GPU memory: the pass adds what it
    places), their limits, and the host they share (to weigh cores and GPU memory as one)."""

    use: dict[int, float]
    running: dict[int, list[float]]  # owner -> [jobs, cores, GPU memory bytes]
    limits: UserLimits
    host: Resources  # cores, and GPU memory as the sum over the GPUs (gpu_mem)

    def weight(self, need: Resources) -> float:
        return host_share(need, self.host)

    def standing(self) -> dict[int, float]:
        """Each user's use as the order between users weighs it: their decayed use, and each
        job of theirs running now as if it had run :data:`PROJECTED_S` already (as a job placed
        in the pass counts), so that the user whose jobs hold the host now waits behind one
        whose do not, before their use has grown."""
        out = dict(self.use)
        for owner, (_, cores, gpu_mem) in self.running.items():
            held = host_share(Resources(cores=cores, gpu_mem=int(gpu_mem)), self.host)
            out[owner] = out.get(owner, 0.0) + held * PROJECTED_S
        return out

    def over(self, owner: int | None, need: Resources) -> str | None:
        """Why ``owner``'s job of ``need`` waits for their own jobs (a per-user limit), or None."""
        if owner is None or not self.limits.any():
            return None
        jobs, cores, gpu_mem = self.running.get(owner, [0, 0.0, 0])
        return self.limits.over((int(jobs), cores, int(gpu_mem)), (need.cores, gpu_mem_held(need)))

    def add(self, owner: int | None, need: Resources) -> None:
        """``owner``'s job of ``need`` placed (or running): counted for their limits and standing."""
        if owner is None:
            return
        row = self.running.setdefault(owner, [0, 0.0, 0])
        row[0] += 1
        row[1] += need.cores
        row[2] += gpu_mem_held(need)
