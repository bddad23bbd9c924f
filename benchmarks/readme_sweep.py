"""The README's sweep as printed, under the job manager's defaults, checked as issue 33
judges it: how many of its 4 jobs run at once (at least 3), every epoch exact, a trivial job
submitted beside it starts within 10 s, and after ``tandem daemon stop`` and a new start
the next sweep of the same template starts all its points within 10 s (no probing again).

Each scenario runs in a fresh ``HOME``, runtime and state directory, as a new user:

    tandem share define imagenet --dataset mypkg.data:train_set --batch-size 256 --shuffle
    for lr in 0.1 0.03 0.01 0.003; do
      tandem submit --share imagenet --group lr-sweep --name r18-lr$lr -- python train.py --lr $lr
    done
    tandem wait

``mypkg.data:train_set`` is a tensor per item (nothing to decode); ``train.py`` imports
MLflow, reads the share (``Consumer.from_env``), sleeps 0.15 s a batch (standing for the
GPU step: the host stays under half busy), logs a metric per epoch, and writes the indices
of every epoch, which this script checks (each epoch is the dataset, exactly once). While the
sweep runs (3 or more of its jobs running and the host under half busy over a second, or 60
s after the sweep's submission), ``tandem submit -- python -c 'print(1)'`` is the trivial
job. Then ``tandem daemon stop``, ``tandem daemon start`` and the same sweep again.

Scenarios: ``quiet`` (nothing else on the host), ``busy`` (one core held busy from outside by
``python -c 'while 1: pass'``).

    python benchmarks/readme_sweep.py [--scenarios quiet,busy] [--epochs 4] [--out benchmarks/results]

Writes ``readme_sweep.json`` and ``.md``: per scenario, jobs at once (most seen by polling
``tandem ls --json`` every 0.2 s), each job's wait (submitted to started), the trivial job's
wait, the second sweep's time from its first submit to all four running, and epochs checked.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ITEMS = 256 * 40  # 40 batches an epoch: 6 s of "GPU steps" an epoch
LRS = ["0.1", "0.03", "0.01", "0.003"]

DATA = """
import torch

class Items(torch.utils.data.Dataset):
    def __len__(self):
        return {items}

    def __getitem__(self, i):
        return {{"x": torch.full((3, 8, 8), float(i)), "i": i}}

def train_set():
    return Items()
"""

TRAIN = """
import argparse, json, os, time
import mlflow
from tandem.share import Consumer

ap = argparse.ArgumentParser()
ap.add_argument("--lr", type=float, required=True)
args = ap.parse_args()
epochs = []
with mlflow.start_run(), Consumer.from_env() as loader:
    for epoch in range({epochs}):
        seen = []
        for batch in loader:
            seen += batch["i"].tolist()
            time.sleep(0.15)  # the GPU step
        mlflow.log_metric("seen", len(seen), step=epoch)
        epochs.append(seen)
with open(os.path.join(os.environ["SWEEP_OUT"], f"lr{{args.lr}}.json"), "w") as f:
    json.dump(epochs, f)
