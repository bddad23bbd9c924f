"""The simulator and the daemon reach their decisions through the same functions
(tandem.place.decide): on one job set, with the same running jobs, the same things learnt and
the same measurements, the daemon's admission and the simulator's pass start the same jobs
in the same places and give the others the same reasons. And the simulator gains what the
shared core does: probes of --cpus auto started side by side within what the host has (none
waits for another's measurement), what was learnt reserved by the next job of the key and by
the script's other commands."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tandem.place.active import Active, Startup
from tandem.place.admission import Admission
from tandem.place.decide import GpuReading, Peak
from tandem.place.model import RUNNING, SUCCEEDED, Capacity, GpuInfo
from tandem.place.policies import Limits, make_policy
from tandem.place.records import AttemptPlacement
from tandem.place.reserve import MEM_MARGIN, Learned, Measuring
from tandem.place.resources import Reservation, Resources
from tandem.place.scheduler import Placement, plan
from tandem.place.sim.simrun import SimRun, gpu_reading, uuid_of
from tandem.place.sim.simulate import SlowdownModel, _Sim, simulate
from tandem.place.sim.trace import TraceJob, trace_job
from tandem.place.state import State
from tandem.units import GiB

T = 200.0  # the clock at the pass (the jobs were submitted at 0: none starves yet)


def _job(
    name: str, cpus: float, mem: int = GiB, gpus: int = 0, gpu_mem: int | None = None, **kw: Any
) -> TraceJob:
    return trace_job(0.0, name, f"python {name}.py", cpus, mem, gpus, gpu_mem, 600.0, 0.5, **kw)


TRACE = [
    _job("given", 1.0),  # 1: runs
    _job("auto-a", 0.0),  # 2: runs, a probe of its key
    _job("gpu-share", 1.0, gpus=1, gpu_mem=10 * GiB, gpu_share=60),  # 3: runs on the GPU
    _job("auto-a", 0.0),  # 4: alike to 2, still a probe: starts beside it (no wait)
    _job("auto-new", 0.0),  # 5: another probe: starts too (8 cores, a core each to start)
    _job("learnt", 0.0),  # 6: its key's cores learnt: starts at them
    _job("gpu-learnt", 1.0, gpus=1, gpu_mem=None),  # 7: GPU memory learnt for its key
    _job("gpu-share2", 0.5, gpus=1, gpu_mem=4 * GiB, gpu_share=50),  # 8: 60 + 50 > 100: waits
    _job("too-big", 1.0, mem=15 * GiB),  # 9: RAM short
]
RUNNING_IDS = (1, 2, 3)


class _Window:
    def __init__(self, value: float | None) -> None:
        self.value = value

    def mean(self, *_: Any) -> float | None:
        return self.value

    def p95(self, *_: Any) -> float | None:
        return self.value


class _Monitor:
    """The daemon's samplers, reading what the simulator's model says they would."""

    def __init__(self, sim: _Sim) -> None:
        host = sim._host_slot()
        self.cpu, self.mem_available = _Window(host.cpu_mean), host.mem_available
        reading = gpu_reading(sim.on_gpu[0], sim.gpu_mem, sim.now)
        gpu = type("Gpu", (), {"mem_used": reading.mem_used, "activity": _Window(reading.activity_mean)})
        self.gpus = {uuid_of(0): gpu}

    def readings(self) -> dict[str, GpuReading]:
        """As :meth:`tandem.place.devices.Monitor.readings`: each GPU's last reading, by uuid."""
        return {u: GpuReading(g.mem_used, g.activity.mean(), g.activity.p95()) for u, g in self.gpus.items()}


class _NoProducers:
    """A daemon's producers where no share is defined (the queue's jobs read none)."""

    @staticmethod
    def rows(_waiting: Any, _active: Any) -> tuple[dict[str, int], dict[str, Any]]:
        return {}, {}


def _running(t: TraceJob, cpu: Measuring, ram: int) -> Reservation:
    """What a running job of the trace reserves: its cores as learnt, its given GPU memory."""
    return Reservation(Resources(cpu.cores, ram, t.gpus, t.spec.gpu_mem or 0, t.spec.gpu_share or 0))


