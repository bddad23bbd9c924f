"""The GPU share benchmark's measurement of one (mode, N): its processes' CPU and GPU
energy, and the run of its jobs and producer."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import psutil
import torch

from tandem.bench.gpu_share.accounting import (
    _cores,
    epoch_accounting,
    label_mismatches,
    private_workers,
    union_rate,
)
from tandem.bench.gpu_share.config import CTX, MODES, SAMPLE_INTERVAL_S, SHARED_MODES, GpuShareConfig
from tandem.bench.gpu_share.jobs import PRODUCERS, GpuJobResult, _start, job_main
from tandem.bench.harness import Every, JobProcesses, free_ports, tensorsocket_available


# --------------------------------------------------------------------------- measurement
class GpuEnergy:
    """NVML's total-energy counter (mJ) of the GPU behind ``device``, via tandem.watch."""

    def __init__(self, device: str):
        self.why_not = ""
        self._sampler: Any = None
        self._device: Any = None
        if not device.startswith("cuda"):
            self.why_not = "not a GPU run"
            return
        try:
            from tandem.watch.samplers.nvml import NvmlSampler

            sampler = NvmlSampler(run_pids=lambda: ())
        except Exception as exc:  # noqa: BLE001 - no energy figures, the run goes on
            self.why_not = f"NVML unavailable: {exc}"
            return
        ok, why = sampler.available()
        ordinal = torch.device(device).index or 0
        found = [d for d in sampler.devices if d.ordinal == ordinal]
        if not ok or not found:
            self.why_not = why or f"NVML does not see {device}"
        elif found[0].mig:
            self.why_not = "a MIG instance: NVML gives energy for the whole GPU only"
        elif sampler.read(found[0]).energy_mj is None:
            self.why_not = "this GPU has no total-energy counter"
        else:
            self._sampler, self._device = sampler, found[0]
            return
        sampler.close()

    def read_mj(self) -> float | None:
        if self._sampler is None:
            return None
        value = self._sampler.read(self._device).energy_mj
        return None if value is None else float(value)

    def close(self) -> None:
        if self._sampler is not None:
            self._sampler.close()
            self._sampler = None


class TreeSampler(Every):
    """Cumulative CPU-seconds of this process's descendants by role (``job``, ``producer``,
    ``workers``: a descendant of a job or producer, i.e. a loader worker; ``other``: the rest,
    such as the forkserver that starts them) and the GPU energy counter, every 0.2 s; a
    process that is gone keeps its last figure. :meth:`between` reads them over a window."""

    ROLES = ("job", "producer", "workers", "other")

    def __init__(self, energy: GpuEnergy):
        super().__init__(SAMPLE_INTERVAL_S)
        self.roles: dict[int, str] = {}  # pid -> role, set by the runner as it starts them
        self._energy = energy
        self._lock = threading.Lock()  # the runner ticks too, once the jobs are done
        self._me = psutil.Process()
        self._last: dict[tuple[int, float], float] = {}  # (pid, create time) -> CPU s
        self._role_of: dict[tuple[int, float], str] = {}  # (pid, create time) -> role
        self.times: list[float] = []
        self.cpu: dict[str, list[float]] = {r: [] for r in self.ROLES}
        self.energy_mj: list[float | None] = []

    def tick(self) -> None:
        with self._lock:
            self._tick()

    def _tick(self) -> None:
        try:
            kids = self._me.children(recursive=True)
        except psutil.Error:
            kids = []
        for p in kids:
            try:
                t = p.cpu_times()
                key = (p.pid, p.create_time())
                self._last[key] = t.user + t.system
                if key not in self._role_of:
                    self._role_of[key] = self._role(p)
            except psutil.Error:
                pass
        now = time.monotonic()
        totals = dict.fromkeys(self.ROLES, 0.0)
        for key, cpu in self._last.items():
            totals[self.roles.get(key[0]) or self._role_of.get(key, "other")] += cpu
        energy = self._energy.read_mj()
        self.times.append(now)
        for role in self.ROLES:
            self.cpu[role].append(totals[role])
        self.energy_mj.append(energy)

    def _role(self, p: psutil.Process) -> str:
        """A process the runner did not start itself: a loader worker of a job or producer
        (by ancestry), or something else (``other``: not input)."""
        if p.pid in self.roles:
            return self.roles[p.pid]
        try:
            ancestors = p.parents()
        except psutil.Error:
            return "other"
        return "workers" if any(a.pid in self.roles for a in ancestors) else "other"

    def between(self, t0: float, t1: float) -> tuple[dict[str, float], float | None]:
        """CPU-seconds by role and GPU joules from ``t0`` to ``t1`` (interpolated; energy from
        the readings that succeeded, None unless they cover the window)."""
        if len(self.times) < 2 or t1 <= t0:
            return dict.fromkeys(self.ROLES, 0.0), None
        ts = np.asarray(self.times)
        cpu = {r: float(np.interp(t1, ts, v) - np.interp(t0, ts, v)) for r, v in self.cpu.items()}
        read = [(t, e) for t, e in zip(self.times, self.energy_mj) if e is not None]
        if len(read) < 2 or read[0][0] > t0 or read[-1][0] < t1:
            return cpu, None
        et = np.asarray([t for t, _ in read])
        e = np.asarray([v for _, v in read], dtype=np.float64)
        return cpu, float(np.interp(t1, et, e) - np.interp(t0, et, e)) / 1000.0


