"""How long the tests wait: every deadline is scaled by ``TANDEM_TEST_SLACK`` (default 3,
sized for a 2-core machine with both cores busy), so that a pass never depends on the
machine being idle. Deadlines bound waits on conditions; they are not speed targets."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

SLACK = float(os.environ.get("TANDEM_TEST_SLACK", "3"))


def scaled(seconds: float) -> float:
    """``seconds`` on an idle machine, as a deadline here."""
    return seconds * SLACK


def until(what: Callable[[], T], seconds: float, message: str | Callable[[], str], every: float = 0.05) -> T:
    """Wait for ``what()`` to hold, at most ``scaled(seconds)``, and return what it gave; else
    fail with ``message`` (a callable: called then, for the state that shows why)."""
    deadline = time.monotonic() + scaled(seconds)
    while not (value := what()):
        if time.monotonic() >= deadline:
            raise AssertionError(
                message() if callable(message) else f"not within {scaled(seconds):g} s: {message}"
            )
        time.sleep(every)
    return value
