"""Entry point of the recorder helper process (``python -m tandem.watch.sinks.writer_process``).

Kept apart from :mod:`tandem.watch.sinks.writer`, which the tracker imports, so that
running this module does not import it twice. The protocol is described there.
"""

from __future__ import annotations

import json
import os
import pickle
import queue
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from tandem.watch.sinks.csv_sink import Point
from tandem.watch.sinks.recorder import Recorder
from tandem.watch.sinks.writer import _recv

_events: Any = None  # the pipe to the parent; fd 1 is pointed at stderr (see main)


def _emit(event: str, recorder: Recorder, **extra: Any) -> None:
    message = {"event": event, "run_id": recorder.run_id, "where": recorder.where,
               "fell_back": recorder.fell_back, **extra}  # fmt: skip
    try:
        _events.write(json.dumps(message) + "\n")
        _events.flush()
    except (OSError, ValueError):
        pass  # the parent is gone: the run is still ended properly


def _watch_parent(parent: int, gone: threading.Event) -> None:
    # End of file on stdin can come late: DataLoader workers forked by the script hold
    # the pipe's write end too. So the parent is also checked by pid.
    while not gone.wait(1.0):
        if os.getppid() != parent:
            gone.set()


def main() -> int:
    global _events
    # The helper is in a session of its own (no terminal signals) and ignores the signals a
    # scheduler or a closing terminal sends the script: it must outlive the script to
    # record how the run ended.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    # Events go to the parent on a private copy of fd 1; fd 1 itself (and anything MLflow
    # prints there, such as "View run ... at ..." for a server store) goes to stderr.
    _events = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    parent = int(os.environ.get("TANDEM_WRITER_PARENT", os.getppid()))
    stdin = sys.stdin.buffer
    try:
        kind, payload = _recv(stdin)
    except EOFError:
        return 0
    if kind != "init":
        print(f"tandem writer: expected init, got {kind!r}", file=sys.stderr)
        return 2
    store, name, tags, fallback_dir, flush_s = payload
    recorder = Recorder(store, name, tags, fallback_dir=fallback_dir, flush_s=flush_s)
    messages: queue.SimpleQueue = queue.SimpleQueue()
    gone = threading.Event()

    def read() -> None:
        while True:
            try:
                messages.put(_recv(stdin))
            except (EOFError, OSError, pickle.UnpicklingError):
                gone.set()
                return

    threading.Thread(target=read, name="tandem-writer-read", daemon=True).start()
    threading.Thread(
        target=_watch_parent, args=(parent, gone), name="tandem-writer-parent", daemon=True
    ).start()
    # Reading starts before the store is open (MLflow's import and a slow server take
    # seconds), so the parent's pipe never fills; the recorder queues until it is open.
    recorder.wait_open(600)
    _emit("opened", recorder)
    status = "KILLED"  # unless the parent says otherwise
    while True:
        try:
            kind, payload = messages.get(timeout=0.5)
        except queue.Empty:
            if gone.is_set() and messages.empty():
                break
            continue
        if kind == "points":
            recorder.log([Point(*p) for p in payload])
        elif kind == "tags":
            recorder.set_tags(payload)
        elif kind == "artifact":
            recorder.log_artifact(Path(payload))
        elif kind == "close":
            status = payload
            break
    ok = recorder.close(status, timeout=300)
    t = os.times()  # the helper's whole CPU time: imports, store, every write
    _emit("closed", recorder, cpu_seconds=t.user + t.system, ok=ok)
    try:
        _events.close()
    except OSError:
        pass
    # Everything is written and closed. Leave without interpreter shutdown: the reader
    # thread may sit in a read of stdin (a fork-mode worker of the script holds its write
    # end), and finalising a buffered stream another thread holds aborts Python.
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
