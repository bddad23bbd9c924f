"""Running the dashboard: bind, print the URL with the token, serve until interrupted.

The server binds its socket itself before uvicorn starts, so that ``--port 0`` (any free
port) prints the port it got, and a port in use is a clear error rather than a log line.
"""

from __future__ import annotations

import ipaddress
import socket
import sys
import webbrowser
from pathlib import Path

from tandem.web.access import LOOPBACK_HOSTS, load_token


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def mlflow_db(state_dir: Path) -> Path | None:
    """The SQLite file of the manager's MLflow store, as its daemon is configured (None: the
    store is not a SQLite file)."""
    from tandem.dirs import mlflow_store_uri
    from tandem.place.config import DaemonConfig
    from tandem.watch.stores.mlflow_store import sqlite_path

    return sqlite_path(DaemonConfig.load(state_dir).store or mlflow_store_uri(state_dir))


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


def serve(state_dir: Path, host: str = "127.0.0.1", port: int = 8765, open_browser: bool = True) -> None:
    """Serve the dashboard of ``state_dir`` on ``host:port`` until Ctrl-C."""
    import uvicorn

    from tandem.web.app import build

    token = load_token()
    hosts = LOOPBACK_HOSTS if is_loopback(host) else LOOPBACK_HOSTS | {host.lower()}
    sock = bind(host, port)
    shown = f"[{host.strip('[]')}]" if ":" in host.strip("[]") else host
    url = f"http://{shown}:{sock.getsockname()[1]}/"
    app = build(state_dir, mlflow_db(state_dir), token, frozenset(hosts))
    print(f"tandem dashboard of {state_dir}: {url}?token={token}", flush=True)
    print(f"  (the token is kept in {_token_path()}; Ctrl-C to stop)", file=sys.stderr, flush=True)
    if open_browser:
        webbrowser.open(f"{url}?token={token}")
    config = uvicorn.Config(
        app, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=1
    )
    uvicorn.Server(config).run(sockets=[sock])


def _token_path() -> Path:
    from tandem.web.access import token_file

    return token_file()
