"""How long the tests wait: every deadline is scaled by ``TANDEM_TEST_SLACK`` (default 3,
sized for a 2-core machine with both cores busy), so that a pass never depends on the
machine being idle. Deadlines bound waits on conditions; they are not speed targets."""

from __future__ import annotations

import os

SLACK = float(os.environ.get("TANDEM_TEST_SLACK", "3"))


def scaled(seconds: float) -> float:
    """``seconds`` on an idle machine, as a deadline here."""
    return seconds * SLACK
