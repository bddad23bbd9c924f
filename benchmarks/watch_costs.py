"""Where the tracker's time goes: the unit costs behind tandem.watch's design choices.

Measures on this machine:
* importing MLflow and opening a new SQLite store, in a fresh process that has already
  loaded torch and tandem (CPU-seconds, peak RSS growth): why ``track()`` writes from a
  helper process outside the run;
* MLflow's ``log_batch`` CPU time per metric point on a SQLite store: why unchanged values
  are not stored again;
* one ``smaps_rollup`` read (PSS/USS) of a process with torch imported: why PSS is read
  within a time budget;
* each default sampler's CPU time per sample on a tree of 5 torch processes.

Run: ``python benchmarks/watch_costs.py``. Writes ``benchmarks/results/watch_costs.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

# What a training process that already has torch and tandem loaded would pay for MLflow.
IMPORT_PROBE = """
import json, os, resource, sys, time
import torch
from tandem.watch.stores import MlflowStore
t0 = os.times(); r0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
store = MlflowStore(sys.argv[1])
store.prepare()
t1 = os.times(); r1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"cpu_s": t1.user + t1.system - t0.user - t0.system, "rss_mib": (r1 - r0) / 1024}))
"""

SLEEPER = "import time, torch\ntime.sleep({s})\n"
TREE = (
    "import subprocess, sys, time, torch\n"
    "kids = [subprocess.Popen([sys.executable, '-c', {sleeper!r}]) for _ in range(4)]\n"
    "time.sleep({s})\n"
    "for k in kids: k.wait()\n"
)


def mlflow_import_and_open(tmp: Path) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", IMPORT_PROBE, f"sqlite:///{tmp}/import.db"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def mlflow_cpu_per_point(tmp: Path, keys: int = 20, points: int = 40, batches: int = 10) -> dict:
    from mlflow.entities import Metric

    from tandem.watch.point import Point
    from tandem.watch.stores import MlflowStore

    store = MlflowStore(f"sqlite:///{tmp}/points.db", experiment="cost")
    store.open("cost", {})
    now = int(time.time() * 1000)
    store.log([Point(f"system/k{i}", 0.0, now, 0) for i in range(keys)])  # the keys exist
    t0 = time.process_time()
    for b in range(batches):
        ms = [Metric(f"system/k{i % keys}", float(i), now + b * 1000 + i, b) for i in range(points)]
        store._client.log_batch(store.run_id, metrics=ms)
    cpu = time.process_time() - t0
    store.close("FINISHED")
    return {"points": batches * points, "cpu_ms_per_point": 1000 * cpu / (batches * points)}


def samplers_on_a_torch_tree(samples: int = 40) -> dict:
    from tandem.watch.samplers.process_tree import ProcessTreeSampler, memory_rollup
    from tandem.watch.tracker import default_samplers

    tree = subprocess.Popen([sys.executable, "-c", TREE.format(sleeper=SLEEPER.format(s=120), s=120)])
    try:
        deadline = time.monotonic() + 120
        while len(psutil.Process(tree.pid).children()) < 4:
            if time.monotonic() > deadline:
                raise RuntimeError("the tree did not start")
            time.sleep(0.2)
        time.sleep(8)  # all five have imported torch by now
        t0 = time.process_time()
        for _ in range(20):
            memory_rollup(tree.pid)
        rollup_ms = 1000 * (time.process_time() - t0) / 20
        run_tree = ProcessTreeSampler(tree.pid, since_start=True)
        samplers = [run_tree, *default_samplers(run_tree)]
        per = {s.name: 0.0 for s in samplers}
        for _ in range(samples):
            for s in samplers:
                if not s.available()[0]:
                    continue
                t = time.thread_time()
                s.sample()
                per[s.name] += time.thread_time() - t
            time.sleep(0.25)
        return {
            "smaps_rollup_ms_per_torch_process": rollup_ms,
            "sampler_cpu_ms_per_sample": {k: 1000 * v / samples for k, v in per.items()},
        }
    finally:
        for p in psutil.Process(tree.pid).children(recursive=True):
            p.kill()
        tree.kill()
        tree.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = {
            "when": time.strftime("%Y-%m-%d %H:%M"),
            "machine": f"{platform.machine()}, {psutil.cpu_count()} logical CPUs",
            "commit": subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
            ).stdout.strip(),
            "command": "python benchmarks/watch_costs.py",
            "mlflow_import_and_new_sqlite_store": mlflow_import_and_open(Path(tmp)),
            "mlflow_log_batch": mlflow_cpu_per_point(Path(tmp)),
            **samplers_on_a_torch_tree(),
        }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "watch_costs.json").write_text(json.dumps(result, indent=2))
    imp, lb = result["mlflow_import_and_new_sqlite_store"], result["mlflow_log_batch"]
    lines = [
        "# Unit costs behind tandem.watch (measured, this machine)",
        "",
        f"{result['when']}, {result['machine']}, commit {result['commit']}: `{result['command']}`.",
        "",
        "| what | cost |",
        "|---|---|",
        "| import MLflow, open a new SQLite store (torch already loaded) "
        f"| {imp['cpu_s']:.2f} CPU-s, +{imp['rss_mib']:.0f} MiB |",
        f"| MLflow `log_batch` on SQLite | {lb['cpu_ms_per_point']:.2f} ms CPU per metric point |",
        f"| one `smaps_rollup` read, torch process | {result['smaps_rollup_ms_per_torch_process']:.1f} ms |",
    ]
    for name, ms in result["sampler_cpu_ms_per_sample"].items():
        lines.append(f"| sampler `{name}`, tree of 5 torch processes | {ms:.2f} ms CPU per sample |")
    (args.out / "watch_costs.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
