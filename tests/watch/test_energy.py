"""CPU energy: RAPL counters (wrap, sub-domains, attribution) and the estimate where none is readable.

This machine has no RAPL, so the powercap tree is written out as files with the layout and
values the kernel gives (``energy_uj`` counting up, wrapping at ``max_energy_range_uj``).
"""

from __future__ import annotations

import pytest

from tandem.watch.samplers.energy import CpuEnergySampler, EnergyCounter, find_rapl_packages

MAX_RANGE = 262_143_328_850  # a real package's max_energy_range_uj


def _zone(root, name, domain, energy):
    z = root / name
    z.mkdir(parents=True)
    (z / "name").write_text(domain + "\n")
    (z / "energy_uj").write_text(f"{energy}\n")
    (z / "max_energy_range_uj").write_text(f"{MAX_RANGE}\n")
    return z


def test_counter_wraps_at_its_range():
    c = EnergyCounter(1e-6, wrap=MAX_RANGE)
    c.update(MAX_RANGE - 1_000_000)
    assert c.update(4_000_000) == pytest.approx(5.0)  # 1 J before the wrap, 4 J after


def test_only_package_domains_are_summed(tmp_path):
    _zone(tmp_path, "intel-rapl:0", "package-0", 1_000)
    _zone(tmp_path, "intel-rapl:0:0", "core", 1_000)  # a sub-domain: part of package-0
    _zone(tmp_path, "intel-rapl:1", "package-1", 1_000)
    _zone(tmp_path, "intel-rapl:2", "psys", 1_000)
    assert [d.name for d in find_rapl_packages(tmp_path)] == ["package-0", "package-1"]


def test_measured_energy_is_shared_by_cpu_time(tmp_path):
    z0 = _zone(tmp_path, "intel-rapl:0", "package-0", 10_000_000)
    z1 = _zone(tmp_path, "intel-rapl:1", "package-1", MAX_RANGE - 500_000)
    cpu = {"run": 0.0, "host": 0.0}
    s = CpuEnergySampler(lambda: cpu["run"], root=tmp_path, host_cpu_seconds=lambda: cpu["host"])
    assert s.measured and s.available() == (True, "")
    s.sample()
    (z0 / "energy_uj").write_text(f"{10_000_000 + 30_000_000}\n")  # +30 J
    (z1 / "energy_uj").write_text("9500000\n")  # wrapped: +10 J
    cpu.update(run=1.0, host=4.0)  # the run used a quarter of the host's busy CPU time
    m = s.sample()
    assert m["system/energy/cpu_package_measured_joules"] == pytest.approx(40.0)
    assert m["system/energy/cpu_attributed_measured_joules"] == pytest.approx(10.0)
    assert not any("estimated" in k for k in m)


def test_unreadable_counter_gives_an_estimate_named_so(tmp_path, monkeypatch):
    z = _zone(tmp_path, "intel-rapl:0", "package-0", 0)
    (z / "energy_uj").unlink()
    (z / "energy_uj").mkdir()  # reading it fails, as a root-only file does for users
    monkeypatch.setenv("TANDEM_WATTS_PER_CORE", "5")
    cpu = {"run": 10.0}
    s = CpuEnergySampler(lambda: cpu["run"], root=tmp_path)
    ok, why = s.available()
    assert ok and not s.measured and "estimating" in why and "energy_uj" in why
    s.sample()
    cpu["run"] = 12.0
    m = s.sample()
    assert m == {"system/energy/cpu_estimated_joules": pytest.approx(10.0)}  # 2 CPU-s x 5 W


def test_bad_watts_per_core_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_WATTS_PER_CORE", "lots")
    with pytest.raises(ValueError, match="TANDEM_WATTS_PER_CORE='lots' is not a number"):
        CpuEnergySampler(lambda: 0.0, root=tmp_path)
