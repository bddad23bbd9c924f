"""A discrete-event simulator of the job manager: the daemon's scheduling on modelled devices.

:func:`simulate` replays a trace (:mod:`tandem.place.sim.trace`) on a modelled server. At each
event (an arrival, a job's end, a job's memory settling, an out-of-memory check, a waiting
job crossing the starvation limit, a job's samples) it decides through the daemon's own
functions (:mod:`tandem.place.decide`: what each waiting job reserves, given, learnt from
the runs of its key or its script before or from a running job alike, or a probe started
beside the others within what the host has;
the host's and GPUs' views) and calls the real :func:`tandem.place.scheduler.plan` with the
real policy object: no admission or placement logic lives here. Only the measurements are
modelled (:mod:`tandem.place.sim.simrun`: cores, the host's window, SM activity), and:

- **Memory.** A job reaches its true peak (:attr:`TraceJob.true_gpu_mem`) as it starts.
  The measured use of a GPU is the sum of its jobs' peaks. A job of unknown memory (a
  probe) reserves nothing until it has settled (``settle_s`` after its start), then its
  peak plus the margin, as the daemon does.
- **Cores.** A job of ``--cpus auto`` (``cpus`` 0 in its trace) reserves what its key was
  measured at (its learnt runs, or a running job alike), else starts as a probe and is
  measured from its samples (:attr:`TraceJob.cores_used`), as in the daemon.
- **Out of memory.** ``oom_after_s`` after a job starts, its GPUs are checked: while the
  true memory there exceeds the GPU's, the newest job there crashes (GPU OOM) and, like
  in the daemon, is retried (at most :data:`RETRIES` times) with escalation 1 then 2,
  declaring its peak plus the margin. Its work is lost.
- **Collocation slowdown** (:class:`SlowdownModel`).

Traces carry no share groups nor dependencies: those parts of the daemon's admission are
not simulated.

The daemon re-plans on its tick (and at once after a change); here every input of
:func:`plan` that changes with time has its own event (a GPU stops being fresh when its
newest job settles; a job starts starving ``starve_after_s`` after submission), so a
periodic tick would only repeat identical plans and is not needed.
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import asdict, replace
from typing import Any

import numpy as np

from tandem.place.active import STARTUP_SAMPLES, Startup
from tandem.place.decide import HOST_WINDOW_S, Pass, Peak, gpu_views, host_view
from tandem.place.model import OOM, RETRYING, RUNNING, SUCCEEDED, GpuInfo
from tandem.place.policies import GpuSlot, HostSlot, Limits, make_policy
from tandem.place.reserve import FOLLOW_SAMPLES, MEM_MARGIN, STARTUP_MAX_SAMPLES, Learned, Measuring
from tandem.place.resources import Resources
from tandem.place.retry import retry
from tandem.place.scheduler import Placement, Waiting, fits_at_all, plan
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
from tandem.place.sim.simrun import RETRIES, SimJob, SimRun, all_given, gpu_reading, record, uuid_of
from tandem.place.sim.trace import GiB, TraceJob

_EPS = 1e-9
# A run is sampled once a second while a sample may change what a pass decides: its start-up
# and the host's window, and, for --cpus auto, until its start-up is over and a whole window
# of samples has followed (a trace's use is constant: later samples change nothing).
_SAMPLES_FIXED = max(STARTUP_SAMPLES, math.ceil(HOST_WINDOW_S))
_SAMPLES_AUTO = STARTUP_SAMPLES + STARTUP_MAX_SAMPLES + FOLLOW_SAMPLES

# --- simulated state -----------------------------------------------------------------------------


# Event kinds, in the order they are handled when they fall at the same time (after the
# jobs that end then, which are not events: their times change with every rate change).
_OOM, _SETTLE, _ARRIVE, _STARVE, _SAMPLE = range(5)


class _Sim:
    def __init__(
        self,
        jobs: list[TraceJob],
        policy: str,
        gpus: int,
        gpu_mem: int,
        total: Resources,
        limits: Limits,
        model: SlowdownModel,
    ) -> None:
        self.policy = make_policy(policy)
        self.limits = limits
        self.model = model
        self.n_gpus = gpus
        self.gpu_mem = gpu_mem
        self.total = total  # the machine's cores and RAM
        self.infos = [GpuInfo(g, uuid_of(g), gpu_mem) for g in range(gpus)]
        self.empty_gpus = gpu_views(self.infos, [], {}, limits.settle_s, 0.0)  # the submit check's
        order = sorted(range(len(jobs)), key=lambda i: jobs[i].offset_s)  # stable: file order on ties
        self.jobs = [SimJob(jobs[i], record(n + 1, jobs[i])) for n, i in enumerate(order)]
        self.t0 = self.jobs[0].trace.offset_s if self.jobs else 0.0
        self.now = self.t0
        self.events: list[tuple[float, int, int, int]] = []  # (time, kind, seq, payload)
        self._seq = 0
        self.waiting: dict[int, SimJob] = {}
        self.runs: list[SimRun] = []
        self.on_gpu: list[list[SimRun]] = [[] for _ in range(gpus)]
        # What the daemon learns as jobs end: peaks per learning key, cores of --cpus auto.
        self.peaks: dict[str, Peak] = {}
        self.startup = Startup(Learned())
        self.reasons: dict[int, str] = {}  # why each job waited at the last pass
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
            # fresh); what changes next (a settling, an end, a sample) is an event.
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
            if self._refused(job):
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
                    if r.gpu_probing:
                        # A probe has settled: from now on it holds its peak plus the margin.
                        gpu_mem = int(r.peak * (1 + self.limits.gpu_mem_margin))
                        r.reservation, r.gpu_settled = r.reservation.measured(gpu_mem=gpu_mem, why=""), True
                    self._touch(r.gpus)  # no longer fresh
                    self.changed = True
        elif kind == _STARVE and payload in self.waiting:
            self.changed = True  # only the clock moved, but past this job's starvation limit
        elif kind == _SAMPLE:
            self._sample(payload)

    def _sample(self, job_id: int) -> None:
        """A run's sample (one a second), as the daemon's sampler gives it: its first few are
        its program's start-up, the next ones its --cpus auto reservation's measurement."""
        r = next((r for r in self.runs if r.job.id == job_id), None)
        if r is None:
            return
        r.samples += 1
        r.cpus_used = used = r.trace.cores_used
        if r.samples <= STARTUP_SAMPLES:
            self.startup.seen(r.job.command, used)
        elif r.cpu is not None and r.cpu.sample(used):
            r.reservation = r.reservation.measured(cores=round(r.cpu.cores, 3), why=r.cpu.source)
            self.changed = True
        if r.samples in (STARTUP_SAMPLES, _SAMPLES_FIXED):  # its start-up, the host's window: over
            self.changed = True
        if r.samples < (_SAMPLES_AUTO if r.cpu is not None and r.cpu.auto else _SAMPLES_FIXED):
            self._push(self.now + 1.0, _SAMPLE, job_id)

    # --- scheduling -------------------------------------------------------------------------------

    def _decisions(self, runs: list[SimRun]) -> Pass:
        return Pass(runs, self.startup.learned, self.peaks, self.startup, self.limits.gpu_mem_margin)

    def _refused(self, job: SimJob) -> bool:
        """The daemon's submit check: whether it could never fit this machine, empty."""
        decide = self._decisions([])
        w = decide.waiting(job.job, decide.reserve(job.job), job.trace.offset_s)
        host = host_view(
            self.total, [], self.startup, self.now, mem_available=None, cpu_mean=None, cpu_p95=None
        )
        return fits_at_all(w, host, self.empty_gpus) is not None

    def _queue(self) -> list[Waiting]:
        """What the daemon's pass shows the scheduler of the waiting jobs (in its order:
        job ids), through the same decisions; why the others wait goes to ``reasons``."""
        decide = self._decisions(self.runs)
        out = []
        for job in sorted(self.waiting.values(), key=lambda j: j.id):
            reserved = job.fixed or decide.reserve(job.job)
            if job.fixed is None and all_given(job.job):
                job.fixed = reserved  # learnt figures never change it: not decided again
            out.append(decide.waiting(job.job, reserved, job.job.queued_at or job.job.submitted))
        return out

    def _schedule(self) -> None:
        if not self.waiting:
            return
        self.reasons = {}
        queue = self._queue()
        if not queue:
            return
        outcome = plan(queue, self._host_slot(), self._gpu_slots(), self.policy, self.limits, self.now)
        self.reasons.update(outcome.reasons)
        for p in outcome.placements:
            self._start(self.waiting.pop(p.job_id), p)

    def _start(self, job: SimJob, p: Placement) -> None:
        job.attempts += 1
        job.state = RUNNING
        job.gpus = p.gpus
        job.first_start = self.now if job.first_start is None else job.first_start
        job.last_start = self.now
        # As the daemon's attempt start (tandem.place.attempts): the pass's reservation. Its
        # RAM of --mem auto is raised to its use at once (the daemon raises it to the measured
        # peak as that grows: the trace's RAM is its use from the start).
        reserved = p.reservation
        used_ram = int(job.trace.spec.mem * (1 + MEM_MARGIN))
        if not job.job.mem and used_ram > reserved.resources.ram:
            reserved = reserved.measured(ram=used_ram, why="measured, this run")
        run = SimRun(
            job.job,
            job.trace,
            p,
            self.now,
            self.now + self.limits.settle_s,
            reserved,
            job.trace.duration_s,
            job.trace.true_gpu_mem,
            Measuring(job.job, self.startup.learned, start=reserved),
        )
        self.runs.append(run)
        for g in p.gpus:
            self.on_gpu[g].append(run)
        self._touch(p.gpus)
        self.runs_changed = True
        self._push(run.settled_at, _SETTLE, job.id)
        self._push(self.now + 1.0, _SAMPLE, job.id)
        for g in p.gpus:
            self._push(self.now + self.model.oom_after_s, _OOM, g)

    def _activity(self, runs: list[SimRun]) -> float:
        return min(1.0, sum(r.trace.compute for r in runs))

    def _touch(self, gpus: tuple[int, ...]) -> None:
        for g in gpus:
            self.slots[g] = None

    def _gpu_slots(self) -> list[GpuSlot]:
        # A GPU's view changes only when a job starts, ends or settles there (each touches it).
        for g, slot in enumerate(self.slots):
            if slot is None:
                runs = self.on_gpu[g]
                reading = {uuid_of(g): gpu_reading(runs, self.gpu_mem, self.now)}
                self.slots[g] = gpu_views([self.infos[g]], runs, reading, self.limits.settle_s, self.now)[0]
        return self.slots  # type: ignore[return-value]

    def _host_slot(self) -> HostSlot:
        busy = min(1.0, sum(r.window_cores(self.now) for r in self.runs) / self.total.cores)
        return host_view(
            self.total,
            self.runs,
            self.startup,
            self.now,
            # jobs use the RAM they reserve
            mem_available=self.total.ram - sum(r.reservation.resources.ram for r in self.runs),
            cpu_mean=busy,
            cpu_p95=busy,
        )

    def _rates(self) -> None:
        per_gpu = [self.model.gpu(sum(r.trace.compute for r in runs), len(runs)) for runs in self.on_gpu]
        host = self.model.host(sum(r.trace.cores_used for r in self.runs), self.total.cores)
        for r in self.runs:
            r.slowdown = max(per_gpu[g] for g in r.gpus) if r.gpus else host
            r.end_at = self.now + max(0.0, r.remaining) * r.slowdown

    # --- endings ---------------------------------------------------------------------------------

    def _check_memory(self, g: int) -> None:
        runs = self.on_gpu[g]
        while runs and sum(r.peak for r in runs) > self.gpu_mem:
            newest = max(runs, key=lambda r: (r.started, r.job.id))
            self._end(newest, OOM)

    def _end(self, r: SimRun, how: str) -> None:
        self.runs.remove(r)
        for g in r.gpus:
            self.on_gpu[g].remove(r)
        self._touch(r.gpus)
        self.changed = self.runs_changed = True
        job = self.jobs[r.job.id - 1]
        job.ran_s += self.now - r.started
        key = job.job.learning_key
        # What the daemon records of its run (tandem.place.attempts): its peaks.
        old = self.peaks.get(key, Peak())
        self.peaks[key] = Peak(
            max(old.peak_mem or 0, r.trace.spec.mem) or None,
            max(old.peak_gpu_mem or 0, r.peak if r.gpus else 0) or None,
        )
        if how == SUCCEEDED:
            measured = r.cpu.measured() if r.cpu is not None and r.cpu.auto else None
            if measured is not None:  # what its key reserves next
                self.startup.learned.seen_job(job.job, measured)
            job.state, job.end = SUCCEEDED, self.now
            return
        self.crashes += 1
        again = retry(
            "gpu_oom",
            job.attempts,
            RETRIES,
            job.job.escalation,
            job.job.gpu_mem,
            job.trace.spec.mem,
            r.peak,
            None,
            self.limits.gpu_mem_margin,
        )
        if again is not None:  # as the daemon: the GPU with most free memory, then alone
            job.job = replace(job.job, escalation=again.escalation, gpu_mem=again.gpu_mem, queued_at=self.now)
            job.fixed = None
            if not self._refused(job):
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
            machine={
                "gpus": self.n_gpus,
                "gpu_mem": self.gpu_mem,
                "cpus": self.total.cores,
                "mem": self.total.ram,
            },
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
    sim = _Sim(
        jobs, policy, gpus, gpu_mem, Resources(cpus, mem), limits or Limits(), model or SlowdownModel()
    )
    sim.run()
    return sim.result(policy, time.perf_counter() - started)
