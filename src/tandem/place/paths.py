"""Where the job manager's state lives: ``$TANDEM_STATE_DIR``, else
``$XDG_STATE_HOME/tandem``, else ``~/.local/state/tandem``; a private directory (0700)."""

from __future__ import annotations

import os
from pathlib import Path

from tandem import _ipc


class StateError(Exception):
    """The state file cannot be used (corrupt, locked, from a newer version)."""


def state_dir_path() -> Path:
    """Where the job manager's state is (not created here)."""
    explicit = os.environ.get("TANDEM_STATE_DIR")
    if explicit:
        path = Path(explicit)
    elif os.environ.get("XDG_STATE_HOME"):
        path = Path(os.environ["XDG_STATE_HOME"]) / "tandem"
    else:
        path = Path.home() / ".local" / "state" / "tandem"
    return path.expanduser().resolve()


def state_dir() -> Path:
    """The private directory of the job manager's state, created if needed."""
    return private_dir(state_dir_path())


def private_dir(path: Path) -> Path:
    """``path``, private to this user (:func:`tandem._ipc.private_dir`): it holds each job's
    environment (tokens, keys) and the commands the supervisor runs."""
    return _ipc.private_dir(path, "state directory", "TANDEM_STATE_DIR", StateError)
