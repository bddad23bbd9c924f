"""How long the tests wait: every deadline is scaled by ``TANDEM_TEST_SLACK`` (default 3,
sized for a 2-core machine with both cores busy), so that a pass never depends on the
machine being idle. Deadlines bound waits on conditions; they are not speed targets."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

SLACK = float(os.environ.get("TANDEM_TEST_SLACK", "3"))


def scaled(seconds: float) -> float:
    """``seconds`` on an idle machine, as a deadline here."""
    return seconds * SLACK


def until(
    what: Callable[[], object], seconds: float, message: Callable[[], str], every: float = 0.05
) -> None:
    """Wait for ``what()`` to hold, at most ``scaled(seconds)``; else fail with ``message()``
    (called then: the state that shows why)."""
    deadline = time.monotonic() + scaled(seconds)
    while not what():
        assert time.monotonic() < deadline, message()
        time.sleep(every)
