"""Talking to the daemon: one request, one reply; start the daemon when none is running.

``submit`` starts a daemon if none serves the state directory (as task-spooler does), so
``tandem submit -- python train.py`` needs no set-up. The daemon runs in a session of its
own with its output in ``daemon.log`` in the state directory.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tandem import _ipc
from tandem.place import protocol

START_TIMEOUT_S = 30.0


class DaemonError(Exception):
    """The daemon is not there, did not answer, or refused the request."""


def request(state_dir: Path, message: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
    """Send ``message``; return the reply, or raise :class:`DaemonError` (with its message)."""
    path = protocol.socket_path(state_dir)
    try:
        with _ipc.new_socket() as sock:
            sock.settimeout(timeout)
            sock.connect(str(path))
            sock.settimeout(None)
            _ipc.send_packet(sock, protocol.encode(message), timeout=timeout)
            data, fds = _ipc.recv_packet(sock, timeout=timeout)
            _ipc.close_fds(fds)
    except (FileNotFoundError, ConnectionRefusedError):
        raise DaemonNotRunning(f"no daemon serves {state_dir}") from None
    except TimeoutError:
        raise DaemonTimeout(
            f"the daemon of {state_dir} did not answer within {timeout:g} s (busy or stuck; a request "
            "it has received may still be carried out: check `tandem ls` before repeating it)"
        ) from None
    except (EOFError, OSError) as exc:
        raise DaemonError(f"lost the daemon of {state_dir} mid-request ({exc})") from None
    reply = protocol.decode(data)
    if not reply.get("ok"):
        error = DaemonRefused if reply.get("refused") else DaemonError
        raise error(reply.get("error", "the daemon refused the request"))
    return reply


class DaemonNotRunning(DaemonError):
    pass


class DaemonTimeout(DaemonError):
    """The daemon did not answer in time (stopped, overloaded or stuck)."""


class DaemonRefused(DaemonError):
    """The request was understood and refused (a job that can never fit, say)."""


def is_running(state_dir: Path) -> bool:
    """Does a daemon answer for ``state_dir``? (One that is stopping counts as gone; one
    that does not answer at all is an error, not a reason to start a second.)"""
    try:
        request(state_dir, {"op": "status"}, timeout=5.0)
        return True
    except DaemonTimeout:
        raise
    except DaemonError:
        return False


def job_spec(
    command: list[str],
    *,
    name: str | None = None,
    cpus: float = 1.0,
    mem: int = 0,
    gpus: int | None = None,
    gpu_mem: int | None = None,
    gpu_share: int | None = None,
    priority: int = 0,
    retries: int = 2,
    share: str | None = None,
    group: str | None = None,
    after: list[int] | None = None,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
) -> dict[str, Any]:
    """The ``submit`` request's job: what ``tandem submit`` sends (the environment defaults
    to this process's, the directory to the current one)."""
    from tandem.place.model import job_key

    return {
        "name": name,
        "job_key": job_key(name, command),
        "command": command,
        "cwd": cwd or os.getcwd(),
        "env": dict(os.environ) if env is None else env,
        "cpus": cpus,
        "mem": mem,
        "gpus": gpus,
        "gpu_mem": gpu_mem,
        "gpu_share": gpu_share,
        "priority": priority,
        "retries": retries,
        "share": share,
        "group": group,
        "after": after or [],
    }


def start_daemon(
    state_dir: Path, options: list[str], timeout: float = START_TIMEOUT_S, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Start a daemon for ``state_dir`` in the background and wait until it answers."""
    log_path = state_dir / "daemon.log"
    env = dict(os.environ if env is None else env, TANDEM_STATE_DIR=str(state_dir))
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tandem.cli", "daemon", "start", "--foreground", *options],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            cwd="/",
        )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        code = proc.poll()
        if code is not None:
            # Another daemon won a race to start? Then it answers; else report why ours died.
            try:
                return request(state_dir, {"op": "status"}, timeout=5.0)
            except DaemonError:
                raise DaemonError(f"the daemon exited at start (exit {code}):\n{_tail(log_path)}") from None
        try:
            return request(state_dir, {"op": "status"}, timeout=2.0)
        except DaemonNotRunning:
            time.sleep(0.1)
    proc.kill()
    proc.wait(10)
    raise DaemonError(f"the daemon did not come up within {timeout:g} s:\n{_tail(log_path)}")


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no daemon.log)"


def ensure_daemon(state_dir: Path) -> None:
    if not is_running(state_dir):
        start_daemon(state_dir, [])


def daemon_pid(state_dir: Path) -> int | None:
    """The pid the last daemon of ``state_dir`` wrote in ``daemon.json`` (None if unknown)."""
    from tandem.place.shim import read_json

    info = read_json(state_dir / "daemon.json")
    return None if info is None else int(info["pid"])


__all__ = [
    "DaemonError",
    "DaemonNotRunning",
    "DaemonRefused",
    "DaemonTimeout",
    "ensure_daemon",
    "is_running",
    "request",
    "start_daemon",
]
