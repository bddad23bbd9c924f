"""What the daemon has and how busy it is: capacity at start, measurements every second.

Capacity: the cores this process may run on (its CPU affinity, so a cpuset, and its
cgroup's CPU quota), the RAM (the host's, or its cgroup's limit: :mod:`~tandem.place.run.supervisor.cgroups`),
and the GPUs NVML lists (through ``watch``'s NVML code), each narrowed by the daemon's
options: inside a container, a Slurm allocation or a systemd slice, what it was given.
Measurements: the host's CPU use and free RAM (psutil; under a memory limit, what the limit
leaves) and, per GPU, memory used, the memory of each process, and
SM activity (GPM on Hopper and newer; else NVML's utilisation, which only says a kernel
ran), kept over a sliding window for the scheduler's mean and 95th percentile.

Without NVML (no driver, no nvidia-ml-py) there are no GPUs and the manager schedules
cores and RAM only.

On a Ray cluster every node is measured where it is: an agent there (a
:class:`~tandem.place.run.launchers.ray_backend.NodeAgent`) runs a :class:`Monitor` of its own and
hands its :meth:`Monitor.sample_of` to the daemon, whose Monitor keeps each node's last
(:meth:`Monitor.take`): the same readings as this host's, by node.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import psutil

from tandem.place import clock
from tandem.place.decide import GpuReading
from tandem.place.model import Capacity, GpuInfo, format_size
from tandem.place.resources import Cap, Resources
from tandem.place.run.supervisor import cgroups

log = logging.getLogger(__name__)


def host_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return psutil.cpu_count() or 1


def usable_cpus() -> tuple[float, str]:
    """The cores this process may use, and what sets it: min(its affinity, its cgroup's quota)."""
    affinity, quota = host_cpus(), cgroups.limits().cores
    if quota is not None and quota < affinity:
        return quota, f"its cgroup's CPU quota of {quota:g} cores"
    return float(affinity), f"{affinity} cores in its CPU affinity"


def usable_mem() -> tuple[int, str]:
    """The RAM this process may use, and what sets it: min(the host's, its cgroup's limit)."""
    host, limit = psutil.virtual_memory().total, cgroups.limits().ram
    if limit is not None and limit < host:
        return limit, f"its cgroup's memory limit of {format_size(limit)}"
    return host, f"the host's {format_size(host)} of RAM"


def available_mem(groups: cgroups.Cgroups | None = None) -> int:
    """RAM free for new work now: the host's available, or less where a cgroup limit leaves less."""
    available, (_, free) = psutil.virtual_memory().available, (groups or cgroups.Cgroups()).memory()
    return available if free is None else min(available, free)


def parse_gpu_list(text: str | None, available: Iterable[GpuInfo]) -> tuple[GpuInfo, ...]:
    """``--gpus 0,2`` (indices or UUIDs), ``none`` or ``all``/None against what NVML lists."""
    gpus = tuple(available)
    if text is None or text.strip().lower() == "all":
        return gpus
    if text.strip().lower() in ("none", ""):
        return ()
    chosen = []
    for token in (t.strip() for t in text.split(",")):
        match = [g for g in gpus if str(g.index) == token or g.uuid == token or g.uuid.startswith(token)]
        if len(match) != 1:
            listed = ", ".join(f"{g.index} ({g.uuid})" for g in gpus) or "none"
            raise ValueError(f"--gpus: {token!r} names no single GPU here; the GPUs are: {listed}")
        if match[0] not in chosen:
            chosen.append(match[0])
    return tuple(chosen)


class Nvml:
    """The daemon's NVML view of every GPU (``watch``'s sampler, all devices visible)."""

    def __init__(self, nvml: Any = None) -> None:
        from tandem.watch.samplers.nvml import NvmlSampler

        self.sampler = NvmlSampler(run_pids=lambda: (), visible=None, nvml=nvml, env={})
        ok, self.why_not = self.sampler.available()
        self.gpus: tuple[GpuInfo, ...] = ()
        if not ok:
            return
        for d in self.sampler.devices:
            reading = self.sampler.read(d)
            self.gpus += (GpuInfo(d.parent_index, d.uuid, int(reading.memory_total_bytes or 0)),)
        self._ordinal = {d.uuid: d for d in self.sampler.devices}

    def read(self, uuid: str) -> Any:
        return self.sampler.read(self._ordinal[uuid])

    def close(self) -> None:
        self.sampler.close()


def detect_capacity(cap: Cap, gpus: str | None, nvml: Nvml | None) -> Capacity:
    """What the daemon hands out: what this process may use, within ``cap`` (``--cpus``,
    ``--mem``: refused where it asks for more than is here), and the GPUs ``--gpus`` names."""
    (total_cpus, cpus_from), (total_mem, mem_from) = usable_cpus(), usable_mem()
    if cap.cores is not None and cap.cores > total_cpus:
        raise ValueError(f"--cpus {cap.cores:g}: the daemon may use {total_cpus:g} cores here ({cpus_from})")
    if cap.ram is not None and cap.ram > total_mem:
        limit = f"the daemon may use {format_size(total_mem)} here ({mem_from})"
        raise ValueError(f"--mem {format_size(cap.ram)}: {limit}")
    listed = nvml.gpus if nvml is not None else ()
    if gpus not in (None, "none", "all", "") and not listed:
        why = nvml.why_not if nvml is not None else "NVML not loaded"
        raise ValueError(f"--gpus {gpus}: no GPU can be used here ({why})")
    total = cap.of(Resources(total_cpus, total_mem))
    return Capacity(total, parse_gpu_list(gpus, listed))


@dataclass
class Window:
    """Timestamped values over the last ``span`` seconds: mean and 95th percentile."""

    span: float
    values: deque[tuple[float, float]] = field(default_factory=deque)

    def add(self, t: float, value: float) -> None:
        self.values.append((t, value))
        while self.values and self.values[0][0] < t - self.span:
            self.values.popleft()

    def _last(self, seconds: float | None) -> list[float]:
        if seconds is None or not self.values:
            return [v for _, v in self.values]
        since = self.values[-1][0] - seconds
        return [v for t, v in self.values if t >= since]

    def mean(self, seconds: float | None = None) -> float | None:
        """Over the whole window, or its last ``seconds``."""
        values = self._last(seconds)
        return sum(values) / len(values) if values else None

    def p95(self, seconds: float | None = None) -> float | None:
        values = sorted(self._last(seconds))
        if not values:
            return None
        return values[min(len(values) - 1, int(round(0.95 * (len(values) - 1))))]


@dataclass(frozen=True)
class GpuSample:
    """One GPU of a node as its agent last read it (the activity over the agent's window)."""

    mem_used: int | None
    activity_mean: float | None
    activity_p95: float | None
    energy_mj: int | None
    process_mem: dict[int, int]  # pid (the node's) -> bytes


@dataclass(frozen=True)
class NodeSample:
    """A node's host and GPUs as its agent last measured them: free RAM, the busy share of
    its cores over the host window, and its GPUs by the node's own index (NVML's)."""

    mem_available: int | None
    cpu_mean: float | None  # a share of ``cpus``
    cpu_p95: float | None
    gpus: dict[int, GpuSample] = field(default_factory=dict)
    cpus: float = 0.0  # the cores it measured (its own: Ray's declared count may differ)
    age_s: float = 0.0  # how old it was when handed out (a sampler that fails leaves it aging)


STALE_S = 10.0  # a node's sample older than this (received) is no reading: admitted on reservations


@dataclass
class GpuMeasure:
    mem_used: int | None = None
    activity: Window = field(default_factory=lambda: Window(30.0))
    process_mem: dict[int, int] = field(default_factory=dict)
    energy_mj: int | None = None


class Monitor:
    """Samples the host and the daemon's GPUs; the daemon calls :meth:`sample` each second."""

    def __init__(self, capacity: Capacity, window_s: float, nvml: Nvml | None) -> None:
        self.capacity = capacity
        self.nvml = nvml
        self.cpu = Window(window_s)
        self.mem_available: int | None = None
        self._cgroups = cgroups.Cgroups()  # which cgroups it is in, read once; their files each sample
        # Under a CPU quota, busy is what its cgroup uses of it (the host's load is other
        # tenants'); else the host's busy share, as a share of these cores.
        quota = self._cgroups.cpu_quota()
        self._cgroup_cpu = (
            quota is not None and quota < host_cpus() and self._cgroups.cpu_seconds() is not None
        )
        self._last_cpu = (clock.monotonic(), self._cgroups.cpu_seconds() or 0.0)
        # this host's GPUs (a Ray node's are its agent's: :meth:`take`)
        self.gpus = {g.uuid: GpuMeasure(activity=Window(window_s)) for g in capacity.gpus if not g.node}
        self.nodes: dict[str, tuple[float, NodeSample]] = {}  # a Ray node -> (received, its sample)
        psutil.cpu_percent()  # the first call only sets the base

    def sample(self) -> None:
        now = clock.monotonic()
        busy = psutil.cpu_percent() / 100.0
        if self._cgroup_cpu:
            used, (then, before) = self._cgroups.cpu_seconds() or 0.0, self._last_cpu
            self._last_cpu = (now, used)
            busy = (used - before) / max(now - then, 1e-3) / max(self.capacity.total.cores, 1e-3)
        self.cpu.add(now, busy)
        self.mem_available = available_mem(self._cgroups)
        if self.nvml is None:
            return
        for uuid, m in self.gpus.items():
            try:
                r = self.nvml.read(uuid)
            except Exception as exc:  # a GPU that fell off the bus: keep the last values
                log.warning("cannot read GPU %s: %s", uuid, exc)
                continue
            m.mem_used = r.memory_used_bytes
            m.energy_mj = r.energy_mj
            m.process_mem = {pid: int(used or 0) for pid, used in r.processes}
            activity = r.sm_active_percent if r.sm_active_percent is not None else r.utilization_percent
            if activity is not None:
                m.activity.add(now, activity / 100.0)

    def sample_of(self, host_window_s: float) -> NodeSample:
        """What this monitor measures now, as a node's agent hands it to the daemon (its
        GPUs by NVML's index)."""
        gpus = {}
        for g in (g for g in self.capacity.gpus if g.uuid in self.gpus):
            m = self.gpus[g.uuid]
            gpus[g.index] = GpuSample(
                m.mem_used, m.activity.mean(), m.activity.p95(), m.energy_mj, dict(m.process_mem)
            )
        mean, p95 = self.cpu.mean(host_window_s), self.cpu.p95(host_window_s)
        return NodeSample(self.mem_available, mean, p95, gpus, self.capacity.total.cores)

    def take(self, node: str, sample: NodeSample) -> None:
        """Keep a Ray node's sample, as its agent sent it (dated when it was taken)."""
        self.nodes[node] = (clock.monotonic() - sample.age_s, sample)

    def node(self, node: str) -> NodeSample | None:
        """A Ray node's last sample, or None: none came within :data:`STALE_S` (no agent
        there yet, or it does not answer)."""
        got = self.nodes.get(node)
        return got[1] if got is not None and clock.monotonic() - got[0] <= STALE_S else None

    def _remote(self, uuid: str) -> GpuSample | None:
        """A Ray node's GPU as its agent measured it (its ``local`` index is NVML's there)."""
        gpu = next((g for g in self.capacity.gpus if g.uuid == uuid and g.node), None)
        sample = self.node(gpu.node) if gpu is not None else None
        return sample.gpus.get(gpu.local or 0) if gpu is not None and sample is not None else None

    def readings(self) -> dict[str, GpuReading]:
        """Every GPU measured now, by uuid: this host's and the Ray nodes' (where their
        agents answer)."""
        out = {u: GpuReading(m.mem_used, m.activity.mean(), m.activity.p95()) for u, m in self.gpus.items()}
        for g in self.capacity.gpus:
            if g.node and (r := self._remote(g.uuid)) is not None:
                out[g.uuid] = GpuReading(r.mem_used, r.activity_mean, r.activity_p95)
        return out

    def energy_mj(self, uuid: str) -> int | None:
        """The GPU's energy counter (None: not measured, a Ray node's GPU whose agent has
        not answered say)."""
        m = self.gpus.get(uuid)
        if m is None:
            remote = self._remote(uuid)
            return None if remote is None else remote.energy_mj
        return m.energy_mj

    def job_gpu_mem(self, uuid: str, pids: Iterable[int]) -> int:
        """The GPU memory ``pids`` use on GPU ``uuid`` (a Ray node's: its pids there)."""
        m = self.gpus.get(uuid)
        used = m.process_mem if m is not None else getattr(self._remote(uuid), "process_mem", {})
        return sum(used.get(pid, 0) for pid in pids)
