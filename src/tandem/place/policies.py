"""Placement policies: which GPUs a job goes to, and whether the host takes another job.

A policy is a small class behind one interface (:class:`Policy`). It sees the devices as
the scheduler does (:class:`GpuSlot`, :class:`HostSlot`: reservations, measured use, how
settled they are) and only ranks and gates; the rules every policy keeps (reservations
never exceed capacity, the per-GPU cap, no one joins a GPU whose newcomer's memory is still
growing) are the scheduler's (:mod:`tandem.place.scheduler`), so a policy cannot break
them. The daemon and the simulator run these same classes.

- ``exclusive``: one job per GPU (and one CPU-only job on the host), strict FIFO. The
  baseline: what task-spooler or a whole-GPU Slurm queue does.
- ``first-fit``: the first GPU (by index) where the job's memory fits.
- ``best-fit``: the GPU left with the least free memory once the job is on it.
- ``most-free-memory``: the GPU with the most free memory.
- ``packing`` (default): an empty GPU first; else collocate on the least busy GPU whose
  compute stays under the thresholds (mean and 95th percentile of SM activity over the
  window) and whose memory fits as measured after its jobs settled. CPU-only jobs are
  admitted on their declared cores and RAM.

What a job declared decides; a measurement may only hold a job back where it shows more
than the reservations say: a host busier than its reserved cores (a job that declared too
little, or load from outside the manager), a GPU whose compute the jobs on it already fill.
A missing or stale measurement never holds back a job whose neighbours all declared their
needs: four jobs that fit start in one pass, not one per settle period. On a GPU, compute is
a need too: jobs that declare their share of it (``--gpu-share``, percent) are admitted
while their shares add up to 100 at most; a GPU with a job of undeclared compute, too new
to be measured, waits for its measurement (a job of unknown size, as a probe is for memory).

Every gate returns ``None`` (admitted) or the reason, in words for ``tandem ls``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from tandem.place.resources import Resources
from tandem.units import format_cores


@dataclass(frozen=True)
class Limits:
    """The knobs that gate collocation. Defaults from the research behind tandem:
    collocation stops paying once one job alone keeps a GPU about 80% busy (and CARMA's
    gate rejects SM activity >= 0.80), so a GPU whose 95th-percentile SM activity is 0.80
    or more takes no one else; a mean under 0.60 leaves a newcomer room. Jobs allocate
    for tens of seconds after they start, so memory is trusted only after it has stopped
    growing for ``settle_s`` (30 s, as CARMA blocks a GPU 30 s after each launch). Four
    jobs per GPU: four ResNet-50s under MPS still gained on an H100."""

    max_per_gpu: int = 4
    settle_s: float = 30.0
    window_s: float = 30.0
    sm_mean: float = 0.60
    sm_p95: float = 0.80
    cpu_mean: float = 0.85  # fraction of the host's cores busy, mean over the window
    cpu_p95: float = 0.98
    gpu_mem_margin: float = 0.10  # reserve a known peak plus this fraction
    host_mem_headroom: float = 0.05  # keep this fraction of RAM free of new jobs
    starve_after_s: float = 600.0  # a job waiting longer than this stops backfill past it
    host_load: bool = (
        True  # measured load beyond the reservations (from outside the manager too) holds jobs back
    )


@dataclass
class GpuSlot:
    """One GPU as the scheduler sees it now."""

    index: int
    uuid: str
    mem_total: int
    mem_reserved: int = 0
    mem_used: int | None = None  # measured (NVML); None when unknown
    jobs: int = 0
    probing: bool = False  # a job of unknown memory on it has not settled: nobody joins
    probing_job: int | None = None  # which one (for the reason a job waits)
    compute_declared: int | None = 0  # sum of its jobs' --gpu-share; None: one declared none
    fresh: bool = False  # a job started on it less than settle_s ago: measurements are stale
    alone: bool = False  # a job that must run alone is on it
    activity_mean: float | None = None  # SM activity (else utilisation), 0..1, over the window
    activity_p95: float | None = None
    # Its memory can never be read (a Ray node's GPU that no one there measures): a job of
    # unknown GPU memory is no probe on it (nothing would settle it), it reserves none.
    unmeasured: bool = False

    def free_reserved(self) -> int:
        return self.mem_total - self.mem_reserved

    def free_measured(self) -> int | None:
        return None if self.mem_used is None else self.mem_total - self.mem_used


@dataclass
class HostSlot:
    """The host's cores and RAM as the scheduler sees them now: what it has (``total``),
    what its running jobs reserve (``reserved``: cores and RAM) and what is measured."""

    total: Resources
    reserved: Resources = Resources()
    mem_available: int | None = None  # measured
    cpu_mean: float | None = None  # fraction of all cores busy, over the window
    cpu_p95: float | None = None
    cpus_over: tuple[float, int | None] = (0.0, None)  # cores used beyond declared, and the job most over
    cpus_starting: float = 0.0  # of those, what jobs still starting use (an import's burst)
    weighted: bool = False  # jobs run under CPU weights: the kernel shares cores out by them
    jobs: int = 0  # CPU-only jobs running
    all_jobs: int = 0  # every job running (GPU jobs use the host's cores and RAM too)
    alone: bool = False  # a job that must run alone on the host is running
    # Cores measured busy (from outside the manager too) over the last seconds, with the jobs
    # still starting at their figure and jobs of hard (given) cores at least at it; None:
    # not measured. A job of learnt cores may start where this leaves room (scheduler).
    cpus_busy: float | None = None


class Policy:
    """Ranks the GPUs that may take a job and gates collocation. Subclasses override."""

    name: ClassVar[str] = ""
    backfill: ClassVar[bool] = True
    collocate: ClassVar[bool] = True
    compute_aware: ClassVar[bool] = False

    def gpu_blocks(self, gpu: GpuSlot, need: Resources, limits: Limits) -> str | None:
        """Why ``gpu`` may not take this job (beyond the scheduler's own rules), or None."""
        return None

    def rank(self, gpus: list[GpuSlot], need: Resources) -> list[GpuSlot]:
        """The admissible GPUs, best first."""
        return sorted(gpus, key=lambda g: g.index)

    def host_blocks(self, host: HostSlot, need: Resources, limits: Limits) -> str | None:
        """Why the host may not start another CPU-only job now, or None."""
        return None


def free_after(gpu: GpuSlot, need: Resources) -> int:
    known = gpu.free_reserved()
    measured = gpu.free_measured()
    free = known if measured is None else min(known, measured)
    return free - need.gpu_mem


class Exclusive(Policy):
    name = "exclusive"
    backfill = False
    collocate = False

    def gpu_blocks(self, gpu: GpuSlot, need: Resources, limits: Limits) -> str | None:
        return f"GPU {gpu.index} is taken (policy exclusive: one job per GPU)" if gpu.jobs else None

    def host_blocks(self, host: HostSlot, need: Resources, limits: Limits) -> str | None:
        return "a CPU job runs (policy exclusive: one at a time)" if host.jobs else None


class FirstFit(Policy):
    name = "first-fit"


class BestFit(Policy):
    name = "best-fit"

    def rank(self, gpus: list[GpuSlot], need: Resources) -> list[GpuSlot]:
        return sorted(gpus, key=lambda g: (free_after(g, need), g.index))


class MostFreeMemory(Policy):
    name = "most-free-memory"

    def rank(self, gpus: list[GpuSlot], need: Resources) -> list[GpuSlot]:
        return sorted(gpus, key=lambda g: (-free_after(g, need), g.index))


class Packing(Policy):
    """Memory- and compute-aware: spread over empty GPUs first, then collocate where the
    measured SM activity leaves room."""

    name = "packing"
    compute_aware = True

    def gpu_blocks(self, gpu: GpuSlot, need: Resources, limits: Limits) -> str | None:
        if gpu.jobs == 0:
            return None
        if gpu.fresh or gpu.activity_mean is None or gpu.activity_p95 is None:
            # Too new to be measured: declared compute shares decide; undeclared ones wait.
            if gpu.compute_declared is not None and need.gpu_share:
                if gpu.compute_declared + need.gpu_share <= 100:
                    return None
                left = 100 - gpu.compute_declared
                return (
                    f"GPU {gpu.index} compute: needs {need.gpu_share}%, {left}% not yet declared by its jobs"
                )
            return (
                f"GPU {gpu.index} settling: its jobs' compute not yet measured (jobs that declare "
                "--gpu-share start without waiting)"
            )
        if gpu.activity_mean < limits.sm_mean and gpu.activity_p95 < limits.sm_p95:
            return None
        return (
            f"held back: GPU {gpu.index} measured busy (SM activity mean {gpu.activity_mean:.0%}, "
            f"p95 {gpu.activity_p95:.0%}; packing admits under {limits.sm_mean:.0%} and {limits.sm_p95:.0%})"
        )

    def rank(self, gpus: list[GpuSlot], need: Resources) -> list[GpuSlot]:
        return sorted(gpus, key=lambda g: (g.jobs > 0, g.activity_mean or 0.0, free_after(g, need), g.index))

    def host_blocks(self, host: HostSlot, need: Resources, limits: Limits) -> str | None:
        # Jobs measured using more cores than they declared (a start-up burst, a job that
        # declared too little) hold back a newcomer that the cores they use would not leave room for.
        over, who = host.cpus_over
        total, reserved = host.total.cores, host.reserved.cores
        # Under CPU weights (one a job), jobs past their start-up that use idle cores beyond
        # their declaration give a newcomer its share back as it starts: it is held back
        # only where its fair share of the cores is less than it declared. Start-up bursts
        # are still waited out (not every import of a sweep at once).
        fair = total / (host.all_jobs + 1)
        shared_out = host.weighted and need.cores <= fair + 1e-9
        reclaimed = shared_out and host.cpus_starting <= 1e-9
        if over > 0 and reserved + over + need.cores > total + 1e-9 and not reclaimed:
            left = max(0.0, total - reserved - over)
            return (
                f"held back: jobs use {over:.1f} cores more than they declared (job {who} most; a starting "
                "job as its program did at start), "
                f"{left:.1f} of {total:g} cores left"
            )
        if not limits.host_load or host.jobs == 0 or host.cpu_mean is None or host.cpu_p95 is None:
            return None
        busy = host.cpu_mean * total
        if shared_out:  # what jobs past their start-up use beyond their declaration goes back to it
            busy -= max(0.0, over - host.cpus_starting)
        # Only use beyond the reservations counts (an under-declared job, load from outside
        # the manager); a slack of half a core, or 5% of a big host, for start-up bursts.
        if busy <= reserved + max(0.5, 0.05 * total):
            return None
        if busy + need.cores <= limits.cpu_mean * total and host.cpu_p95 < limits.cpu_p95:
            return None
        return (
            f"held back: host measured {host.cpu_mean:.0%} busy ({busy:.1f} cores), more than the "
            f"{format_cores(reserved)} cores reserved"
        )


POLICIES: dict[str, type[Policy]] = {
    p.name: p for p in (Exclusive, FirstFit, BestFit, MostFreeMemory, Packing)
}
DEFAULT_POLICY = "packing"


def make_policy(name: str) -> Policy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}") from None
