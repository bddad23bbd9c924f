"""Energy counters and the CPU energy sampler: RAPL where readable, an estimate where not.

RAPL (``/sys/class/powercap/intel-rapl:N``, also used for AMD packages) counts package
energy in microjoules for the whole socket: every process on the host adds to it. A run's
share is the package energy of each interval times the run's fraction of the host's busy
CPU time in that interval, so two collocated runs do not both claim the whole socket.
Where the counter cannot be read (root-only on recent kernels, masked in containers,
absent on many VMs), the sampler estimates from the run's CPU-seconds and a per-core power;
those metrics say ``estimated`` in their names and are never summed with measured ones.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from tandem.watch.samplers.base import Sampler

POWERCAP = Path("/sys/class/powercap")
# Without a counter, a busy logical core is charged this many watts. A guess, said as
# one: server parts draw roughly 3-6 W per busy thread at full load (TDP / threads).
DEFAULT_WATTS_PER_CORE = 4.0
WATTS_PER_CORE_ENV = "TANDEM_WATTS_PER_CORE"


class EnergyCounter:
    """Turns a cumulative hardware counter into energy since the first reading.

    ``wrap`` is the counter's range (RAPL's ``max_energy_range_uj``): a reading below the
    last one means it wrapped once. Without ``wrap`` (NVML's 64-bit counter), a reading
    below the last one means the counter was reset (driver reload): that interval adds
    nothing rather than a huge negative or positive jump.
    """

    def __init__(self, scale_to_joules: float, wrap: int | None = None):
        self.scale = scale_to_joules
        self.wrap = wrap
        self.last: int | None = None
        self.joules = 0.0

    def update(self, raw: int) -> float:
        """The energy added since the previous reading, in J (0 for the first)."""
        if self.last is None:
            self.last = raw
            return 0.0
        delta = raw - self.last
        if delta < 0:
            delta = delta + self.wrap if self.wrap else 0
        self.last = raw
        added = delta * self.scale
        self.joules += added
        return added


@dataclass(frozen=True)
class RaplDomain:
    name: str  # e.g. "package-0"
    energy_path: Path
    max_range_uj: int | None


def find_rapl_packages(root: Path = POWERCAP) -> list[RaplDomain]:
    """Top-level package domains (not their core/uncore/dram sub-domains)."""
    found = []
    for zone in sorted(root.glob("intel-rapl:*")):
        if zone.name.count(":") != 1:  # intel-rapl:0:1 is a sub-domain of package 0
            continue
        try:
            name = (zone / "name").read_text().strip()
        except OSError:
            continue
        if not name.startswith("package"):
            continue
        try:
            max_range: int | None = int((zone / "max_energy_range_uj").read_text())
        except (OSError, ValueError):
            max_range = None
        found.append(RaplDomain(name, zone / "energy_uj", max_range))
    return found


def host_busy_cpu_seconds() -> float:
    t = psutil.cpu_times()
    return t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)


def watts_per_core() -> float:
    raw = os.environ.get(WATTS_PER_CORE_ENV)
    if raw is None:
        return DEFAULT_WATTS_PER_CORE
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{WATTS_PER_CORE_ENV}={raw!r} is not a number of watts") from None
    if value <= 0:
        raise ValueError(f"{WATTS_PER_CORE_ENV} must be positive, got {value}")
    return value


class CpuEnergySampler(Sampler):
    """CPU energy of the run: measured through RAPL where readable, else estimated.

    ``run_cpu_seconds`` returns the run's cumulative CPU-seconds (the process-tree
    sampler's user + system); ``host_cpu_seconds`` the host's busy CPU-seconds.
    """

    name = "cpu_energy"

    def __init__(
        self,
        run_cpu_seconds: Callable[[], float],
        root: Path = POWERCAP,
        host_cpu_seconds: Callable[[], float] = host_busy_cpu_seconds,
    ):
        self._run_cpu = run_cpu_seconds
        self._host_cpu = host_cpu_seconds
        self._root = root
        self._domains: list[RaplDomain] = []
        self._counters: dict[str, EnergyCounter] = {}
        self._why_not = ""
        self._probe()
        self._watts_per_core = watts_per_core()
        self._last_cpu: tuple[float, float] | None = None  # (run, host) CPU-seconds
        self._attributed_j = 0.0
        self._start_run_cpu: float | None = None
        self._last_t: float | None = None

    def _probe(self) -> None:
        domains = find_rapl_packages(self._root)
        if not domains:
            self._why_not = f"no RAPL package domain under {self._root}"
            return
        readable = []
        for d in domains:
            try:
                int(d.energy_path.read_text())
            except (OSError, ValueError) as exc:
                self._why_not = f"{d.energy_path} is not readable ({exc.__class__.__name__}; root only?)"
                continue
            readable.append(d)
        self._domains = readable
        self._counters = {d.name: EnergyCounter(1e-6, d.max_range_uj) for d in readable}

    @property
    def measured(self) -> bool:
        return bool(self._domains)

    def available(self) -> tuple[bool, str]:
        # Always usable: the estimate needs only CPU time. The reason says which mode.
        if self.measured:
            return True, ""
        return True, f"estimating CPU energy ({self._watts_per_core:g} W per busy core): {self._why_not}"

    def sample(self) -> dict[str, float]:
        run_cpu = self._run_cpu()
        if self._start_run_cpu is None:
            self._start_run_cpu = run_cpu
        if not self.measured:
            return {
                "system/energy/cpu_estimated_joules": (run_cpu - self._start_run_cpu) * self._watts_per_core
            }
        host_cpu = self._host_cpu()
        now = time.monotonic()
        added = 0.0
        for d in self._domains:
            try:
                added += self._counters[d.name].update(int(d.energy_path.read_text()))
            except (OSError, ValueError):
                continue
        if self._last_cpu is not None:
            d_run = run_cpu - self._last_cpu[0]
            d_host = host_cpu - self._last_cpu[1]
            if d_host > 0:
                self._attributed_j += added * min(1.0, max(0.0, d_run / d_host))
        package_j = sum(c.joules for c in self._counters.values())
        metrics = {
            "system/energy/cpu_package_measured_joules": package_j,
            "system/energy/cpu_attributed_measured_joules": self._attributed_j,
        }
        if self._last_t is not None and now > self._last_t:
            metrics["system/energy/cpu_package_measured_watts"] = added / (now - self._last_t)
        self._last_cpu = (run_cpu, host_cpu)
        self._last_t = now
        return metrics
