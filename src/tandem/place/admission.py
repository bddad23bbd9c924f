"""What one scheduling pass of the daemon sees, and what it says about the jobs it leaves
waiting.

From the running attempts, the live producers and the measurements it builds the host and
GPU slots (:class:`~tandem.place.policies.HostSlot`, ``GpuSlot``); from the waiting jobs
the scheduler's :class:`~tandem.place.scheduler.Waiting` (a job of a share group whose
producer is not running carries its charge apart: the pass charges it to whichever job of
the group it starts first, which starts the producer); it resolves dependencies (a job
after one that failed is cancelled); and it keeps why each waiting job waits, writing only
what changed.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from tandem.place.active import STARTUP_SAMPLES, Active, Startup
from tandem.place.devices import Monitor
from tandem.place.model import FINAL_STATES, QUEUED, SUCCEEDED, Capacity
from tandem.place.policies import GpuSlot, HostSlot, Limits
from tandem.place.producers import Producers
from tandem.place.reserve import AUTO_CPUS, key_words, mem_reservation, probing_keys, running_figures
from tandem.place.scheduler import Waiting
from tandem.place.state import Job, State

Ended = dict[int, tuple[str, float | None]]  # job id -> (state, ended) of dependencies
# The host's load from outside the reservations is judged over the last few seconds, not the
# GPU's 30-s window: a start-up burst (an import) is over in seconds, and a long window held
# jobs back for its length and then let them all in at once. Jobs over their declaration
# are counted at once from their own last sample (HostSlot.cpus_over).
HOST_WINDOW_S = 5.0


def _over_declared(active: list[Active], startup: Startup) -> tuple[float, int | None]:
    """Cores the running jobs use beyond what they declared (a job that declared too little,
    a start-up burst), and the job most over its share: as last measured, and for a job
    still starting, at least what its program used at start before."""
    over = []
    for a in active:
        used = a.cpus_used or 0.0
        if a.samples < STARTUP_SAMPLES:
            used = max(used, startup.cores(a.job.command))
        if used > a.cpus:
            over.append((used - a.cpus, a.job.id))
    return (sum(o for o, _ in over), max(over)[1]) if over else (0.0, None)


def _busy_cores(active: list[Active], startup: Startup, measured: float | None, now: float) -> float | None:
    """The cores a waiting job of learnt cores must leave to the others: the host's measured
    busy cores over the last seconds (load from outside the manager too), plus each job
    started within that window at its figure (its reservation, or what its program used at
    start where its use is not known: the window has not seen it yet), plus what each job of
    given cores reserved and does not use now (a hard reservation is kept for it)."""
    if measured is None:
        return None
    busy = measured
    for a in active:
        if now - a.started < HOST_WINDOW_S or a.samples < STARTUP_SAMPLES:
            known = a.cpu is not None and a.cpu.source.startswith("measured")
            busy += a.cpus if known else max(a.cpus, startup.cores(a.job.command))
        elif a.cpu is None or not a.cpu.auto:
            busy += max(0.0, a.cpus - (a.cpus_used or 0.0))
    return busy


def _probe_reason(probing: int | None, active: dict[int, Active]) -> str | None:
    """Why a job of --cpus auto never seen before waits while job ``probing`` is measured."""
    if probing is None:
        return None
    measured = (
        f"job {probing}'s measurement"
        if probing in active
        else f"job {probing}, the next new job to be measured"
    )
    return (
        f"cores: --cpus auto, a job not seen before; waits for {measured} (one new job is measured at a time)"
    )


class Admission:
    def __init__(
        self,
        state: State,
        capacity: Capacity,
        limits: Limits,
        monitor: Monitor,
        producers: Producers,
        startup: Startup,
    ) -> None:
        self.state, self.capacity, self.limits = state, capacity, limits
        self.monitor, self.producers, self.startup = monitor, producers, startup
        self._reasons: dict[int, str] = {}  # as last written
        self._peaks: dict[str, Any] = {}
        self._peaks_version: tuple[int, int] | None = None

    def peaks(self) -> dict[str, Any]:
        """The measured peaks of every job key (read again only when the state changed):
        looked up once a pass, then for each waiting job from this."""
        version = self.state.version()
        if version != self._peaks_version:
            self._peaks = {r["job_key"]: r for r in self.state.peaks()}
            self._peaks_version = version
        return self._peaks

    def host_slot(self, active: Iterable[Active]) -> HostSlot:
        active = list(active)
        cpu_jobs = [a for a in active if not a.placement.gpus]
        mean = self.monitor.cpu.mean(HOST_WINDOW_S)
        measured = None if mean is None else mean * self.capacity.cpus
        live = [self.producers.reservation(s, True) for s in self.state.shares() if self.producers.running(s)]
        return HostSlot(
            cpus_total=self.capacity.cpus,
            mem_total=self.capacity.mem,
            cpus_reserved=sum(a.cpus for a in active) + sum(c for c, _ in live),
            mem_reserved=sum(a.mem for a in active) + sum(m for _, m in live),
            mem_available=self.monitor.mem_available,
            cpu_mean=self.monitor.cpu.mean(HOST_WINDOW_S),
            cpu_p95=self.monitor.cpu.p95(HOST_WINDOW_S),
            cpus_over=_over_declared(active, self.startup),
            jobs=len(cpu_jobs),
            all_jobs=len(active),
            alone=any(a.placement.alone for a in cpu_jobs),
            cpus_busy=_busy_cores(active, self.startup, measured, time.time()),
        )

    def gpu_slots(self, active: Iterable[Active]) -> list[GpuSlot]:
        now = time.time()
        active = list(active)
        slots = []
        for g in self.capacity.gpus:
            on = [a for a in active if g.uuid in a.uuids]
            m = self.monitor.gpus.get(g.uuid)
            probing = [a.job.id for a in on if a.gpu_mem_reserved is None]
            shares = [a.job.gpu_share for a in on]
            slots.append(
                GpuSlot(
                    index=g.index,
                    uuid=g.uuid,
                    mem_total=g.mem_total,
                    mem_reserved=sum(a.gpu_mem_reserved or 0 for a in on),
                    mem_used=m.mem_used if m else None,
                    jobs=len(on),
                    probing=bool(probing),
                    probing_job=probing[0] if probing else None,
                    compute_declared=None if None in shares else sum(shares),  # type: ignore[arg-type]
                    fresh=any(now - a.started < self.limits.settle_s for a in on),
                    alone=any(a.placement.alone for a in on),
                    activity_mean=m.activity.mean() if m else None,
                    activity_p95=m.activity.p95() if m else None,
                )
            )
        return slots

    def waiting(
        self, jobs: list[Job], ended: Ended, active: dict[int, Active], reasons: dict[int, str]
    ) -> list[Waiting]:
        """The jobs the scheduler may consider; why each other one waits goes into ``reasons``."""
        out = []
        shares = {s.name: s for s in self.state.shares()}
        running = {name: self.producers.running(s) for name, s in shares.items()}  # once a pass, not a job
        in_share: dict[str, int] = {}  # its running jobs, per share
        for a in active.values():
            if a.job.share:
                in_share[a.job.share] = in_share.get(a.job.share, 0) + 1
        peaks = self.peaks()
        # One job of --cpus auto never seen before is measured at a time (tandem.place.reserve),
        # but the jobs of a share group: they run together whatever their cores (their group
        # is bounded: scheduler.share_bound), so they are not probed one after another.
        probing = next((a.job.id for a in active.values() if a.probing and not a.job.share), None)
        probe_reason = _probe_reason(probing, active)
        # A job alike to a running one (its learning key) starts at that one's measurement;
        # one alike to a probe queued before it waits for that one, not a probe itself.
        figures, probes = running_figures(active.values()), probing_keys(active.values())
        for job in jobs:
            if job.id in active or job.cancel_requested:
                continue
            since = job.queued_at or job.submitted
            if job.after:
                pending = [d for d in job.after if ended.get(d, ("", None))[0] != SUCCEEDED]
                if pending:
                    reasons[job.id] = "after job " + ", ".join(str(d) for d in pending)
                    continue
                since = max([since] + [ended[d][1] or 0.0 for d in job.after])
            cpus, source, probe = self.startup.learned.reserve(job, figures)
            # A share group's points do not wait for the first one's measurement: each that
            # joins late makes the producer serve its epochs again (scheduler.share_bound).
            if probe and job.learning_key in probes and not job.share:
                first = probes[job.learning_key]
                measured = f"job {first}'s measurement" if first in active else f"job {first}, to be measured"
                reasons[job.id] = (
                    f"cores: --cpus auto; waits for {measured}, a job "
                    f"alike (job key {key_words(job.learning_key)}), then starts at it"
                )
                continue
            if probe and not job.share and probe_reason is not None:
                reasons[job.id] = probe_reason  # one string for the whole queue behind it
                continue
            if probe:
                probes[job.learning_key] = job.id  # the others of its key wait for it
                if not job.share:
                    probe_reason = _probe_reason(job.id, active)
            known = peaks.get(job.learning_key)
            mem = job.mem or mem_reservation(0, known and known["peak_mem"], job.learning_key)[0]
            share = shares.get(job.share or "")
            with_producer, p_cpus, p_mem = False, 0.0, 0
            if share is not None and not running[share.name]:
                if self.producers.stopping(share.name):
                    reasons[job.id] = f"share {share.name}: its previous producer is still stopping"
                    continue  # a new producer could not take the name yet
                # Whichever job of the group starts first also starts its producer: the pass
                # charges it to that one, once (scheduler.plan), so it never overbooks the host.
                p_cpus, p_mem = self.producers.reservation(share, running=False)
                with_producer = True
            gpu_mem = job.gpu_mem
            if job.gpus and gpu_mem is None and known is not None and known["peak_gpu_mem"]:
                gpu_mem = int(known["peak_gpu_mem"] * (1 + self.limits.gpu_mem_margin))
            # Where its shared batches are: a running producer's GPU, if it keeps them on one.
            prefer = (
                self.producers.prefer_gpus(share.name) if share is not None and running[share.name] else ()
            )
            out.append(
                Waiting(
                    job.id,
                    job.priority,
                    job.submitted,
                    cpus,
                    mem,
                    job.gpus or 0,  # resolved at submit: a queued job's count is never None
                    gpu_mem,
                    job.escalation,
                    waiting_since=since,
                    prefer_gpus=prefer,
                    with_producer=with_producer,
                    gpu_share=job.gpu_share,
                    share=share.name if share is not None else None,
                    producer_cpus=p_cpus,
                    producer_mem=p_mem,
                    share_jobs=in_share.get(share.name, 0)
                    if share is not None and running[share.name]
                    else None,
                    elastic=job.cpus == AUTO_CPUS,
                    # A job whose use is known (learnt for its key, or a running job alike's) is
                    # not held back by the start-up of the jobs starting with it: a sweep's
                    # points start together, their imports sharing the cores for seconds.
                    startup_cpus=None
                    if job.gpus or source.startswith("measured")
                    else self.startup.cores(job.command),
                )
            )
        return out

    def write_reasons(self, reasons: dict[int, str]) -> None:
        """Store why each job waits: only what changed (a long queue costs no write per tick)."""
        changed = {i: r for i, r in reasons.items() if self._reasons.get(i) != r}
        if changed:
            self.state.set_reasons(changed)
        self._reasons = reasons

    def dependencies(self, waiting: list[Job]) -> Ended:
        """``id -> (state, ended)`` of every job a waiting job depends on (one query)."""
        return self.state.ended_of({d for j in waiting for d in j.after})

    def resolve(self, waiting: list[Job], deps: Ended) -> list[Job]:
        """Cancel the queued jobs one of whose dependencies ended other than succeeded; the
        jobs still waiting."""
        still = []
        for job in waiting:
            if not job.after:
                still.append(job)
                continue
            failed = next(
                (d for d in job.after if deps.get(d, ("", None))[0] in FINAL_STATES - {SUCCEEDED}), None
            )
            if job.state != QUEUED or failed is None:
                still.append(job)
                continue
            why = f"dependency {failed} ended {deps[failed][0]}"
            self.state.cancel(job.id, why, why, time.time())
        return still
