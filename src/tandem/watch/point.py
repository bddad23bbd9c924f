"""The core record of ``tandem.watch``: one metric value at one time.

Samplers produce values, the tracker turns them into points, and the recorders and stores
move and keep points. A point is ``(key, value, timestamp_ms, step)`` with the sample's
real time, as MLflow's API has it.
"""

from __future__ import annotations

from typing import NamedTuple


class Point(NamedTuple):
    key: str
    value: float
    timestamp_ms: int
    step: int = 0
