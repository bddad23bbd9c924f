"""Where the job manager's state lives: ``$TANDEM_STATE_DIR``, else
``$XDG_STATE_HOME/tandem``, else ``~/.local/state/tandem``; a private directory (0700)."""

from __future__ import annotations

from pathlib import Path

from tandem import _ipc
from tandem.dirs import state_dir_path

__all__ = ["StateError", "private_dir", "state_dir", "state_dir_path"]


class StateError(Exception):
    """The state file cannot be used (corrupt, locked, from a newer version)."""


def state_dir() -> Path:
    """The private directory of the job manager's state, created if needed."""
    return private_dir(state_dir_path())


def private_dir(path: Path) -> Path:
    """``path``, private to this user (:func:`tandem._ipc.private_dir`): it holds each job's
    environment (tokens, keys) and the commands the supervisor runs."""
    return _ipc.private_dir(path, "state directory", "TANDEM_STATE_DIR", StateError)
