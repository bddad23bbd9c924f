"""Where tandem keeps its state on this machine (paths only: nothing is created here).

``$TANDEM_STATE_DIR``, else ``$XDG_STATE_HOME/tandem``, else ``~/.local/state/tandem``: the
job manager's jobs (:mod:`tandem.place`) and the stored data selections
(:mod:`tandem.select`) live there, and their MLflow runs in its ``mlflow.db``.
"""

from __future__ import annotations

import os
from pathlib import Path


def state_dir_path() -> Path:
    """Where tandem's state is (not created here)."""
    explicit = os.environ.get("TANDEM_STATE_DIR")
    if explicit:
        path = Path(explicit)
    elif os.environ.get("XDG_STATE_HOME"):
        path = Path(os.environ["XDG_STATE_HOME"]) / "tandem"
    else:
        path = Path.home() / ".local" / "state" / "tandem"
    return path.expanduser().resolve()


def mlflow_store_uri(state_dir: Path | None = None) -> str:
    """The MLflow store of tandem's state: ``$MLFLOW_TRACKING_URI``, else the state
    directory's ``mlflow.db`` (the job manager's jobs, its producers, the selections)."""
    directory = state_dir if state_dir is not None else state_dir_path()
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{directory / 'mlflow.db'}"
