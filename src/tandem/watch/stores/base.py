"""What a run store is: where one run is kept, behind one small synchronous interface.

A run store owns one run: ``open(name, tags)`` creates it, then ``log(points)``,
``set_tags``, ``log_artifact`` and ``close(status)``. The implementations are MLflow
(:mod:`~tandem.watch.stores.mlflow_store`) and a plain directory
(:mod:`~tandem.watch.stores.file_store`). The asynchronous, batched front that the tracker
talks to, with the fall-back to a file when a store fails, is in ``tandem.watch._recording``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

from tandem.watch.point import Point

DEFAULT_DB = "mlflow.db"
FALLBACK_DIR = "tandem-runs"


def default_store_uri() -> str:
    """``$MLFLOW_TRACKING_URI`` if set, else a SQLite store ``mlflow.db`` in the working directory."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd() / DEFAULT_DB}"


class RunStore(Protocol):
    run_id: str
    where: str

    def open(self, name: str, tags: dict[str, str], start_ms: int | None = None) -> None: ...
    def log(self, points: list[Point]) -> None: ...
    def set_tags(self, tags: dict[str, str]) -> None: ...
    def log_artifact(self, path: Path) -> None: ...
    def close(self, status: str) -> None: ...
