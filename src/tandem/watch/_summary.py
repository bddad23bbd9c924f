"""The summary of a run: built from its samples as they come, stored with it, printed as a table.

Energy is kept by source: measured (RAPL, the NVML counter) and estimated are separate
lines and separate totals, never added together.
"""

from __future__ import annotations

import re
import threading
import time
from collections import defaultdict
from collections.abc import Mapping

from rich.table import Table

_GPU = re.compile(
    r"^system/gpu_(\d+)/(utilization_percent|run_memory_bytes|energy_measured_joules|"
    r"energy_estimated_joules|power_watts)$"
)
_STALL = re.compile(r"^system/share/.+/consumer_\d+/stall_seconds$")
_CONSUMER = re.compile(r"^system/share/.+/consumer_\d+/")

# energy metric -> (summary key, source said in the table)
ENERGY_SOURCES = {
    "system/energy/cpu_attributed_measured_joules": (
        "energy_cpu_measured_joules",
        "CPU, RAPL, run's share of package",
    ),
    "system/energy/cpu_package_measured_joules": (
        "energy_cpu_package_measured_joules",
        "CPU package, RAPL, whole host",
    ),
    "system/energy/cpu_estimated_joules": ("energy_cpu_estimated_joules", "CPU, estimated from CPU-seconds"),
}


def energy_totals(last: Mapping[str, float]) -> dict[str, float]:
    """A run's energy from its latest (cumulative) metrics: by source (``energy_cpu_*``,
    ``energy_gpu_*``) and in all, measured and estimated apart, never added together; the
    whole host's CPU package is its own line, not the run's."""
    s: dict[str, float] = {}
    for key in sorted(last):
        m = _GPU.match(key)
        if m and m.group(2) in ("energy_measured_joules", "energy_estimated_joules"):
            name = f"energy_gpu_{m.group(2).split('_')[1]}_joules"
            s[name] = s.get(name, 0.0) + last[key]
    for metric, (key, _) in ENERGY_SOURCES.items():
        if metric in last:
            s[key] = last[metric]
    for kind in ("measured", "estimated"):
        parts = [f"energy_cpu_{kind}_joules", f"energy_gpu_{kind}_joules"]
        if any(p in s for p in parts):
            s[f"energy_{kind}_joules"] = sum(s.get(p, 0.0) for p in parts)
    return s


class SummaryBuilder:
    """Folds samples into the figures a run's summary needs (no sample is kept)."""

    def __init__(self) -> None:
        self.last: dict[str, float] = {}
        self.peak: dict[str, float] = defaultdict(float)
        self.total: dict[str, float] = defaultdict(float)
        self.count: dict[str, int] = defaultdict(int)
        self.lock = threading.Lock()
        # Start-up: from the run's start until data first flows (a consumer of a share is
        # seen): imports, the model built, MLflow waited for. What a run costs beyond it is
        # what scales with the data it reads (tandem select report's break-even).
        self.started = time.monotonic()
        self.startup: dict[str, float] | None = None

    def add(self, metrics: dict[str, float]) -> None:
        with self.lock:
            self._add(metrics)

    def _add(self, metrics: dict[str, float]) -> None:
        for k, v in metrics.items():
            self.last[k] = v
            if v > self.peak[k]:
                self.peak[k] = v
            self.total[k] += v
            self.count[k] += 1
        if self.startup is None and any(_CONSUMER.match(k) for k in metrics):
            self.startup = {"startup_seconds": time.monotonic() - self.started}
            cpu = [self.last.get(f"system/process_tree/cpu_{w}_seconds") for w in ("user", "system")]
            if None not in cpu:
                self.startup["startup_cpu_seconds"] = sum(c for c in cpu if c is not None)
            for kind in ("measured", "estimated"):
                energy = energy_totals(self.last).get(f"energy_{kind}_joules")
                if energy is not None:
                    self.startup[f"startup_energy_{kind}_joules"] = energy

    def _mean(self, key: str) -> float:
        return self.total[key] / self.count[key] if self.count[key] else 0.0

    def result(self, duration_s: float, samples: int = 0, tracker_cpu_s: float = 0.0) -> dict[str, float]:
        pt = "system/process_tree/"
        s: dict[str, float] = {"duration_s": duration_s}
        user, system = self.last.get(pt + "cpu_user_seconds"), self.last.get(pt + "cpu_system_seconds")
        if user is not None and system is not None:
            s["cpu_seconds"] = user + system
            s["cpu_user_seconds"], s["cpu_system_seconds"] = user, system
            if duration_s > 0:
                s["cpu_percent_mean"] = 100.0 * (user + system) / duration_s
        if pt + "cpu_percent" in self.peak:
            s["cpu_percent_peak"] = self.peak[pt + "cpu_percent"]
        for name in ("rss", "pss", "uss"):
            if pt + f"{name}_bytes" in self.peak:
                s[f"peak_{name}_bytes"] = self.peak[pt + f"{name}_bytes"]
        for name in ("read", "write"):
            if pt + f"{name}_bytes" in self.last:
                s[f"{name}_bytes"] = self.last[pt + f"{name}_bytes"]
        for key in sorted(self.last):
            m = _GPU.match(key)
            if not m:
                continue
            i, what = m.groups()
            if what == "utilization_percent":
                s[f"gpu_{i}_utilization_mean_percent"] = self._mean(key)
                s[f"gpu_{i}_utilization_peak_percent"] = self.peak[key]
            elif what == "run_memory_bytes":
                s[f"gpu_{i}_run_memory_peak_bytes"] = self.peak[key]
            elif what == "power_watts":
                s[f"gpu_{i}_power_mean_watts"] = self._mean(key)
        s.update(energy_totals(self.last))
        stalls = [v for k, v in self.last.items() if _STALL.match(k)]
        if stalls:
            s["data_stall_seconds"] = sum(stalls)
        if samples:
            s["samples"] = float(samples)
            if duration_s > 0:
                s["samples_per_s"] = samples / duration_s
        s["tracker_cpu_seconds"] = tracker_cpu_s
        s.update(self.startup or {})
        return s


