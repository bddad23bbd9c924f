"""Entry point of the recorder helper process (``python -m tandem.watch._recording.helper_main``).

Kept apart from :mod:`tandem.watch._recording.helper` (the parent's side, which the tracker
imports), so that running this module does not import that one twice. The protocol is
described there.
"""

from __future__ import annotations

import os
import pickle
import queue
import signal
import sys
import threading
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from tandem.watch._recording.recorder import Recorder
from tandem.watch.point import Point

_events: Connection | None = None  # to the parent; fd 1 is pointed at stderr (see main)


def _emit(event: str, recorder: Recorder, **extra: Any) -> None:
    message = {
        "event": event,
        "run_id": recorder.run_id,
        "where": recorder.where,
        "fell_back": recorder.fell_back,
        **extra,
    }
    try:
        assert _events is not None
        _events.send(message)
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
    # The helper is in a process group of its own (no Ctrl-C from the terminal) and ignores
    # the signals a scheduler or a closing terminal sends the script: it must outlive the
    # script to record how the run ended. SIGTTOU: a background group's warning on a
    # terminal set to ``stty tostop`` must not stop it.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGTTOU):
        signal.signal(sig, signal.SIG_IGN)
    # Below the run's priority before the heavy work (MLflow's import): see helper.py.
    os.nice(int(os.environ.get("TANDEM_HELPER_NICE", "0")))
    # Events go to the parent on a private copy of fd 1; fd 1 itself (and anything MLflow
    # prints there, such as "View run ... at ..." for a server store) goes to stderr.
    _events = Connection(os.dup(1), readable=False)
    os.dup2(2, 1)
    parent = int(os.environ.get("TANDEM_WRITER_PARENT", os.getppid()))
    inbox = Connection(os.dup(0), writable=False)
    try:
        kind, payload = inbox.recv()
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
                messages.put(inbox.recv())
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
    _emit("closed", recorder, ok=ok)
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