@dataclass
class ModeRun:
    mode: str
    jobs: int
    status: str = "ok"  # ok | failed | unavailable
    note: str = ""
    samples: int = 0  # all jobs' timed samples
    window_s: float = 0.0  # the union of the jobs' timed windows
    samples_per_s: float = 0.0
    pct_of_limit: float | None = None
    cpu_s: float = 0.0  # every process of the run, over the window
    cpu_s_per_sample: float | None = None
    cores_busy: float | None = None
    cores_by_role: dict = field(default_factory=dict)
    input_cores: float | None = None  # cores busy in the producer and loader workers
    cores_over_limit: float | None = None  # cores busy less the limit's for the same N
    gpu_joules: float | None = None
    joules_per_sample: float | None = None
    lost: int | None = None
    duplicated: int | None = None
    label_mismatches: int | None = None
    workers: str = ""
    leaked_producers: list = field(default_factory=list)
    elapsed_s: float = 0.0  # the whole run, start-up included
    per_job: list = field(default_factory=list)


def unavailable(mode: str, cfg: GpuShareConfig) -> str | None:
    """Why ``mode`` cannot run here, or None."""
    cuda = cfg.device.startswith("cuda")
    if mode == "tensorsocket":
        if not tensorsocket_available():
            return "tensorsocket is not installed (pip install 'tandem[compare]')"
        if not cuda:
            return "TensorSocket is compared on a GPU only"
    if mode not in MODES:
        return f"unknown mode (one of {', '.join(MODES)})"
    return None


