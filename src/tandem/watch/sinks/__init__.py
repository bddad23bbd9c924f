"""Sinks: where samples go. Each takes ``log(points)`` and ``close()``; a point is
``(key, value, timestamp_ms, step)`` with the sample's real time, as MLflow's API has it."""

from tandem.watch.sinks.csv_sink import CsvSink, Point

__all__ = ["CsvSink", "Point"]
