"""A run kept as a JSON-lines file that another process forwards to the real store.

The job manager's supervisors track each job with watch's own :class:`~tandem.watch.Run`
(the same samplers and summary as ``tandem run``) into a :class:`SpoolStore`: appending a
line costs microseconds and imports nothing, so no job pays MLflow's import (seconds of
CPU). One helper per state directory tails every spool (:func:`read_spool`) and writes it
through :class:`~tandem.watch.stores.MlflowStore` while the job runs.

Writes never raise: a full or read-only disk keeps the lines in memory (up to
``MAX_PENDING``), says so once through ``warn``, and writes them when it can again, so the
job goes on and nothing sampled is lost while memory allows.

Each line is one object: ``{"open": {"name", "tags", "start_ms"}}``, ``{"points": [[key,
value, ms, step], ...]}``, ``{"tags": {...}}``, ``{"artifact": path}`` (a copy kept beside
the spool) or ``{"close": status}``.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tandem.watch.point import Point

MAX_PENDING = 200_000  # lines held in memory while the disk refuses them


class SpoolStore:
    """A :class:`~tandem.watch.stores.RunStore` that appends to ``path``."""

    def __init__(self, path: Path, warn: Callable[[str], None] | None = None) -> None:
        self.path = Path(path)
        self.run_id = ""
        self.where = f"{self.path} (forwarded to MLflow by the job manager)"
        self._pending: list[str] = []
        self._warn = warn or (lambda _m: None)
        self._said = False
        self.dropped = 0

    def _append(self, entry: dict[str, Any]) -> None:
        self._pending.append(json.dumps(entry) + "\n")
        try:
            with open(self.path, "a") as f:
                f.write("".join(self._pending))
        except OSError as exc:
            if len(self._pending) > MAX_PENDING:
                self.dropped += len(self._pending) - MAX_PENDING
                del self._pending[: len(self._pending) - MAX_PENDING]
            if not self._said:
                self._said = True
                self._warn(f"cannot write {self.path} ({exc.strerror}); metrics kept in memory until it can")
            return
        if self._said:
            self._said = False
            self._warn(f"{self.path} is writable again; the metrics held meanwhile are written")
        self._pending.clear()

    def open(self, name: str, tags: dict[str, str], start_ms: int | None = None) -> None:
        self._append({"open": {"name": name, "tags": tags, "start_ms": start_ms}})

    def log(self, points: list[Point]) -> None:
        self._append({"points": [[p.key, p.value, p.timestamp_ms, p.step] for p in points]})

    def set_tags(self, tags: dict[str, str]) -> None:
        self._append({"tags": {k: str(v) for k, v in tags.items()}})

    def log_artifact(self, path: Path) -> None:
        # The caller may remove it right after (a temporary summary.json): keep a copy.
        keep = self.path.parent / "artifacts" / Path(path).name
        try:
            keep.parent.mkdir(exist_ok=True)
            shutil.copyfile(path, keep)
        except OSError as exc:
            self._warn(f"artifact {path} not kept: {exc}")
            return
        self._append({"artifact": str(keep)})

    def close(self, status: str, end_ms: int | None = None) -> None:
        self._append({"close": status})  # its end is the daemon's to say (Tracker.ended)

    def flush(self) -> bool:
        """Write what is held; whether nothing is held any more."""
        if self._pending:
            try:
                with open(self.path, "a") as f:
                    f.write("".join(self._pending))
                self._pending.clear()
            except OSError:
                return False
        return True


def read_spool(path: Path, offset: int) -> tuple[list[dict[str, Any]], int]:
    """The complete lines of ``path`` from byte ``offset``, and the offset after them (a
    line still being written is left for the next read)."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return [], offset
    end = data.rfind(b"\n") + 1
    entries = []
    for line in data[:end].splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue  # a line cut short when its writer was killed
        if isinstance(entry, dict):
            entries.append(entry)
    return entries, offset + end


def points_of(entry: dict[str, Any]) -> list[Point]:
    return [Point(k, float(v), int(ms), int(step)) for k, v, ms, step in entry.get("points", ())]
