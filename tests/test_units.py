"""Figures for people: sizes and cores as ``ls``, ``show`` and the waiting reasons print them."""

from __future__ import annotations

import pytest

from tandem.place.scheduler import _cores_short
from tandem.units import format_cores, format_size
from tests.place.needs import host_slot, waiting


@pytest.mark.parametrize(
    ("cores", "text"),
    [(0.00966509, "0.01"), (0.25, "0.25"), (0.3, "0.3"), (0.544, "0.54"), (1.26, "1.3"), (2.0, "2")],
)
def test_cores_are_rounded_for_people(cores: float, text: str) -> None:
    assert format_cores(cores) == text


def test_a_waiting_reason_says_free_cores_rounded() -> None:
    assert format_size(1536 * 1024**2) == "1.5G"
    job = waiting(1, cpus=0.25)
    host = host_slot(cpus_total=2.0, mem_total=2**30, cpus_reserved=1.99033491)
    assert _cores_short(job, host) == "cores: needs 0.25, 0.01 of 2 free"
