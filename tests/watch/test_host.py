"""The host sampler on this machine: plausible values and rates from real counters."""

from __future__ import annotations

import os
import tempfile
import time

import psutil

from tandem.watch.samplers import HostSampler


def test_host_sampler_reads_memory_cpu_and_disk_rates():
    sampler = HostSampler()
    first = sampler.sample()
    assert "system/host/disk_write_bytes_per_s" not in first, "rates need two samples"
    total = psutil.virtual_memory().total
    assert first["system/host/memory_total_bytes"] == total
    assert 0 < first["system/host/memory_used_bytes"] < total
    with tempfile.NamedTemporaryFile(dir=os.getcwd()) as f:  # real disk writes
        f.write(os.urandom(8 << 20))
        f.flush()
        os.fsync(f.fileno())
    time.sleep(0.2)
    second = sampler.sample()
    assert 0.0 <= second["system/host/cpu_percent"] <= 100.0
    for key in ("disk_read", "disk_write", "net_recv", "net_sent"):
        assert second[f"system/host/{key}_bytes_per_s"] >= 0.0
    assert sampler.available() == (True, "")
