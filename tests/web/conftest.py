"""A daemon with a private state directory (place's ``cli`` fixture) and a dashboard served
on a free port for it; both stopped after the test."""

from __future__ import annotations

import http.client
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.place.conftest import Cli, cli  # noqa: F401 (the fixture, for these tests too)
from tests.timing import scaled

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")


@dataclass
class Dashboard:
    base: str  # http://127.0.0.1:PORT/
    login_page: Path  # the 0600 page that logs a browser in (a one-time code, renewed after each use)
    proc: subprocess.Popen
    cli: Cli
    opened: Path  # the arguments tandem dashboard started the browser with, one a line
    token: str = ""  # a session token of the test's own (as a script would get one)

    @property
    def login_url(self) -> str:
        """What tandem dashboard opened the browser on."""
        return self.opened.read_text().splitlines()[-1]

    def code(self) -> str:
        """The login code the page holds now."""
        return re.search(r"#login=([\w-]+)", self.login_page.read_text()).group(1)  # type: ignore[union-attr]

    def log_in(self, code: str | None = None) -> tuple[int, dict]:
        """``POST /api/login`` with ``code`` (the page's current one by default), from the
        dashboard's own origin: (status, body)."""
        parts = urlsplit(self.base)
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
        body = json.dumps({"code": self.code() if code is None else code})
        origin = self.base.rstrip("/")
        conn.request("POST", "/api/login", body, {"Origin": origin, "Content-Type": "application/json"})
        response = conn.getresponse()
        answer = response.status, json.loads(response.read() or b"{}")
        conn.close()
        return answer


@pytest.fixture
def dashboard(cli: Cli) -> Iterator[Dashboard]:  # noqa: F811
    cli("daemon", "start", "--cpus", "2", "--mem", "2G")
    # The browser tandem dashboard opens (as a user's would be): one that writes down the
    # arguments it was given, for the tests to check and follow.
    opened = cli.tmp / "browser-argv.txt"
    browser = cli.tmp / "browser.sh"
    browser.write_text(f'#!/bin/sh\nprintf \'%s\\n\' "$0" "$@" > {opened}.tmp && mv {opened}.tmp {opened}\n')
    browser.chmod(0o755)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tandem.cli", "dashboard", "--port", "0"],
        env={**cli.env, "BROWSER": str(browser)},
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
        base = line.split(": ", 1)[1].strip()
        port = urlsplit(base).port
        login_page = Path(cli.env["TANDEM_RUNTIME_DIR"]) / "dashboard" / f"login-{port}.html"
        board = Dashboard(base, login_page, proc, cli, opened)
        wait_for(opened.exists, what="tandem dashboard opening the browser")
        status, body = board.log_in()
        assert status == 200, body
        board.token = body["token"]
        yield board
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
