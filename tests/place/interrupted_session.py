"""Not collected by the suite (no ``test_`` prefix): the session tests/place/test_interrupted.py
runs in a pytest of its own and interrupts, a test whose daemon and job are running when it is."""

from __future__ import annotations

import os
import time
from pathlib import Path

from tests.place.conftest import Cli


def test_holds_a_daemon_until_interrupted(cli: Cli) -> None:
    cli("daemon", "start", "--cpus", "1", "--mem", "1G", "--no-track")
    job = cli.submit("--", "sleep", "300")
    cli.wait_state(job, {"running"}, timeout=60)
    said = Path(os.environ["TANDEM_INTERRUPT_ME"])
    said.with_suffix(".tmp").write_text(str(cli.state))
    said.with_suffix(".tmp").rename(said)  # the test interrupts this session now
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:  # until interrupted (a long test's stand-in)
        time.sleep(0.1)
