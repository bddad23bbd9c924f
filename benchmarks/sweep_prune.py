"""A 9-trial sweep that stops its worse trials early, under tandem and under Ray Tune with
ASHA, in one run: makespan, CPU-seconds, trials stopped early, the best.

Both arms run ``benchmarks/sweep_prune_trial.py`` (the README's script shape: tandem's
drop-in ``DataLoader``, the loss logged each epoch; a CPU-costly dataset) over ``--lrs``
(9 learning rates) for ``--epochs`` (9) epochs, each arm in a fresh ``HOME`` and runtime
directory, one after the other:

- **tandem**, its defaults, as a user types it: ``tandem submit --group prune-sweep --grid
  lr=... --prune asha --metric loss:min -- python .../sweep_prune_trial.py {lr}``, ``tandem
  wait group:prune-sweep``, ``tandem daemon stop``. The trials' loaders ask the daemon for
  one producer of their data (no definition); ASHA's defaults: grace 1, reduction 3.
- **ray**: a fresh local Ray instance and ``tune.Tuner(tune.with_resources(trainable,
  {"cpu": 0.5}), param_space={"lr": tune.grid_search(...)}, tune_config=TuneConfig(
  scheduler=ASHAScheduler(metric="loss", mode="min", grace_period=1, reduction_factor=3,
  max_t=EPOCHS)))``: each trial its own ``DataLoader``.

Makespan, CPU-s (the arm's cgroup, or its reaped children, the larger), as
``benchmarks/sweep_vs.py`` measures them (its runner's pieces are used). A trial counts as
stopped early where it did fewer than ``--epochs`` epochs; every epoch a trial did must be
the dataset exactly once; no trial may be shown failed (tandem: ``tandem ls``'s states;
Ray: the result grid's errors).

    python benchmarks/sweep_prune.py [--quick] [--arms tandem,ray] [--out benchmarks/results]

Writes ``sweep_prune[-LABEL].json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from manager_cost import Watcher
from sweep_vs import PR_SET_CHILD_SUBREAPER, by_role, environment, measure_arm, role_table

ROOT = Path(__file__).resolve().parent
TRIAL = ROOT / "sweep_prune_trial.py"
LRS = "0.3,0.1,0.03,0.01,0.003,0.001,0.0003,0.0001,0.00003"
ARMS = ("tandem", "ray")
GROUP = "prune-sweep"


def run_tandem(work: Path, lrs: list[str], epochs: int) -> None:
    def tandem(*args: str, **kw: object) -> subprocess.CompletedProcess:
        return subprocess.run(["tandem", *args], cwd=work, **kw)  # type: ignore[call-overload, no-any-return]

    try:
        grid = ["--group", GROUP, "--grid", "lr=" + ",".join(lrs), "--prune", "asha", "--metric", "loss:min"]
        if tandem("submit", *grid, "--", "python", str(TRIAL), "{lr}").returncode != 0:
            raise SystemExit("tandem submit failed")
        waited = tandem("wait", f"group:{GROUP}")
        states = json.loads(tandem("ls", "--all", "--json", capture_output=True, text=True).stdout)
        (work / "states.json").write_text(
            json.dumps({j["id"]: j["state"] for j in states if j.get("role") != "producer"})
        )
        if waited.returncode != 0:
            raise SystemExit("tandem wait: a trial failed")
    finally:
        tandem("daemon", "stop")


def run_ray(work: Path, lrs: list[str], epochs: int) -> None:
    import ray
    import sweep_prune_trial
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    ray.init(address="local", _temp_dir=str(work / "ray"))
    try:
        asha = ASHAScheduler(metric="loss", mode="min", grace_period=1, reduction_factor=3, max_t=epochs)
        tuner = tune.Tuner(
            tune.with_resources(sweep_prune_trial.ray_trainable, {"cpu": 0.5}),
            param_space={"lr": tune.grid_search([float(lr) for lr in lrs])},
            tune_config=tune.TuneConfig(scheduler=asha),
            run_config=tune.RunConfig(name=GROUP, storage_path=str(work / "ray_results")),
        )
        results = tuner.fit()
        (work / "states.json").write_text(
            json.dumps({str(i): "error" if r.error else "ok" for i, r in enumerate(results)})
        )
        if results.errors or len(results) != len(lrs):
            raise SystemExit(f"ray: {len(results)} results, errors {results.errors}")
    finally:
        ray.shutdown()


def run_arm(arm: str, args: argparse.Namespace) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"sprune-{arm}-"))
    env = environment(work, args)
    command = [sys.executable, __file__, "--run-arm", arm, "--work", str(work), "--lrs", args.lrs,
               "--epochs", str(args.epochs)]  # fmt: skip
    watcher = Watcher() if arm == "tandem" else None
    if watcher is not None:
        watcher.start()
    run = measure_arm(command, work, env, args.timeout, args.linger, watcher)
    roles = None
    if watcher is not None:
        watcher.finish()
        roles = by_role(watcher, 0.0)
    rc, t0 = run.exit_code, run.t0
    trials = [json.loads(p.read_text()) for p in sorted((work / "trials").glob("trial-*.json"))]
    states = json.loads((work / "states.json").read_text()) if (work / "states.json").exists() else {}
    log_tail = (work / "arm.log").read_text(errors="replace")[-3000:]
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    best = min(trials, key=lambda t: t["loss"], default=None)
    full = [t for t in trials if t["epochs"] == args.epochs]
    failed = [k for k, s in states.items() if s in ("failed", "oom", "error", "cancelled")]
    return {
        "arm": arm,
        "exit_code": rc,
        "trials": len(lrs_of(args)),
        "trials_seen": len(trials),
        "stopped_early": len(trials) - len(full),
        "run_to_the_end": len(full),
        "failed_shown": failed,
        "epochs_exact": all(all(t["exact"]) for t in trials),
        "best": None if best is None else {"lr": best["lr"], "loss": best["loss"], "epochs": best["epochs"]},
        "best_run_to_its_end": best is not None and best["epochs"] == args.epochs,
        "ok": rc == 0
        and len(trials) == len(lrs_of(args))
        and not failed
        and all(all(t["exact"]) for t in trials),
        "makespan_s": max((t["end"] for t in trials), default=t0) - t0,
        "cpu_s": run.cpu_s,
        "cpu_s_cgroup": run.cpu_s_cgroup,
        "cgroup": run.cgroup,
        "cpu_s_reaped_children": run.cpu_s_reaped_children,
        "other_load_cpu_s": run.other_load_cpu_s,
        "states": states,
        "per_trial": [
            {k: t[k] for k in ("lr", "epochs", "loss")} | {"end_s": round(t["end"] - t0, 2)} for t in trials
        ],
        "leftovers_killed": run.leftovers_killed,
        "by_role": roles,
        "log_tail": log_tail if rc != 0 else "",
    }


def lrs_of(args: argparse.Namespace) -> list[str]:
    return [lr.strip() for lr in args.lrs.split(",") if lr.strip()]


def table(results: list[dict]) -> str:
    ray = next((r for r in results if r["arm"] == "ray" and r["ok"]), None)
    lines = [
        "| arm | makespan, s | vs Ray Tune + ASHA | CPU-s | vs Ray Tune | stopped early | best (lr, epochs) "
        "| failed |",
        "|---|---:|---:|---:|---:|---:|---|---:|",
    ]
    for r in results:
        ratio = f"{r['makespan_s'] / ray['makespan_s']:.2f}x" if ray and r["ok"] else "-"
        cpu_ratio = f"{r['cpu_s'] / ray['cpu_s']:.2f}x" if ray and r["ok"] else "-"
        best = f"{r['best']['lr']:g}, {r['best']['epochs']}" if r["best"] else "-"
        lines.append(
            f"| {r['arm']} | {r['makespan_s']:.1f} | {ratio} | {r['cpu_s']:.1f} | {cpu_ratio} | "
            f"{r['stopped_early']}/{r['trials']} | {best} | "
            f"{len(r['failed_shown'])}{'' if r['ok'] else ' FAILED'} |"
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arms", default=",".join(ARMS), help="which, in this order")
    ap.add_argument("--lrs", default=LRS, help="the grid (9 learning rates)")
    ap.add_argument("--items", type=int, default=1200)
    ap.add_argument("--clip-s", type=float, default=2.0, help="seconds of audio an item is made from")
    ap.add_argument("--epochs", type=int, default=9)
    ap.add_argument("--quick", action="store_true", help="300 items, 4 epochs: a check, not a figure")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds an arm may take")
    ap.add_argument("--linger", type=float, default=120, help="seconds left processes get to end")
    ap.add_argument("--out", type=Path, default=ROOT / "results")
    ap.add_argument("--label", default="")
    ap.add_argument("--keep", action="store_true", help="keep each arm's work directory")
    ap.add_argument("--run-arm", choices=ARMS, help=argparse.SUPPRESS)
    ap.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.private_workers = 0  # sweep_vs's environment(): a private loader reads in its trial
    if args.run_arm:
        {"tandem": run_tandem, "ray": run_ray}[args.run_arm](args.work, lrs_of(args), args.epochs)
        return 0
    if args.quick:
        args.items, args.epochs = 300, 4
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    if bad := [a for a in arms if a not in ARMS]:
        ap.error(f"unknown arm(s) {bad}: choose among {', '.join(ARMS)}")
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise SystemExit("cannot become a child subreaper (Linux only)")
    results = []
    for arm in arms:
        print(f"{arm}: running ({len(lrs_of(args))} trials)...", file=sys.stderr, flush=True)
        r = run_arm(arm, args)
        results.append(r)
        said = (
            f"{arm}: makespan {r['makespan_s']:.1f} s, {r['cpu_s']:.1f} CPU-s, {r['stopped_early']} stopped"
        )
        print(f"{said} early, exit {r['exit_code']}" + (f"\n{r['log_tail']}" if not r["ok"] else ""),
              file=sys.stderr, flush=True)  # fmt: skip
    print(table(results))
    roles = next((r["by_role"] for r in results if r.get("by_role")), None)
    if roles is not None:
        print(role_table(roles))
    payload = {
        "command": ("python benchmarks/sweep_prune.py " + " ".join(sys.argv[1:])).strip(),
        "when": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": {
            "cores": psutil.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "workload": {"lrs": lrs_of(args), "items": args.items, "clip_s": args.clip_s, "epochs": args.epochs},
        "results": results,
    }
    label = f"-{args.label}" if args.label else ""
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"sweep_prune{label}.json").write_text(json.dumps(payload, indent=1) + "\n")
    (args.out / f"sweep_prune{label}.md").write_text(
        f"# A pruned sweep: tandem vs Ray Tune with ASHA ({payload['when']})\n\n`{payload['command']}`: "
        f"{len(lrs_of(args))} trials, {args.items} items x up to {args.epochs} epochs; "
        f"{psutil.cpu_count()} cores.\n\n{table(results)}\n"
        + (
            f"\nWhere the tandem arm's CPU went, by role (the kernel's figures per process; the trials' "
            f"loops are not measured apart here):\n\n{role_table(roles)}\n"
            if roles is not None
            else ""
        )
    )
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
