"""Three CPU-bound training jobs on one share against the same three with private loaders,
in one run: wall time and CPU-seconds of each.

**The jobs**: a small CNN (``tandem.bench.models.tiny_cnn``, SGD, batches of 32, torch's
default thread count: no ``set_num_threads``) for ``--epochs`` epochs over a generated JPEG
folder (``tandem.bench.images``, as ``make demo``'s), each item decoded, resized, randomly
cropped to 224, flipped and normalised on every read (``tandem.bench.data.ImageFolder``).
Each job checks that every epoch was every item exactly once (items carry their index).

**The arms**, one after the other, each in a fresh ``HOME``, runtime and state directory:

- **private**: the three jobs started at once as plain processes, each with its own shuffled
  ``DataLoader`` of ``--private-workers`` worker processes;
- **manager**: under the job manager with its defaults, as a user types it: ``tandem share
  define cpub --dataset .../share_cpu_bound.py:train_set --batch-size 32 --shuffle``, three
  ``tandem submit --share cpub --group cpub -- python .../share_cpu_bound.py --job share``
  (no ``--cpus``), ``tandem wait group:cpub``, ``tandem daemon stop``;
- **plain** (b'): one producer (``tandem share serve cpub ...`` with the same options and
  ``--epochs``) and the three jobs reading it, all started at once as plain processes: the
  share's own cost (CPU weights, window), without the manager's admission.

**Wall**: from the arm's start to the end of its last job (each job stamps its end).
**CPU-s**: every process of the arm, from the kernel (a ``cpuacct`` cgroup of the arm's own;
see ``benchmarks/sweep_vs.py``, whose accounting this reuses).

    python benchmarks/share_cpu_bound.py [--quick] [--arms private,manager,plain]

Writes ``benchmarks/results/share_cpu_bound[-LABEL].json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from sweep_vs import PR_SET_CHILD_SUBREAPER, CpuGroup, children_cpu_s, reap  # noqa: E402

ARMS = ("private", "manager", "plain")
JOBS = 3
BATCH = 32


# ------------------------------------------------------------------------------ one job
def train_set():  # noqa: ANN201 - a torch Dataset, imported lazily
    """``tandem share define ... --dataset benchmarks/share_cpu_bound.py:train_set``: the
    image folder ``$CPUB_DATA``, items ``(image, label, index)``."""
    import torch

    from tandem.bench.data import ImageFolder

    class Indexed(torch.utils.data.Dataset):
        def __init__(self, inner: ImageFolder) -> None:
            self.inner = inner

        def __len__(self) -> int:
            return len(self.inner)

        def __getitem__(self, index: int) -> tuple:
            image, label = self.inner[index]
            return image, label, index

    return Indexed(ImageFolder(os.environ["CPUB_DATA"]))


def _cpu_s() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def job(loader: str, jid: int) -> None:
    """One training job; writes ``$CPUB_OUT/job-<loader>-<jid>.json``; fails if an epoch
    was not every item once."""
    start, cpu0 = time.time(), _cpu_s()
    import numpy as np
    import torch

    from tandem.bench.models import tiny_cnn

    epochs, workers = int(os.environ["CPUB_EPOCHS"]), int(os.environ["CPUB_WORKERS"])
    torch.manual_seed(jid)
    model = tiny_cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    dataset = train_set()  # the private loader's, and how many items an epoch must have
    items = len(dataset)
    if loader == "share":
        from tandem.share import Consumer

        batches = Consumer.from_env(batch_size=BATCH)
    else:
        batches = torch.utils.data.DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=workers)
    per_epoch, exact = [], []
    try:
        for _ in range(epochs):
            seen = []
            for x, y, idx in batches:
                loss = torch.nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                seen.append(idx)
            got = torch.cat(seen).numpy()
            per_epoch.append(len(got))
            exact.append(len(got) == items and bool((np.bincount(got, minlength=items) == 1).all()))
    finally:
        if loader == "share":
            batches.close()
    out = Path(os.environ["CPUB_OUT"])
    out.mkdir(parents=True, exist_ok=True)
    result = {
        "jid": jid,
        "loader": loader,
        "start": start,
        "end": time.time(),
        "cpu_s": _cpu_s() - cpu0,
        "torch_threads": torch.get_num_threads(),
        "samples_per_epoch": per_epoch,
        "exact": exact,
    }
    (out / f"job-{loader}-{jid}.json").write_text(json.dumps(result))
    if not all(exact) or len(set(per_epoch)) != 1:
        raise SystemExit(f"job {jid}: epochs not exact: {per_epoch} samples, exact {exact}")


# ------------------------------------------------------------------------------ the arms
def _share_options(args: argparse.Namespace) -> list[str]:
    # $CPUB_SHARE_OPTIONS: more options of the share, for experiments (the figures use none)
    extra = os.environ.get("CPUB_SHARE_OPTIONS", "").split()
    return ["--dataset", f"{__file__}:train_set", "--batch-size", str(BATCH), "--shuffle", *extra]


def _jobs(loader: str, env: dict[str, str]) -> list[subprocess.Popen]:
    return [
        subprocess.Popen([sys.executable, __file__, "--job", loader, "--jid", str(i)], env=env)
        for i in range(JOBS)
    ]


def run_arm_here(arm: str, args: argparse.Namespace) -> None:
    """The arm itself, in its own process (in the arm's cgroup)."""
    env = dict(os.environ)
    if arm == "private":
        procs = _jobs("private", env)
    elif arm == "plain":
        serve = ["tandem", "share", "serve", "cpub", *_share_options(args), "--epochs", str(args.epochs)]
        producer = subprocess.Popen(serve, env=env)
        procs = _jobs("share", dict(env, TANDEM_SHARE="cpub"))
        codes = [p.wait() for p in procs]
        producer.wait(120)
        if any(codes):
            raise SystemExit(f"a job failed: exit codes {codes}")
        return
    else:

        def tandem(*words: str) -> int:
            return subprocess.run(["tandem", *words], env=env).returncode

        if tandem("share", "define", "cpub", *_share_options(args)) != 0:
            raise SystemExit("tandem share define failed")
        try:
            for i in range(JOBS):
                command = ["--", sys.executable, __file__, "--job", "share", "--jid", str(i)]
                if tandem("submit", "--share", "cpub", "--group", "cpub", "--name", f"job{i}", *command):
                    raise SystemExit("tandem submit failed")
            if tandem("wait", "group:cpub") != 0:
                raise SystemExit("tandem wait: a job failed")
        finally:
            tandem("daemon", "stop")
        return
    codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit(f"a job failed: exit codes {codes}")


def run_arm(arm: str, args: argparse.Namespace, data: Path) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"cpub-{arm}-"))
    (work / "home").mkdir()
    (work / "run").mkdir(mode=0o700)
    drop = ("TANDEM_STATE_DIR", "XDG_STATE_HOME", "MLFLOW_TRACKING_URI", "XDG_RUNTIME_DIR", "TANDEM_SHARE")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(
        HOME=str(work / "home"),
        TANDEM_RUNTIME_DIR=str(work / "run"),
        CPUB_DATA=str(data),
        CPUB_EPOCHS=str(args.epochs),
        CPUB_WORKERS=str(args.private_workers),
        CPUB_OUT=str(work / "jobs"),
        TANDEM_STATE_DIR=str(work / "state"),
        PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}",
    )
    load = os.getloadavg()
    busy0 = psutil.cpu_times()
    group = CpuGroup(work.name)
    cpu0 = children_cpu_s()
    t0 = time.time()
    with open(work / "arm.log", "wb") as log:
        runner = subprocess.Popen(
            [sys.executable, __file__, "--run-arm", arm, "--epochs", str(args.epochs)],
            cwd=work,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=group.join,
        )
        try:
            rc = runner.wait(args.timeout)
        except subprocess.TimeoutExpired:
            runner.kill()
            rc = runner.wait()
    leftovers = reap(time.monotonic() + 60)
    cpu = max(children_cpu_s() - cpu0, group.cpu_s() or 0.0)
    group.remove()
    busy1 = psutil.cpu_times()
    host_busy = sum(
        getattr(busy1, f) - getattr(busy0, f) for f in ("user", "nice", "system", "irq", "softirq")
    )
    jobs = [json.loads(p.read_text()) for p in sorted((work / "jobs").glob("job-*.json"))]
    exact = [j for j in jobs if len(j["exact"]) == args.epochs and all(j["exact"])]
    log_tail = (work / "arm.log").read_text(errors="replace")[-3000:]
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return {
        "arm": arm,
        "exit_code": rc,
        "ok": rc == 0 and len(exact) == JOBS,
        "jobs_exact": len(exact),
        "wall_s": max((j["end"] for j in jobs), default=time.time()) - t0,
        "cpu_s": cpu,
        "jobs_cpu_s": sum(j["cpu_s"] for j in jobs),
        "other_load_cpu_s": host_busy - cpu,
        "load_before": load,
        "leftovers_killed": leftovers,
        "per_job": [
            {
                "jid": j["jid"],
                "start_s": round(j["start"] - t0, 2),
                "end_s": round(j["end"] - t0, 2),
                "cpu_s": round(j["cpu_s"], 2),
                "torch_threads": j["torch_threads"],
                "samples_per_epoch": j["samples_per_epoch"],
            }
            for j in jobs
        ],
        "log_tail": log_tail if rc != 0 else "",
    }


