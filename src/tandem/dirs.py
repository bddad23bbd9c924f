"""Where tandem keeps its state on this machine (a path only: nothing is created here).

``$TANDEM_STATE_DIR``, else ``$XDG_STATE_HOME/tandem``, else ``~/.local/state/tandem``: the
job manager's jobs (:mod:`tandem.place`) and the stored data selections
(:mod:`tandem.select`) live there.
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
