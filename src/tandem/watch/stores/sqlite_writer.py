"""Runs written straight into a SQLite MLflow store's tables, with no MLflow import.

Importing MLflow's client and SQL store costs 2-3 s of a core. The job manager's MLflow
helper paid it once per daemon and every ``tandem run`` once per command: about a sixth of
a small sweep's CPU, and more than the manager's whole share of it (issue 49). What tandem
writes to a run is small and fixed: the run (``runs`` and its ``mlflow.runName`` tag), tags,
metrics with each key's latest value, params, its end, and files under its artifact
directory. :class:`SqliteTables` writes those rows as MLflow's SQL store does (the same
rows, checks and limits), each call one transaction.

It writes only a store whose tables are at a schema version it was checked against
(:data:`KNOWN_SCHEMAS`, alembic's revision in ``alembic_version``): a store of another
MLflow version, one whose experiment keeps its artifacts anywhere but a local folder, or
anything unexpected goes through MLflow's client (:class:`~tandem.watch.stores.mlflow_store.
MlflowStore` decides). The tests check what is written here against MLflow reading it back.
"""

from __future__ import annotations

import math
import posixpath
import re
import sqlite3
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import unquote, urlparse

from tandem.watch.point import Point

# Alembic revisions of MLflow's tracking schema whose tables this module writes: the rows of
# ``runs``, ``tags``, ``params``, ``metrics``, ``latest_metrics`` and ``experiments`` as
# MLflow 3.17's SQL store writes them (``dc11669786a5``); MLflow 3.18's (``f4a9b2c7d1e6``) adds
# tables of other features only, these six are the same. A new MLflow adds its revision here
# once tests/watch/ pass against it (the Makefile's MLFLOW_PIN says which one they run with).
KNOWN_SCHEMAS = frozenset({"dc11669786a5", "f4a9b2c7d1e6"})

# MLflow's limits (mlflow.utils.validation): a longer tag value is cut, a longer param refused.
MAX_KEY = 250
MAX_TAG_VALUE = 8000
MAX_PARAM_VALUE = 6000
RUN_NAME_TAG = "mlflow.runName"
USER_TAG = "mlflow.user"
BUSY_TIMEOUT_S = 60.0  # a job's own MLflow may hold the file's write lock meanwhile

_NAME = re.compile(r"^[/\w.\- :]*$")


def check_key(key: str, what: str = "key") -> str:
    """``key`` where MLflow takes it as a metric, param or tag name, else ``ValueError``
    (MLflow's rules: these characters, no path that normalises to another name)."""
    norm = posixpath.normpath(key)
    if not key or not _NAME.match(key) or norm != key or norm == "." or norm.startswith(("..", "/")):
        raise ValueError(
            f"invalid {what} {key!r}: names may contain only letters, digits, '_', '-', '.', "
            "' ', ':' and '/', and must not read as another path"
        )
    if len(key) > MAX_KEY:
        raise ValueError(f"invalid {what} {key[:40]!r}...: longer than {MAX_KEY} characters")
    return key


def stored_value(value: float) -> tuple[float, int]:
    """A metric's value as MLflow's SQL store keeps it: ``(value, is_nan)``; NaN is 0 with
    the flag, an infinity the largest float of its sign."""
    if math.isnan(value):
        return 0.0, 1
    if math.isinf(value):
        return (1.7976931348623157e308 if value > 0 else -1.7976931348623157e308), 0
    return float(value), 0


def local_folder(uri: str) -> Path | None:
    """The folder of an artifact location that is a local path or ``file:`` URI; None for
    any other (a bucket, a server's ``mlflow-artifacts:``)."""
    if uri.startswith("/"):
        return Path(uri)
    parsed = urlparse(uri)
    if parsed.scheme == "file" and parsed.netloc in ("", "localhost"):
        return Path(unquote(parsed.path))
    return None


