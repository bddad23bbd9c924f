"""What a selection cost: its scoring tracked by tandem.watch as an MLflow run.

Wall seconds and CPU-seconds are measured here (this process and its children); energy
comes from watch's summary, measured (RAPL, NVML) and estimated kept apart, never added
together. Where watch's extra is not installed, the run is left out and the meta says why.
The store is the state directory's ``mlflow.db`` (the job manager's), unless
``$MLFLOW_TRACKING_URI`` names another.
"""

from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psutil

from tandem.dirs import mlflow_store_uri, private_file, state_dir


def _cpu_s() -> float:
    t = psutil.Process().cpu_times()
    return t.user + t.system + t.children_user + t.children_system


@contextmanager
def measure(name: str, tags: dict[str, str], track: bool = True) -> Iterator[dict[str, Any]]:
    """Fills the yielded dict with the cost of the block (after it ends)."""
    cost: dict[str, Any] = {}
    run = None
    if not track:
        cost["tracking"] = "off (track=False)"
    elif importlib.util.find_spec("mlflow") is None:
        cost["tracking"] = "not tracked: MLflow is not installed (pip install 'tandem[watch]')"
    else:
        try:
            from tandem.watch.stores.mlflow_store import MlflowStore
            from tandem.watch.tracker import Run

            directory = state_dir()  # the private state directory, refused as it is
            if not os.environ.get("MLFLOW_TRACKING_URI"):
                private_file(directory / "mlflow.db")  # 0600 before SQLite makes it with the umask
            store = MlflowStore(mlflow_store_uri(directory), "tandem-select")
            run = Run(name=name, tags=tags, store=store, quiet=True, interval=0.5).start()
        except Exception as exc:  # noqa: BLE001 - the selection goes on without a run
            cost["tracking"] = f"not tracked: {type(exc).__name__}: {exc}"
    t0, cpu0 = time.monotonic(), _cpu_s()
    try:
        yield cost
    except BaseException:
        if run is not None:
            run.stop("FAILED")
        raise
    cost["wall_s"] = time.monotonic() - t0
    cost["cpu_s"] = _cpu_s() - cpu0
    if run is not None:
        summary = run.stop("FINISHED")
        cost["mlflow_run_id"] = run.run_id
        cost["mlflow_store"] = mlflow_store_uri()
        for key in ("energy_measured_joules", "energy_estimated_joules"):
            if key in summary:
                cost[key] = summary[key]
