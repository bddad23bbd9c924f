"""A discrete-event simulator of the job manager: the daemon's scheduling on modelled devices.

:func:`simulate` replays a trace (:mod:`tandem.place.sim.trace`) on a modelled server. At each
event (an arrival, a job's end, a job's memory settling, an out-of-memory check, a waiting
job crossing the starvation limit) it builds the scheduler's view of the devices
(:class:`~tandem.place.policies.GpuSlot`, ``HostSlot``) from the simulated state, exactly
as the daemon builds it from measurements, and calls the real
:func:`tandem.place.scheduler.plan` with the real policy object: no placement logic lives
here. What is modelled instead of measured:

- **Activity.** A GPU's SM activity is ``min(1, sum of its jobs' compute)``; it is
  reported to the policy (mean and 95th percentile alike: a steady state) once no job there
  is fresh, and as unknown before, when a real window would still mix old and new load.
- **Memory.** A job reaches its true peak (:attr:`TraceJob.true_gpu_mem`) as it starts.
  The measured use of a GPU is the sum of its jobs' peaks. A job of unknown memory (a
  probe) reserves nothing until it has settled (``settle_s`` after its start), then its
  peak plus the margin, as the daemon does.
- **Out of memory.** ``oom_after_s`` after a job starts, its GPUs are checked: while the
  true memory there exceeds the GPU's, the newest job there crashes (GPU OOM) and, like
  in the daemon, is retried (at most :data:`RETRIES` times) with escalation 1 then 2,
  declaring its peak plus the margin. Its work is lost.
- **Collocation slowdown** (:class:`SlowdownModel`).

The daemon re-plans on its tick (and at once after a change); here every input of
:func:`plan` that changes with time has its own event (a GPU stops being fresh when its
newest job settles; a job starts starving ``starve_after_s`` after submission), so a
periodic tick would only repeat identical plans and is not needed.
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from tandem.place.model import OOM, QUEUED, RETRYING, RUNNING, SUCCEEDED, job_key
from tandem.place.policies import GpuSlot, HostSlot, Limits, make_policy
from tandem.place.retry import retry
from tandem.place.scheduler import Waiting, fits_at_all, plan
from tandem.place.sim.simmodel import (  # noqa: F401 (AGGREGATE_KEYS, JobResult: the simulator's API)
    AGGREGATE_KEYS,
    GPU_IDLE_W,
    GPU_MAX_W,
    REFUSED,
    UNPLACED,
    JobResult,
    SimResult,
    SlowdownModel,
)
from tandem.place.sim.trace import GiB, TraceJob, command_args

RETRIES = 2  # the daemon's default retries per job (``tandem submit --retries``)
_EPS = 1e-9

# --- simulated state -----------------------------------------------------------------------------


@dataclass
class _Job:
    id: int
    trace: TraceJob
    key: str
    gpu_mem: int | None  # declared per GPU; raised after an OOM
    state: str = QUEUED
    escalation: int = 0
    attempts: int = 0
    first_start: float | None = None
    last_start: float | None = None
    end: float | None = None
    ran_s: float = 0.0  # running time over all attempts
    gpus: tuple[int, ...] = ()
    waiting: Waiting | None = None  # what the scheduler is shown, while it cannot change


@dataclass
class _Run:
    """A running attempt."""

    job: _Job
    gpus: tuple[int, ...]
    start: float
    settled_at: float
    reserved: int | None  # per GPU; None while a probe has not settled
    alone: bool
    remaining: float  # seconds of work at the speed alone
    peak: int  # true GPU memory per GPU
    slowdown: float = 1.0
    end_at: float = math.inf


# Event kinds, in the order they are handled when they fall at the same time (after the
# jobs that end then, which are not events: their times change with every rate change).
_OOM, _SETTLE, _ARRIVE, _STARVE = range(4)


class _Sim:
    def __init__(
        self,
        jobs: list[TraceJob],
        policy: str,
        gpus: int,
        gpu_mem: int,
        cpus: float,
        mem: int,
        limits: Limits,
        model: SlowdownModel,
    ) -> None:
        self.policy = make_policy(policy)
        self.limits = limits
        self.model = model
        self.n_gpus = gpus
        self.gpu_mem = gpu_mem
        self.cpus = cpus
        self.mem = mem
        order = sorted(range(len(jobs)), key=lambda i: jobs[i].offset_s)  # stable: file order on ties
        self.jobs = [
            _Job(n + 1, jobs[i], job_key(jobs[i].name or None, command_args(jobs[i])), jobs[i].gpu_mem)
            for n, i in enumerate(order)
        ]
        self.t0 = self.jobs[0].trace.offset_s if self.jobs else 0.0
        self.now = self.t0
        self.events: list[tuple[float, int, int, int]] = []  # (time, kind, seq, payload)
        self._seq = 0
        self.waiting: dict[int, _Job] = {}
        self.runs: list[_Run] = []
        self.on_gpu: list[list[_Run]] = [[] for _ in range(gpus)]
        self.peaks: dict[str, int] = {}  # job key -> peak GPU memory, as the daemon's peaks table
        self.slots: list[GpuSlot | None] = [None] * gpus  # the scheduler's view of each GPU; None: stale
        self.changed = False  # something a plan reads has changed since the last plan
        self.runs_changed = False  # the set of running jobs has changed: rates too
        self.crashes = 0
        self.retries = 0
        self.busy_gpu_s = 0.0
        self.activity_gpu_s = 0.0
        self.energy_j = 0.0
        self.arrivals_left = len(self.jobs)
        for job in self.jobs:
            self._push(job.trace.offset_s, _ARRIVE, job.id)

    def _push(self, t: float, kind: int, payload: int) -> None:
        self._seq += 1
        heapq.heappush(self.events, (t, kind, self._seq, payload))

    # --- the loop -----------------------------------------------------------------------------

    def run(self) -> None:
        while True:
            t_event = self.events[0][0] if self.events else math.inf
            t_end = min((r.end_at for r in self.runs), default=math.inf)
            t = min(t_event, t_end)
            if t == math.inf or not (self.runs or self.waiting or self.arrivals_left):
                break  # the events left (settling, starvation limits) would only run the clock on
            self._advance(t)
            for r in [r for r in self.runs if r.end_at <= t + _EPS]:
                self._end(r, SUCCEEDED)
            while self.events and self.events[0][0] <= t + _EPS:
                _, kind, _, payload = heapq.heappop(self.events)
                self._handle(kind, payload)
            # Plan only after a change. Not after a plan's own placements: its pass ended with
            # the state they made, and no more fits in it (a GPU or host that just took a job is
            # fresh); what changes next (a settling, an end) is an event.
            if self.changed:
                self.changed = False
                self._schedule()
            if self.runs_changed:
                self.runs_changed = False
                self._rates()
        for job in self.waiting.values():  # nothing more can happen: these would wait forever
            job.state = UNPLACED

    def _advance(self, t: float) -> None:
        dt = t - self.now
        if dt > 0:
            for r in self.runs:
                r.remaining -= dt / r.slowdown
            for runs in self.on_gpu:
                if runs:
                    activity = self._activity(runs)
                    self.busy_gpu_s += dt
                    self.activity_gpu_s += dt * activity
                    self.energy_j += dt * (GPU_MAX_W - GPU_IDLE_W) * activity
            self.energy_j += dt * GPU_IDLE_W * self.n_gpus
        self.now = t

    def _handle(self, kind: int, payload: int) -> None:
        if kind == _ARRIVE:
            self.arrivals_left -= 1
            job = self.jobs[payload - 1]
            why = fits_at_all(self._waiting_of(job), self._host_slot(), self._gpu_slots())
            if why:
                job.state, job.end = REFUSED, self.now
                return
            self.waiting[job.id] = job
            self.changed = True
            if self.policy.backfill:  # a strict FIFO policy never passes a job over: no change then
                self._push(job.trace.offset_s + self.limits.starve_after_s, _STARVE, job.id)
        elif kind == _OOM:
            self._check_memory(payload)
        elif kind == _SETTLE:
            for r in self.runs:
                if r.job.id == payload and r.settled_at <= self.now:
                    if r.reserved is None and r.gpus:
                        # A probe has settled: from now on it holds its peak plus the margin.
                        r.reserved = int(r.peak * (1 + self.limits.gpu_mem_margin))
                    self._touch(r.gpus)  # no longer fresh
                    self.changed = True
        elif kind == _STARVE and payload in self.waiting:
            self.changed = True  # only the clock moved, but past this job's starvation limit

    # --- scheduling -------------------------------------------------------------------------------

    def _waiting_of(self, job: _Job) -> Waiting:
        if job.waiting is not None:
            return job.waiting
        gpu_mem = job.gpu_mem
        if job.trace.gpus and gpu_mem is None and self.peaks.get(job.key):
            gpu_mem = int(self.peaks[job.key] * (1 + self.limits.gpu_mem_margin))  # as the daemon's _waiting
        t = job.trace
        w = Waiting(job.id, t.priority, t.offset_s, t.cpus, t.mem, t.gpus, gpu_mem, job.escalation)
        if gpu_mem is not None or not t.gpus:  # an auto job's may change with each peak recorded
            job.waiting = w
        return w

    def _schedule(self) -> None:
        if not self.waiting:
            return
        queue = [self._waiting_of(j) for j in self.waiting.values()]
        wanted = {w.id: w for w in queue}
        for p in plan(
            queue, self._host_slot(), self._gpu_slots(), self.policy, self.limits, self.now
        ).placements:
            job = self.waiting.pop(p.job_id)
            w = wanted[p.job_id]
            job.attempts += 1
            job.state = RUNNING
            job.gpus = p.gpus
            job.first_start = self.now if job.first_start is None else job.first_start
            job.last_start = self.now
            run = _Run(
                job,
                p.gpus,
                self.now,
                self.now + self.limits.settle_s,
                None if p.probe else w.gpu_mem,
                p.alone,
                job.trace.duration_s,
                job.trace.true_gpu_mem,
            )
            self.runs.append(run)
            for g in p.gpus:
                self.on_gpu[g].append(run)
            self._touch(p.gpus)
            self.runs_changed = True
            self._push(run.settled_at, _SETTLE, job.id)
            for g in p.gpus:
                self._push(self.now + self.model.oom_after_s, _OOM, g)

    def _fresh(self, runs: list[_Run]) -> bool:
        return any(self.now < r.settled_at for r in runs)

    def _activity(self, runs: list[_Run]) -> float:
        return min(1.0, sum(r.job.trace.compute for r in runs))

    def _touch(self, gpus: tuple[int, ...]) -> None:
        for g in gpus:
            self.slots[g] = None

    def _gpu_slots(self) -> list[GpuSlot]:
        # A GPU's view changes only when a job starts, ends or settles there (each touches it).
        for g, slot in enumerate(self.slots):
            if slot is None:
                self.slots[g] = self._gpu_slot(g)
        return self.slots  # type: ignore[return-value]

    def _gpu_slot(self, g: int) -> GpuSlot:
        runs = self.on_gpu[g]
        fresh = self._fresh(runs)
        activity = None if fresh else self._activity(runs)
        return GpuSlot(
            index=g,
            uuid=f"sim-gpu-{g}",
            mem_total=self.gpu_mem,
            mem_reserved=sum(r.reserved or 0 for r in runs),
            mem_used=min(self.gpu_mem, sum(r.peak for r in runs)),
            jobs=len(runs),
            probing=any(r.reserved is None for r in runs),
            compute_declared=None if runs else 0,  # traces declare no --gpu-share
            fresh=fresh,
            alone=any(r.alone for r in runs),
            activity_mean=activity,
            activity_p95=activity,
        )

    def _host_slot(self) -> HostSlot:
        cpu_runs = [r for r in self.runs if not r.gpus]
        fresh = self._fresh(cpu_runs)
        busy = None if fresh else min(1.0, self._busy_cores(cpu_runs) / self.cpus)
        mem_reserved = sum(r.job.trace.mem for r in self.runs)
        return HostSlot(
            cpus_total=self.cpus,
            mem_total=self.mem,
            cpus_reserved=sum(r.job.trace.cpus for r in self.runs),
            mem_reserved=mem_reserved,
            mem_available=self.mem - mem_reserved,  # jobs are taken to use the RAM they reserve
            cpu_mean=busy,
            cpu_p95=busy,
            jobs=len(cpu_runs),
            all_jobs=len(self.runs),
            alone=any(r.alone for r in cpu_runs),
        )

    @staticmethod
    def _busy_cores(cpu_runs: list[_Run]) -> float:
        # Only CPU-only jobs count: GPU jobs' own CPU use (data loading) is not modelled.
        return sum(r.job.trace.cpus * r.job.trace.compute for r in cpu_runs)

    def _rates(self) -> None:
        per_gpu = [self.model.gpu(sum(r.job.trace.compute for r in runs), len(runs)) for runs in self.on_gpu]
        host = self.model.host(self._busy_cores([r for r in self.runs if not r.gpus]), self.cpus)
        for r in self.runs:
            r.slowdown = max(per_gpu[g] for g in r.gpus) if r.gpus else host
            r.end_at = self.now + max(0.0, r.remaining) * r.slowdown

    # --- endings ---------------------------------------------------------------------------------

    def _check_memory(self, g: int) -> None:
        runs = self.on_gpu[g]
        while runs and sum(r.peak for r in runs) > self.gpu_mem:
            newest = max(runs, key=lambda r: (r.start, r.job.id))
            self._end(newest, OOM)

    def _end(self, r: _Run, how: str) -> None:
        self.runs.remove(r)
        for g in r.gpus:
            self.on_gpu[g].remove(r)
        self._touch(r.gpus)
        self.changed = self.runs_changed = True
        job = r.job
        job.ran_s += self.now - r.start
        if r.gpus:
            self.peaks[job.key] = max(self.peaks.get(job.key, 0), r.peak)
        if how == SUCCEEDED:
            job.state, job.end = SUCCEEDED, self.now
            return
        self.crashes += 1
        again = retry(
            "gpu_oom",
            job.attempts,
            RETRIES,
            job.escalation,
            job.gpu_mem,
            job.trace.mem,
            r.peak,
            None,
            self.limits.gpu_mem_margin,
        )
        if again is not None:  # as the daemon: the GPU with most free memory, then alone
            job.escalation, job.gpu_mem = again.escalation, again.gpu_mem
            job.waiting = None
            if fits_at_all(self._waiting_of(job), self._host_slot(), self._gpu_slots()) is None:
                job.state = RETRYING
                self.retries += 1
                self.waiting[job.id] = job
                return
        job.state, job.end = OOM, self.now

    # --- results ---------------------------------------------------------------------------------

    def result(self, policy: str, wall_s: float) -> SimResult:
        out = []
        for j in self.jobs:
            t = j.trace
            done = j.state == SUCCEEDED and j.end is not None and j.last_start is not None
            jct = j.end - t.offset_s if j.end is not None and j.state != REFUSED else None
            run = j.end - j.last_start if done else None  # type: ignore[operator]
            out.append(
                JobResult(
                    id=j.id,
                    name=t.name,
                    kind=t.kind,
                    state=j.state,
                    submit=t.offset_s - self.t0,
                    start=None if j.first_start is None else j.first_start - self.t0,
                    end=None if j.end is None else j.end - self.t0,
                    wait_s=None if jct is None else jct - j.ran_s,
                    jct_s=jct,
                    run_s=run,
                    slowdown=None if run is None else run / t.duration_s,
                    attempts=j.attempts,
                    gpus=list(j.gpus),
                )
            )
        ok = [r for r in out if r.state == SUCCEEDED]
        jcts = np.array([r.jct_s for r in ok], dtype=float)
        slow = np.array([r.slowdown for r in ok], dtype=float)
        ends = [j.end for j in self.jobs if j.end is not None and j.state != REFUSED]
        makespan = max(ends) - self.t0 if ends else 0.0
        denom = self.n_gpus * makespan

        def stat(values: np.ndarray, f: Any) -> float:
            return float(f(values)) if len(values) else 0.0

        return SimResult(
            policy=policy,
            machine={"gpus": self.n_gpus, "gpu_mem": self.gpu_mem, "cpus": self.cpus, "mem": self.mem},
            limits=asdict(self.limits),
            model=asdict(self.model),
            jobs=out,
            makespan_s=makespan,
            jct_mean_s=stat(jcts, np.mean),
            jct_p50_s=stat(jcts, np.median),
            jct_p95_s=stat(jcts, lambda v: np.percentile(v, 95)),
            wait_mean_s=stat(np.array([r.wait_s for r in ok], dtype=float), np.mean),
            slowdown_mean=stat(slow, np.mean),
            slowdown_max=stat(slow, np.max),
            gpu_util=self.busy_gpu_s / denom if denom else 0.0,
            sm_activity_mean=self.activity_gpu_s / denom if denom else 0.0,
            energy_kwh_estimated=self.energy_j / 3.6e6,
            oom_crashes=self.crashes,
            retries=self.retries,
            wall_s=wall_s,
        )


def simulate(
    jobs: list[TraceJob],
    policy: str,
    gpus: int,
    gpu_mem: int = 80 * GiB,
    cpus: float = 64,
    mem: int = 512 * GiB,
    limits: Limits | None = None,
    model: SlowdownModel | None = None,
) -> SimResult:
    """Replay ``jobs`` on a modelled server of ``gpus`` GPUs of ``gpu_mem`` bytes each,
    ``cpus`` cores and ``mem`` bytes of RAM, placing them with ``policy`` (a name of
    :data:`~tandem.place.policies.POLICIES`) under ``limits``, collocated jobs slowing as
    ``model`` says. Deterministic: the same inputs give the same result."""
    started = time.perf_counter()
    sim = _Sim(jobs, policy, gpus, gpu_mem, cpus, mem, limits or Limits(), model or SlowdownModel())
    sim.run()
    return sim.result(policy, time.perf_counter() - started)
