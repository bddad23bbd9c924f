"""The recorder in a helper process, for ``track()`` inside a training script.

Importing MLflow and opening a new store cost a training process about 3.7 CPU-seconds and
180 MiB of memory (``benchmarks/watch_costs.py``), which would then be charged to the very
run being measured. So ``track()`` starts this small
helper (``python -m tandem.watch.sinks.writer_process``), which the process-tree sampler leaves
out of the run, and sends it the points over a pipe.

Parent to helper, on stdin: length-prefixed pickles ``(kind, payload)``: ``init``,
``points``, ``tags``, ``artifact``, ``close``. Helper to parent, on stdout: one JSON object
per line: ``{"event": "opened"|"closed", ...}``. If the parent dies, the helper sees end of
file, ends the run as KILLED and exits: a killed script leaves no run marked as running.
"""

from __future__ import annotations

import json
import os
import pickle
import queue
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO

from tandem.watch.sinks.csv_sink import Point

_LEN = struct.Struct(">I")


def _send(stream: BinaryIO, message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_LEN.pack(len(data)) + data)
    stream.flush()


def _recv(stream: BinaryIO) -> Any:
    head = stream.read(_LEN.size)
    if len(head) < _LEN.size:
        raise EOFError
    size = _LEN.unpack(head)[0]
    data = stream.read(size)
    if len(data) < size:  # the writer died mid-message
        raise EOFError
    return pickle.loads(data)


class RecorderProcess:
    """The parent's side: the same calls as :class:`Recorder`, served by the helper.

    Calls only queue their message: a sender thread writes to the pipe, so a training
    loop that logs every step never waits for the helper (which may be busy importing
    MLflow for seconds, with the pipe full).
    """

    def __init__(self, store: Any, name: str, tags: dict[str, str], fallback_dir: str | Path = "tandem-runs",
                 flush_s: float = 5.0):  # fmt: skip
        self.name = name
        env = dict(os.environ)
        # The helper must import this very tandem, even if the script found it by sys.path.
        package_root = str(Path(__file__).resolve().parents[3])
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
        env["TANDEM_WRITER_PARENT"] = str(os.getpid())
        env["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tandem.watch.sinks.writer_process"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True, env=env,
            start_new_session=True,  # no Ctrl-C or hang-up from the script's terminal
        )  # fmt: skip
        self.pid = self._proc.pid
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self.opened = threading.Event()
        self._closed = threading.Event()
        self._run_id = ""
        self._where = str(getattr(store, "where", ""))
        self.cpu_seconds = 0.0
        self.fell_back = False
        self.ended_cleanly = False  # True once the helper said the run is closed
        self._reader = threading.Thread(target=self._read_events, name="tandem-writer-events", daemon=True)
        self._reader.start()
        self._sender = threading.Thread(target=self._send_loop, name="tandem-writer-send", daemon=True)
        self._sender.start()
        self._outbox.put(("init", (store, name, tags, str(fallback_dir), flush_s)))

    def _send_loop(self) -> None:
        assert self._proc.stdin is not None
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
                    _send(self._proc.stdin, message)
                except (BrokenPipeError, ValueError, OSError):
                    return  # the helper is gone; it said why on stderr
                if message[0] == "close":
                    return

    def _read_events(self) -> None:
        assert self._proc.stdout is not None
        try:
            for line in self._proc.stdout:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue  # not one of ours
                self._run_id = event.get("run_id", self._run_id)
                self._where = event.get("where", self._where)
                self.fell_back = event.get("fell_back", self.fell_back)
                self.cpu_seconds = event.get("cpu_seconds", self.cpu_seconds)
                if event.get("event") == "opened":
                    self.opened.set()
                elif event.get("event") == "closed":
                    self.ended_cleanly = bool(event.get("ok", True))
                    self._closed.set()
        except (OSError, ValueError):
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
            print(f"tandem: warning: the run's writer (pid {self.pid}) is still writing to {self._where}; "
                  "it finishes on its own", file=sys.stderr, flush=True)  # fmt: skip
            return False
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass  # it said it is done; it exits on its own
        for stream in (self._proc.stdin, self._proc.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass
        return self.ended_cleanly

    @property
    def run_id(self) -> str:
        return self._run_id

    @property
    def where(self) -> str:
        return self._where
