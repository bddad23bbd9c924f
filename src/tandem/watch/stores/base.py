"""What a run store is: where one run is kept, behind one small synchronous interface.

A run store owns one run: ``open(name, tags)`` creates it, then ``log(points)``,
``set_tags``, ``log_artifact`` and ``close(status)``. The implementations are MLflow
(:mod:`~tandem.watch.stores.mlflow_store`) and a plain directory
(:mod:`~tandem.watch.stores.file_store`). The asynchronous, batched front that the tracker
talks to, with the fall-back to a file when a store fails, is in ``tandem.watch._recording``.

Also here: what a tracked command is told of its run (:func:`run_env`), so that MLflow in
it writes to that run rather than making a second one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from tandem.watch.point import Point

DEFAULT_DB = "mlflow.db"
FALLBACK_DIR = "tandem-runs"


def default_store_uri() -> str:
    """``$MLFLOW_TRACKING_URI`` if set, else a SQLite store ``mlflow.db`` in the working directory."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd() / DEFAULT_DB}"


def absolute_uri(uri: str) -> str:
    """``uri`` with a relative local path made absolute (against the working directory), so
    that another process, in another directory, reaches the same store: ``sqlite:///x.db``,
    ``file:./mlruns`` and a bare path. Any other URI (a server, ``databricks``) is kept."""
    if uri.startswith("sqlite:///"):
        path = uri.removeprefix("sqlite:///")
        if path and not path.startswith("/") and not path.startswith(":memory:"):
            return f"sqlite:///{os.path.abspath(path)}"
        return uri
    if uri.startswith("file:") and not uri.startswith("file:/"):
        return Path(os.path.abspath(uri.removeprefix("file:"))).as_uri()
    bare = "://" not in uri and ":" not in uri.split("/", 1)[0] and not uri.startswith("databricks")
    if bare:  # a path: MLflow's file store
        return os.path.abspath(uri)
    return uri


# What a tracked command's MLflow is told of its run. MLflow's fluent API resumes the run of
# MLFLOW_RUN_ID at ``mlflow.start_run()`` (and at the first ``mlflow.log_*`` without one);
# Hugging Face's MLflowCallback reads all three; the experiment name is set too because
# that callback calls ``set_experiment($MLFLOW_EXPERIMENT_NAME)`` first, and MLflow refuses
# to resume a run of another experiment than the one set.
RUN_ENV = ("MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_NAME")


def run_env(uri: str, run_id: str, experiment: str) -> dict[str, str]:
    """The environment variables that make MLflow in a child process write to the run
    ``run_id`` of store ``uri`` (see :data:`RUN_ENV`)."""
    return {
        "MLFLOW_TRACKING_URI": absolute_uri(uri),
        "MLFLOW_RUN_ID": run_id,
        "MLFLOW_EXPERIMENT_NAME": experiment,
    }


def with_run_env(env: Mapping[str, str], run: Mapping[str, str]) -> dict[str, str]:
    """``env`` with ``run`` (from :func:`run_env`) set in it; ``MLFLOW_EXPERIMENT_ID`` is
    dropped (it names an experiment and would contradict the run's). An empty ``run``
    (no MLflow run) leaves ``env`` as it is."""
    out = dict(env)
    if run:
        out.pop("MLFLOW_EXPERIMENT_ID", None)
        out.update(run)
    return out


class RunStore(Protocol):
    run_id: str
    where: str

    def open(self, name: str, tags: dict[str, str], start_ms: int | None = None) -> None: ...
    def log(self, points: list[Point]) -> None: ...
    def set_tags(self, tags: dict[str, str]) -> None: ...
    def log_artifact(self, path: Path) -> None: ...
    def close(self, status: str, end_ms: int | None = None) -> None: ...  # end_ms None: now
