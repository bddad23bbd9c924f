"""A run kept in MLflow, through its public client API (any tracking URI MLflow accepts).

MLflow is imported only when a store is opened: importing it costs seconds of CPU, which
the tracker spends off the tracked run's path (``tandem.watch._recording``).
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from tandem.watch.point import Point
from tandem.watch.stores.base import default_store_uri

LOCK_TIMEOUT_S = 60.0


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI; None for any other store (an in-memory one
    included)."""
    path = uri.removeprefix("sqlite:///")
    return Path(path) if uri.startswith("sqlite:///") and path and not path.startswith(":memory:") else None


def _quiet_mlflow() -> None:
    # MLflow logs INFO lines on first use of a SQLite store (creating tables) and on every
    # run it ends ("View run ..."); a wrapped command's output should not be interleaved.
    import logging

    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)


_LOCKS: dict[str, FileLock] = {}  # one per store file in a process: taken again by its holder, it is held


@contextlib.contextmanager
def _sqlite_init_lock(uri: str) -> Iterator[None]:
    """Serialise first use of a SQLite store: MLflow creates the tables on first use, and
    two runs starting together on a new file would both try (one then fails). The same
    thread may take it again while it holds it (MLflow's store built in :meth:`MlflowStore.
    prepare` takes it through :mod:`.mlflow_plugin`)."""
    db = sqlite_path(uri)
    if db is None:
        yield
        return
    db.parent.mkdir(parents=True, exist_ok=True)
    path = os.path.abspath(f"{db}.lock")
    lock = _LOCKS.setdefault(path, FileLock(path, timeout=LOCK_TIMEOUT_S, mode=0o600))
    try:
        lock.acquire()
    except Timeout:  # its holder is stopped (Ctrl-Z) or stuck
        raise TimeoutError(f"{db}.lock held by another run for {LOCK_TIMEOUT_S:.0f} s") from None
    try:
        yield
    finally:
        lock.release()


def _check_owned(db: Path) -> None:
    """A store file that is there must be this user's own (and a link to it, the user's
    own link): another user's file or link, planted in a shared folder, would send the
    runs' tags and output to them."""
    me = os.getuid()
    for what, st in (("link", os.lstat(db)), ("file", os.stat(db))):
        if st.st_uid != me and not (what == "link" and not stat.S_ISLNK(st.st_mode)):
            raise OSError(
                f"{db}: the {what} belongs to uid {st.st_uid}, not to you; a store tandem writes "
                "must be a file of yours (move it away, or give --store)"
            )


