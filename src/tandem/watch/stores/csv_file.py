"""The metrics file of a file-store run: one CSV row per metric point.

Rows are ``timestamp_ms,step,key,value`` (long format: any set of metrics, readable with
``pandas.read_csv`` or a spreadsheet). Each ``log`` call is written and flushed at once,
so a run that is killed keeps everything logged before.
"""

from __future__ import annotations

import csv
from pathlib import Path

from tandem.watch.point import Point

HEADER = ("timestamp_ms", "step", "key", "value")


class CsvSink:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        new = not self.path.exists() or self.path.stat().st_size == 0
        self._file = self.path.open("a", newline="")
        self._writer = csv.writer(self._file)
        if new:
            self._writer.writerow(HEADER)
            self._file.flush()

    def log(self, points: list[Point]) -> None:
        self._writer.writerows((p.timestamp_ms, p.step, p.key, repr(float(p.value))) for p in points)
        self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()

    def __enter__(self) -> CsvSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_points(path: str | Path) -> list[Point]:
    """The points of a CSV written by :class:`CsvSink`."""
    with Path(path).open(newline="") as f:
        rows = csv.reader(f)
        header = next(rows, None)
        if tuple(header or ()) != HEADER:
            raise ValueError(f"{path} is not a tandem metrics CSV (header {header!r})")
        return [Point(key, float(value), int(ts), int(step)) for ts, step, key, value in rows]
