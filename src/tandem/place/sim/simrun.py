"""A simulated running attempt (:class:`SimRun`) and the measurements the simulator fakes.

A :class:`SimRun` is what :mod:`tandem.place.decide` reads of a running attempt (its
:class:`~tandem.place.decide.RunningAttempt`), as the daemon's
:class:`~tandem.place.active.Active` is: the simulator and the daemon reach their decisions
through the same functions, and only what the samplers would measure is modelled here:

- **Cores.** A job keeps :attr:`TraceJob.cores_used` cores busy from its start (a constant
  series, one sample a second): its first samples are its program's start-up
  (:class:`~tandem.place.active.Startup`), the next ones feed its reservation of
  ``--cpus auto`` (:class:`~tandem.place.reserve.Measuring`), as the daemon's sampler does.
- **The host's busy cores** over the daemon's window (:data:`~tandem.place.decide.HOST_WINDOW_S`):
  each job's use times the share of the window it has run.
- **A GPU's SM activity**: ``min(1, sum of its jobs' compute)``, unknown while a job there is
  fresh (a real window would still mix old and new load); its memory used: its jobs' peaks.
"""

from __future__ import annotations

from dataclasses import dataclass

from tandem.place.decide import HOST_WINDOW_S, GpuReading
from tandem.place.model import QUEUED, job_key
from tandem.place.records import Job
from tandem.place.reserve import AUTO_CPUS, Measuring
from tandem.place.resources import Reservation
from tandem.place.scheduler import Placement
from tandem.place.sim.trace import TraceJob, command_args

RETRIES = 2  # the daemon's default retries per job (``tandem submit --retries``)


@dataclass
class SimJob:
    """A job of the trace as the simulation goes."""

    trace: TraceJob
    job: Job  # as the daemon would store it (escalated, its GPU memory raised, on a retry)
    state: str = QUEUED
    attempts: int = 0
    first_start: float | None = None
    last_start: float | None = None
    end: float | None = None
    ran_s: float = 0.0  # running time over all attempts
    gpus: tuple[int, ...] = ()
    fixed: Reservation | None = None  # its reservation, where all of it is given (never changes)

    @property
    def id(self) -> int:
        return self.job.id


def record(n: int, t: TraceJob) -> Job:
    """A trace's job as the daemon stores it once submitted."""
    args = command_args(t)
    return Job(
        **dict(t.spec.to_dict(), command=args, gpus=t.gpus, retries=RETRIES),
        id=n,
        job_key=job_key(t.spec.name, args),
        submitted=t.offset_s,
    )


def all_given(job: Job) -> bool:
    """Whether what ``job`` reserves is all given (nothing learnt can change it)."""
    return job.cpus != AUTO_CPUS and bool(job.mem) and (not job.gpus or job.gpu_mem is not None)


def uuid_of(g: int) -> str:
    return f"sim-gpu-{g}"


@dataclass
class SimRun:
    """A running attempt of a simulated job: what it reserves follows its measurement as
    the daemon's :class:`~tandem.place.active.Active` does (the pass's reservation, its
    cores of --cpus auto as sampled, a probe's GPU memory once settled)."""

    job: Job  # as the daemon stores it (its fields, escalated on a retry)
    trace: TraceJob
    placement: Placement
    started: float
    settled_at: float
    reservation: Reservation
    remaining: float  # seconds of work at the speed alone
    peak: int  # true GPU memory per GPU
    cpu: Measuring | None
    gpu_settled: bool = False  # a probe's GPU memory is known (settle_s after its start)
    samples: int = 0
    cpus_used: float | None = None
    slowdown: float = 1.0
    end_at: float = float("inf")

    @property
    def uuids(self) -> tuple[str, ...]:
        return tuple(uuid_of(g) for g in self.placement.gpus)

    @property
    def gpus(self) -> tuple[int, ...]:
        return self.placement.gpus

    @property
    def alone(self) -> bool:
        return self.placement.alone

    @property
    def gpu_probing(self) -> bool:
        return self.placement.probe and not self.gpu_settled

    @property
    def probing(self) -> bool:
        return self.cpu is not None and self.cpu.probe

    def window_cores(self, now: float) -> float:
        """Its cores as the host's window mean counts them now."""
        return self.trace.cores_used * min(1.0, (now - self.started) / HOST_WINDOW_S)


def gpu_reading(runs: list[SimRun], gpu_mem: int, now: float) -> GpuReading:
    """One GPU of ``gpu_mem`` bytes as the simulator's model says the sampler would read it."""
    fresh = any(now < r.settled_at for r in runs)
    activity = None if fresh else min(1.0, sum(r.trace.compute for r in runs))
    return GpuReading(min(gpu_mem, sum(r.peak for r in runs)), activity, activity)
