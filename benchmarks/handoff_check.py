"""Re-measure only the hand-off latency of tandem.share.

    python benchmarks/handoff_check.py [--policy wait|skip] [--rounds N] [--json PATH]
    TANDEM_SHARE_TABLE=0 python benchmarks/handoff_check.py     # the socket transport

The time of a consumer's ``next()`` while the producer is ahead, for batches of 1 MB, 38.5 MB
and 100 MB (``src/tandem/bench/handoff.py``). That file is loaded from this checkout and
uses tandem's public API only, so the same script measures another checkout's tandem:
``PYTHONPATH=/path/to/other/src python benchmarks/handoff_check.py``.
Prints a table (median and p90 per round) and optionally writes the figures as JSON.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path

_DIR = Path(__file__).resolve().parents[1] / "src" / "tandem" / "bench"


def _load_handoff():
    # As a top-level module from this checkout's file, so that it measures whichever tandem
    # is imported; appended to sys.path (spawned producers inherit it) so nothing is shadowed.
    sys.path.append(str(_DIR))
    return importlib.import_module("handoff")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", choices=("wait", "skip"), default="wait")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--json", dest="json_path")
    args = parser.parse_args()
    handoff = _load_handoff()
    transport = "socket only" if os.environ.get("TANDEM_SHARE_TABLE") == "0" else "default"
    print(f"policy {args.policy}, transport {transport}")
    rows = []
    for r in range(args.rounds):
        for shape in handoff.SHAPES:
            row = {"round": r, **handoff.measure(shape, args.policy)}
            rows.append(row)
            label = "x".join(map(str, row["shape"]))
            mb, median, p90 = row["mbytes"], row["median_ms"], row["p90_ms"]
            print(f"{label:>14} {mb:6.1f} MB  median {median:.3f} ms  p90 {p90:.3f} ms", flush=True)
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump({"policy": args.policy, "transport": transport, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
