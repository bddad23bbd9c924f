"""The decisions of admission, pure: what a job reserves (:func:`reserve`), whether a waiting
job may be considered this pass and what the scheduler is shown of it (:class:`Pass`), and
the host's and GPUs' views (:func:`host_view`, :func:`gpu_views`), from plain inputs: the
job's fields, what was learnt, the running attempts' measured figures and the clock. No I/O,
no state.

The daemon calls these at submit (:mod:`tandem.place.requests`), on each pass
(:mod:`tandem.place.admission`), at an attempt's start (:mod:`tandem.place.attempts`) and
for ``tandem status``; the simulator (:mod:`tandem.place.sim.simulate`) calls the same
functions, faking only the measurements (its trace's cores and memory stand in for the
samplers): what one decides on the same inputs, the other does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tandem.place.active import STARTUP_SAMPLES, Startup
from tandem.place.model import PRODUCER_ROLE, GpuInfo
from tandem.place.policies import GpuSlot, HostSlot
from tandem.place.records import Job
from tandem.place.reserve import (
    AUTO_CPUS,
    Learned,
    Measuring,
    mem_reservation,
    running_figures,
)
from tandem.place.resources import GIVEN, LEARNT, PROBE, Reservation, Resources
from tandem.place.scheduler import Waiting

# The host's load from outside the reservations is judged over the last few seconds, not the
# GPU's 30-s window: a start-up burst (an import) is over in seconds, and a long window held
# jobs back for its length and then let them all in at once. Jobs over their declaration
# are counted at once from their own last sample (HostSlot.cpus_over).
HOST_WINDOW_S = 5.0


@dataclass(frozen=True, slots=True)
class Peak:
    """What was measured for a learning key before (the state's ``peaks`` row)."""

    peak_mem: int | None = None
    peak_gpu_mem: int | None = None

    @classmethod
    def of(cls, row: Any) -> Peak | None:
        """From a ``peaks`` row (a mapping, or sqlite3.Row), or None."""
        return None if row is None else cls(row["peak_mem"], row["peak_gpu_mem"])


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU as last measured (NVML, or the simulator's model)."""

    mem_used: int | None = None
    activity_mean: float | None = None
    activity_p95: float | None = None


class RunningAttempt(Protocol):
    """A running attempt as these functions read it (:class:`tandem.place.active.Active`,
    the simulator's run): what it reserves now (:attr:`reservation`, followed as it is
    measured), where, and its measured cores."""

    job: Job
    started: float
    samples: int
    cpus_used: float | None
    cpu: Measuring | None

    @property
    def reservation(self) -> Reservation: ...

    @property
    def gpus(self) -> tuple[int, ...]: ...

    @property
    def uuids(self) -> tuple[str, ...]: ...

    @property
    def alone(self) -> bool: ...

    @property
    def gpu_probing(self) -> bool:
        """On its GPU, its memory not yet settled (a probe: the GPU takes no one else)."""
        ...

    @property
    def probing(self) -> bool: ...


def reserve(
    job: Job,
    learned: Learned,
    alike: Mapping[str, tuple[float, int]] | None,
    peak: Peak | None,
    gpu_mem_margin: float,
) -> Reservation:
    """What ``job`` reserves as it would start now, and where each figure came from: its
    given figures, else what its learning key was measured to use (``learned`` cores,
    ``peak`` RAM and GPU memory plus their margins), else what a running job alike reserves
    (``alike``: :func:`~tandem.place.reserve.running_figures`), else a probe's. The one
    place a reservation is worked out: at submit, each pass, by the simulator; the start
    and the attempt's record keep the pass's value."""
    cores, cores_why, probe = learned.reserve(job, alike)
    ram, ram_why = mem_reservation(job.mem, peak.peak_mem if peak else None, job.learning_key)
    gpu_mem = job.gpu_mem
    if job.gpus and gpu_mem is None and peak is not None and peak.peak_gpu_mem:
        gpu_mem = int(peak.peak_gpu_mem * (1 + gpu_mem_margin))
    return Reservation(
        Resources(cores, ram, job.gpus or 0, gpu_mem or 0, job.gpu_share or 0),
        cores_from=GIVEN if job.cpus != AUTO_CPUS else PROBE if probe else LEARNT,
        ram_from=GIVEN if job.mem else LEARNT if ram else PROBE,
        gpu_mem_from=GIVEN if job.gpu_mem is not None else LEARNT if gpu_mem is not None else PROBE,
        cores_why=cores_why,
        ram_why=ram_why,
    )


class Pass:
    """One scheduling pass's decisions on the waiting jobs, in queue order: what each
    reserves (:meth:`reserve`) and what the scheduler is shown of it (:meth:`waiting`).
    No job waits for another's measurement: jobs of ``--cpus auto`` never seen before
    (probes, :mod:`tandem.place.reserve`) start side by side within what the host has,
    each counted at what its program used at start (a whole core for one never seen) until
    its own samples are in: on an idle 2-core host two start in one pass and the next ones
    as the first bursts end (the scheduler's ``startup_cpus`` and the host's measured busy
    cores). A job alike to a running one that was measured (its learning key) starts at
    that one's figure."""

    def __init__(
        self,
        running: Iterable[RunningAttempt],
        learned: Learned,
        peaks: Mapping[str, Peak],
        startup: Startup,
        gpu_mem_margin: float,
    ) -> None:
        running = list(running)
        self.learned, self.peaks, self.startup = learned, peaks, startup
        self.gpu_mem_margin = gpu_mem_margin
        self.figures = running_figures(running)

    def reserve(self, job: Job) -> Reservation:
        """What ``job`` reserves as it would start in this pass (the scheduler decides
        whether that fits now)."""
        return reserve(job, self.learned, self.figures, self.peaks.get(job.learning_key), self.gpu_mem_margin)

    def waiting(self, job: Job, reserved: Reservation, since: float, **share: Any) -> Waiting:
        """What the scheduler is shown of ``job``; ``share``: its share group's fields of
        :class:`~tandem.place.scheduler.Waiting` (the admission's)."""
        return Waiting(
            job.id,
            job.priority,
            job.submitted,
            reserved,
            job.escalation,
            waiting_since=since,
            # A producer's cores are its definition's or learnt: it may start on measured room
            # (a probe too, except a system manager's: Learned.probes_elastic).
            elastic=(job.cpus == AUTO_CPUS and (reserved.cores_from != PROBE or self.learned.probes_elastic))
            or job.role == PRODUCER_ROLE,
            # A job whose use is known (learnt for its key, or a running job alike's) is
            # not held back by the start-up of the jobs starting with it: a sweep's
            # points start together, their imports sharing the cores for seconds.
            startup_cpus=None
            if job.gpus or reserved.cores_why.startswith("measured")
            else self.startup.cores(job.command),
            owner=job.owner,
            **share,
        )


def _over_declared(running: list[RunningAttempt], startup: Startup) -> tuple[float, int | None, float]:
    """Cores the running jobs use beyond what they declared (a job that declared too little,
    a start-up burst), the job most over its share, and how much of it is jobs still
    starting: as last measured, and for a job still starting, at least what its program
    used at start before."""
    over, starting = [], 0.0
    for a in running:
        used, cores = a.cpus_used or 0.0, a.reservation.resources.cores
        if a.samples < STARTUP_SAMPLES:
            used = max(used, startup.cores(a.job.command))
            starting += max(0.0, used - cores)
        if used > cores:
            over.append((used - cores, a.job.id))
    return (sum(o for o, _ in over), max(over)[1], starting) if over else (0.0, None, 0.0)


def _over_fields(over: tuple[float, int | None, float]) -> dict[str, Any]:
    return {"cpus_over": over[:2], "cpus_starting": over[2]}


def _busy_cores(
    running: list[RunningAttempt], startup: Startup, measured: float | None, now: float
) -> float | None:
    """The cores a waiting job of learnt cores must leave to the others: the host's measured
    busy cores over the last seconds (load from outside the manager too), plus each job
    started within that window at its figure (its reservation, or what its program used at
    start where its use is not known: the window has not seen it yet), plus what each job of
    given cores reserved and does not use now (a hard reservation is kept for it)."""
    if measured is None:
        return None
    busy = measured
    for a in running:
        cores = a.reservation.resources.cores
        if now - a.started < HOST_WINDOW_S or a.samples < STARTUP_SAMPLES:
            known = a.cpu is not None and a.cpu.source.startswith("measured")
            busy += cores if known else max(cores, startup.cores(a.job.command))
        elif (a.cpu is None or not a.cpu.auto) and a.job.role != PRODUCER_ROLE:
            busy += max(0.0, cores - (a.cpus_used or 0.0))
    return busy


def host_view(
    total: Resources,
    running: Iterable[RunningAttempt],
    startup: Startup,
    now: float,
    *,
    mem_available: int | None,
    cpu_mean: float | None,
    cpu_p95: float | None,
    weighted: bool = False,
) -> HostSlot:
    """The host as the scheduler sees it: the running jobs' reservations (share groups'
    producers among them), the measured free RAM and busy share of the cores over
    :data:`HOST_WINDOW_S`, what jobs use over their declaration, and the busy cores a job
    of learnt cores must leave. ``weighted``: the jobs run under CPU weights (each its
    cgroup's; :mod:`tandem.place.run.supervisor.weights`), so that the kernel gives a
    newcomer its share of cores that running jobs use beyond what they declared."""
    running = list(running)
    # A producer is reserved as a job is, but it is no job of the policies' counts (one CPU
    # job at a time, alone): its group's jobs run beside it.
    jobs = [a for a in running if a.job.role != PRODUCER_ROLE]
    cpu_jobs = [a for a in jobs if not a.gpus]
    return HostSlot(
        total=total,
        reserved=Resources(
            cores=sum(a.reservation.resources.cores for a in running),
            ram=sum(a.reservation.resources.ram for a in running),
        ),
        mem_available=mem_available,
        cpu_mean=cpu_mean,
        cpu_p95=cpu_p95,
        **_over_fields(_over_declared(jobs, startup)),
        weighted=weighted,
        jobs=len(cpu_jobs),
        all_jobs=len(jobs),
        alone=any(a.alone for a in cpu_jobs),
        cpus_busy=_busy_cores(running, startup, None if cpu_mean is None else cpu_mean * total.cores, now),
    )


def gpu_views(
    gpus: Sequence[GpuInfo],
    running: Iterable[RunningAttempt],
    measured: Mapping[str, GpuReading],
    settle_s: float,
    now: float,
) -> list[GpuSlot]:
    """Each GPU as the scheduler sees it: its jobs' reservations and declared compute, the
    measured memory and activity (``measured``, by uuid), whether a job of unknown memory
    (a probe) is on it or one started within ``settle_s``."""
    running = list(running)
    slots = []
    for g in gpus:
        on = [a for a in running if g.uuid in a.uuids]
        m = measured.get(g.uuid)
        probing = [a.job.id for a in on if a.gpu_probing]
        shares = [a.job.gpu_share for a in on]
        slots.append(
            GpuSlot(
                index=g.index,
                uuid=g.uuid,
                mem_total=g.mem_total,
                mem_reserved=sum(0 if a.gpu_probing else a.reservation.resources.gpu_mem for a in on),
                mem_used=m.mem_used if m else None,
                jobs=len(on),
                probing=bool(probing),
                probing_job=probing[0] if probing else None,
                compute_declared=None if None in shares else sum(shares),  # type: ignore[arg-type]
                fresh=any(now - a.started < settle_s for a in on),
                alone=any(a.alone for a in on),
                activity_mean=m.activity_mean if m else None,
                activity_p95=m.activity_p95 if m else None,
            )
        )
    return slots
