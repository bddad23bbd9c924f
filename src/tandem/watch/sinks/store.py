"""Where a run is kept: the run stores (MLflow, a plain directory) behind one small interface.

A run store is synchronous and owns one run: ``open(name, tags)`` creates it, then
``log(points)``, ``set_tags``, ``log_artifact`` and ``close(status)``. The asynchronous,
batched front that the tracker talks to, with the fall-back to a file when MLflow cannot be
reached, is :class:`tandem.watch.sinks.recorder.Recorder`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from tandem.watch.sinks.csv_sink import CsvSink, Point, read_points

DEFAULT_DB = "mlflow.db"
FALLBACK_DIR = "tandem-runs"
LOCK_TIMEOUT_S = 60.0


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


def _quiet_mlflow() -> None:
    # MLflow logs INFO lines on first use of a SQLite store (creating tables) and on every
    # run it ends ("View run ..."); a wrapped command's output should not be interleaved.
    import logging

    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)


@contextlib.contextmanager
def _sqlite_init_lock(uri: str) -> Iterator[None]:
    """Serialise first use of a SQLite store: MLflow creates the tables on first use, and
    two runs starting together on a new file would both try (one then fails)."""
    if not uri.startswith("sqlite:///"):
        yield
        return
    db = Path(uri.removeprefix("sqlite:///"))
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{db}.lock", "a") as lock:
        deadline = time.monotonic() + LOCK_TIMEOUT_S
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:  # its holder is stopped (Ctrl-Z) or stuck
                    raise TimeoutError(f"{db}.lock held by another run for {LOCK_TIMEOUT_S:.0f} s") from None
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


class MlflowStore:
    """One MLflow run through the public client API (any tracking URI MLflow accepts)."""

    MAX_METRICS_PER_CALL = 1000  # MLflow's log_batch limit

    def __init__(self, uri: str | None = None, experiment: str = "tandem"):
        self.uri = uri or default_store_uri()
        self.experiment = experiment
        self.run_id = ""
        self.where = self.uri
        self._client = None

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
            client = MlflowClient(tracking_uri=self.uri)
            return client, self._experiment_id(client)

    def open(self, name: str, tags: dict[str, str], start_ms: int | None = None) -> None:
        client, exp_id = self.prepare()
        run = client.create_run(exp_id, start_time=start_ms, run_name=name, tags=tags)
        self._client, self.run_id = client, run.info.run_id
        self.where = f"{self.uri} (experiment {self.experiment!r}, run {self.run_id})"

    def _artifact_location(self) -> str | None:
        """For a SQLite store, artifacts (output.log, summary.json) go beside the database
        (``mlruns/<experiment>/`` next to ``mlflow.db``), not into whatever directory the
        first run happened to start in, which is MLflow's default."""
        if not self.uri.startswith("sqlite:///"):
            return None
        db = Path(self.uri.removeprefix("sqlite:///")).resolve()
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

    def log_artifact(self, path: Path) -> None:
        self._client.log_artifact(self.run_id, str(path))

    def close(self, status: str) -> None:
        self._client.set_terminated(self.run_id, status=status)


class FileStore:
    """A run as a plain directory: ``metrics.csv`` (or ``.parquet``), ``run.json``, artifacts.

    Metrics go to the CSV as they come (a killed run keeps them); with ``fmt="parquet"`` the
    CSV is also written out as ``metrics.parquet`` when the run closes.
    """

    def __init__(self, root: str | Path = FALLBACK_DIR, fmt: str = "csv"):
        if fmt not in ("csv", "parquet"):
            raise ValueError(f"file format must be 'csv' or 'parquet', not {fmt!r}")
        self.root = Path(root)
        self.fmt = fmt
        self.run_id = ""
        self.where = str(self.root)
        self.dir: Path | None = None
        self._csv: CsvSink | None = None
        self._meta: dict = {}

    def open(self, name: str, tags: dict[str, str], start_ms: int | None = None) -> None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.run_id = f"{name}-{stamp}-{os.getpid()}"
        self.dir = self.root / self.run_id
        self.dir.mkdir(parents=True, exist_ok=False)
        self._csv = CsvSink(self.dir / "metrics.csv")
        self._meta = {
            "run_id": self.run_id,
            "name": name,
            "tags": dict(tags),
            "start_time_ms": int(time.time() * 1000),
            "status": "RUNNING",
        }
        self._write_meta()
        self.where = str(self.dir)

    def _write_meta(self) -> None:
        assert self.dir is not None
        tmp = self.dir / "run.json.tmp"
        tmp.write_text(json.dumps(self._meta, indent=2))
        tmp.replace(self.dir / "run.json")

    def log(self, points: list[Point]) -> None:
        assert self._csv is not None
        self._csv.log(points)

    def set_tags(self, tags: dict[str, str]) -> None:
        self._meta["tags"].update({k: str(v) for k, v in tags.items()})
        self._write_meta()

    def log_artifact(self, path: Path) -> None:
        assert self.dir is not None
        shutil.copy2(path, self.dir / Path(path).name)

    def close(self, status: str) -> None:
        assert self._csv is not None and self.dir is not None
        self._csv.close()
        if self.fmt == "parquet":
            write_parquet(self.dir / "metrics.csv", self.dir / "metrics.parquet")
        self._meta.update(status=status, end_time_ms=int(time.time() * 1000))
        self._write_meta()


def write_parquet(csv_path: Path, out: Path) -> None:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise RuntimeError("the parquet format needs pyarrow: pip install pyarrow") from None
    points = read_points(csv_path)
    table = pa.table(
        {
            "timestamp_ms": pa.array([p.timestamp_ms for p in points], pa.int64()),
            "step": pa.array([p.step for p in points], pa.int64()),
            "key": pa.array([p.key for p in points], pa.string()),
            "value": pa.array([p.value for p in points], pa.float64()),
        }
    )
    pq.write_table(table, out)
