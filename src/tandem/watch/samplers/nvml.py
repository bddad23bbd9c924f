"""GPUs through NVML (nvidia-ml-py): only the devices the run can see.

The run sees what ``CUDA_VISIBLE_DEVICES`` gives it: indices, GPU UUIDs (or unique
prefixes), MIG device UUIDs; an empty value hides every GPU and, as in CUDA, the list ends
at the first entry that names no device. Metrics are numbered by the run's own CUDA
ordinal (``gpu_0`` is the run's ``cuda:0``); the UUID behind each ordinal is stored as a
tag. Per device: utilisation (the share of time a kernel ran; saturates at 100), memory
used on the device and by the run's own processes, power, energy from the hardware counter
as a delta over the run (power integrated over time, named ``estimated``, where the GPU has
no counter), and SM activity and occupancy through GPM on GPUs that offer it (Hopper+).

MIG instances: memory and the run's memory are per instance; power and energy belong to
the whole GPU and are not attributed to an instance, so they are left out.

NVML's per-process list uses host pids; inside a container with its own pid namespace the
run's memory on the GPU reads 0 (the device's memory is still right).

Everything that touches NVML goes through ``self.nvml`` (the ``pynvml`` module by
default), so the selection and conversion logic runs in tests on recorded values.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tandem.watch.samplers.base import Sampler
from tandem.watch.samplers.energy import EnergyCounter

VISIBLE_ENV = "CUDA_VISIBLE_DEVICES"


@dataclass(frozen=True)
class GpuDevice:
    """One physical GPU as NVML enumerates it (PCI bus order)."""

    index: int
    uuid: str
    name: str = ""
    mig_uuids: tuple[str, ...] = ()


@dataclass(frozen=True)
class VisibleDevice:
    ordinal: int  # the run's CUDA ordinal
    uuid: str  # the GPU's or the MIG instance's UUID
    parent_index: int
    mig: bool = False


def select_visible(spec: str | None, devices: list[GpuDevice]) -> list[VisibleDevice]:
    """The devices a process with ``CUDA_VISIBLE_DEVICES=spec`` can use, in its CUDA order.

    Index entries are read in NVML's (PCI bus) order, which is CUDA's order when
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` or when all GPUs are the same model.
    """
    if spec is None:
        return [VisibleDevice(i, d.uuid, d.index) for i, d in enumerate(devices)]
    chosen: list[VisibleDevice] = []
    seen: set[str] = set()
    for raw in spec.split(","):
        token = raw.strip()
        found = _find(token, devices)
        if found is None or found[0] in seen:
            break  # CUDA ignores everything from the first invalid entry on
        uuid, parent, mig = found
        seen.add(uuid)
        chosen.append(VisibleDevice(len(chosen), uuid, parent, mig))
    return chosen


def _find(token: str, devices: list[GpuDevice]) -> tuple[str, int, bool] | None:
    if not token:
        return None
    if token.lstrip("-").isdigit():
        i = int(token)
        matches = [d for d in devices if d.index == i]
        return (matches[0].uuid, matches[0].index, False) if matches else None
    if token.startswith("MIG-"):
        hits = [(u, d.index) for d in devices for u in d.mig_uuids if u.startswith(token)]
        return (hits[0][0], hits[0][1], True) if len(hits) == 1 else None
    prefix = token if token.startswith("GPU-") else f"GPU-{token}"
    hits_gpu = [d for d in devices if d.uuid.startswith(prefix)]
    return (hits_gpu[0].uuid, hits_gpu[0].index, False) if len(hits_gpu) == 1 else None


@dataclass
class GpuReading:
    """What one sample read from NVML for one device; None where the device says no."""

    utilization_percent: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    power_mw: int | None = None
    energy_mj: int | None = None  # total-energy counter, mJ since the driver loaded
    processes: tuple[tuple[int, int | None], ...] = ()  # (pid, used bytes or None)
    sm_active_percent: float | None = None
    sm_occupancy_percent: float | None = None


@dataclass
class GpuState:
    """Per-device state between samples (energy since the run began)."""

    counter: EnergyCounter = field(default_factory=lambda: EnergyCounter(1e-3))
    estimated_j: float = 0.0
    last_power_w: float | None = None
    last_t: float | None = None


def reading_metrics(
    ordinal: int, reading: GpuReading, state: GpuState, run_pids: Iterable[int], now: float
) -> dict[str, float]:
    """Convert one reading into metrics (units in the names), updating ``state``."""
    p = f"system/gpu_{ordinal}/"
    m: dict[str, float] = {}
    if reading.utilization_percent is not None:
        m[p + "utilization_percent"] = float(reading.utilization_percent)
    if reading.memory_used_bytes is not None:
        m[p + "memory_used_bytes"] = float(reading.memory_used_bytes)
    if reading.memory_total_bytes:
        m[p + "memory_total_bytes"] = float(reading.memory_total_bytes)
        if reading.memory_used_bytes is not None:
            m[p + "memory_used_percent"] = 100.0 * reading.memory_used_bytes / reading.memory_total_bytes
    pids = set(run_pids)
    m[p + "run_memory_bytes"] = float(sum(used or 0 for pid, used in reading.processes if pid in pids))
    m[p + "run_processes"] = float(sum(1 for pid, _ in reading.processes if pid in pids))
    if reading.power_mw is not None:
        watts = reading.power_mw / 1000.0
        m[p + "power_watts"] = watts
    else:
        watts = None
    if reading.energy_mj is not None:
        state.counter.update(reading.energy_mj)
        m[p + "energy_measured_joules"] = state.counter.joules
    elif watts is not None:
        # No counter (pre-Volta): integrate power over time, trapezoid rule.
        if state.last_power_w is not None and state.last_t is not None:
            state.estimated_j += 0.5 * (watts + state.last_power_w) * (now - state.last_t)
        m[p + "energy_estimated_joules"] = state.estimated_j
    state.last_power_w, state.last_t = watts, now
    if reading.sm_active_percent is not None:
        m[p + "sm_active_percent"] = reading.sm_active_percent
    if reading.sm_occupancy_percent is not None:
        m[p + "sm_occupancy_percent"] = reading.sm_occupancy_percent
    return m


def _load_pynvml() -> Any:
    import pynvml  # nvidia-ml-py

    return pynvml


class NvmlSampler(Sampler):
    name = "nvml"

    def __init__(
        self,
        run_pids: Callable[[], Iterable[int]],
        visible: str | None = None,
        nvml: Any = None,
        env: Mapping[str, str] | None = None,
    ):
        """``visible`` is the run's CUDA_VISIBLE_DEVICES (default: from ``env``, which
        defaults to this process's environment)."""
        self._run_pids = run_pids
        env = os.environ if env is None else env
        self._spec = visible if visible is not None else env.get(VISIBLE_ENV)
        self._why_not = ""
        self.devices: list[VisibleDevice] = []
        self._handles: dict[int, Any] = {}
        self._state: dict[int, GpuState] = {}
        self._gpm: dict[int, list[Any]] = {}  # ordinal -> [previous sample, spare sample]
        self._started = False
        try:
            self.nvml = nvml if nvml is not None else _load_pynvml()
        except ImportError as exc:
            self.nvml = None
            self._why_not = f"nvidia-ml-py is not installed ({exc})"
            return
        try:
            self.nvml.nvmlInit()
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
            self._why_not = f"NVML cannot start here ({exc}); no NVIDIA driver?"
            return
        self._started = True
        try:
            self._open()
        except Exception as exc:
            self._why_not = f"NVML failed while listing GPUs ({exc})"
            self.devices = []

    def _enumerate(self) -> tuple[list[GpuDevice], dict[str, Any]]:
        n = self.nvml
        devices, handles = [], {}
        for i in range(n.nvmlDeviceGetCount()):
            h = n.nvmlDeviceGetHandleByIndex(i)
            uuid = _text(n.nvmlDeviceGetUUID(h))
            handles[uuid] = h
            migs = []
            try:
                current, _pending = n.nvmlDeviceGetMigMode(h)
            except Exception:
                current = 0
            if current:
                for j in range(n.nvmlDeviceGetMaxMigDeviceCount(h)):
                    try:
                        mh = n.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
                    except Exception:
                        continue  # an empty MIG slot
                    mu = _text(n.nvmlDeviceGetUUID(mh))
                    handles[mu] = mh
                    migs.append(mu)
            devices.append(GpuDevice(i, uuid, _text(n.nvmlDeviceGetName(h)), tuple(migs)))
        return devices, handles

    def _open(self) -> None:
        devices, handles = self._enumerate()
        if not devices:
            self._why_not = "NVML sees no GPU"
            return
        self.devices = select_visible(self._spec, devices)
        if not self.devices:
            self._why_not = f"the run sees no GPU ({VISIBLE_ENV}={self._spec!r})"
            return
        for d in self.devices:
            self._handles[d.ordinal] = handles[d.uuid]
            self._state[d.ordinal] = GpuState()
            if not d.mig:
                self._gpm_open(d.ordinal)

    def _gpm_open(self, ordinal: int) -> None:
        n = self.nvml
        try:
            if not n.nvmlGpmQueryDeviceSupport(self._handles[ordinal]).isSupportedDevice:
                return
            samples = [n.nvmlGpmSampleAlloc(), n.nvmlGpmSampleAlloc()]
            n.nvmlGpmSampleGet(self._handles[ordinal], samples[0])
        except Exception:
            return  # older GPU or driver: no GPM, no SM activity metrics
        self._gpm[ordinal] = samples

    def available(self) -> tuple[bool, str]:
        return (bool(self.devices), self._why_not)

    def tags(self) -> dict[str, str]:
        """Which physical device each of the run's ordinals is (stored with the run)."""
        return {f"tandem.gpu_{d.ordinal}": d.uuid for d in self.devices}

    def _call(self, fn: str, *args: Any) -> Any:
        try:
            return getattr(self.nvml, fn)(*args)
        except Exception:  # NVMLError_NotSupported and friends: this device does not say
            return None

    def read(self, d: VisibleDevice) -> GpuReading:
        h = self._handles[d.ordinal]
        util = None if d.mig else self._call("nvmlDeviceGetUtilizationRates", h)
        mem = self._call("nvmlDeviceGetMemoryInfo", h)
        procs = self._call("nvmlDeviceGetComputeRunningProcesses", h) or []
        reading = GpuReading(
            utilization_percent=float(util.gpu) if util is not None else None,
            memory_used_bytes=int(mem.used) if mem is not None else None,
            memory_total_bytes=int(mem.total) if mem is not None else None,
            processes=tuple((int(p.pid), p.usedGpuMemory) for p in procs),
        )
        if not d.mig:
            reading.power_mw = self._call("nvmlDeviceGetPowerUsage", h)
            reading.energy_mj = self._call("nvmlDeviceGetTotalEnergyConsumption", h)
        if d.ordinal in self._gpm:
            reading.sm_active_percent, reading.sm_occupancy_percent = self._gpm_read(d.ordinal)
        return reading

    def _gpm_read(self, ordinal: int) -> tuple[float | None, float | None]:
        n = self.nvml
        prev, cur = self._gpm[ordinal]
        try:
            n.nvmlGpmSampleGet(self._handles[ordinal], cur)
            get = n.c_nvmlGpmMetricsGet_t()
            get.version = n.NVML_GPM_METRICS_GET_VERSION
            get.numMetrics = 2
            get.sample1, get.sample2 = prev, cur
            get.metrics[0].metricId = n.NVML_GPM_METRIC_SM_UTIL
            get.metrics[1].metricId = n.NVML_GPM_METRIC_SM_OCCUPANCY
            n.nvmlGpmMetricsGet(get)
        except Exception:
            return None, None
        self._gpm[ordinal] = [cur, prev]  # the newest becomes the base of the next interval
        return tuple(  # type: ignore[return-value]
            float(get.metrics[i].value) if get.metrics[i].nvmlReturn == 0 else None for i in (0, 1)
        )

    def sample(self) -> dict[str, float]:
        now = time.monotonic()
        pids = set(self._run_pids())
        out: dict[str, float] = {}
        for d in self.devices:
            out.update(reading_metrics(d.ordinal, self.read(d), self._state[d.ordinal], pids, now))
        return out

    def close(self) -> None:
        if not self._started:
            return
        for samples in self._gpm.values():
            for s in samples:
                self._call("nvmlGpmSampleFree", s)
        self._gpm.clear()
        self._call("nvmlShutdown")
        self._started = False


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
