"""A run's start-up in its summary: from the run's start until its data first flowed (a
consumer of a share seen in its tree), with the CPU-seconds and energy spent by then, which
``tandem select report`` leaves out of what scales with the data."""

from __future__ import annotations

import time

from tandem.watch._summary import SummaryBuilder

CPU = "system/process_tree/cpu_{}_seconds"


def test_start_up_ends_when_a_consumer_is_first_seen() -> None:
    summary = SummaryBuilder()
    summary.add({CPU.format("user"): 3.0, CPU.format("system"): 0.5})  # imports: no data yet
    assert summary.startup is None
    deadline = time.monotonic() + 5
    while time.monotonic() - summary.started < 0.05 and time.monotonic() < deadline:
        time.sleep(0.01)
    summary.add({CPU.format("user"): 4.0, "system/share/toy/consumer_1/samples": 32.0})
    summary.add({CPU.format("user"): 9.0, "system/share/toy/consumer_1/samples": 640.0})
    result = summary.result(duration_s=10.0)
    assert result["startup_cpu_seconds"] == 4.5  # as it stood when data first flowed, not at the end
    assert 0.05 <= result["startup_seconds"] < 10.0
    assert "startup_energy_measured_joules" not in result  # no energy figure: none said


def test_a_run_that_reads_no_share_has_no_start_up_figure() -> None:
    summary = SummaryBuilder()
    summary.add({CPU.format("user"): 3.0, CPU.format("system"): 0.5})
    assert not any(k.startswith("startup") for k in summary.result(duration_s=4.0))
