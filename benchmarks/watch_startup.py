"""What starting ``tandem run`` costs the command it tracks, with several runs started at once.

Starts ``--runs`` (default 3) ``tandem run`` wrappers together, each around a busy,
CPU-bound Python command, against one new MLflow SQLite store, and measures:

* **the wrapper's start-up CPU-seconds**: CPU time (user + system) of the ``tandem run``
  process and of any helper it started (everything under the wrapper but the tracked
  command's own tree), from its launch until its command has run ``--window`` seconds;
* **the command's CPU share**: the tracked command's own CPU-seconds in its first
  ``--window`` seconds of life, as a share of one core (1.0 = it had a core to itself);
* **launch to command start**: wall seconds from launching ``tandem run`` to the command
  running (the wrapper's imports and checks).

Whichever ``tandem`` the interpreter imports is measured, so the same script measures a
checkout of another commit: ``PYTHONPATH=/tmp/base/src python benchmarks/watch_startup.py
--label before``. Repeats ``--reps`` times and reports the median of each figure (the
machine is shared: figures vary from run to run). Writes
``benchmarks/results/watch_startup[-LABEL].{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

# The tracked command: records its pid and start, then its own CPU time at ``window``
# seconds after its start, and stays busy until ``total`` seconds.
BUSY = """
import json, os, sys, time
t0 = time.monotonic(); out = sys.argv[1]; window = float(sys.argv[2]); total = float(sys.argv[3])
open(out + ".pid", "w").write(f"{os.getpid()} {time.time()}")
cpu_at = None
while time.monotonic() - t0 < total:
    sum(range(20000))
    if cpu_at is None and time.monotonic() - t0 >= window:
        cpu_at = time.process_time()
start = time.time() - (time.monotonic() - t0)
json.dump({"pid": os.getpid(), "start": start, "cpu_at_window": cpu_at}, open(out, "w"))
"""


def _cpu(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


def _wrapper_side_cpu(wrapper: psutil.Process, command_pid: int | None) -> float:
    """CPU of the wrapper and its descendants, except the tracked command's tree."""
    total = _cpu(wrapper)
    for child in wrapper.children(recursive=False):
        if child.pid == command_pid:
            continue
        try:
            total += _cpu(child) + sum(_cpu(c) for c in child.children(recursive=True))
        except psutil.NoSuchProcess:
            pass  # an ended helper: its time is in the wrapper's children_* figures below
    t = wrapper.cpu_times()
    return total + t.children_user + t.children_system


def one_round(runs: int, window: float, tmp: Path) -> list[dict]:
    store = tmp / "mlflow.db"
    total = window + 2.0
    procs, outs, launched = [], [], []
    for i in range(runs):
        out = tmp / f"cmd{i}.json"
        command = [sys.executable, "-c", BUSY, str(out), str(window), str(total)]
        argv = [sys.executable, "-m", "tandem.cli", "run", "-q", "--store", f"sqlite:///{store}",
                "-n", f"startup-{i}", "--", *command]  # fmt: skip
        launched.append(time.time())
        procs.append(subprocess.Popen(argv, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        outs.append(out)
    wrappers = [psutil.Process(p.pid) for p in procs]
    # Each wrapper is measured when its command has run ``window`` seconds: its imports,
    # the store's opening and the first writes, all of which compete with the commands.
    startup_cpu: list[float | None] = [None] * runs
    deadline = time.monotonic() + 300
    while any(c is None for c in startup_cpu):
        if time.monotonic() > deadline:
            raise SystemExit("the commands did not start in 300 s")
        for i, (w, out) in enumerate(zip(wrappers, outs)):
            pid_file = Path(f"{out}.pid")
            if startup_cpu[i] is not None or not pid_file.exists():
                continue
            fields = pid_file.read_text().split()
            if len(fields) == 2 and time.time() >= float(fields[1]) + window:
                startup_cpu[i] = _wrapper_side_cpu(w, int(fields[0]))
        time.sleep(0.05)
    rows = []
    for i, p in enumerate(procs):
        _, err = p.communicate(timeout=300)
        if p.returncode != 0:
            raise SystemExit(f"tandem run {i} failed ({p.returncode}): {err.decode()[-2000:]}")
        cmd = json.loads(outs[i].read_text())
        rows.append({
            "wrapper_startup_cpu_s": startup_cpu[i],
            "command_cpu_share": cmd["cpu_at_window"] / window,
            "launch_to_command_s": cmd["start"] - launched[i],
        })  # fmt: skip
    return rows


def _commit() -> str:
    import tandem

    src = Path(tandem.__file__).resolve().parents[2]

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(src), *args], capture_output=True, text=True).stdout.strip()

    return git("rev-parse", "--short", "HEAD") + ("+changes" if git("status", "--porcelain", "src") else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3, help="tandem runs started together")
    ap.add_argument("--window", type=float, default=6.0, help="seconds after start that are measured")
    ap.add_argument("--reps", type=int, default=3, help="rounds; the median is reported")
    ap.add_argument("--label", default="", help="a name for this measurement (before, after, ...)")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = ap.parse_args()
    all_rows: list[dict] = []
    for rep in range(args.reps):
        with tempfile.TemporaryDirectory(prefix="tandem-startup-") as tmp:
            rows = one_round(args.runs, args.window, Path(tmp))
        all_rows += rows
        print(f"round {rep + 1}: " + ", ".join(f"{r['command_cpu_share']:.2f}" for r in rows)
              + " command CPU share", file=sys.stderr)  # fmt: skip
    keys = ("wrapper_startup_cpu_s", "command_cpu_share", "launch_to_command_s")
    med = {k: statistics.median(r[k] for r in all_rows) for k in keys}
    result = {
        "label": args.label,
        "commit": _commit(),
        "tandem": str(Path(__import__("tandem").__file__).resolve().parent),
        "when": time.strftime("%Y-%m-%d %H:%M"),
        "machine": f"{platform.machine()}, {os.cpu_count()} logical CPUs",
        "load_before": os.getloadavg()[0],
        # On a shared machine, run it at a higher priority than the others' work (nice -n -10),
        # so that the figures show tandem's processes competing with each other.
        "niceness": os.getpriority(os.PRIO_PROCESS, 0),
        "runs": args.runs, "window_s": args.window, "reps": args.reps,
        "median": med,
        "rows": all_rows,
    }  # fmt: skip
    names = {
        "wrapper_startup_cpu_s": f"wrapper CPU-s (+ helpers), launch to command's {args.window:g} s",
        "command_cpu_share": f"command's CPU in its first {args.window:g} s, share of one core",
        "launch_to_command_s": "launch of `tandem run` to the command's start, s",
    }
    lines = [
        f"# `tandem run` start-up, {args.runs} runs started together ({args.label or 'unlabelled'})",
        "",
        f"{result['when']}, {result['machine']}, commit {result['commit']}: "
        f"`python benchmarks/watch_startup.py --label {args.label}` at niceness {result['niceness']}, "
        f"1-min load {result['load_before']:.1f} before (median of {len(all_rows)} runs "
        f"in {args.reps} rounds).",
        "",
        "| figure | median | min | max |",
        "|---|---|---|---|",
    ]
    for k in keys:
        vals = [r[k] for r in all_rows]
        lines.append(f"| {names[k]} | {med[k]:.2f} | {min(vals):.2f} | {max(vals):.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    suffix = f"-{args.label}" if args.label else ""
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"watch_startup{suffix}.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / f"watch_startup{suffix}.md").write_text(text)


if __name__ == "__main__":
    main()
