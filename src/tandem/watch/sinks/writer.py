"""The recorder in a helper process, for ``track()`` inside a training script.

Importing MLflow costs a training process about 2 CPU-seconds and 200 MB of memory, which
would then be charged to the very run being measured. So ``track()`` starts this small
helper (``python -m tandem.watch.sinks.writer``), which the process-tree sampler leaves
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
import signal
import struct
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, BinaryIO

from tandem.watch.sinks.csv_sink import Point
from tandem.watch.sinks.recorder import Recorder

_LEN = struct.Struct(">I")


def _send(stream: BinaryIO, message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_LEN.pack(len(data)) + data)
    stream.flush()


def _recv(stream: BinaryIO) -> Any:
    head = stream.read(_LEN.size)
    if len(head) < _LEN.size:
        raise EOFError
    data = stream.read(_LEN.unpack(head)[0])
    return pickle.loads(data)


class RecorderProcess:
    """The parent's side: the same calls as :class:`Recorder`, served by the helper."""

    def __init__(
        self,
        store: Any,
        name: str,
        tags: dict[str, str],
        fallback_dir: str | Path = "tandem-runs",
        flush_s: float = 2.0,
    ):
        self.name = name
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tandem.watch.sinks.writer"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
        )
        self.pid = self._proc.pid
        self._lock = threading.Lock()
        self.opened = threading.Event()
        self._closed = threading.Event()
        self._run_id = ""
        self._where = str(getattr(store, "where", ""))
        self.cpu_seconds = 0.0
        self.fell_back = False
        self._reader = threading.Thread(target=self._read_events, name="tandem-writer-events", daemon=True)
        self._reader.start()
        self._put(("init", (store, name, tags, str(fallback_dir), flush_s)))

    def _put(self, message: Any) -> None:
        assert self._proc.stdin is not None
        with self._lock:
            try:
                _send(self._proc.stdin, message)
            except (BrokenPipeError, ValueError):
                pass  # the helper is gone; it said why on stderr

    def _read_events(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            event = json.loads(line)
            self._run_id = event.get("run_id", self._run_id)
            self._where = event.get("where", self._where)
            self.fell_back = event.get("fell_back", self.fell_back)
            self.cpu_seconds = event.get("cpu_seconds", self.cpu_seconds)
            if event["event"] == "opened":
                self.opened.set()
            elif event["event"] == "closed":
                self._closed.set()
        self.opened.set()  # the helper ended: nobody waits forever

    def log(self, points: list[Point]) -> None:
        if points:
            self._put(("points", [tuple(p) for p in points]))

    def set_tags(self, tags: dict[str, str]) -> None:
        self._put(("tags", dict(tags)))

    def log_artifact(self, path: Path) -> None:
        self._put(("artifact", str(path)))

    def wait_open(self, timeout: float = 60.0) -> bool:
        return self.opened.wait(timeout)

    def close(self, status: str = "FINISHED", timeout: float = 60.0) -> bool:
        self._put(("close", status))
        done = self._closed.wait(timeout)
        try:
            self._proc.wait(timeout=10 if done else 1)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        for stream in (self._proc.stdin, self._proc.stdout):
            if stream is not None:
                stream.close()
        return done

    @property
    def run_id(self) -> str:
        return self._run_id

    @property
    def where(self) -> str:
        return self._where


def _emit(event: str, recorder: Recorder, **extra: Any) -> None:
    sys.stdout.write(
        json.dumps(
            {
                "event": event,
                "run_id": recorder.run_id,
                "where": recorder.where,
                "fell_back": recorder.fell_back,
                **extra,
            }
        )
        + "\n"
    )
    sys.stdout.flush()


def main() -> int:
    # Ctrl-C goes to the whole foreground process group; the helper must outlive the
    # script's own handling of it to record how the run ended.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stdin = sys.stdin.buffer
    kind, payload = _recv(stdin)
    if kind != "init":
        print(f"tandem writer: expected init, got {kind!r}", file=sys.stderr)
        return 2
    store, name, tags, fallback_dir, flush_s = payload
    recorder = Recorder(store, name, tags, fallback_dir=fallback_dir, flush_s=flush_s)
    recorder.wait_open(600)
    _emit("opened", recorder)
    status = "KILLED"  # unless the parent says otherwise
    while True:
        try:
            kind, payload = _recv(stdin)
        except EOFError:
            break
        if kind == "points":
            recorder.log([Point(*p) for p in payload])
        elif kind == "tags":
            recorder.set_tags(payload)
        elif kind == "artifact":
            recorder.log_artifact(Path(payload))
        elif kind == "close":
            status = payload
            break
    recorder.close(status, timeout=300)
    t = os.times()  # the helper's whole CPU time: imports, store, every write
    _emit("closed", recorder, cpu_seconds=t.user + t.system)
    return 0


if __name__ == "__main__":
    sys.exit(main())