def _learnt() -> Startup:
    return Startup(Learned({"name:learnt": [0.4]}))


def _simulator() -> _Sim:
    sim = _Sim(TRACE, "packing", 1, 80 * GiB, Resources(8.0, 16 * GiB), Limits(), SlowdownModel())
    sim.now = T
    sim.startup = _learnt()
    sim.peaks = {"name:gpu-learnt": Peak(GiB, 6 * GiB)}
    for job in sim.jobs:
        if job.id in RUNNING_IDS:
            t, rec = job.trace, job.job
            cpu = Measuring(rec, sim.startup.learned)
            r = _running(
                t, cpu, rec.mem or int(t.spec.mem * (1 + MEM_MARGIN))
            )  # the simulator's RAM: its use
            p = Placement(job.id, (0,) if t.gpus else (), r, False, False)
            run = SimRun(rec, t, p, T - 100, T - 70, r, 600.0, t.true_gpu_mem, cpu)
            run.samples, run.cpus_used, job.state = 30, 0.5, RUNNING
            sim.runs.append(run)
            if t.gpus:
                sim.on_gpu[0].append(run)
        else:
            sim.waiting[job.id] = job
    return sim


def test_the_simulator_and_the_daemons_admission_reach_the_same_decisions(tmp_path: Path) -> None:
    sim = _simulator()
    monitor = _Monitor(sim)  # what the daemon's samplers read: the simulator's measurements
    waiting = {j.id: j for j in sim.waiting.values()}
    sim._schedule()
    sim_started = {i: j.gpus for i, j in waiting.items() if j.state == RUNNING}

    state = State(tmp_path)
    state.record_peak("name:gpu-learnt", GiB, 6 * GiB, 60.0)
    startup, limits = _learnt(), Limits()
    capacity = Capacity(Resources(8.0, 16 * GiB), (GpuInfo(0, uuid_of(0), 80 * GiB),))
    admission = Admission(state, capacity, limits, monitor, _NoProducers(), startup)  # type: ignore[arg-type]
    now = time.time()
    active = {}
    for job in _simulator().jobs:
        if job.id in RUNNING_IDS:
            t = job.trace
            cpu = Measuring(job.job, startup.learned)
            uuids = (uuid_of(0),) if t.gpus else ()
            placed = AttemptPlacement(
                gpus=(0,) if t.gpus else (), uuids=uuids, reservation=_running(t, cpu, job.job.mem)
            )
            a = Active(job.job, 1, placed, tmp_path, now - 100, cpu=cpu)
            a.samples, a.cpus_used = 30, 0.5
            active[job.id] = a
    reasons: dict[int, str] = {}
    queue = admission.waiting([w.job for w in waiting.values()], {}, active, reasons)
    host, gpus = admission.host_slot(active.values()), admission.gpu_slots(active.values())
    outcome = plan(queue, host, gpus, make_policy("packing"), limits, T)  # the same clock
    reasons.update(outcome.reasons)
    daemon_started = {p.job_id: p.gpus for p in outcome.placements}

    assert daemon_started == sim_started
    assert reasons == sim.reasons
    # The job set exercises each decision: the learnt ones and the probes start (none waits
    # for another's measurement), the rest wait for a reason.
    assert set(daemon_started) == {4, 5, 6, 7}, (daemon_started, reasons)
    assert not any("measurement" in r for r in reasons.values()), reasons
    assert reasons[8].startswith("GPU") or "compute" in reasons[8], reasons[8]
    assert "RAM" in reasons[9], reasons[9]


def test_the_simulator_starts_new_keys_side_by_side_and_the_next_one_at_what_was_learnt() -> None:
    """Three alike jobs of --cpus auto and another new one on 8 cores: all start at once
    (each counted at a core for its start-up; none waits for another's measurement); a job
    of the key submitted after they ended starts at once at what was learnt."""
    trace = [_job("sweep", 0.0) for _ in range(3)] + [_job("other", 0.0)]
    trace.append(trace_job(3000.0, "sweep", "python sweep.py", 0.0, GiB, 0, None, 60.0, 0.5))
    result = simulate(trace, "packing", 0, cpus=8.0, mem=64 * GiB)
    start = {j.id: j.start for j in result.jobs}
    assert all(j.state == SUCCEEDED for j in result.jobs), result.jobs
    assert [start[i] for i in (1, 2, 3, 4)] == [0.0] * 4, start
    assert start[5] == 3000.0  # its key learnt: no probe, no wait


