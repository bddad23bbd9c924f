"""One scheduling pass: which waiting jobs start now, and where.

:func:`plan` is pure: it takes the waiting jobs (:class:`Waiting`), the host and GPUs as
they are now (:class:`~tandem.place.policies.HostSlot`, ``GpuSlot``), a policy and its
limits, and returns placements. The daemon calls it every tick with measured state; the
simulator calls it with modelled state. Rules every policy keeps, here and nowhere else:

- Reservations never exceed capacity: the sum of running jobs' cores, RAM and GPU memory
  stays within what the daemon has, and a job's memory must also fit what is measured free
  (once the jobs already there have settled).
- A GPU whose newest job has unknown memory that is still growing (``probing``) takes no
  one; nor does a GPU or host running a job that must run alone.
- At most ``max_per_gpu`` jobs per GPU.
- A job of unknown GPU memory (``gpu_mem`` None) is a probe: it goes to the GPU with the
  most free memory, whatever the policy, and that GPU takes no one else until it settles.
- Retries escalate (:attr:`Waiting.escalation`): 1 = the GPU with most free memory,
  2 = alone on a GPU (or alone on the host for a CPU-only job).

Queue order: higher priority first, then submission order. A job that cannot be placed
is passed over (backfill) unless the policy is strict FIFO or it has waited longer than
``starve_after_s``: then nothing behind it starts until it has (so a large job is not
starved by a stream of small ones).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from tandem.place.model import format_size
from tandem.place.policies import GpuSlot, HostSlot, Limits, MostFreeMemory, Need, Policy


@dataclass(frozen=True)
class Waiting:
    """A job the scheduler may start: what it needs and how long it has waited."""

    id: int
    priority: int
    submitted: float
    cpus: float
    mem: int
    gpus: int
    gpu_mem: int | None  # per GPU; None: unknown (a probe)
    escalation: int = 0  # 0 first try; 1 most-free GPU; 2 alone
    waiting_since: float | None = None  # since when it could start (queued, requeued, deps met)
    prefer_gpus: tuple[int, ...] = ()  # where its shared data is (a GPU-slab producer's GPU)


@dataclass(frozen=True)
class Placement:
    job_id: int
    gpus: tuple[int, ...]  # GPU indices
    gpu_mem: int | None  # reserved per GPU (None: a probe, reserved once measured)
    alone: bool
    probe: bool


_MOST_FREE = MostFreeMemory()


def order(queue: Sequence[Waiting]) -> list[Waiting]:
    return sorted(queue, key=lambda w: (-w.priority, w.submitted, w.id))


def plan(
    queue: Sequence[Waiting],
    host: HostSlot,
    gpus: Sequence[GpuSlot],
    policy: Policy,
    limits: Limits,
    now: float,
) -> list[Placement]:
    """The jobs to start now, in order. ``host`` and ``gpus`` are not changed."""
    host = dataclasses.replace(host)
    slots = [dataclasses.replace(g) for g in gpus]
    placed: list[Placement] = []
    for job in order(queue):
        placement = _place(job, host, slots, policy, limits)
        if placement is not None:
            _reserve(job, placement, host, slots)
            placed.append(placement)
            continue
        since = job.submitted if job.waiting_since is None else job.waiting_since
        if not policy.backfill or now - since >= limits.starve_after_s:
            break
    return placed


def fits_at_all(
    job: Waiting, host: HostSlot, gpus: Sequence[GpuSlot], limits: Limits | None = None
) -> str | None:
    """Why ``job`` can never run on this machine (its needs exceed the capacity), or None."""
    usable = int(host.mem_total * (1 - (limits or Limits()).host_mem_headroom))
    if job.cpus > host.cpus_total + 1e-9:
        return f"asks for {job.cpus:g} cores; the manager has {host.cpus_total:g}"
    if job.mem > usable:
        return f"asks for {format_size(job.mem)} of RAM; the manager hands out at most {format_size(usable)}"
    if job.gpus > len(gpus):
        return f"asks for {job.gpus} GPU(s); the manager has {len(gpus)}"
    if job.gpus and job.gpu_mem is not None:
        biggest = sorted((g.mem_total for g in gpus), reverse=True)[job.gpus - 1]
        if job.gpu_mem > biggest:
            return f"asks for {format_size(job.gpu_mem)} per GPU; the largest GPU has {format_size(biggest)}"
    return None


def _need(job: Waiting) -> Need:
    return Need(job.cpus, job.mem, job.gpus, job.gpu_mem, alone=job.escalation >= 2)


def _host_fits(job: Waiting, host: HostSlot, limits: Limits) -> bool:
    if host.cpus_reserved + job.cpus > host.cpus_total + 1e-9:
        return False
    if host.mem_reserved + job.mem > host.mem_total:
        return False
    if host.mem_available is not None:
        headroom = int(limits.host_mem_headroom * host.mem_total)
        if job.mem + headroom > host.mem_available:
            return False
    return True


def _place(
    job: Waiting, host: HostSlot, gpus: list[GpuSlot], policy: Policy, limits: Limits
) -> Placement | None:
    if not _host_fits(job, host, limits):
        return None
    need = _need(job)
    if host.alone:  # a job that must run alone on the host (after a host OOM): nobody joins it
        return None
    if job.gpus == 0:
        if need.alone and host.all_jobs > 0:
            return None
        if not need.alone and not policy.host_admits(host, need, limits):
            return None
        return Placement(job.id, (), None, need.alone, probe=False)
    admissible = [g for g in gpus if _gpu_allows(g, need, policy, limits)]
    if len(admissible) < job.gpus:
        return None
    probe = job.gpu_mem is None
    ranker = _MOST_FREE if probe or job.escalation >= 1 else policy
    ranked = ranker.rank(admissible, need)
    if job.prefer_gpus:  # the GPU its batches are on, if admissible; the policy's order otherwise
        ranked = sorted(ranked, key=lambda g: g.index not in job.prefer_gpus)
    chosen = ranked[: job.gpus]
    return Placement(job.id, tuple(sorted(g.index for g in chosen)), job.gpu_mem, need.alone, probe)


def _gpu_allows(gpu: GpuSlot, need: Need, policy: Policy, limits: Limits) -> bool:
    if gpu.alone or gpu.probing or gpu.jobs >= limits.max_per_gpu:
        return False
    # Alone needs an empty GPU; a probe needs a GPU whose use is known: empty, or settled.
    if gpu.jobs > 0 and (need.alone or (need.gpu_mem is None and gpu.fresh)):
        return False
    if need.gpu_mem is not None:
        if gpu.mem_reserved + need.gpu_mem > gpu.mem_total:
            return False
        measured = gpu.free_measured()
        # Measured free memory counts only once the jobs on the GPU have settled (jobs
        # allocate for tens of seconds after they start; reading it earlier causes OOMs).
        if measured is not None and not gpu.fresh and need.gpu_mem > measured:
            return False
    else:
        measured = gpu.free_measured()
        if gpu.free_reserved() <= 0 or (measured is not None and measured <= 0):
            return False
    return policy.gpu_admits(gpu, need, limits)


def _reserve(job: Waiting, p: Placement, host: HostSlot, gpus: list[GpuSlot]) -> None:
    host.cpus_reserved += job.cpus
    host.mem_reserved += job.mem
    if host.mem_available is not None:
        host.mem_available -= job.mem
    host.all_jobs += 1
    if not p.gpus:
        host.jobs += 1
        host.fresh = True
        host.alone = host.alone or p.alone
        return
    for g in gpus:
        if g.index in p.gpus:
            g.jobs += 1
            g.fresh = True
            g.alone = g.alone or p.alone
            if p.probe:
                g.probing = True
            else:
                g.mem_reserved += p.gpu_mem or 0
