"""A run kept in MLflow: in a SQLite store whose schema tandem knows, written straight into
its tables (:mod:`~tandem.watch.stores.sqlite_writer`); in any other store, through MLflow's
public client API (any tracking URI MLflow accepts).

MLflow is imported only when a store that needs it is opened: importing it costs seconds of
CPU, which the tracker spends off the tracked run's path (``tandem.watch._recording``).
Also here: how a new SQLite store file is made (:func:`create_store`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from filelock import FileLock, Timeout

from tandem.watch.point import Point
from tandem.watch.stores.base import default_store_uri

if TYPE_CHECKING:
    from tandem.watch.stores.sqlite_writer import SqliteTables

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
    """One MLflow run: written straight into a SQLite store's tables where tandem knows their
    schema (:mod:`~tandem.watch.stores.sqlite_writer`: no MLflow import, seconds of CPU
    less), else through MLflow's public client API (any tracking URI MLflow accepts)."""

    MAX_METRICS_PER_CALL = 1000  # MLflow's log_batch limit

    def __init__(self, uri: str | None = None, experiment: str = "tandem"):
        self.uri = uri or default_store_uri()
        self.experiment = experiment
        self.run_id = ""
        self.where = self.uri
        self._client: Any = None  # an MlflowClient, where MLflow writes (imported lazily)
        self._tables: SqliteTables | None = None  # or the store's tables, written directly
        self._artifacts: Path | None = None  # the experiment's artifact folder, with _tables
        self._experiment_id_now = ""  # once prepared

    def prepare(self) -> str:
        """Make the store if new (its tables, the experiment) and choose how to write it;
        the experiment's id. With MLflow's client, seconds of CPU the first time (its
        import): the demo calls it before its clocks start."""
        if self._tables is not None or self._client is not None:
            return self._experiment_id_now
        with _sqlite_init_lock(self.uri):
            _create(self.uri)
            exp_id = self._prepare_tables()
            if exp_id is None:
                exp_id = self._prepare_client()
        self._experiment_id_now = exp_id
        return exp_id

    def _prepare_tables(self) -> str | None:
        """The experiment's id where this store's tables are written directly, else None."""
        db = sqlite_path(self.uri)
        if db is None or "?" in self.uri or not db.is_file():
            return None
        from tandem.watch.stores.sqlite_writer import SqliteTables

        tables = SqliteTables.open(db)
        if tables is None:
            return None
        location = self._artifact_location()
        assert location is not None  # a sqlite store has one
        try:
            exp_id, folder = tables.experiment(
                self.experiment, location, db.resolve().parent / "mlruns" / "0"
            )
        except Exception:
            tables.close()
            raise
        if folder is None:  # its artifacts go elsewhere than a local folder: MLflow's
            tables.close()
            return None
        self._tables, self._artifacts = tables, folder
        return exp_id

    def _prepare_client(self) -> str:
        # MLflow prints "View run ... at ..." to stdout when a run against a server ends;
        # under ``tandem run`` that would land in the command's output.
        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
        from mlflow.tracking import MlflowClient

        _quiet_mlflow()  # after the import: mlflow sets its logger up when imported
        self._client = MlflowClient(tracking_uri=self.uri)
        return self._experiment_id(self._client)

    def open(self, name: str, tags: dict[str, str], start_ms: int | None = None) -> None:
        exp_id = self.prepare()
        if self._tables is not None:
            assert self._artifacts is not None
            self.run_id = self._tables.create_run(exp_id, self._artifacts, name, tags, start_ms)
        else:
            run = self._client.create_run(exp_id, start_time=start_ms, run_name=name, tags=tags)
            self.run_id = run.info.run_id
        self.where = f"{self.uri} (experiment {self.experiment!r}, run {self.run_id})"

    def resume(self, run_id: str) -> None:
        """Go on writing the run ``run_id`` (opened before, by another process)."""
        self.prepare()
        if self._tables is not None:
            self._tables.exists(run_id)
        self.run_id = run_id
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
        if self._tables is not None:
            self._tables.log_metrics(self.run_id, points)
            return
        from mlflow.entities import Metric

        metrics = [Metric(p.key, float(p.value), int(p.timestamp_ms), int(p.step)) for p in points]
        for i in range(0, len(metrics), self.MAX_METRICS_PER_CALL):
            self._client.log_batch(self.run_id, metrics=metrics[i : i + self.MAX_METRICS_PER_CALL])

    def set_tags(self, tags: dict[str, str]) -> None:
        if not tags:
            return
        if self._tables is not None:
            self._tables.set_tags(self.run_id, {k: str(v) for k, v in tags.items()})
            return
        from mlflow.entities import RunTag

        self._client.log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def log_params(self, params: dict[str, str]) -> dict[str, str]:
        """Write the params the run has not got: MLflow never changes one, so what the run's
        own code logged under a name stays. Returns the run's values that differ from these."""
        if not params:
            return {}
        if self._tables is not None:
            have = self._tables.params(self.run_id)
            self._tables.add_params(self.run_id, {k: v for k, v in params.items() if k not in have})
        else:
            from mlflow.entities import Param

            have = self._client.get_run(self.run_id).data.params
            new = [Param(k, v) for k, v in params.items() if k not in have]
            for i in range(0, len(new), 100):  # MLflow's log_batch takes 100 params a call
                self._client.log_batch(self.run_id, params=new[i : i + 100])
        return {k: have[k] for k, v in params.items() if k in have and have[k] != v}

    def log_artifact(self, path: Path) -> None:
        if self._tables is None:
            self._client.log_artifact(self.run_id, str(path))
            return
        folder = self._tables.artifact_dir(self.run_id)
        if folder is None:
            raise OSError(f"run {self.run_id} keeps its artifacts outside a local folder")
        # As MLflow's local artifact repository: the file copied under its own name.
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, folder / path.name)

    def close(self, status: str, end_ms: int | None = None) -> None:
        if self._tables is not None:
            self._tables.set_terminated(
                self.run_id, status, int(time.time() * 1000) if end_ms is None else end_ms
            )
            return
        self._client.set_terminated(self.run_id, status=status, end_time=end_ms)