def _create_private(db: Path) -> None:
    """A new store file ``db`` made 0600 (SQLite gives its journal, ``-wal`` and ``-shm`` files
    the database's mode), and the ``mlruns`` folder beside it, where tandem's runs keep their
    artifacts (a command's output among them), 0700. A file that is there is left as it is.
    The caller holds the store's init lock."""
    try:
        os.close(os.open(db, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        _check_owned(db)
        return
    with contextlib.suppress(FileExistsError):
        (db.parent / "mlruns").mkdir(mode=0o700)


def _create(uri: str) -> None:
    """:func:`create_store` once its lock is held."""
    if (db := sqlite_path(uri)) is not None:
        from tandem.watch.stores._sqlite_seed import seed

        _create_private(db)
        seed(db)  # where it has no tables yet: a copy of MLflow's, seconds less than its migrations


def create_store(uri: str) -> None:
    """Make the store ``uri`` where it is a new SQLite file, as every tandem command makes one:
    under its init lock, private to this user (:func:`_create_private`) and holding MLflow's
    tables. Any other store, and a file that is there already, is left as it is. ``OSError``
    where it cannot be made; ``TimeoutError`` where another holds the lock too long."""
    with _sqlite_init_lock(uri):
        _create(uri)


class MlflowStore:
    """One MLflow run through the public client API (any tracking URI MLflow accepts)."""

    MAX_METRICS_PER_CALL = 1000  # MLflow's log_batch limit

    def __init__(self, uri: str | None = None, experiment: str = "tandem"):
        self.uri = uri or default_store_uri()
        self.experiment = experiment
        self.run_id = ""
        self.where = self.uri
        self._client: Any = None  # an MlflowClient from open() on (mlflow is imported lazily)

    def prepare(self) -> tuple[Any, str]:
        """Import MLflow, create the store's tables and the experiment if new; return
        ``(client, experiment id)``. Seconds of CPU the first time: the demo calls it before
        its clocks start."""
        # MLflow prints "View run ... at ..." to stdout when a run against a server ends;
        # under ``tandem run`` that would land in the command's output.
        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
        from mlflow.tracking import MlflowClient

        _quiet_mlflow()  # after the import: mlflow sets its logger up when imported
        with _sqlite_init_lock(self.uri):
            _create(self.uri)
            client = MlflowClient(tracking_uri=self.uri)
            return client, self._experiment_id(client)

    def open(self, name: str, tags: dict[str, str], start_ms: int | None = None) -> None:
        client, exp_id = self.prepare()
        run = client.create_run(exp_id, start_time=start_ms, run_name=name, tags=tags)
        self._client, self.run_id = client, run.info.run_id
        self.where = f"{self.uri} (experiment {self.experiment!r}, run {self.run_id})"

    def resume(self, run_id: str) -> None:
        """Go on writing the run ``run_id`` (opened before, by another process)."""
        client, _ = self.prepare()
        self._client, self.run_id = client, run_id
        self.where = f"{self.uri} (experiment {self.experiment!r}, run {self.run_id})"

    def _artifact_location(self) -> str | None:
        """For a SQLite store, artifacts (output.log, summary.json) go beside the database
        (``mlruns/<experiment>/`` next to ``mlflow.db``), not into whatever directory the
        first run happened to start in, which is MLflow's default."""
        db = sqlite_path(self.uri)
        if db is None:
            return None
        db = db.resolve()
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in self.experiment)
        return (db.parent / "mlruns" / safe).as_uri()

    def _experiment_id(self, client) -> str:  # type: ignore[no-untyped-def]
        exp = client.get_experiment_by_name(self.experiment)  # creates the tables if new
        if exp is not None:
            return exp.experiment_id
        try:
            return client.create_experiment(self.experiment, artifact_location=self._artifact_location())
        except Exception:
            # another run created it since (a server store, which the lock does not cover)
            exp = client.get_experiment_by_name(self.experiment)
            if exp is None:
                raise
            return exp.experiment_id

    def log(self, points: list[Point]) -> None:
        from mlflow.entities import Metric

        metrics = [Metric(p.key, float(p.value), int(p.timestamp_ms), int(p.step)) for p in points]
        for i in range(0, len(metrics), self.MAX_METRICS_PER_CALL):
            self._client.log_batch(self.run_id, metrics=metrics[i : i + self.MAX_METRICS_PER_CALL])

    def set_tags(self, tags: dict[str, str]) -> None:
        from mlflow.entities import RunTag

        if tags:
            self._client.log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def log_params(self, params: dict[str, str]) -> dict[str, str]:
        """Write the params the run has not got: MLflow never changes one, so what the run's
        own code logged under a name stays. Returns the run's values that differ from these."""
        from mlflow.entities import Param

        if not params:
            return {}
        have = self._client.get_run(self.run_id).data.params
        new = [Param(k, v) for k, v in params.items() if k not in have]
        for i in range(0, len(new), 100):  # MLflow's log_batch takes 100 params a call
            self._client.log_batch(self.run_id, params=new[i : i + 100])
        return {k: have[k] for k, v in params.items() if k in have and have[k] != v}

    def log_artifact(self, path: Path) -> None:
        self._client.log_artifact(self.run_id, str(path))

    def close(self, status: str, end_ms: int | None = None) -> None:
        self._client.set_terminated(self.run_id, status=status, end_time=end_ms)
