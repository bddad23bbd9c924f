"""The manager's clock: where the daemon's modules read the time.

The daemon is given a clock (``Daemon(..., clock=...)``; by default the system's) and its
state, scheduler, admission, requests and views read it here, so that a test can run the
daemon in its own process on a fake clock that it advances (``tests/place/inproc.py``)
rather than wait on the wall clock. What a scheduling pass costs (``time.process_time``)
is always measured for real.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """What the daemon asks of a clock: the time's module answers it."""

    def time(self) -> float: ...

    def monotonic(self) -> float: ...

    def sleep(self, seconds: float, /) -> None: ...


SYSTEM: Clock = time
_clock: Clock = SYSTEM


def use(clock: Clock) -> None:
    """Read the time from ``clock`` from now on (one daemon per process: its own)."""
    global _clock
    _clock = clock


def current() -> Clock:
    return _clock


def now() -> float:
    """Seconds since the epoch (wall time: what records and logs are stamped with)."""
    return _clock.time()


def monotonic() -> float:
    """Seconds on a clock that never steps back (intervals and deadlines)."""
    return _clock.monotonic()


def sleep(seconds: float) -> None:
    _clock.sleep(seconds)
