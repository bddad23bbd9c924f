"""The whole host: CPU %, memory, disk and network throughput (context for a run's own use)."""

from __future__ import annotations

import time

import psutil

from tandem.watch.samplers.base import Sampler


class HostSampler(Sampler):
    name = "host"

    def __init__(self) -> None:
        self._last: tuple[float, tuple[int, int], tuple[int, int]] | None = None
        psutil.cpu_percent(None)  # the first call only starts psutil's interval

    def available(self) -> tuple[bool, str]:
        return True, ""

    @staticmethod
    def _io() -> tuple[tuple[int, int], tuple[int, int]]:
        disk = psutil.disk_io_counters()
        net = psutil.net_io_counters()
        return (
            (disk.read_bytes, disk.write_bytes) if disk else (0, 0),
            (net.bytes_recv, net.bytes_sent) if net else (0, 0),
        )

    def sample(self) -> dict[str, float]:
        now = time.monotonic()
        mem = psutil.virtual_memory()
        disk, net = self._io()
        metrics = {
            "system/host/cpu_percent": psutil.cpu_percent(None),  # of all cores: 100 = all busy
            "system/host/memory_used_bytes": float(mem.total - mem.available),
            "system/host/memory_total_bytes": float(mem.total),
        }
        if self._last is not None and now > self._last[0]:
            dt = now - self._last[0]
            (r0, w0), (rx0, tx0) = self._last[1], self._last[2]
            metrics.update(
                {
                    "system/host/disk_read_bytes_per_s": (disk[0] - r0) / dt,
                    "system/host/disk_write_bytes_per_s": (disk[1] - w0) / dt,
                    "system/host/net_recv_bytes_per_s": (net[0] - rx0) / dt,
                    "system/host/net_sent_bytes_per_s": (net[1] - tx0) / dt,
                }
            )
        self._last = (now, disk, net)
        return metrics
