"""Entry point of the recorder helper process (``python -m tandem.watch.sinks.writer_process``).

Kept apart from :mod:`tandem.watch.sinks.writer`, which the tracker imports, so that
running this module does not import it twice. The protocol is described there.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from tandem.watch.sinks.csv_sink import Point
from tandem.watch.sinks.recorder import Recorder
from tandem.watch.sinks.writer import _recv


def _emit(event: str, recorder: Recorder, **extra: Any) -> None:
    message = {"event": event, "run_id": recorder.run_id, "where": recorder.where,
               "fell_back": recorder.fell_back, **extra}  # fmt: skip
    try:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()
    except OSError:
        pass  # the parent is gone: the run is still ended properly below


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
    try:
        sys.stdout.close()
    except OSError:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
