"""What tracking costs: the tracker's own CPU time at 1 s and 0.1 s intervals.

Tracked workload: a training-like process tree (a parent with torch imported and 4 child
processes, also with torch, like DataLoader workers), each busy 10 ms in every 100 ms and
touching fresh memory now and then, so that CPU times, memory and host figures change at
every sample as in real training (unchanged values are stored less often, so an idle
workload would flatter the tracker). Two ways of tracking are measured:

* ``tandem run``: the wrapper is a separate process (sampling) with a helper process (the
  MLflow writer); their CPU time is read from /proc between a warm-up point (imports done,
  store open) and the end, and divided by the wall time between them.
* ``track()`` inside the script: the sampling thread runs in the training process (its CPU
  time is reported by the summary as ``tracker_cpu_seconds``); the MLflow writer is a helper
  process, measured the same way as the wrapper.

Run: ``python benchmarks/watch_overhead.py [--seconds 30]``. Writes
``benchmarks/results/watch_overhead.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

WORK = (
    "import time, torch\n"
    "def work(seconds):\n"
    "    end, keep = time.time() + seconds, []\n"
    "    while time.time() < end:\n"
    "        t = time.time() + 0.01\n"
    "        while time.time() < t: pass\n"
    "        keep.append(bytearray(64 << 10)); keep = keep[-200:]\n"
    "        time.sleep(0.09)\n"
)
TREE = (
    WORK
    + """
import subprocess, sys
kids = [subprocess.Popen([sys.executable, "-c", {work!r} + "work({s})"]) for _ in range(4)]
work({s})
for k in kids:
    k.wait()
"""
)

TRACKED_SCRIPT = (
    WORK
    + """
import subprocess, sys
from tandem.watch import track
with track(name="overhead-track-{interval}", interval={interval}, quiet=True) as run:
    kids = [subprocess.Popen([sys.executable, "-c", {work!r} + "work({s})"]) for _ in range(4)]
    work({s})
    for k in kids:
        k.wait()
print("TRACKER_CPU", run.summary["tracker_cpu_seconds"], run.summary["duration_s"])
"""
)


def _cpu(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


SETTLE_S = 7.0


def _wait_open(store: str, name: str, timeout: float = 60.0) -> None:
    """Until the run is in the store (imports done, store open), then past the recorder's
    first flush (every 5 s), which writes the points queued while the store was opening:
    one-time start-up work, not the steady state this measures."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(store)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        exps = [e.experiment_id for e in client.search_experiments()]
        if exps and client.search_runs(exps, filter_string=f"attributes.run_name = '{name}'"):
            time.sleep(SETTLE_S)
            return
        time.sleep(0.5)
    raise RuntimeError(f"run {name} did not open in {timeout} s")


def _measure(pid: int, seconds: float) -> dict:
    """CPU of the tracker process over ``seconds`` of steady state."""
    tracker = psutil.Process(pid)
    c0, t0 = _cpu(tracker), time.monotonic()
    time.sleep(seconds)
    c1, t1 = _cpu(tracker), time.monotonic()
    return {"tracker_cpu_s": c1 - c0, "wall_s": t1 - t0, "percent_of_one_core": 100 * (c1 - c0) / (t1 - t0)}


def _helper_pid(parent: int, timeout: float = 30.0) -> int | None:
    """The recorder helper process of ``parent`` (``tandem.watch._recording.helper_main``;
    ``writer_process`` before 2026-11-22), or None. Older ``tandem run`` wrappers wrote from a
    thread instead: matching both names lets this script measure older checkouts too."""
    me = psutil.Process(parent)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for c in me.children():
            if any(n in " ".join(c.cmdline()) for n in ("helper_main", "writer_process")):
                return c.pid
        time.sleep(0.1)
    return None