def _starts(cores_used: float, n: int) -> list[tuple[float, float]]:
    trace = [
        trace_job(0.0, f"p{i}", f"python p{i}.py", 0.0, GiB, 0, None, 60.0, cores_used) for i in range(n)
    ]
    result = simulate(trace, "packing", 0, cpus=2.0, mem=64 * GiB)
    assert all(j.state == SUCCEEDED for j in result.jobs), result.jobs
    return sorted((j.start, j.end) for j in result.jobs if j.start is not None and j.end is not None)


def test_on_two_cores_new_jobs_start_side_by_side_within_what_the_host_has() -> None:
    """Conservatively: new jobs of --cpus auto start two at once on 2 idle cores (each counted
    at a whole core while it starts), the next ones as those bursts end and are measured;
    CPU-bound ones (a core each) never more than the cores at once, light ones (0.3 of a
    core) six within seconds, none waiting a run's length for another's measurement."""
    heavy = _starts(1.0, 6)
    assert [s for s, _ in heavy[:2]] == [0.0, 0.0] and heavy[2][0] > 0.0, heavy
    assert max(sum(1 for s, e in heavy if s <= t < e) for t, _ in heavy) == 2, heavy
    light = _starts(0.3, 8)
    assert [s for s, _ in light[:2]] == [0.0, 0.0], light
    assert sum(1 for s, _ in light if s < 10.0) == 6, light  # 6 x 0.3 cores + margins: the host's 2


def test_a_reservation_says_where_each_figure_came_from() -> None:
    """decide.reserve: given figures are given; --cpus auto learnt for its key, or a probe;
    GPU memory auto from its key's peak plus the margin, else a GPU probe (None)."""
    from tandem.place.decide import reserve
    from tandem.place.records import Job
    from tandem.place.reserve import AUTO_CPUS, PROBE_CORES, margin
    from tandem.place.resources import GIVEN, LEARNT, PROBE

    learned = Learned({"name:seen": [0.5]})
    given = reserve(
        Job(["x"], "/", cpus=2.0, mem=GiB, gpus=1, gpu_mem=3 * GiB, id=1), learned, None, None, 0.1
    )
    assert (given.resources.cores, given.resources.ram, given.gpu_mem, given.probe) == (
        2.0,
        GiB,
        3 * GiB,
        False,
    )
    r = given
    assert (r.cores_from, r.ram_from, r.gpu_mem_from) == (GIVEN, GIVEN, GIVEN)
    seen = Job(
        ["x"], "/", name="seen", cpus=AUTO_CPUS, mem=0, gpus=1, gpu_mem=None, id=2, job_key="name:seen"
    )
    learnt = reserve(seen, learned, None, Peak(2 * GiB, 10 * GiB), 0.1)
    assert (
        learnt.resources.cores == margin(0.5)
        and learnt.gpu_mem == int(10 * GiB * 1.1)
        and learnt.resources.ram == int(2 * GiB * 1.1)
    )
    r = learnt
    assert (r.cores_from, r.ram_from, r.gpu_mem_from) == (LEARNT, LEARNT, LEARNT)
    new = Job(["y"], "/", cpus=AUTO_CPUS, mem=0, gpus=1, gpu_mem=None, id=3, job_key="cmd:y")
    probe = reserve(new, learned, None, None, 0.1)
    assert probe.probe and probe.resources.cores == PROBE_CORES and probe.gpu_mem is None
    r = probe
    assert (r.cores_from, r.ram_from, r.gpu_mem_from) == (PROBE, PROBE, PROBE)
    alike = reserve(new, learned, {"cmd:y": (0.7, 9)}, None, 0.1)  # a running job alike measured
    assert not alike.probe and alike.resources.cores == 0.7 and "job 9 running" in alike.cores_why