"""


class Sweep:
    """One scenario: a fresh user's directories, and the ``tandem`` commands of the README."""

    def __init__(self, root: Path, epochs: int) -> None:
        self.root = root
        self.out = root / "out"
        for d in ("home", "run", "state", "out", "mypkg"):
            (root / d).mkdir(mode=0o700)
        (root / "mypkg" / "__init__.py").write_text("")
        (root / "mypkg" / "data.py").write_text(DATA.format(items=ITEMS))
        (root / "train.py").write_text(TRAIN.format(epochs=epochs))
        self.env = {
            **os.environ,
            "HOME": str(root / "home"),
            "TANDEM_RUNTIME_DIR": str(root / "run"),
            "TANDEM_STATE_DIR": str(root / "state"),
            "SWEEP_OUT": str(self.out),
            "PYTHONPATH": os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p),
        }

    def tandem(self, *args: str, timeout: float = 600) -> str:
        done = subprocess.run(
            ["tandem", *args], cwd=self.root, env=self.env, capture_output=True, text=True, timeout=timeout
        )
        if done.returncode != 0:
            raise SystemExit(f"tandem {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
        return done.stdout

    def jobs(self) -> list[dict]:
        return json.loads(self.tandem("ls", "--json"))

    def submit_sweep(self) -> list[int]:
        ids = []
        for lr in LRS:
            out = self.tandem(
                "submit", "--share", "imagenet", "--group", "lr-sweep", "--name", f"r18-lr{lr}",
                "--", sys.executable, "train.py", "--lr", lr,
            )  # fmt: skip
            ids.append(_id_of(out))
        return ids


def _id_of(out: str) -> int:
    for word in out.replace(":", " ").split():
        if word.isdigit():
            return int(word)
    raise SystemExit(f"no job id in submit's reply: {out!r}")


def watch(sweep: Sweep, ids: list[int], trivial_after: bool) -> dict:
    """Poll until the jobs end: the most running at once, when each started; submit the
    trivial job once all of ``ids`` that will run together run (or 20 s passed)."""
    most, started, trivial, reasons, host_busy = 0, {}, None, {}, None
    t0 = time.time()
    while True:
        jobs = {j["id"]: j for j in sweep.jobs()}
        ours = [jobs[i] for i in ids]
        running = [j for j in ours if j["state"] == "running"]
        most = max(most, len(running))
        for j in ours:
            if j.get("started") and j["id"] not in started:
                started[j["id"]] = j["started"] - j["submitted"]
        if trivial_after and trivial is None and len(running) >= 3:
            # beside the sweep once it runs, the host under half busy (its imports are over)
            busy = psutil.cpu_percent(interval=1.0)
            if busy < 50 or time.time() - t0 > 60:
                trivial = _id_of(sweep.tandem("submit", "--", sys.executable, "-c", "print(1)"))
                host_busy = busy
        elif trivial is not None and jobs.get(trivial, {}).get("reason"):
            reasons[jobs[trivial]["reason"]] = None  # why it waited, in order
        live = ("queued", "running", "retrying", "waiting")
        trivial_done = trivial is None or jobs.get(trivial, {}).get("state") not in (*live, None)
        if trivial_done and all(j["state"] not in live for j in ours):
            break
        time.sleep(0.2)
    result = {"at_once": most, "waits_s": [round(started.get(i, float("nan")), 1) for i in ids]}
    result["states"] = [jobs[i]["state"] for i in ids]
    if trivial is not None:
        t = jobs[trivial]
        result["trivial_wait_s"] = round(t["started"] - t["submitted"], 1) if t.get("started") else None
        result["trivial_state"] = t["state"]
        result["trivial_reasons"] = list(reasons)
        result["host_busy_percent_at_trivial_submit"] = host_busy
    return result


def epochs_exact(sweep: Sweep) -> bool:
    for lr in LRS:
        path = sweep.out / f"lr{float(lr)}.json"
        if not path.exists():
            return False
        for seen in json.loads(path.read_text()):
            if sorted(seen) != list(range(ITEMS)):
                return False
        path.unlink()
    return True


def run_scenario(name: str, epochs: int) -> dict:
    busy = subprocess.Popen([sys.executable, "-c", "while 1: pass"]) if name == "busy" else None
    try:
        with tempfile.TemporaryDirectory(prefix="readme-sweep-") as tmp:
            sweep = Sweep(Path(tmp), epochs)
            define = "share define imagenet --dataset mypkg.data:train_set --batch-size 256 --shuffle"
            sweep.tandem(*define.split())
            first = watch(sweep, sweep.submit_sweep(), trivial_after=True)
            first["epochs_exact"] = epochs_exact(sweep)
            sweep.tandem("daemon", "stop")
            sweep.tandem("daemon", "start")
            t0 = time.time()
            ids = sweep.submit_sweep()
            while True:
                jobs = {j["id"]: j for j in sweep.jobs()}
                if all(jobs[i]["state"] != "queued" for i in ids) or time.time() - t0 > 120:
                    break
                time.sleep(0.2)
            starts = [jobs[i].get("started") for i in ids]
            again = watch(sweep, ids, trivial_after=False)
            again["all_started_s"] = round(max(starts) - t0, 1) if all(starts) else None
            again["epochs_exact"] = epochs_exact(sweep)
            sweep.tandem("daemon", "stop")
            return {"scenario": name, "first": first, "after_restart": again}
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()


def table(results: list[dict]) -> str:
    lines = [
        "| scenario | sweep | jobs at once | waits (s) | epochs exact | trivial job's wait (s) "
        "| all 4 started after (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for part in ("first", "after_restart"):
            p = r[part]
            lines.append(
                f"| {r['scenario']} | {part.replace('_', ' ')} | {p['at_once']} of 4 | "
                f"{', '.join(map(str, p['waits_s']))} | {'yes' if p['epochs_exact'] else 'NO'} | "
                f"{_trivial(p, part)} | {p.get('all_started_s', '')} |"
            )
    return "\n".join(lines)


def _trivial(sweep: dict, part: str) -> str:
    if part != "first":
        return ""
    if "trivial_wait_s" not in sweep:
        return "not submitted: the host was never under half busy"
    return f"{sweep['trivial_wait_s']} (host {sweep['host_busy_percent_at_trivial_submit']:.0f}% busy)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenarios", default="quiet,busy")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = ap.parse_args()
    results = []
    for name in args.scenarios.split(","):
        print(f"{name}: running...", file=sys.stderr, flush=True)
        results.append(run_scenario(name, args.epochs))
        print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    load = os.getloadavg()
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"cores": os.cpu_count(), "loadavg_at_end": load, "command": " ".join(sys.argv)}
    (args.out / "readme_sweep.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    md = (
        f"# The README's sweep under the job manager\n\n`{meta['command']}`, {os.cpu_count()} cores, "
        f"load at end {load[0]:.1f}\n\n{table(results)}\n"
    )
    (args.out / "readme_sweep.md").write_text(md)
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