def bench_run(interval: float, seconds: float, store: str) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "tandem.cli",
        "run",
        "-q",
        "-i",
        str(interval),
        "--store",
        store,
        "-n",
        f"overhead-run-{interval}",
        "--",
        sys.executable,
        "-c",
        TREE.format(s=seconds + 25, work=WORK),
    ]
    proc = subprocess.Popen(cmd)
    _wait_open(store, f"overhead-run-{interval}")
    helper_pid = _helper_pid(proc.pid, timeout=2.0)  # open and settled: it exists by now, if any
    helper = psutil.Process(helper_pid) if helper_pid is not None else None
    h0 = _cpu(helper) if helper is not None else 0.0
    out = _measure(proc.pid, seconds)
    writer = 100 * (_cpu(helper) - h0) / out["wall_s"] if helper is not None else 0.0
    sampling = out["percent_of_one_core"]
    out.update(
        mode="tandem run",
        interval_s=interval,
        exit_code=proc.wait(seconds + 120),
        sampling_percent_of_one_core=sampling,
        writer_helper_percent_of_one_core=writer,
        percent_of_one_core=sampling + writer,
    )
    return out


def bench_track(interval: float, seconds: float, store: str, workdir: Path) -> dict:
    script = workdir / f"tracked_{interval}.py"
    script.write_text(TRACKED_SCRIPT.format(interval=interval, s=seconds + 25, work=WORK))
    env = {**os.environ, "MLFLOW_TRACKING_URI": store}
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env)
    _wait_open(store, f"overhead-track-{interval}")
    helper_pid = _helper_pid(proc.pid)
    if helper_pid is None:
        raise RuntimeError("track(): no recorder helper found")
    writer = _measure(helper_pid, seconds)
    stdout, _ = proc.communicate(timeout=seconds + 120)
    line = next(ln for ln in stdout.splitlines() if ln.startswith("TRACKER_CPU"))
    sampler_cpu, duration = (float(x) for x in line.split()[1:])
    return {
        "mode": "track()",
        "interval_s": interval,
        "exit_code": proc.returncode,
        "sampling_percent_of_one_core": 100 * sampler_cpu / duration,
        "writer_helper_percent_of_one_core": writer["percent_of_one_core"],
        "percent_of_one_core": 100 * sampler_cpu / duration + writer["percent_of_one_core"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=30.0, help="length of each tracked run")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        store = f"sqlite:///{tmp}/mlflow.db"
        # Create the store's tables first: this script's own lookups (_wait_open) would
        # otherwise race the first run's helper to create them.
        from mlflow.tracking import MlflowClient

        MlflowClient(store).search_experiments()
        for interval in (1.0, 0.1):
            rows.append(bench_run(interval, args.seconds, store))
            print(rows[-1], flush=True)
            rows.append(bench_track(interval, args.seconds, store, Path(tmp)))
            print(rows[-1], flush=True)
    result = {
        "when": time.strftime("%Y-%m-%d %H:%M"),
        "machine": f"{platform.machine()}, {psutil.cpu_count()} logical CPUs",
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip(),
        "command": "python benchmarks/watch_overhead.py --seconds " + f"{args.seconds:g}",
        "tracked_tree": (
            "5 processes with torch imported (a parent and 4 children), each busy 10 ms in every 100 ms"
        ),
        "runs": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "watch_overhead.json").write_text(json.dumps(result, indent=2))
    lines = [
        "# Tracker overhead (measured, this machine)",
        "",
        f"{result['when']}, {result['machine']}, commit {result['commit']}: `{result['command']}`.",
        f"Tracked: {result['tracked_tree']}. Target: under 1% of one core at a 1 s interval.",
        "",
        "| mode | interval | tracker CPU, % of one core | met (<1% at 1 s) |",
        "|---|---|---|---|",
    ]
    for r in rows:
        pct = r["percent_of_one_core"]
        met = ("yes" if pct < 1.0 else "no") if r["interval_s"] == 1.0 else "-"
        detail = ""
        sampler = "sampling thread" if r["mode"] == "track()" else "wrapper"
        detail = (
            f" ({sampler} {r['sampling_percent_of_one_core']:.2f} + "
            f"writer helper {r['writer_helper_percent_of_one_core']:.2f})"
        )
        lines.append(f"| {r['mode']} | {r['interval_s']:g} s | {pct:.2f}{detail} | {met} |")
    (args.out / "watch_overhead.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
