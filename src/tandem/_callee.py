"""The job side of ``tandem.jobs.call``: ``python -m tandem._callee CALL_DIR`` loads the
pickled callable and its arguments, runs it, and leaves ``result.pkl`` beside them:
``(True, value, "")`` or ``(False, exception, traceback text)``. Exits 0 or 1 accordingly,
so the job manager records how it ended.

It starts with nothing of the job's directory on its import path (``python -P``: a ``tandem``
folder there is never imported in place of tandem); the caller's own folders
(``paths.json``: where its process found its modules) are searched after this interpreter's
own, so that a function pickled by reference to a module of the caller's project is found,
and a package planted in one of them never stands in for an installed one."""

from __future__ import annotations

import json
import pickle
import sys
import traceback
from pathlib import Path


def main(call_dir: Path) -> int:
    listed = call_dir / "paths.json"
    if listed.exists():
        sys.path.extend(p for p in json.loads(listed.read_text()) if p not in sys.path)
    fn, args, kwargs = pickle.loads((call_dir / "call.pkl").read_bytes())
    try:
        outcome = (True, fn(*args, **kwargs), "")
    except BaseException as exc:  # noqa: BLE001 - every failure goes back to the caller
        trace = traceback.format_exc()
        print(trace, file=sys.stderr, flush=True)
        try:
            pickle.dumps(exc)
        except Exception:  # an exception that cannot travel: its text does
            exc = RuntimeError(f"{type(exc).__name__}: {exc}")
        outcome = (False, exc, trace)
    try:
        data = pickle.dumps(outcome)
    except Exception as exc:  # a return value that cannot be pickled
        data = pickle.dumps((False, TypeError(f"the return value cannot be pickled: {exc}"), ""))
    tmp = call_dir / "result.pkl.tmp"
    tmp.write_bytes(data)
    tmp.replace(call_dir / "result.pkl")
    return 0 if outcome[0] else 1


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
