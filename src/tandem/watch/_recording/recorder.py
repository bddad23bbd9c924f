"""The recorder: points to a run store, asynchronous, batched, and never the reason a run fails.

The sampling thread hands points to :meth:`Recorder.log`, which only appends to a queue.
A writer thread opens the run store (MLflow by default: importing it and opening a SQLite
store takes seconds, so the command starts at once and early samples wait in the queue),
then writes in batches every ``flush_s`` seconds. If the store cannot be opened or a write
fails, the writer warns once, saying where the rest goes, opens a file store instead and
carries on there: the run is never stopped and no point after the failure is lost.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tandem.watch.point import Point
from tandem.watch.stores.base import RunStore
from tandem.watch.stores.file_store import FileStore


class Recorder:
    def __init__(
        self,
        store: RunStore,
        name: str,
        tags: dict[str, str],
        fallback_dir: str | Path = "tandem-runs",
        flush_s: float = 5.0,
        warn: Callable[[str], None] | None = None,
    ):
        self.store = store
        self.name = name
        self._tags = dict(tags)
        self._fallback = lambda: FileStore(fallback_dir)
        self.flush_s = flush_s
        self._warn = warn or (lambda msg: print(f"tandem: warning: {msg}", file=sys.stderr, flush=True))
        self.start_ms = int(time.time() * 1000)  # the run's start, not the (later) store opening
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self.opened = threading.Event()
        self.fell_back = False
        self.error: str | None = None
        self.closed_ok = True
        self._thread = threading.Thread(target=self._run, name="tandem-recorder", daemon=True)
        self._thread.start()

    # --- called from other threads -------------------------------------------------------
    def log(self, points: list[Point]) -> None:
        if points:
            self._queue.put(("points", points))

    def set_tags(self, tags: dict[str, str]) -> None:
        self._queue.put(("tags", dict(tags)))

    def log_artifact(self, path: Path) -> None:
        self._queue.put(("artifact", Path(path)))

    def close(self, status: str = "FINISHED", timeout: float = 60.0) -> bool:
        """Write what is queued, end the run; False if that did not finish in ``timeout``."""
        self._queue.put(("close", status))
        self._thread.join(timeout)
        return not self._thread.is_alive() and self.closed_ok

    def wait_open(self, timeout: float = 60.0) -> bool:
        return self.opened.wait(timeout)

    @property
    def run_id(self) -> str:
        return self.store.run_id

    @property
    def where(self) -> str:
        return self.store.where

    # --- the writer thread ---------------------------------------------------------------
    def _run(self) -> None:
        self._guard(lambda: self.store.open(self.name, self._tags, self.start_ms), "open")
        self.opened.set()
        pending: list[Point] = []
        last_flush = time.monotonic()
        while True:
            wait = max(0.0, last_flush + self.flush_s - time.monotonic())
            try:
                kind, item = self._queue.get(timeout=wait)
            except queue.Empty:
                kind, item = "tick", None
            if kind == "points":
                pending.extend(item)
                if len(pending) < 5000 and time.monotonic() - last_flush < self.flush_s:
                    continue
            if pending:  # flush on time, on size, and before any other operation
                batch, pending = pending, []
                # (each op runs before the loop goes on: no late binding, hence B023's noqa)
                self._guard(lambda: self.store.log(batch), "write metrics")  # noqa: B023
            last_flush = time.monotonic()
            if kind == "tags":
                self._tags.update(item)
                self._try(lambda: self.store.set_tags(item), "set tags")  # noqa: B023
            elif kind == "artifact":
                self._try(lambda: self.store.log_artifact(item), f"store {item.name}")  # noqa: B023
            elif kind == "close":
                self._guard(lambda: self.store.close(item), "end the run")  # noqa: B023
                return

    def _try(self, op: Callable[[], None], what: str) -> None:
        """Tags and artifacts: a failure costs that item only (warned), not the store."""
        try:
            op()
        except Exception as exc:
            self._warn(f"could not {what} in {self.store.where}: {type(exc).__name__}: {exc}")

    def _guard(self, op: Callable[[], None], what: str) -> None:
        # ``op`` reads ``self.store`` when called, so after a fall-back it runs on the file store.
        delays = (1.0,) if what == "open" else (1.0, 2.0, 4.0)  # a locked SQLite file, a server hiccup
        for attempt in range(len(delays) + 1):
            try:
                op()
                return
            except Exception as exc:
                if self.fell_back:  # the file store failed too: say so, keep the run going
                    self._warn(f"could not {what} in {self.store.where}: {exc}")
                    return
                failed_where = self.store.where
                self.error = f"{type(exc).__name__}: {exc}"
                if attempt == len(delays):
                    break
                time.sleep(delays[attempt])
        if what == "end the run":
            # Everything else is written: a new store holding only the end would help nobody.
            self.closed_ok = False
            self._warn(f"could not {what} in {failed_where} ({self.error}); it may show as still running")
            return
        self.fell_back = True
        failed = self.store
        self.store = self._fallback()
        try:
            self.store.open(self.name, self._tags, self.start_ms)
        except Exception as exc:
            self.store = _Nowhere()
            self._warn(
                f"could not {what} in {failed_where} ({self.error}) nor open a local "
                f"file store ({exc}); this run's metrics from now on are lost"
            )
        else:
            self._warn(
                f"could not {what} in {failed_where} ({self.error}); "
                f"this run's metrics from now on are kept in {self.store.where}"
            )
        if what != "open":
            try:  # best effort: do not leave the first store's run marked as running
                failed.set_tags({"tandem.continued_in": self.store.where})
                failed.close("FAILED")
            except Exception:
                pass
            self._guard(op, what)


class _Nowhere:
    """Where a run goes when neither its store nor a local file can take it: nowhere (the
    user was warned once); the run itself goes on."""

    run_id = ""
    where = "nowhere"

    def open(self, name: str, tags: dict[str, str], start_ms: int | None = None) -> None: ...
    def log(self, points: list[Point]) -> None: ...
    def set_tags(self, tags: dict[str, str]) -> None: ...
    def log_artifact(self, path: Path) -> None: ...
    def close(self, status: str, end_ms: int | None = None) -> None: ...
