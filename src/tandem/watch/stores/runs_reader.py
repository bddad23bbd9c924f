"""Reading tracked runs back from an MLflow store, for ``tandem report``: one small interface,
:class:`RunsReader`, and two readers of it.

- :class:`SqliteRuns`: a ``sqlite:`` store (the default, and the job manager's) read through
  MLflow's own tables, read-only, with no MLflow import. Importing MLflow and its SQL store
  costs about two seconds of a core, which was most of a report of a sweep; the job
  manager's sweep report has read these tables the same way since issue 46
  (:mod:`tandem.place.sweep_report`). Only MLflow's long-standing tables and columns are
  read (``experiments``, ``runs``, ``tags``, ``metrics``, ``latest_metrics``); a file that
  lacks one is no store this reader knows, and :func:`open_reader` hands it to MLflow.
- :class:`MlflowRuns`: any other store (a tracking server, a file store), through
  ``MlflowClient``.

Both give the same :class:`StoredRun` records; both read only, and neither creates a store.
"""

from __future__ import annotations

import math
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tandem.watch.stores.mlflow_store import sqlite_path

# MLflow's tables and the columns read here, checked once when a store is opened.
_NEEDED = {
    "experiments": {"experiment_id", "lifecycle_stage"},
    "runs": {"run_uuid", "name", "status", "start_time", "end_time", "lifecycle_stage", "experiment_id"},
    "tags": {"key", "value", "run_uuid"},
    "metrics": {"key", "value", "timestamp", "run_uuid", "step", "is_nan"},
    "latest_metrics": {"key", "value", "run_uuid", "is_nan"},
}


@dataclass
class StoredRun:
    """A run as a store holds it: what a report needs of it."""

    run_id: str
    name: str
    start_ms: int
    end_ms: int | None
    status: str
    tags: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)  # each key's latest value


class RunsReader(Protocol):
    """The lookups a report makes, each of the store's active runs only."""

    def tagged(self, tags: dict[str, str]) -> list[StoredRun]:
        """The runs that carry every one of ``tags``, oldest first."""
        ...

    def get(self, run_id: str) -> StoredRun | None: ...

    def named(self, name: str) -> StoredRun | None:
        """The newest run of that name."""
        ...

    def recent(self, limit: int) -> list[StoredRun]:
        """The newest runs, newest first."""
        ...

    def history(self, run_id: str, key: str) -> list[tuple[int, float]]:
        """Every value of a metric: ``(timestamp ms, value)``, oldest first."""
        ...

    def close(self) -> None: ...


class NotAStore(Exception):
    """A SQLite file without MLflow's tables (as this reader knows them)."""


class SqliteRuns:
    """A ``sqlite:`` MLflow store read through its tables, read-only (see the module's doc)."""

    def __init__(self, path: Path) -> None:
        self.db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            for table, columns in _NEEDED.items():
                have = {row[1] for row in self.db.execute(f"PRAGMA table_info({table})")}
                if not columns <= have:
                    raise NotAStore(f"{path}: no MLflow table {table} with {sorted(columns - have)}")
        except (sqlite3.Error, NotAStore):
            self.db.close()
            raise

    def close(self) -> None:
        self.db.close()

    _ACTIVE = (
        "SELECT r.run_uuid, r.name, r.start_time, r.end_time, r.status FROM runs r "
        "JOIN experiments e ON e.experiment_id = r.experiment_id "
        "WHERE r.lifecycle_stage = 'active' AND e.lifecycle_stage = 'active'"
    )

    def _runs(
        self, where: str = "", args: tuple[Any, ...] = (), order: str = "ASC", limit: int = -1
    ) -> list[StoredRun]:
        sql = f"{self._ACTIVE}{where} ORDER BY r.start_time {order}, r.run_uuid LIMIT ?"
        runs = [
            StoredRun(run, name or run, int(start or 0), int(end) if end else None, status or "")
            for run, name, start, end, status in self.db.execute(sql, (*args, limit))
        ]
        by_id = {r.run_id: r for r in runs}
        ids = list(by_id)
        for i in range(0, len(ids), 500):  # SQLite's bound parameters, at most 999 a query
            chunk = ids[i : i + 500]
            marks = ", ".join("?" for _ in chunk)
            for run, key, value in self.db.execute(
                f"SELECT run_uuid, key, value FROM tags WHERE run_uuid IN ({marks})", chunk
            ):
                by_id[run].tags[key] = value
            for run, key, value, is_nan in self.db.execute(
                f"SELECT run_uuid, key, value, is_nan FROM latest_metrics WHERE run_uuid IN ({marks})", chunk
            ):
                by_id[run].metrics[key] = math.nan if is_nan else float(value)
        return runs

    def tagged(self, tags: dict[str, str]) -> list[StoredRun]:
        where, args = "", []
        for k, (key, value) in enumerate(tags.items()):
            where += (
                f" AND EXISTS (SELECT 1 FROM tags t{k} WHERE t{k}.run_uuid = r.run_uuid"
                f" AND t{k}.key = ? AND t{k}.value = ?)"
            )
            args += [key, value]
        return self._runs(where, tuple(args))

    def get(self, run_id: str) -> StoredRun | None:
        found = self._runs(" AND r.run_uuid = ?", (run_id,))
        return found[0] if found else None

    def named(self, name: str) -> StoredRun | None:
        found = self._runs(" AND r.name = ?", (name,), order="DESC", limit=1)
        return found[0] if found else None

    def recent(self, limit: int) -> list[StoredRun]:
        return self._runs(order="DESC", limit=limit)

    def history(self, run_id: str, key: str) -> list[tuple[int, float]]:
        rows = self.db.execute(
            "SELECT timestamp, value, is_nan FROM metrics WHERE run_uuid = ? AND key = ?"
            " ORDER BY timestamp, value",
            (run_id, key),
        )
        return [(int(ts), math.nan if is_nan else float(value)) for ts, value, is_nan in rows]


