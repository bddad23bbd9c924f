"""The metrics CSV of a file-store run: real files, exact round trip, appends, and a killed
writer keeps its rows."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tandem.watch.point import Point
from tandem.watch.stores.csv_file import CsvSink, read_points


def test_round_trip_and_append(tmp_path):
    path = tmp_path / "run" / "metrics.csv"
    first = [Point("system/host/cpu_percent", 12.5, 1_700_000_000_000, 0),
             Point("system/process_tree/rss_bytes", 3.0e9, 1_700_000_000_000, 0)]  # fmt: skip
    with CsvSink(path) as sink:
        sink.log(first)
    with CsvSink(path) as sink:  # reopening appends, without a second header
        sink.log([Point("samples_per_s", 0.1 + 0.2, 1_700_000_001_000, 7)])
    points = read_points(path)
    assert points[:2] == first
    assert points[2] == Point("samples_per_s", 0.1 + 0.2, 1_700_000_001_000, 7), "floats exact"
    assert path.read_text().count("timestamp_ms") == 1


def test_rows_survive_a_killed_writer(tmp_path):
    path = tmp_path / "m.csv"
    code = (
        "import os, signal\n"
        "from tandem.watch.point import Point\n"
        "from tandem.watch.stores.csv_file import CsvSink\n"
        f"s = CsvSink({str(path)!r})\n"
        "s.log([Point('k', 1.0, 1, 0)])\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    subprocess.run([sys.executable, "-c", code], timeout=60)
    assert read_points(path) == [Point("k", 1.0, 1, 0)]


def test_reading_a_foreign_file_is_a_clear_error(tmp_path):
    other = tmp_path / "x.csv"
    other.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="not a tandem metrics CSV"):
        read_points(other)
