"""A daemon with a private state directory (place's ``cli`` fixture) and a dashboard served
on a free port for it; both stopped after the test."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.place.conftest import Cli, cli  # noqa: F401 (the fixture, for these tests too)
from tests.timing import scaled

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")


@dataclass
class Dashboard:
    base: str  # http://127.0.0.1:PORT/
    token: str
    proc: subprocess.Popen
    cli: Cli

    @property
    def login_url(self) -> str:
        return f"{self.base}?token={self.token}"


@pytest.fixture
def dashboard(cli: Cli) -> Iterator[Dashboard]:  # noqa: F811
    cli("daemon", "start", "--cpus", "2", "--mem", "2G")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tandem.cli", "dashboard", "--port", "0", "--no-open"],
        env=cli.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cli.tmp,
    )
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        if "http://" not in line:
            raise AssertionError(
                f"no URL from tandem dashboard: {line!r} {proc.stderr.read() if proc.stderr else ''}"
            )
        url = line.split(": ", 1)[1].strip()
        base, token = url.split("?token=")
        yield Dashboard(base, token, proc, cli)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def wait_for(predicate, timeout: float = 20.0, what: str = "it") -> None:
    timeout = scaled(timeout)
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout} s")
        time.sleep(0.1)


def state_file(cli: Cli) -> Path:  # noqa: F811
    return cli.state / "place.db"