def table(results: list[dict]) -> str:
    base = next((r for r in results if r["arm"] == "private"), None)
    lines = [
        "| arm | wall s | vs private | CPU-s | jobs exact | job start-end (s) | others CPU-s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        ratio = f"{r['wall_s'] / base['wall_s']:.2f}x" if base and base["wall_s"] else "-"
        spans = ", ".join(f"{j['start_s']:.0f}-{j['end_s']:.0f}" for j in r["per_job"])
        lines.append(
            f"| {r['arm']} | {r['wall_s']:.1f} | {ratio} | {r['cpu_s']:.1f} | "
            f"{r['jobs_exact']}/{JOBS} | {spans} | {r['other_load_cpu_s']:.0f} |"
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arms", default=",".join(ARMS), help="which, in this order")
    ap.add_argument("--images", type=int, default=640)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--private-workers", type=int, default=2, help="DataLoader workers of a private job")
    ap.add_argument("--quick", action="store_true", help="160 images, 1 epoch: a check, not a figure")
    ap.add_argument("--timeout", type=float, default=1200)
    ap.add_argument("--out", type=Path, default=ROOT / "results")
    ap.add_argument("--label", default="")
    ap.add_argument("--keep", action="store_true", help="keep each arm's work directory")
    ap.add_argument("--job", choices=("private", "share"), help=argparse.SUPPRESS)
    ap.add_argument("--jid", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--run-arm", choices=ARMS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.job:
        job(args.job, args.jid)
        return 0
    if args.run_arm:
        run_arm_here(args.run_arm, args)
        return 0
    if args.quick:
        args.images, args.epochs = 160, 1
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    if bad := [a for a in arms if a not in ARMS]:
        ap.error(f"unknown arm(s) {bad}: choose among {', '.join(ARMS)}")
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise SystemExit("cannot become a child subreaper (Linux only)")
    from tandem.bench.images import make_image_folder

    data = make_image_folder(ROOT.parent / "data" / f"cpub-{args.images}", images=args.images)
    results = []
    for arm in arms:
        print(f"{arm}: running...", file=sys.stderr, flush=True)
        r = run_arm(arm, args, data)
        results.append(r)
        print(
            f"{arm}: wall {r['wall_s']:.1f} s, {r['cpu_s']:.1f} CPU-s, {r['jobs_exact']} jobs exact, "
            f"exit {r['exit_code']}" + (f"\n{r['log_tail']}" if not r["ok"] else ""),
            file=sys.stderr,
            flush=True,
        )
    print(table(results))
    payload = {
        "command": ("python benchmarks/share_cpu_bound.py " + " ".join(sys.argv[1:])).strip(),
        "when": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": {
            "cores": psutil.cpu_count(),
            "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "share_options_extra": os.environ.get("CPUB_SHARE_OPTIONS", ""),
        "workload": {
            "jobs": JOBS,
            "images": args.images,
            "epochs": args.epochs,
            "batch": BATCH,
            "model": "tiny_cnn",
            "private_workers": args.private_workers,
        },
        "load_after": os.getloadavg(),
        "results": results,
    }
    label = f"-{args.label}" if args.label else ""
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"share_cpu_bound{label}.json").write_text(json.dumps(payload, indent=1) + "\n")
    loads = ", ".join(f"{r['arm']} {r['load_before'][0]:.1f}" for r in results)
    other = ", ".join(f"{r['arm']} {r['other_load_cpu_s']:.0f}" for r in results)
    (args.out / f"share_cpu_bound{label}.md").write_text(
        f"# Three CPU-bound jobs: one share vs private loaders ({payload['when']})\n\n"
        f"`{payload['command']}`: "
        f"{JOBS} jobs, {args.images} JPEGs x {args.epochs} epochs, tiny_cnn, batch {BATCH}; "
        f"{psutil.cpu_count()} cores.\n\n{table(results)}\n\n1-min load average before each arm: {loads}. "
        f"CPU-s used by the rest of the machine during each arm: {other}.\n"
    )
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