def _quote(value: str) -> str:
    return value.replace("'", "\\'")  # inside an MLflow filter string's quotes


class MlflowRuns:
    """Any MLflow store through ``MlflowClient`` (imported here: seconds of a core)."""

    def __init__(self, uri: str) -> None:
        from mlflow.tracking import MlflowClient

        from tandem.watch.stores.mlflow_store import _quiet_mlflow

        self.client = MlflowClient(tracking_uri=uri)
        _quiet_mlflow()

    def close(self) -> None:
        pass

    @staticmethod
    def _record(mlrun: Any) -> StoredRun:
        info = mlrun.info
        return StoredRun(
            info.run_id,
            info.run_name or info.run_id,
            int(info.start_time or 0),
            int(info.end_time) if info.end_time else None,
            info.status or "",
            dict(mlrun.data.tags),
            {k: float(v) for k, v in mlrun.data.metrics.items()},
        )

    def _search(
        self, filter_string: str = "", order: str = "ASC", limit: int | None = None
    ) -> list[StoredRun]:
        experiments = [e.experiment_id for e in self.client.search_experiments()]
        kwargs: dict[str, Any] = {"order_by": [f"attributes.start_time {order}"]}
        if filter_string:
            kwargs["filter_string"] = filter_string
        if limit is not None:
            kwargs["max_results"] = limit
        return [self._record(r) for r in self.client.search_runs(experiments, **kwargs)]

    def tagged(self, tags: dict[str, str]) -> list[StoredRun]:
        return self._search(" and ".join(f"tags.`{k}` = '{_quote(v)}'" for k, v in tags.items()))

    def get(self, run_id: str) -> StoredRun | None:
        try:
            run = self.client.get_run(run_id)
        except Exception:  # MLflow raises its own for an unknown id
            return None
        return self._record(run) if run.info.lifecycle_stage == "active" else None

    def named(self, name: str) -> StoredRun | None:
        found = self._search(f"attributes.run_name = '{_quote(name)}'", order="DESC", limit=1)
        return found[0] if found else None

    def recent(self, limit: int) -> list[StoredRun]:
        return self._search(order="DESC", limit=limit)

    def history(self, run_id: str, key: str) -> list[tuple[int, float]]:
        return sorted((m.timestamp, m.value) for m in self.client.get_metric_history(run_id, key))


def open_reader(uri: str) -> SqliteRuns | MlflowRuns:
    """The reader of an existing store: its tables for a ``sqlite:`` file MLflow made, else
    MLflow's client. ImportError where MLflow is needed and missing."""
    db = sqlite_path(uri)
    if db is not None and db.is_file() and "?" not in uri:
        try:
            return SqliteRuns(db)
        except (sqlite3.Error, NotAStore):
            pass  # not (as this reader knows) an MLflow store: MLflow says what it is
    return MlflowRuns(uri)
