"""A run kept as a plain directory, for people who do not want MLflow (and the fall-back
when a store fails): ``metrics.csv`` (or also ``.parquet``), ``run.json``, artifacts."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from tandem.watch.point import Point
from tandem.watch.stores.base import FALLBACK_DIR
from tandem.watch.stores.csv_file import CsvSink, read_points


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

    def close(self, status: str, end_ms: int | None = None) -> None:
        assert self._csv is not None and self.dir is not None
        self._csv.close()
        if self.fmt == "parquet":
            write_parquet(self.dir / "metrics.csv", self.dir / "metrics.parquet")
        self._meta.update(status=status, end_time_ms=end_ms or int(time.time() * 1000))
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