def _bytes(v: float) -> str:
    return f"{v / 2**30:.2f} GiB" if v >= 2**30 else f"{v / 2**20:.1f} MiB"


def _joules(v: float) -> str:
    return f"{v:,.1f} J  ({v / 3600:.4f} Wh)"


def summary_rows(s: dict[str, float]) -> list[tuple[str, str]]:
    """(what, value) rows for people, in a fixed order; keys absent from ``s`` are skipped."""
    rows: list[tuple[str, str]] = [("duration", f"{s['duration_s']:.1f} s")]
    if "cpu_seconds" in s:
        rows.append(
            (
                "CPU time (user + system)",
                f"{s['cpu_seconds']:.1f} s ({s['cpu_user_seconds']:.1f} + {s['cpu_system_seconds']:.1f})",
            )
        )
        rows.append(
            (
                "CPU, mean / peak (% of one core)",
                f"{s.get('cpu_percent_mean', 0):.0f} / {s.get('cpu_percent_peak', 0):.0f}",
            )
        )
    for name, what in (("rss", "RSS"), ("pss", "PSS"), ("uss", "USS")):
        if f"peak_{name}_bytes" in s:
            rows.append((f"peak memory, {what}", _bytes(s[f"peak_{name}_bytes"])))
    if "read_bytes" in s:
        rows.append(("disk read / written", f"{_bytes(s['read_bytes'])} / {_bytes(s.get('write_bytes', 0))}"))
    for key in sorted(k for k in s if k.endswith("_utilization_mean_percent")):
        i = key.split("_")[1]
        rows.append(
            (
                f"GPU {i} utilisation, mean / peak",
                f"{s[key]:.0f} / {s[f'gpu_{i}_utilization_peak_percent']:.0f} %",
            )
        )
        if f"gpu_{i}_run_memory_peak_bytes" in s:
            rows.append((f"GPU {i} memory of the run, peak", _bytes(s[f"gpu_{i}_run_memory_peak_bytes"])))
    energy = [
        ("energy_cpu_measured_joules", "energy: CPU, measured (RAPL, run's share)"),
        ("energy_cpu_package_measured_joules", "energy: CPU package, measured (whole host)"),
        ("energy_gpu_measured_joules", "energy: GPU, measured (NVML counter, whole device)"),
        ("energy_measured_joules", "energy: measured total (CPU share + visible GPUs)"),
        ("energy_cpu_estimated_joules", "energy: CPU, estimated"),
        ("energy_gpu_estimated_joules", "energy: GPU, estimated (power x time)"),
        ("energy_estimated_joules", "energy: estimated total"),
    ]
    rows.extend((label, _joules(s[key])) for key, label in energy if key in s)
    if "data_stall_seconds" in s:
        rows.append(("waiting for data (tandem share)", f"{s['data_stall_seconds']:.1f} s"))
    if "samples" in s:
        rows.append(("samples", f"{s['samples']:.0f} ({s.get('samples_per_s', 0):.1f} samples/s)"))
    rows.append(("tracker's sampling CPU time", f"{s.get('tracker_cpu_seconds', 0):.2f} s"))
    return rows


def summary_table(s: dict[str, float], title: str) -> Table:
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    for what, value in summary_rows(s):
        table.add_row(what, value)
    return table
