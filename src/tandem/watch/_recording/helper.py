"""The recorder in a low-priority helper process: MLflow's import and writes off the run's path.

Importing MLflow and opening a new store cost about 3.7 CPU-seconds and 180 MiB of memory
(``benchmarks/watch_costs.py``). Inside a training script (``track()``) they would be
charged to the very run being measured; in the ``tandem run`` wrapper they would compete
for the CPU with the command it has just started (and with its neighbours', when several
runs start at once: ``benchmarks/watch_startup.py``). So both start this small helper
(``python -m tandem.watch._recording.helper_main``) at a lower CPU priority (nice
``HELPER_NICE``), which the process-tree sampler leaves out of the run, and send it the
points.

Parent to helper, on the helper's stdin: ``multiprocessing.connection`` messages
``(kind, payload)``: ``init``, ``points``, ``tags``, ``artifact``, ``close``. Helper to
parent, on its stdout: dicts ``{"event": "opened"|"closed", ...}``. If the parent dies, the
helper sees end of file (or its parent's pid change), ends the run as KILLED and exits: a
killed script leaves no run marked as running.
"""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from tandem._safepath import module_command
from tandem.watch.point import Point
from tandem.watch.stores.base import RunStore

# Lower priority than the run: under contention the kernel gives it about a tenth of the
# CPU share of a process at the default priority. Its work is not urgent: points wait in
# its queue, and the run's end waits for it (up to ``Run.stop``'s timeout).
HELPER_NICE = 10


class HelperRecorder:
    """The parent's side: the same calls as :class:`Recorder`, served by the helper.

    Calls only queue their message: a sender thread writes to the pipe, so a training
    loop that logs every step never waits for the helper (which may be busy importing
    MLflow for seconds, with the pipe full).
    """

    def __init__(
        self, store: RunStore, name: str, tags: dict[str, str], fallback_dir: str | Path, flush_s: float
    ):
        self.name = name
        env = dict(os.environ)
        # The helper must import this very tandem, even if the script found it by sys.path.
        package_root = str(Path(__file__).resolve().parents[3])
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
        env["TANDEM_WRITER_PARENT"] = str(os.getpid())
        env["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"
        env["TANDEM_HELPER_NICE"] = str(HELPER_NICE)
        to_helper, from_helper = os.pipe(), os.pipe()  # (read, write) each, not inherited
        try:
            self._proc = subprocess.Popen(
                module_command("tandem.watch._recording.helper_main"),
                stdin=to_helper[0],
                stdout=from_helper[1],
                close_fds=True,
                env=env,
                # Its own process group: a Ctrl-C in the terminal does not reach it. Not its
                # own session: with the kernel's autogroup scheduling (most desktops and
                # servers), a new session is a new scheduling group with a full share of its
                # own, which would undo its lower priority.
                process_group=0,
            )
        finally:
            os.close(to_helper[0])
            os.close(from_helper[1])
        self._out = Connection(to_helper[1], readable=False)
        self._in = Connection(from_helper[0], writable=False)
        self.pid = self._proc.pid
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self.opened = threading.Event()
        self._closed = threading.Event()
        self._run_id = ""
        self._where = str(getattr(store, "where", ""))
        self.fell_back = False
        self.ended_cleanly = False  # True once the helper said the run is closed
        self._reader = threading.Thread(target=self._read_events, name="tandem-writer-events", daemon=True)
        self._reader.start()
        self._sender = threading.Thread(target=self._send_loop, name="tandem-writer-send", daemon=True)
        self._sender.start()
        self._outbox.put(("init", (store, name, tags, str(fallback_dir), flush_s)))

    def _send_loop(self) -> None:
        while True:
            messages = [self._outbox.get()]
            while True:  # take everything queued: consecutive points go as one message
                try:
                    messages.append(self._outbox.get_nowait())
                except queue.Empty:
                    break
            merged: list[tuple[str, Any]] = []
            for kind, payload in messages:
                if kind == "points" and merged and merged[-1][0] == "points":
                    merged[-1][1].extend(payload)
                else:
                    merged.append((kind, list(payload) if kind == "points" else payload))
            for message in merged:
                try:
                    self._out.send(message)
                except (ValueError, OSError):
                    return  # the helper is gone; it said why on stderr
                if message[0] == "close":
                    return

    def _read_events(self) -> None:
        try:
            while True:
                event = self._in.recv()
                self._run_id = event.get("run_id", self._run_id)
                self._where = event.get("where", self._where)
                self.fell_back = event.get("fell_back", self.fell_back)
                if event.get("event") == "opened":
                    self.opened.set()
                elif event.get("event") == "closed":
                    self.ended_cleanly = bool(event.get("ok", True))
                    self._closed.set()
        except (EOFError, OSError, ValueError):
            pass
        finally:
            self.opened.set()  # the helper ended: nobody waits forever
            self._closed.set()

    def log(self, points: list[Point]) -> None:
        if points:
            self._outbox.put(("points", [tuple(p) for p in points]))

    def set_tags(self, tags: dict[str, str]) -> None:
        self._outbox.put(("tags", dict(tags)))

    def log_artifact(self, path: Path) -> None:
        self._outbox.put(("artifact", str(path)))

    def wait_open(self, timeout: float = 60.0) -> bool:
        return self.opened.wait(timeout)

    def close(self, status: str = "FINISHED", timeout: float = 60.0) -> bool:
        """End the run; False (the caller warns) unless the helper said it closed it cleanly.

        On a timeout the helper is not killed: it holds the points not yet written (a slow
        store, a server retrying) and finishes on its own; it watches for this process's end."""
        deadline = time.monotonic() + timeout
        self._outbox.put(("close", status))
        self._sender.join(timeout)
        self._closed.wait(max(0.0, deadline - time.monotonic()))
        if not self._closed.is_set():
            print(
                f"tandem: warning: the run's writer (pid {self.pid}) is still writing to {self._where}; "
                "it finishes on its own",
                file=sys.stderr,
                flush=True,
            )
            return False
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass  # it said it is done; it exits on its own
        self._out.close()
        self._reader.join(5)  # it has seen "closed"; it ends at the helper's end of file
        return self.ended_cleanly

    @property
    def run_id(self) -> str:
        return self._run_id

    @property
    def where(self) -> str:
        return self._where