def run_one(mode: str, n: int, cfg: GpuShareConfig, root: str, truth: np.ndarray) -> ModeRun:
    """Run ``n`` jobs of ``mode`` to the end (or the timeouts) and measure them."""
    r = ModeRun(mode, n)
    why = unavailable(mode, cfg)
    if why:
        r.status, r.note = "unavailable", f"unavailable: {why}"
        return r
    began = time.monotonic()
    run = JobProcesses(CTX, launch=_start)
    q, built, ready, finish = run.results, run.built, run.ready, CTX.Event()
    progress = [CTX.Array("d", 4, lock=False) for _ in range(n)]
    name = f"gpubench-{os.getpid()}-{mode}-{n}-{time.monotonic_ns() % 10**6}"
    endpoint: Any = free_ports(4) if mode == "tensorsocket" else name
    results: list[GpuJobResult] = []
    notes: list[str] = []
    serving = mode not in SHARED_MODES
    if mode == "private":
        r.workers = f"{private_workers(cfg.workers, n, _cores())} per job"

    def handle(item: Any) -> None:
        nonlocal serving
        if isinstance(item, GpuJobResult):  # what every job of this bench sends
            results.append(item)
        elif item[0] == "serving":
            serving = True
            asked = cfg.gpu_workers if mode == "gpu" else cfg.producer_workers
            r.workers = f"{asked if item[2] is None else item[2]} in the producer"
        elif item[0] == "producer-error":
            notes.append(f"producer: {item[2]}")

    energy = GpuEnergy(cfg.device)
    sampler = TreeSampler(energy)
    try:
        with sampler:
            if mode in SHARED_MODES:
                producer = run.start(PRODUCERS[mode], q, cfg, root, endpoint, ready, finish)
                sampler.roles[producer.pid] = "producer"
                # TensorSocket's consumers need a live producer, and "auto" workers count the
                # cores that are free: then the jobs start once the producer serves.
                if mode == "tensorsocket" or cfg.producer_workers == "auto" and mode == "host":
                    item = run.next(q, cfg.start_timeout_s)
                    if item is None:
                        notes.append("producer: not serving within the start timeout")
                    else:
                        handle(item)
            jobs = []
            if not notes:
                shared = (q, cfg, mode, root, endpoint, n, built, ready, finish)
                jobs = [run.start(job_main, *shared, pr) for pr in progress]
                for p in jobs:
                    sampler.roles[p.pid] = "job"
            # Until every job is built (model, loader or consumer) and the producer serves; a
            # failure on the way ends the run.
            waiting = run.wait_built(
                len(jobs),
                cfg.start_timeout_s,
                handle,
                until=lambda: serving,
                stop=lambda: bool(notes or results),
            )
            if waiting or not serving:
                notes.append(
                    f"{waiting} job(s) not built, producer serving: {serving}, after "
                    f"{time.monotonic() - began:.0f} s"
                )
            if not notes and not results:
                ready.set()  # the common start
                sampler.tick()  # a sample before any window starts (np.interp clamps outside them)
                if not run.gather(cfg.run_timeout_s, handle, lambda: len(results) >= n):
                    missing = n - len(results)
                    notes.append(f"{missing} job(s) gave no result within {cfg.run_timeout_s:g} s: killed")
            sampler.tick()  # while every process is still there: the window's CPU is all seen
            finish.set()
            run.reap(grace_s=15.0 if len(results) == n else 0.5)
    finally:
        run.close()
        energy.close()
    if mode in ("host", "gpu"):
        from tandem.share import live_producers

        r.leaked_producers = [p.name for p in live_producers() if p.name == name]
    r.elapsed_s = time.monotonic() - began
    _summarise(r, results, notes, sampler, cfg, truth)
    return r


def _summarise(
    r: ModeRun,
    results: list[GpuJobResult],
    notes: list[str],
    sampler: TreeSampler,
    cfg: GpuShareConfig,
    truth: np.ndarray,
) -> None:
    done = [j for j in results if not j.error]
    notes += [f"job {j.job}: {j.error}" for j in results if j.error]
    if r.leaked_producers:
        notes.append(f"producer still registered after the run: {r.leaked_producers}")
    r.samples_per_s, t0, t1, r.samples = union_rate(
        [(j.start, j.end) for j in done], [j.timeline for j in done]
    )
    r.window_s = t1 - t0
    cpu, joules = sampler.between(t0, t1)
    r.cpu_s = sum(cpu.values())
    if r.window_s > 0:
        r.cores_busy = r.cpu_s / r.window_s
        r.cores_by_role = {k: round(v / r.window_s, 3) for k, v in cpu.items()}
    if r.samples:
        r.cpu_s_per_sample = r.cpu_s / r.samples
        if joules is not None:
            r.gpu_joules = joules
            r.joules_per_sample = joules / r.samples
    if r.mode != "limit" and done:
        size = int(truth.size)
        accounts = [epoch_accounting(j.indices, size, cfg.epochs) for j in done]
        r.lost = sum(a[0] for a in accounts)
        r.duplicated = sum(a[1] for a in accounts)
        r.label_mismatches = sum(label_mismatches(j.indices, j.labels, truth) for j in done)
    hidden = ("indices", "labels", "timeline")
    r.per_job = [{k: v for k, v in asdict(j).items() if k not in hidden} for j in results]
    if notes or len(done) < r.jobs:
        r.status = "failed"
    r.note = "; ".join(notes)[:1000]
