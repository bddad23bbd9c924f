"""Data selection on a dataset with planted label noise, on this machine, with the defaults.

1. Quality: a 10-class dataset (Gaussian blobs in 20 dimensions, generated here; nothing is
   downloaded) with ``--noise`` of its training labels flipped, and a clean test set. For
   full data, random and every method at the same budget (``--budget``, 30%), over
   ``--seeds`` seeds: the noise the selection kept, the test accuracy of an MLP trained on
   it, the selection's cost (wall and CPU seconds) and the training's.
2. Sharing: a sweep of 4 jobs that train on one small-loss selection, (a) served by one
   producer from one stored selection (computed once), against (b) 4 jobs that each
   select for themselves and load their own data: total CPU-seconds of all processes and
   wall time.

    python benchmarks/select_bench.py [--seeds 3] [--budget 0.3] [--noise 0.5]

Writes ``select_bench.json`` and ``select_bench.md``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil
import torch
import torch.nn.functional as F

from tandem.bench.select_data import Blobs, mlp

ROOT = Path(__file__).resolve().parent

CTX = mp.get_context("spawn")
EPOCHS, BATCH = 60, 64
N_TRAIN, N_TEST, SPREAD = 1500, 2000, 2.5


def big_mlp() -> torch.nn.Module:
    """The trained model: big enough to memorise flipped labels (as real networks do)."""
    return torch.nn.Sequential(torch.nn.Linear(20, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                               torch.nn.ReLU(), torch.nn.Linear(512, 10))  # fmt: skip


def train_and_test(x: torch.Tensor, y: torch.Tensor, test: Blobs, seed: int) -> float:
    torch.manual_seed(seed)
    model = big_mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(EPOCHS):
        order = torch.randperm(len(y), generator=gen)
        for k in range(0, len(y), BATCH):
            idx = order[k : k + BATCH]
            opt.zero_grad()
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
    with torch.no_grad():
        pred = model(torch.from_numpy(test.x)).argmax(1).numpy()
    return float((pred == test.true).mean())


def cpu_now() -> float:
    t = psutil.Process().cpu_times()
    return t.user + t.system


def quality(args: argparse.Namespace) -> list[dict]:
    from tandem.select import select

    test = Blobs(N_TEST, 0.0, seed=100, spread=SPREAD)
    rows = []
    methods = ["full", "random", "small-loss", "el2n", "grand", "kcenter"]
    for seed in range(args.seeds):
        train = Blobs(N_TRAIN, args.noise, seed=seed, spread=SPREAD)
        x, y = torch.from_numpy(train.x), torch.from_numpy(train.y)
        for method in methods:
            t0, c0 = time.monotonic(), cpu_now()
            if method == "full":
                idx = torch.arange(len(y))
                sel_wall = sel_cpu = 0.0
            else:
                sel = select(train, method, args.budget, model=mlp if method != "random" else None, seed=seed,
                             track=False)  # fmt: skip
                idx = torch.from_numpy(sel.indices)
                sel_wall, sel_cpu = time.monotonic() - t0, cpu_now() - c0
            t1, c1 = time.monotonic(), cpu_now()
            acc = train_and_test(x[idx], y[idx], test, seed)
            kept = float(train.flipped[idx.numpy()].mean())
            row = {"method": method, "seed": seed, "noise_kept": kept, "test_accuracy": acc}
            row |= {"select_wall_s": sel_wall, "select_cpu_s": sel_cpu}
            row |= {"train_wall_s": time.monotonic() - t1, "train_cpu_s": cpu_now() - c1}
            rows.append(row)
            print(f"seed {seed} {method:<10} noise kept {rows[-1]['noise_kept']:.2f}  accuracy {acc:.3f}",
                  file=sys.stderr)  # fmt: skip
    return rows


# --- the sweep: one shared selection and producer, against each job on its own ------------------


def dataset() -> Blobs:
    return Blobs(N_TRAIN, 0.5, seed=0, spread=SPREAD)


def job_own(state: str, seed: int, out) -> None:
    """Select for itself (its own store: nothing to reuse), then train on its items."""
    os.environ["TANDEM_STATE_DIR"] = state
    torch.set_num_threads(1)  # as every job here: 4 jobs on the machine's cores
    from tandem.select import select

    train = dataset()
    sel = select(train, "small-loss", 0.3, model=mlp, seed=0, track=False)
    x, y = torch.from_numpy(train.x[sel.indices]), torch.from_numpy(train.y[sel.indices])
    train_and_test(x, y, Blobs(N_TEST, 0.0, seed=100, spread=SPREAD), seed)
    out.put(seed)


def job_reuse(state: str, selection: str, seed: int, out) -> None:
    """Load the stored selection by id (computed once, before), then train on its items."""
    os.environ["TANDEM_STATE_DIR"] = state
    torch.set_num_threads(1)
    from tandem.select import load

    train = dataset()
    sel = load(selection)
    sel.check(train)
    x, y = torch.from_numpy(train.x[sel.indices]), torch.from_numpy(train.y[sel.indices])
    train_and_test(x, y, Blobs(N_TEST, 0.0, seed=100, spread=SPREAD), seed)
    out.put(seed)


def job_shared(name: str, seed: int, out) -> None:
    """Train on what the shared producer serves (the stored selection's items)."""
    from tandem.share import Consumer

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    model = big_mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    consumer = Consumer(name, batch_size=BATCH, timeout=120)
    for _ in range(EPOCHS):
        for x, y in consumer:
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
    consumer.close()
    out.put(seed)


def serve(name: str, selection: str, state: str) -> None:
    os.environ["TANDEM_STATE_DIR"] = state
    torch.set_num_threads(1)
    from tandem.share import Producer

    Producer.from_dataset(dataset(), name, batch_size=128, shuffle=True, selection=selection).serve(
        epochs=None
    )


def tree_cpu(procs: list) -> float:
    total = 0.0
    for p in procs:
        try:
            for q in [psutil.Process(p.pid), *psutil.Process(p.pid).children(recursive=True)]:
                t = q.cpu_times()
                total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def run_jobs(targets: list[tuple]) -> tuple[float, float]:
    """Start the processes, wait for every job's word; (wall s, CPU-s of all of them)."""
    out = CTX.Queue()
    t0 = time.monotonic()
    procs = [CTX.Process(target=t, args=(*a, out)) if t is not serve else CTX.Process(target=t, args=a)
             for t, a in targets]  # fmt: skip
    for p in procs:
        p.start()
    cpu = 0.0
    jobs = sum(1 for t, _ in targets if t is not serve)
    for _ in range(jobs):
        cpu = max(cpu, tree_cpu(procs))
        out.get(timeout=600)
    wall = time.monotonic() - t0
    cpu = max(cpu, tree_cpu(procs))
    for p in procs:
        if p.is_alive():
            p.terminate()
        p.join(10)
    return wall, cpu


def sweep(work: Path) -> dict:
    from tandem.select import select

    state = str(work / "shared-state")
    os.environ["TANDEM_STATE_DIR"] = state
    t0, c0 = time.monotonic(), cpu_now()
    sel = select(dataset(), "small-loss", 0.3, model=mlp, seed=0, track=False)
    select_wall, select_cpu = time.monotonic() - t0, cpu_now() - c0
    name = f"selbench-{os.getpid()}"
    shared_wall, shared_cpu = run_jobs([(serve, (name, sel.id, state))] +
                                       [(job_shared, (name, s)) for s in range(4)])  # fmt: skip
    reuse_wall, reuse_cpu = run_jobs([(job_reuse, (state, sel.id, s)) for s in range(4)])
    own_wall, own_cpu = run_jobs([(job_own, (str(work / f"own-{s}"), s)) for s in range(4)])
    return {"selection": {"wall_s": select_wall, "cpu_s": select_cpu},
            "shared": {"wall_s": select_wall + shared_wall, "cpu_s": select_cpu + shared_cpu},
            "reuse": {"wall_s": select_wall + reuse_wall, "cpu_s": select_cpu + reuse_cpu},
            "own": {"wall_s": own_wall, "cpu_s": own_cpu}}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--budget", type=float, default=0.3)
    ap.add_argument("--noise", type=float, default=0.5)
    ap.add_argument("--out", type=Path, default=ROOT / "results")
    args = ap.parse_args()
    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="select-bench-"))
    os.environ["TANDEM_STATE_DIR"] = str(work / "state")
    rows = quality(args)
    shared = sweep(work)
    by: dict[str, list[dict]] = {}
    for r in rows:
        by.setdefault(r["method"], []).append(r)
    summary = {m: {k: statistics.mean(r[k] for r in rs) for k in rs[0] if k not in ("method", "seed")}
               for m, rs in by.items()}  # fmt: skip
    out = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version()}, "budget": args.budget,
           "noise": args.noise, "seeds": args.seeds, "train": N_TRAIN, "epochs": EPOCHS, "rows": rows,
           "summary": summary, "sweep": shared,
           "command": f"python benchmarks/select_bench.py --seeds {args.seeds} --budget {args.budget:g} "
                      f"--noise {args.noise:g}"}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "select_bench.json").write_text(json.dumps(out, indent=2) + "\n")
    lines = ["| method | noise kept | test accuracy | selection (s / CPU-s) | training (s / CPU-s) |",
             "| --- | --- | --- | --- | --- |"]  # fmt: skip
    for m, s in summary.items():
        lines.append(f"| {m} | {s['noise_kept']:.0%} | {s['test_accuracy']:.3f} | "
                     f"{s['select_wall_s']:.2f} / {s['select_cpu_s']:.2f} | "
                     f"{s['train_wall_s']:.2f} / {s['train_cpu_s']:.2f} |")  # fmt: skip
    sw = shared
    sweep_rows = [
        ("selected once, the jobs fed by one producer", "shared"),
        ("selected once, each job loads it by id", "reuse"),
        ("each job selects for itself", "own"),
    ]
    sweep_md = "\n".join(
        f"| {label} | {sw[k]['wall_s']:.1f} | {sw[k]['cpu_s']:.1f} |" for label, k in sweep_rows
    )
    md = (f"# Selection benchmark\n\n{N_TRAIN} training items, {args.noise:.0%} of labels flipped, budget "
          f"{args.budget:.0%}, {args.seeds} seeds (means), a 512x512 MLP trained {EPOCHS} epochs, "
          f"{os.cpu_count()} cores.\n\n`{out['command']}`\n\n" + "\n".join(lines) +
          f"\n\nA sweep of 4 jobs on one small-loss selection (the selection alone: "
          f"{sw['selection']['wall_s']:.2f} s, {sw['selection']['cpu_s']:.2f} CPU-s; every process counted, "
          "start-up included):\n\n| | wall s | CPU-s |\n| --- | --- | --- |\n" + sweep_md + "\n")  # fmt: skip
    (args.out / "select_bench.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