class SqliteTables:
    """One SQLite MLflow store's run tables, written as MLflow writes them (module doc).
    Made by :meth:`open`, which says whether this store's schema is one it knows."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    @classmethod
    def open(cls, db: Path) -> SqliteTables | None:
        """The store file ``db``'s tables, or None where their schema is not one of
        :data:`KNOWN_SCHEMAS` (or the file is no MLflow store)."""
        conn = sqlite3.connect(db, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        try:
            rows = conn.execute("SELECT version_num FROM alembic_version").fetchall()
        except sqlite3.Error:
            rows = []
        if len(rows) != 1 or rows[0][0] not in KNOWN_SCHEMAS:
            conn.close()
            return None
        return cls(conn)

    def close(self) -> None:
        self._conn.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One transaction, holding the write lock from its start (no read-then-upgrade
        deadlock beside another writer)."""
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    # --- experiments ---------------------------------------------------------------------
    def experiment(
        self, name: str, artifact_location: str, default_location: Path
    ) -> tuple[str, Path | None]:
        """The active experiment ``name`` (made with ``artifact_location`` where there is
        none): its id and its artifacts' local folder (None where not local). ``ValueError``
        where one of that name is deleted, as MLflow refuses it. MLflow's own ``Default``
        experiment (id 0, which its UI and client expect) is made first where a new store
        lacks it, as MLflow makes it on opening one, its artifacts in ``default_location``
        (MLflow's would be ``./mlruns/0`` of whichever directory opened the store first)."""
        with self._write() as conn:
            if conn.execute("SELECT 1 FROM experiments WHERE experiment_id = 0").fetchone() is None:
                now = int(time.time() * 1000)
                conn.execute(
                    "INSERT INTO experiments (experiment_id, name, artifact_location, lifecycle_stage, "
                    "creation_time, last_update_time, workspace) "
                    "VALUES (0, 'Default', ?, 'active', ?, ?, 'default')",
                    (str(default_location), now, now),
                )
            row = conn.execute(
                "SELECT experiment_id, artifact_location, lifecycle_stage FROM experiments "
                "WHERE name = ? AND workspace = 'default'",
                (name,),
            ).fetchone()
            if row is None:
                now = int(time.time() * 1000)
                cur = conn.execute(
                    "INSERT INTO experiments (name, artifact_location, lifecycle_stage, creation_time, "
                    "last_update_time, workspace) VALUES (?, ?, 'active', ?, ?, 'default')",
                    (name, artifact_location, now, now),
                )
                row = (cur.lastrowid, artifact_location, "active")
        if row[2] != "active":
            raise ValueError(
                f"MLflow experiment {name!r} is deleted: restore it (mlflow experiments restore) "
                "or name another with --experiment"
            )
        return str(row[0]), local_folder(row[1] or "")

    # --- runs ----------------------------------------------------------------------------
    def create_run(
        self, experiment_id: str, artifacts: Path, name: str, tags: dict[str, str], start_ms: int | None
    ) -> str:
        """A new run, RUNNING, of ``experiment_id`` whose artifacts go to ``artifacts``/ID/
        artifacts; its id. As MLflow's ``create_run``: the ``mlflow.runName`` tag, the user
        from ``mlflow.user``."""
        run_id = uuid.uuid4().hex
        tags = {**tags}
        tags.setdefault(RUN_NAME_TAG, name)
        if tags[RUN_NAME_TAG] != name:
            raise ValueError(
                f"the run's name {name!r} and its tag {RUN_NAME_TAG} {tags[RUN_NAME_TAG]!r} differ"
            )
        checked = _checked_tags(tags)
        uri = (artifacts / run_id / "artifacts").as_uri()
        with self._write() as conn:
            conn.execute(
                "INSERT INTO runs (run_uuid, name, source_type, source_name, entry_point_name, user_id, "
                "status, start_time, end_time, deleted_time, source_version, lifecycle_stage, "
                "artifact_uri, experiment_id) "
                "VALUES (?, ?, 'UNKNOWN', '', '', ?, 'RUNNING', ?, NULL, NULL, '', 'active', ?, ?)",
                (run_id, name, tags.get(USER_TAG, "unknown"), start_ms, uri, int(experiment_id)),
            )
            conn.executemany(
                "INSERT INTO tags (key, value, run_uuid) VALUES (?, ?, ?)", _rows(checked, run_id)
            )
        return run_id

    def _active(self, conn: sqlite3.Connection, run_id: str) -> None:
        row = conn.execute("SELECT lifecycle_stage FROM runs WHERE run_uuid = ?", (run_id,)).fetchone()
        if row is None:
            raise LookupError(f"no run {run_id} in this MLflow store")
        if row[0] != "active":
            raise ValueError(f"MLflow run {run_id} is deleted; it takes no more writes")

    def exists(self, run_id: str) -> None:
        """``LookupError`` where there is no run ``run_id``, ``ValueError`` where it is deleted."""
        self._active(self._conn, run_id)

    def artifact_dir(self, run_id: str) -> Path | None:
        """The run's artifact folder, where it is a local one."""
        row = self._conn.execute("SELECT artifact_uri FROM runs WHERE run_uuid = ?", (run_id,)).fetchone()
        return local_folder(row[0] or "") if row else None

    def set_tags(self, run_id: str, tags: dict[str, str]) -> None:
        """Set (or replace) tags; ``mlflow.runName`` renames the run, as in MLflow."""
        checked = _checked_tags(tags)
        with self._write() as conn:
            self._active(conn, run_id)
            conn.executemany(
                "INSERT INTO tags (key, value, run_uuid) VALUES (?, ?, ?) "
                "ON CONFLICT (key, run_uuid) DO UPDATE SET value = excluded.value",
                _rows(checked, run_id),
            )
            if RUN_NAME_TAG in checked:
                conn.execute("UPDATE runs SET name = ? WHERE run_uuid = ?", (checked[RUN_NAME_TAG], run_id))

    def log_metrics(self, run_id: str, points: Iterable[Point]) -> None:
        """Each point a metric row (one already there is kept once), and each key's latest
        value updated where a point is newer by (step, timestamp, value), as MLflow orders them."""
        rows: dict[tuple[str, int, int, float, int], None] = {}
        for p in points:
            value, nan = stored_value(float(p.value))
            rows[(check_key(p.key, "metric name"), int(p.timestamp_ms), int(p.step), value, nan)] = None
        if not rows:
            return
        newest: dict[str, tuple[int, int, float, int]] = {}
        for key, ts, step, value, nan in rows:
            if key not in newest or (step, ts, value) > newest[key][:3]:
                newest[key] = (step, ts, value, nan)
        with self._write() as conn:
            self._active(conn, run_id)
            conn.executemany(
                "INSERT OR IGNORE INTO metrics (key, timestamp, step, value, is_nan, run_uuid) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                [(*row, run_id) for row in rows],
            )
            for key, (step, ts, value, nan) in newest.items():
                conn.execute(
                    "INSERT INTO latest_metrics (key, value, timestamp, step, is_nan, run_uuid) "
                    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (key, run_uuid) DO UPDATE SET "
                    "value = excluded.value, timestamp = excluded.timestamp, step = excluded.step, "
                    "is_nan = excluded.is_nan WHERE (excluded.step, excluded.timestamp, excluded.value) "
                    "> (latest_metrics.step, latest_metrics.timestamp, latest_metrics.value)",
                    (key, value, ts, step, nan, run_id),
                )

    def params(self, run_id: str) -> dict[str, str]:
        return dict(self._conn.execute("SELECT key, value FROM params WHERE run_uuid = ?", (run_id,)))

    def add_params(self, run_id: str, params: dict[str, str]) -> None:
        """Params the run has not got (one it has is never changed, as in MLflow)."""
        for key, value in params.items():
            check_key(key, "param name")
            if len(value) > MAX_PARAM_VALUE:
                raise ValueError(
                    f"param {key!r}: its value is longer than MLflow's {MAX_PARAM_VALUE} characters"
                )
        with self._write() as conn:
            self._active(conn, run_id)
            conn.executemany(
                "INSERT OR IGNORE INTO params (key, value, run_uuid) VALUES (?, ?, ?)", _rows(params, run_id)
            )

    def set_terminated(self, run_id: str, status: str, end_ms: int) -> None:
        with self._write() as conn:
            self._active(conn, run_id)
            conn.execute(
                "UPDATE runs SET status = ?, end_time = ? WHERE run_uuid = ?", (status, end_ms, run_id)
            )


def _checked_tags(tags: dict[str, str]) -> dict[str, str]:
    """Tags as MLflow stores them: names checked, values cut at its limit."""
    return {check_key(k, "tag name"): str(v)[:MAX_TAG_VALUE] for k, v in tags.items()}


def _rows(values: dict[str, str], run_id: str) -> list[tuple[str, str, str]]:
    return [(k, v, run_id) for k, v in values.items()]
