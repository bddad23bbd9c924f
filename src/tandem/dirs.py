"""Where tandem keeps its state on this machine, and the one way to open it.

``$TANDEM_STATE_DIR``, else ``$XDG_STATE_HOME/tandem``, else ``~/.local/state/tandem``: the
job manager's jobs (:mod:`tandem.place`) and the stored data selections
(:mod:`tandem.select`) live there, and their MLflow runs in its ``mlflow.db``.

Every command and library entry that reads or writes state opens it with :func:`state_dir`:
created 0700 when missing; refused (:class:`StateDirError`, saying what to do, with nothing
written) when others may enter it, when another user owns it, or when it (as configured) is
a symbolic link; an existing directory is never changed. Files in it are made with
:func:`private_file` (0600).
"""

from __future__ import annotations

import os
from pathlib import Path

from tandem import _ipc


class StateDirError(Exception):
    """The state directory may not be used (shared, another user's, a link), with what to do."""


def state_dir_path() -> Path:
    """Where tandem's state is (not created here). Absolute but not resolved: a symbolic
    link configured as the state directory stays one, to be refused."""
    explicit = os.environ.get("TANDEM_STATE_DIR")
    if explicit:
        path = Path(explicit)
    elif os.environ.get("XDG_STATE_HOME"):
        path = Path(os.environ["XDG_STATE_HOME"]) / "tandem"
    else:
        path = Path.home() / ".local" / "state" / "tandem"
    return Path(os.path.abspath(path.expanduser()))


def state_dir(path: Path | None = None) -> Path:
    """The private state directory (``path``, else :func:`state_dir_path`), created 0700
    if missing; :class:`StateDirError` if it may not be used."""
    return _ipc.private_dir(
        state_dir_path() if path is None else Path(os.path.abspath(path)),
        "state directory",
        "TANDEM_STATE_DIR",
        StateDirError,
    )


def private_file(path: Path) -> Path:
    """``path``, created empty and 0600 if it does not exist (before a library such as
    SQLite makes it with the process's umask); an existing file is left as it is."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
    except FileExistsError:
        pass
    return path


def mlflow_store_uri(state_dir: Path | None = None) -> str:
    """The MLflow store of tandem's state: ``$MLFLOW_TRACKING_URI``, else the state
    directory's ``mlflow.db`` (the job manager's jobs, its producers, the selections)."""
    directory = state_dir if state_dir is not None else state_dir_path()
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{directory / 'mlflow.db'}"


# A lab's server: one system manager (``tandem daemon start --system``, run by root) for every
# user of the host. Its state in /var/lib/tandem (root's only), its socket in /run/tandem (every
# user may connect: who they are comes from the kernel). ``TANDEM_SYSTEM_DIR`` moves both
# (``<dir>/state``, ``<dir>/daemon.sock``), for tests and containers.
SYSTEM_STATE_DIR = Path("/var/lib/tandem")
SYSTEM_SOCKET = Path("/run/tandem/daemon.sock")


SYSTEM_USERS_DIR = Path("/var/lib/tandem-users")


def system_users_dir() -> Path:
    """The folder of a system manager's users' own folders (``<uid>/``: their jobs' MLflow runs,
    theirs to read; beside its state, which is root's only): ``$TANDEM_SYSTEM_DIR/users``, else
    ``/var/lib/tandem-users``."""
    given = os.environ.get("TANDEM_SYSTEM_DIR")
    if given:
        return Path(os.path.abspath(os.path.expanduser(given))) / "users"
    return SYSTEM_USERS_DIR


def system_shares_dir() -> Path:
    """The folder of the host's system manager's public shares (``<uid>/<name>.sock``: each
    definer's producers listen in a folder of theirs, every user may reach): beside its socket."""
    return system_paths()[1].parent / "shares"


def system_paths() -> tuple[Path, Path]:
    """``(state directory, socket)`` of the host's system manager (neither made here)."""
    given = os.environ.get("TANDEM_SYSTEM_DIR")
    if given:
        base = Path(os.path.abspath(os.path.expanduser(given)))
        return base / "state", base / "daemon.sock"
    return SYSTEM_STATE_DIR, SYSTEM_SOCKET
