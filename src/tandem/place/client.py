"""Talking to the daemon: one request, one reply; start the daemon when none is running.

``submit`` starts a daemon if none serves the state directory (as task-spooler does), so
``tandem submit -- python train.py`` needs no set-up. The daemon runs in a session of its
own with its output in ``daemon.log`` in the state directory.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

from tandem._safepath import module_command
from tandem.place import protocol
from tandem.place.model import JobSpec

START_TIMEOUT_S = 30.0
OTHER_START_S = 10.0  # how long another daemon that won the race to start may take to listen
SUBMIT_WITHIN_S = 60.0  # how long a submit keeps trying while daemons die and start
# A sweep's answer comes once every job is made: 100,000 took about a minute on a busy 2-core host.
SWEEP_TIMEOUT_S, SWEEP_POINT_S = 120.0, 0.004


class DaemonError(Exception):
    """The daemon is not there, did not answer, or refused the request."""


def system_manager() -> Path | None:
    """The socket of the host's system manager where one answers (``tandem daemon start
    --system``: :func:`tandem.dirs.system_paths`), else None: then each user's own daemon."""
    import socket

    from tandem.dirs import system_paths

    path = system_paths()[1]
    try:
        if not path.is_socket():
            return None
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
            s.settimeout(2.0)
            s.connect(str(path))
        return path
    except OSError:  # gone, refused (a socket left by a dead manager), not ours to reach
        return None


def own_daemon_too(state_dir: Path) -> Path | None:
    """The socket of this user's own daemon of ``state_dir`` where it answers while the host's
    system manager runs too (which then serves every command: this one serves none), else None."""
    from tandem.place.run.supervisor.files import DaemonFile

    if system_manager() is None or not state_dir.is_dir():
        return None
    info = DaemonFile.read(state_dir)
    if info is None or not info.socket or not Path(info.socket).is_socket():
        return None
    try:
        request_at(Path(info.socket), protocol.Status(), 2.0)
    except DaemonError:
        return None
    return Path(info.socket)


def daemon_socket(state_dir: Path) -> Path:
    """Where the daemon of ``state_dir`` listens: the host's system manager where one runs
    (every user's commands go to it), else as the daemon wrote it in ``daemon.json`` (so a
    shell with another runtime directory, cron's, finds the same daemon), else where it would."""
    from tandem.place.run.supervisor.files import DaemonFile

    system = system_manager()
    if system is not None:
        return system

    info = DaemonFile.read(state_dir)
    if info is not None and info.socket and Path(info.socket).exists():
        return Path(info.socket)
    return protocol.socket_path(state_dir)


def request(state_dir: Path, message: protocol.Request, timeout: float = 10.0) -> Any:
    """Send ``message``; return its reply record (:mod:`tandem.place.protocol`), or raise
    :class:`DaemonError` (with the daemon's message)."""
    return request_at(daemon_socket(state_dir), message, timeout, state_dir)


def request_at(path: Path, message: protocol.Request, timeout: float, state_dir: Path | None = None) -> Any:
    """:func:`request` to the daemon listening at ``path`` (a supervisor knows its daemon's
    socket, not its state directory)."""
    daemon = f"the daemon of {state_dir}" if state_dir else f"the daemon at {path}"
    try:
        answer = protocol.exchange(path, protocol.to_wire(message), timeout)
    except (FileNotFoundError, ConnectionRefusedError):
        raise DaemonNotRunning(f"no daemon serves {state_dir or path}") from None
    except TimeoutError:
        raise DaemonTimeout(
            f"{daemon} did not answer within {timeout:g} s (busy or stuck; a request "
            "it has received may still be carried out: check `tandem ls` before repeating it)"
        ) from None
    except (EOFError, OSError) as exc:
        raise DaemonLost(f"lost {daemon} mid-request ({exc})") from None
    except ValueError as exc:
        raise DaemonError(f"{daemon} answered what this tandem cannot read ({exc})") from None
    try:
        reply = protocol.read_reply(message.OP, answer)
    except ValueError as exc:
        raise DaemonError(f"{daemon} answered what this tandem cannot read ({exc})") from None
    if isinstance(reply, protocol.Failure):
        if reply.error.startswith(("unknown request", "refused: unknown request")):  # an older daemon
            raise DaemonError(
                f"{reply.error}: {daemon} is from an older tandem; restart it "
                "(tandem daemon stop; tandem daemon start): running jobs go on"
            )
        if reply.disk:
            raise DaemonDiskFull(reply.error)
        raise (DaemonRefused if reply.refused else DaemonError)(reply.error)
    return reply


class DaemonNotRunning(DaemonError):
    pass


class DaemonTimeout(DaemonError):
    """The daemon did not answer in time (stopped, overloaded or stuck)."""


class DaemonLost(DaemonError):
    """The connection broke before the answer came."""


class DaemonRefused(DaemonError):
    """The request was understood and refused (a job that can never fit, say)."""


class DaemonDiskFull(DaemonError):
    """The state's disk would not take the request's write (full, failing): nothing was done."""


