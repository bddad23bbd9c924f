"""Running the dashboard: bind, write the login page, print where it is, serve until
interrupted.

The server binds its socket itself before uvicorn starts, so that ``--port 0`` (any free
port) prints the port it got, and a port in use is a clear error rather than a log line.
Nothing secret is printed or put on a command line: the browser is opened on the 0600 login
page (:func:`tandem.web.access.login_file`), by its path.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import webbrowser
from pathlib import Path
from typing import Any

from tandem.web.access import LOOPBACK_HOSTS, Sessions, login_file, write_login_page
from tandem.web.peer import foreign, is_loopback_address


def binds_loopback_only(host: str) -> bool:
    """Whether listening on ``--host host`` (a name or an address, IPv6 in brackets or not)
    keeps the server to this machine: ``localhost`` or a loopback address."""
    return host.lower() == "localhost" or is_loopback_address(host.strip("[]"))


def host_names(host: str) -> frozenset[str]:
    """The names a request's Host header may give for a server listening on ``host``: the
    loopback ones, and ``host`` itself where the user chose another (an IPv6 one in brackets,
    as a URL writes it)."""
    if binds_loopback_only(host):
        return LOOPBACK_HOSTS
    bare = host.strip("[]").lower()
    return LOOPBACK_HOSTS | {f"[{bare}]" if ":" in bare else bare}


def mlflow_db(state_dir: Path) -> Path | None:
    """The SQLite file of the manager's MLflow store, the one its daemon writes to (None: the
    store is not a SQLite file)."""
    from tandem.place import manager_store
    from tandem.watch.stores.mlflow_store import sqlite_path

    return sqlite_path(manager_store(state_dir))


def _system_manager() -> tuple[Path, Path | None] | None:
    """``(socket, MLflow file)`` of the host's system manager where one answers (every user's
    dashboard shows its queue: :mod:`tandem.web.remote`), with this user's runs' store (root's:
    the manager's own); None: this user's own daemon's dashboard."""
    from tandem.dirs import system_paths
    from tandem.place import system_manager, system_user_store
    from tandem.watch.stores.mlflow_store import sqlite_path

    socket = system_manager()
    if socket is None:
        return None
    if os.getuid() == 0:
        return socket, mlflow_db(system_paths()[0])
    return socket, sqlite_path(system_user_store(os.getuid()))


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port} ({exc.strerror}): pick another --port") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def serve(
    state_dir: Path,
    host: str = "127.0.0.1",
    port: int = 8765,
    open_browser: bool = True,
    max_streams: int = 32,
) -> None:
    """Serve the dashboard of ``state_dir`` on ``host:port`` until Ctrl-C."""
    import uvicorn

    from tandem.web.app import build

    sock = bind(host, port)
    shown = f"[{host.strip('[]')}]" if ":" in host.strip("[]") else host
    port = sock.getsockname()[1]
    url = f"http://{shown}:{port}/"
    login = login_file(port)
    with contextlib.suppress(OSError):  # an earlier tandem's lasting token: no longer used
        (login.parent / "token").unlink()
    sessions = Sessions(lambda code: write_login_page(login, url, code))  # rotated at each start
    system = _system_manager()
    if system is None:
        app = build(state_dir, mlflow_db(state_dir), sessions, host_names(host), max_streams, port=port)
        print(f"tandem dashboard of {state_dir}: {url}", flush=True)
    else:  # the host's queue, as this user may see it; their runs in their store
        socket, runs = system
        app = build(socket.parent, runs, sessions, host_names(host), max_streams, port=port, remote=socket)
        print(f"tandem dashboard of the host's system manager (socket {socket}): {url}", flush=True)
    print(
        f"  log in: open {login.as_uri()} in a browser (a one-time login, renewed after each use; "
        "from another machine, the URL in it); Ctrl-C to stop",
        file=sys.stderr,
        flush=True,
    )
    if open_browser:
        webbrowser.open(login.as_uri())  # a path on the browser's command line, no secret
    config = uvicorn.Config(
        app,
        http=_header_timeout_protocol(),
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=1,
        timeout_keep_alive=int(HEADER_TIMEOUT_S),
        # uvicorn listens again with its backlog (2048 by default): past the 1,024 open files
        # a process has, another user's flood of connections made it log a traceback per
        # failed accept (22 MB in 15 s) and answer no one; within them it refuses in silence.
        backlog=128,
    )
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        with contextlib.suppress(OSError):
            login.unlink()


HEADER_TIMEOUT_S = 10.0  # a request's headers must be in within this, however slowly they trickle
REFUSALS_EVERY_S = 5.0  # at most one line about closed connections this often


class Refusals:
    """What the log says of connections closed unread: the first at once, then at most one
    line each :data:`REFUSALS_EVERY_S` with how many more there were. Another user's flood
    of connections then costs the server a count each, not a line each (nor a full pipe)."""

    def __init__(self, every_s: float = REFUSALS_EVERY_S) -> None:
        self.every_s = every_s
        self.count = 0  # closed since the last line
        self.last = ""
        self._pending: object = None  # the scheduled summary

    def note(self, why: str, loop: Any) -> None:
        self.last = why
        if self._pending is None:
            print(f"tandem dashboard: closed {why}", file=sys.stderr, flush=True)
            self._pending = loop.call_later(self.every_s, self._summary, loop)
        else:
            self.count += 1

    def _summary(self, loop: Any) -> None:
        if not self.count:
            self._pending = None  # quiet again: the next one is said at once
            return
        print(
            f"tandem dashboard: closed {self.count} more connection(s) in {self.every_s:g} s "
            f"(the last: {self.last})",
            file=sys.stderr,
            flush=True,
        )
        self.count = 0
        self._pending = loop.call_later(self.every_s, self._summary, loop)


def _header_timeout_protocol() -> type:
    """uvicorn's HTTP/1.1 protocol with a deadline for each request's headers: a connection
    that sends them slowly, or only half (a slow-loris), is closed instead of held open.
    (uvicorn's keep-alive timeout restarts on every byte received.)"""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    refusals = Refusals()

    class HeaderTimeoutH11(H11Protocol):
        _deadline: object = None
        _waiting_after: object = None

        def _arm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()  # type: ignore[attr-defined]
            self._waiting_after = self.cycle  # the request before the one awaited
            self._deadline = self.loop.call_later(HEADER_TIMEOUT_S, self._too_slow)

        def connection_made(self, transport):  # type: ignore[no-untyped-def]
            super().connection_made(transport)
            why = foreign(transport.get_extra_info("peername"), transport.get_extra_info("sockname"))
            if why is not None:  # another user's socket: closed before a byte of it is read
                transport.abort()
                refusals.note(why, self.loop)
                return
            self._arm()

        def handle_events(self) -> None:
            super().handle_events()
            if self._deadline is not None and self.cycle is not self._waiting_after:
                self._deadline.cancel()  # type: ignore[attr-defined]
                self._deadline = None  # its headers are in: the handler's time is its own

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()  # a kept-alive connection's next request

        def connection_lost(self, exc):  # type: ignore[no-untyped-def]
            if self._deadline is not None:
                self._deadline.cancel()  # type: ignore[attr-defined]
            super().connection_lost(exc)

        def _too_slow(self) -> None:
            self._deadline = None
            if self.cycle is self._waiting_after and not self.transport.is_closing():
                self.transport.close()

    return HeaderTimeoutH11
