"""The supervisor's wait for its job (:func:`tandem.place.run.supervisor.proctrack.wait_exit`): asleep
until the job ends or a signal's handler says stop, woken at once by either."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from tandem.place.run.supervisor.proctrack import wait_exit
from tests.timing import scaled


@pytest.fixture
def long_job() -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    yield proc
    proc.kill()
    proc.wait()


def test_returns_when_the_job_ends(long_job: subprocess.Popen) -> None:
    assert long_job.stdin is not None
    long_job.stdin.close()  # the job reads its end of input and exits
    t0 = time.monotonic()
    wait_exit(long_job, lambda: False)
    assert long_job.returncode == 0
    assert time.monotonic() - t0 < scaled(10), "not woken by the job's end"


def test_a_signal_whose_handler_says_stop_wakes_it(long_job: subprocess.Popen) -> None:
    stopped: list[int] = []
    old = signal.signal(signal.SIGUSR1, lambda signum, _frame: stopped.append(signum))
    try:
        # Another process signals us once it has started: whether before the wait or while
        # it sleeps, the wait must end without the job ending.
        sender = subprocess.Popen(
            [sys.executable, "-c", f"import os, signal; os.kill({os.getpid()}, signal.SIGUSR1)"]
        )
        t0 = time.monotonic()
        wait_exit(long_job, lambda: bool(stopped))
        assert stopped == [signal.SIGUSR1]
        assert long_job.poll() is None, "the job ended; only the signal should have woken the wait"
        assert time.monotonic() - t0 < scaled(20), "not woken by the signal"
        sender.wait()
    finally:
        signal.signal(signal.SIGUSR1, old)
    assert signal.set_wakeup_fd(-1) == -1  # the wakeup fd was given back