def is_running(state_dir: Path) -> bool:
    """Does a daemon answer for ``state_dir``? (One that is stopping counts as gone; one
    that does not answer at all is an error, not a reason to start a second.)"""
    try:
        request(state_dir, protocol.Status(), timeout=5.0)
        return True
    except DaemonTimeout:
        raise
    except DaemonError:
        return False


def submit(
    state_dir: Path, spec: JobSpec, timeout: float = 10.0, within: float = SUBMIT_WITHIN_S
) -> protocol.Submitted:
    """Submit ``spec``; the reply (its ``id``). A submit that finds no daemon, or whose daemon
    dies or does not answer while it waits, starts one (with the configuration kept in the
    state directory) and is sent again with the same token, for up to ``within`` seconds: the
    daemon then answers with the job the first one made, if it made one, so a retry never
    makes two jobs and a submit made while the daemon restarts lands."""
    if spec.token is None:
        spec = dataclasses.replace(spec, token=uuid.uuid4().hex)
    return _until_answered(state_dir, protocol.Submit(spec), timeout, within)


def submit_sweep(
    state_dir: Path,
    spec: JobSpec,
    points: list[dict[str, Any]],
    fill_env: list[str],
    timeout: float | None = None,
    within: float = SUBMIT_WITHIN_S,
) -> protocol.SweepSubmitted:
    """Submit one job per point (:mod:`tandem.place.sweep`), in one request, as
    :func:`submit` does (a retry gets the jobs the first one made). The daemon makes them
    all before it answers: ``timeout`` grows with the points (100,000: over 8 minutes)."""
    if timeout is None:
        timeout = SWEEP_TIMEOUT_S + SWEEP_POINT_S * len(points)
    if spec.token is None:
        spec = dataclasses.replace(spec, token=uuid.uuid4().hex)
    return _until_answered(state_dir, protocol.SubmitSweep(spec, points, fill_env), timeout, within)


def submit_many(
    state_dir: Path, specs: list[JobSpec], timeout: float | None = None, within: float = SUBMIT_WITHIN_S
) -> protocol.SweepSubmitted:
    """Submit these jobs in one request, all or none, as :func:`submit` does (each keeps a
    token: a retry gets the jobs the first one made)."""
    if timeout is None:
        timeout = SWEEP_TIMEOUT_S + SWEEP_POINT_S * len(specs)
    specs = [s if s.token is not None else dataclasses.replace(s, token=uuid.uuid4().hex) for s in specs]
    return _until_answered(state_dir, protocol.SubmitMany(specs), timeout, within)


def _until_answered(state_dir: Path, message: protocol.Request, timeout: float, within: float) -> Any:
    system = system_manager()
    if system is not None:  # the host's manager: no daemon of the user's own is started
        return request_at(system, message, timeout)
    deadline = time.monotonic() + within
    while True:
        try:
            return request(state_dir, message, timeout=timeout)
        except (DaemonNotRunning, DaemonTimeout, DaemonLost):
            if time.monotonic() > deadline:
                raise
        try:
            ensure_daemon(state_dir)
        except DaemonError:  # another start under way, or it died as it started: again
            time.sleep(0.2)


def start_daemon(
    state_dir: Path, timeout: float = START_TIMEOUT_S, env: dict[str, str] | None = None
) -> protocol.DaemonStatus:
    """Start a daemon for ``state_dir`` in the background (with the configuration kept there,
    :class:`~tandem.place.config.DaemonConfig`) and wait until it answers. Refused, before
    anything is written, where the state directory is read-only or a database removed under
    its daemon has a kept copy not put back (:func:`~tandem.place.identity.check_may_start`)."""
    from tandem.place.identity import check_may_start
    from tandem.watch.stores.base import absolute_uri

    check_may_start(state_dir)
    log_path = state_dir / "daemon.log"
    env = dict(os.environ if env is None else env, TANDEM_STATE_DIR=str(state_dir))
    if env.get("MLFLOW_TRACKING_URI"):  # the daemon runs in /: a relative store is the one meant here
        env["MLFLOW_TRACKING_URI"] = absolute_uri(env["MLFLOW_TRACKING_URI"])
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            module_command("tandem.place.daemon", str(state_dir)),
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
            # Another daemon won a race to start (it holds the lock)? Then it answers soon,
            # once it listens; else report why ours died.
            other = min(deadline, time.monotonic() + OTHER_START_S)
            while time.monotonic() < other:
                try:
                    return request(state_dir, protocol.Status(), timeout=2.0)
                except DaemonNotRunning:
                    time.sleep(0.1)
                except DaemonError:
                    break
            raise DaemonError(f"the daemon exited at start (exit {code}):\n{_tail(log_path)}")
        try:
            return request(state_dir, protocol.Status(), timeout=2.0)
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
        start_daemon(state_dir)


def daemon_pid(state_dir: Path) -> int | None:
    """The pid the last daemon of ``state_dir`` wrote in ``daemon.json`` (None if unknown)."""
    from tandem.place.run.supervisor.files import DaemonFile

    info = DaemonFile.read(state_dir)
    return None if info is None else info.pid


__all__ = [
    "DaemonDiskFull",
    "DaemonError",
    "DaemonNotRunning",
    "DaemonRefused",
    "DaemonTimeout",
    "ensure_daemon",
    "is_running",
    "request",
    "start_daemon",
    "submit",
]
