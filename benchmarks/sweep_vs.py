"""The same 8-trial learning-rate sweep under tandem, Ray Tune and submitit, in one run:
makespan and CPU-seconds of each.

Every arm runs the trial of ``benchmarks/sweep_vs_trial.py`` (one CPU-costly dataset, one
training script; see its docstring) over ``--lrs`` (8 learning rates), each in a fresh
``HOME`` and runtime directory, one arm after the other:

- **tandem**, with its defaults, as a user types it: ``tandem share define sweepvs --dataset
  .../sweep_vs_trial.py:train_set --batch-size 64 --shuffle``, one ``tandem submit --share
  sweepvs --group sweep-vs --grid lr=... --name trial-lr{lr} -- python .../sweep_vs_trial.py
  --lr {lr}``, ``tandem wait group:sweep-vs``; then ``tandem daemon stop``. A fresh state
  directory, so a fresh daemon that has learnt nothing. The trials read one shared producer.
- **plain**: tandem's share without its manager, the same commands a user could start by
  hand: one ``tandem share serve sweepvs`` (the share's options; stopped with a Ctrl-C once
  the last trial has ended) and the 8 trials reading it, all started at once. A trial's own
  process here (its CPU-s, interpreter and imports included, from ``getrusage``) is what the
  tandem arm's trials are held to.
- **ray**: a fresh local Ray instance (``ray.init(address="local")``, a new temp dir) and
  ``tune.Tuner(tune.with_resources(trainable, {"cpu": 0.5}), param_space={"lr":
  tune.grid_search(...)})``: each trial its own ``DataLoader``; ``ray.shutdown()`` at the end.
- **submitit**: ``submitit.LocalExecutor`` (``timeout_min`` raised, nothing else), one job a
  trial, each its own ``DataLoader``. The local executor starts every job at once.

**Makespan**: from the launch of the arm's process (which then imports its tool and runs
the commands above) to the end of the last trial's training (each trial stamps its end).
**CPU-s**: every CPU-second of every process the arm started, from the kernel: the arm runs
in a cgroup of its own (v1 ``cpuacct``, else v2, where one can be made; root here), whose
total counts every process that ran in it however it ended. Also measured, as a check:
this process is a child subreaper (``PR_SET_CHILD_SUBREAPER``), so the arm's processes all
end as its descendants, and ``getrusage(RUSAGE_CHILDREN)`` before and after gives what was
reaped up to it; that misses processes reaped where their times reach no parent of ours
(Ray's: 22 of 92 CPU-s in one run here), so the figure is the larger of the two (both are
lower bounds; both are in the JSON, with which cgroup). *Trial loops* is what the trials report
for their training loop and private loaders; the rest is everything else (interpreters and
imports, tandem's producer, daemon and helpers, Ray's processes). Every trial must finish,
with every epoch exactly the dataset (its indices counted), else the arm fails.

**By role** (the tandem arm): while it runs, ``benchmarks/manager_cost.py``'s ``Watcher``
reads every descendant's ``/proc/PID/stat`` ten times a second, and each process this
script reaps is read as a zombie first, so every CPU-second is given to one role: the
trials (each job's process tree, its supervisor's reaped children; of it, the loop the
trial reports and what it spends beside it: interpreter, imports, the consumer), the
producer, the supervisors, the daemon, the MLflow helper and the commands (the arm's
process and the ``tandem`` commands it ran). The table is printed and written to the
``.md``; each job's figures are in the JSON.

    python benchmarks/sweep_vs.py [--quick] [--arms tandem,plain,ray,submitit] [--out benchmarks/results]

Writes ``sweep_vs[-LABEL].json`` and ``.md``. ``--quick``: 400 items, 2 epochs (a check
that it runs, not a figure).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
from manager_cost import Watcher, account  # beside this file: run as a script, its folder is on sys.path

ROOT = Path(__file__).resolve().parent
TRIAL = ROOT / "sweep_vs_trial.py"
LRS = "0.3,0.1,0.03,0.01,0.003,0.001,0.0003,0.0001"
PR_SET_CHILD_SUBREAPER = 36
ARMS = ("tandem", "plain", "ray", "submitit")


# ------------------------------------------------------------------ the arms (each in its own process)
def run_tandem(work: Path, lrs: list[str]) -> None:
    def tandem(*args: str) -> int:
        return subprocess.run(["tandem", *args], cwd=work).returncode

    if tandem("share", "define", "sweepvs", "--dataset", f"{TRIAL}:train_set", "--batch-size", "64",
              "--shuffle") != 0:  # fmt: skip
        raise SystemExit("tandem share define failed")
    try:
        grid = ["--grid", "lr=" + ",".join(lrs), "--name", "trial-lr{lr}"]
        if tandem("submit", "--share", "sweepvs", "--group", "sweep-vs", *grid, "--",
                  "python", str(TRIAL), "--lr", "{lr}") != 0:  # fmt: skip
            raise SystemExit("tandem submit failed")
        if tandem("wait", "group:sweep-vs") != 0:
            raise SystemExit("tandem wait: a trial failed")
    finally:
        tandem("daemon", "stop")


def run_plain(work: Path, lrs: list[str]) -> None:
    """tandem's share without its manager: one producer (``tandem share serve`` with the
    share's options) and the trials reading it, all started at once as plain processes; the
    producer serves until the last trial has ended (a trial whose interpreter starts late
    still reads its epochs), then is stopped as a user stops it (Ctrl-C). What a trial costs
    outside the manager, to hold the tandem arm's trials to."""
    serve = ["tandem", "share", "serve", "sweepvs", "--dataset", f"{TRIAL}:train_set", "--batch-size", "64",
             "--shuffle"]  # fmt: skip
    producer = subprocess.Popen(serve, cwd=work)
    env = dict(os.environ, TANDEM_SHARE="sweepvs")
    trials = [subprocess.Popen([sys.executable, str(TRIAL), "--lr", lr], cwd=work, env=env) for lr in lrs]
    codes = [t.wait() for t in trials]
    producer.send_signal(signal.SIGINT)
    producer.wait(120)
    if any(codes):
        raise SystemExit(f"plain: the trials exited {codes}")


def run_ray(work: Path, lrs: list[str]) -> None:
    import ray
    import sweep_vs_trial
    from ray import tune

    ray.init(address="local", _temp_dir=str(work / "ray"))
    try:
        tuner = tune.Tuner(
            tune.with_resources(sweep_vs_trial.ray_trainable, {"cpu": 0.5}),
            param_space={"lr": tune.grid_search([float(lr) for lr in lrs])},
            run_config=tune.RunConfig(name="sweep-vs", storage_path=str(work / "ray_results")),
        )
        results = tuner.fit()
        if results.errors or len(results) != len(lrs):
            raise SystemExit(f"ray: {len(results)} results, errors {results.errors}")
    finally:
        ray.shutdown()


def run_submitit(work: Path, lrs: list[str]) -> None:
    import submitit
    import sweep_vs_trial

    executor = submitit.LocalExecutor(folder=work / "submitit")
    executor.update_parameters(timeout_min=60)  # the default, 2 minutes, would cut a trial
    jobs = [executor.submit(sweep_vs_trial.train, float(lr), "private") for lr in lrs]
    for job in jobs:
        job.result()  # raises the trial's error


# ------------------------------------------------------------------ the runner
def environment(work: Path, args: argparse.Namespace) -> dict[str, str]:
    """A fresh HOME and runtime directory; the workload's size; the trial importable."""
    home, runtime = work / "home", work / "run"
    home.mkdir()
    runtime.mkdir(mode=0o700)
    drop = ("TANDEM_STATE_DIR", "XDG_STATE_HOME", "MLFLOW_TRACKING_URI", "XDG_RUNTIME_DIR", "RAY_ADDRESS")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(
        HOME=str(home),
        TANDEM_RUNTIME_DIR=str(runtime),
        PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}",
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
        SWEEPVS_ITEMS=str(args.items),
        SWEEPVS_CLIP_S=str(args.clip_s),
        SWEEPVS_EPOCHS=str(args.epochs),
        SWEEPVS_WORKERS=str(args.private_workers),
        SWEEPVS_OUT=str(work / "trials"),
    )
    return env


class CpuGroup:
    """A cgroup of the arm's own (v1 ``cpuacct``, else v2), where one can be made: the
    kernel's CPU total of every process that ever ran in it, whoever reaps them (Ray's
    workers are reaped where their times reach no ``RUSAGE_CHILDREN`` of ours)."""

    def __init__(self, name: str) -> None:
        self.path: Path | None = None
        v1, v2 = Path("/sys/fs/cgroup/cpuacct"), Path("/sys/fs/cgroup")
        for base, kind in ((v1, "v1 cpuacct"), (v2, "v2")):
            if kind == "v2" and not (v2 / "cgroup.controllers").exists():
                continue
            try:
                (base / name).mkdir()
            except OSError:
                continue
            self.path, self.kind = base / name, kind
            return
        self.kind = "none"

    def join(self) -> None:
        """In the child before it runs the arm (``preexec_fn``)."""
        if self.path is not None:
            (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def cpu_s(self) -> float | None:
        if self.path is None:
            return None
        if self.kind == "v2":
            stat = dict(line.split() for line in (self.path / "cpu.stat").read_text().splitlines())
            return int(stat["usage_usec"]) / 1e6
        return int((self.path / "cpuacct.usage").read_text()) / 1e9

    def remove(self) -> None:
        if self.path is not None:
            try:
                self.path.rmdir()
            except OSError:
                pass


def children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def reap(deadline: float, watcher: Watcher | None = None) -> list[str]:
    """Reap every descendant (orphans come to this subreaper) until none is left; past
    ``deadline``, end what is left (its command lines are returned)."""
    killed: list[str] = []
    while True:
        try:
            pid, _ = _reaped(watcher)
        except ChildProcessError:
            return killed
        if pid:
            continue
        if time.monotonic() > deadline:
            for child in psutil.Process().children(recursive=True):
                try:
                    killed.append(" ".join(child.cmdline()[:4]))
                    child.send_signal(signal.SIGKILL if len(killed) > 50 else signal.SIGTERM)
                except psutil.Error:
                    pass
            deadline = time.monotonic() + 5
        time.sleep(0.05)


@dataclass
class ArmRun:
    """What one arm's process (and every process it started) took, as the kernel counts it."""

    exit_code: int | None
    t0: float  # wall clock at its launch
    wall_s: float
    cpu_s: float  # the larger of the two lower bounds below
    cpu_s_cgroup: float | None
    cgroup: str
    cpu_s_reaped_children: float
    other_load_cpu_s: float  # what the rest of the machine used meanwhile
    leftovers_killed: list[str]


def _reaped(watcher: Watcher | None) -> tuple[int, int]:
    """One ended child of this process reaped (pid, wait status), read as a zombie first by
    ``watcher`` where there is one; (0, 0) where none has ended."""
    if watcher is None:
        return os.waitpid(-1, os.WNOHANG)
    if (reaped := watcher.reap_one()) is None:
        return 0, 0
    pid, proc = reaped
    return pid, proc.status if proc is not None and proc.status is not None else 0


def measure_arm(
    command: list[str], work: Path, env: dict[str, str], timeout: float, linger: float,
    watcher: Watcher | None = None,
) -> ArmRun:  # fmt: skip
    """Run ``command`` (an arm) in ``work`` in a CPU cgroup of its own, reaping whatever
    ends meanwhile (this process is a child subreaper: orphans come to it) until it ends,
    then its leftovers (``linger`` seconds, then ended). With ``watcher``, each process is
    also read by role (``benchmarks/manager_cost.py``'s ``Watcher``, in a thread of this
    process, outside the arm's cgroup)."""
    busy0 = psutil.cpu_times()
    group = CpuGroup(work.name)
    cpu0 = children_cpu_s()
    t0 = time.time()
    with open(work / "arm.log", "wb") as log:
        runner = subprocess.Popen(
            command, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=group.join
        )
    rc = None
    deadline = time.monotonic() + timeout
    while rc is None:  # reap whatever ends meanwhile (orphans included) until the arm ends
        try:
            pid, status = _reaped(watcher)
        except ChildProcessError:
            break
        if pid == runner.pid:
            rc = os.waitstatus_to_exitcode(status)
            runner.returncode = rc
        elif not pid:
            if time.monotonic() > deadline:
                runner.kill()
            time.sleep(0.05)
    arm_s = time.time() - t0
    leftovers = reap(time.monotonic() + linger, watcher)
    reaped = children_cpu_s() - cpu0
    in_group = group.cpu_s()
    group.remove()
    # Both are lower bounds of the truth (a process auto-reaped or moved out of the group
    # escapes one of them): the larger one is the figure; both are in the JSON.
    cpu = max(reaped, in_group or 0.0)
    busy1 = psutil.cpu_times()
    fields = ("user", "nice", "system", "irq", "softirq")
    host_busy = sum(getattr(busy1, f) - getattr(busy0, f) for f in fields)
    return ArmRun(rc, t0, arm_s, cpu, in_group, group.kind, reaped, host_busy - cpu, leftovers)


def run_arm(arm: str, args: argparse.Namespace) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"svs-{arm}-"))
    env = environment(work, args)
    load = os.getloadavg()
    command = [sys.executable, __file__, "--run-arm", arm, "--work", str(work), "--lrs", args.lrs]
    watcher = Watcher() if arm == "tandem" else None
    if watcher is not None:
        watcher.start()
    run = measure_arm(command, work, env, args.timeout, args.linger, watcher)
    rc, t0, cpu = run.exit_code, run.t0, run.cpu_s
    trials = [json.loads(p.read_text()) for p in sorted((work / "trials").glob("trial-*.json"))]
    finished = [t for t in trials if len(t["exact"]) == args.epochs and all(t["exact"])]
    roles = None
    if watcher is not None:
        watcher.finish()
        roles = by_role(watcher, sum(t["loop_cpu_s"] for t in trials))
    log_tail = (work / "arm.log").read_text(errors="replace")[-3000:]
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    loops = sum(t["loop_cpu_s"] for t in trials)
    return {
        "arm": arm,
        "exit_code": rc,
        "trials": len(lrs_of(args)),
        "trials_finished_exact": len(finished),
        "ok": rc == 0 and len(finished) == len(lrs_of(args)),
        "makespan_s": max((t["end"] for t in trials), default=t0) - t0,
        "arm_wall_s": run.wall_s,
        "cpu_s": cpu,
        "cpu_s_cgroup": run.cpu_s_cgroup,
        "cgroup": run.cgroup,
        "cpu_s_reaped_children": run.cpu_s_reaped_children,
        "trial_loops_cpu_s": loops,
        "rest_cpu_s": cpu - loops,
        # a trial's own process, mean (Ray's workers may run several: not one trial's)
        "trial_process_cpu_s": (
            sum(t["process_cpu_s"] for t in trials) / len(trials) if trials and arm != "ray" else None
        ),
        "other_load_cpu_s": run.other_load_cpu_s,  # what the rest of the machine used meanwhile
        "load_before": load,
        "leftovers_killed": run.leftovers_killed,
        "by_role": roles,
        "per_trial": [
            {
                "lr": t["lr"],
                "start_s": round(t["start"] - t0, 2),
                "end_s": round(t["end"] - t0, 2),
                "loop_cpu_s": round(t["loop_cpu_s"], 2),
                "process_cpu_s": round(t["process_cpu_s"], 2),
                "samples_per_epoch": t["samples_per_epoch"],
                "exact": t["exact"],
                "torch_threads": t["torch_threads"],
                "loss": t["loss"],
            }
            for t in trials
        ],
        "log_tail": log_tail if rc != 0 else "",
    }


def by_role(watcher: Watcher, loops: float) -> dict:
    """The tandem arm's CPU-s by role, from the kernel's figures per process (each read as a
    zombie where this process reaped it, else its last read): see ``manager_cost.account``.
    *Commands* are the arm's own process and the ``tandem`` commands it ran."""
    arm = next(p for p in watcher.procs.values() if p.role == "commands" and "--run-arm" in p.argv)
    r = account({"wall_s": 0.0, "procs": list(watcher.procs.values()), "bash": arm.pid, "stop": -1,
                 "timeline": []})  # fmt: skip
    trials = [j for j in r["jobs"] if j["what"] != "producer"]
    parts = r["manager_parts"]
    return {
        "trials": r["training_cpu_s"],
        "trial_loops": loops,
        "trials_beside_their_loops": r["training_cpu_s"] - loops,
        "trials_n": len(trials),
        "producer": r["producer_cpu_s"],
        "warm_imports": r["warm_imports_cpu_s"],
        "supervisors": parts["supervisors"],
        "supervisors_n": len(r["jobs"]),
        "daemon": parts["daemon"],
        "mlflow_helper": parts["mlflow_helper"],
        "manager_other": parts["other_read"],
        "manager": r["manager_cpu_s"],
        "manager_share_of_jobs": r["ratio_to_jobs_and_producer"],
        "commands": r["commands_cpu_s"],
        "all": r["all_cpu_s"],
        "jobs": r["jobs"],
    }


def role_table(roles: dict) -> str:
    """The tandem arm's attribution table (the benchmarks page's)."""
    n = max(1, roles["trials_n"])
    rows = [
        (f"trials ({roles['trials_n']} process trees)", roles["trials"],
         f"{roles['trials'] / n:.2f} a trial"),
        ("  their training loops", roles["trial_loops"], f"{roles['trial_loops'] / n:.2f} a trial"),
        ("  beside the loop (interpreter, imports, consumer)", roles["trials_beside_their_loops"],
         f"{roles['trials_beside_their_loops'] / n:.2f} a trial"),
        ("producer (its tree)", roles["producer"], "the loading, once for all"),
        ("warm imports (the supervisors' fork server)", roles.get("warm_imports", 0.0),
         "torch and MLflow imported once for every job"),
        (f"supervisors ({roles['supervisors_n']})", roles["supervisors"], ""),
        ("daemon", roles["daemon"], ""),
        ("MLflow helper", roles["mlflow_helper"], ""),
        ("manager, other", roles["manager_other"], ""),
        ("manager: all of it", roles["manager"],
         f"{100 * (roles['manager_share_of_jobs'] or 0):.1f}% of the jobs' (trials, producer, warm imports)"),
        ("commands", roles["commands"], "the arm's process: tandem share define, submit, wait, daemon stop"),
        ("all", roles["all"], "reaped here, each read as a zombie"),
    ]  # fmt: skip
    lines = ["| tandem arm, by role | CPU-s | |", "|---|---:|---|"]
    lines += [f"| {a} | {b:.2f} | {c} |" for a, b, c in rows]
    return "\n".join(lines)


def lrs_of(args: argparse.Namespace) -> list[str]:
    return [lr.strip() for lr in args.lrs.split(",") if lr.strip()]


def table(results: list[dict]) -> str:
    ray = next((r for r in results if r["arm"] == "ray" and r["ok"]), None)
    lines = [
        "| arm | makespan, s | vs Ray Tune | CPU-s, all | trial loops | the rest | a trial's process | "
        "trials finished, exact |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        ratio = f"{r['makespan_s'] / ray['makespan_s']:.2f}x" if ray and r["ok"] else "-"
        own = "-" if r.get("trial_process_cpu_s") is None else f"{r['trial_process_cpu_s']:.2f}"
        lines.append(
            f"| {r['arm']} | {r['makespan_s']:.1f} | {ratio} | {r['cpu_s']:.1f} | "
            f"{r['trial_loops_cpu_s']:.1f} | {r['rest_cpu_s']:.1f} | {own} | "
            f"{r['trials_finished_exact']}/{r['trials']}{'' if r['ok'] else ' FAILED'} |"
        )
    by_arm = {r["arm"]: r for r in results if r["ok"]}
    if "tandem" in by_arm and "plain" in by_arm and by_arm["plain"].get("trial_process_cpu_s"):
        under, outside = by_arm["tandem"]["trial_process_cpu_s"], by_arm["plain"]["trial_process_cpu_s"]
        lines.append(
            f"\nA trial's own process under the manager: {under:.2f} CPU-s, outside it (plain): "
            f"{outside:.2f}: **{under / outside:.2f}x**."
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arms", default=",".join(ARMS), help="which, in this order")
    ap.add_argument("--lrs", default=LRS, help="the grid (8 learning rates)")
    ap.add_argument("--items", type=int, default=1500)
    ap.add_argument("--clip-s", type=float, default=2.0, help="seconds of audio an item is made from")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--private-workers", type=int, default=0, help="DataLoader workers of a private trial")
    ap.add_argument("--quick", action="store_true", help="400 items, 2 epochs: a check, not a figure")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds an arm may take")
    ap.add_argument("--linger", type=float, default=120, help="seconds left processes get to end")
    ap.add_argument("--out", type=Path, default=ROOT / "results")
    ap.add_argument("--label", default="")
    ap.add_argument("--keep", action="store_true", help="keep each arm's work directory")
    ap.add_argument("--run-arm", choices=ARMS, help=argparse.SUPPRESS)
    ap.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.run_arm:
        runs = {"tandem": run_tandem, "plain": run_plain, "ray": run_ray, "submitit": run_submitit}
        runs[args.run_arm](args.work, lrs_of(args))
        return 0
    if args.quick:
        args.items, args.epochs = 400, 2
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    if bad := [a for a in arms if a not in ARMS]:
        ap.error(f"unknown arm(s) {bad}: choose among {', '.join(ARMS)}")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise SystemExit("cannot become a child subreaper (Linux only)")
    results = []
    for arm in arms:
        print(f"{arm}: running ({len(lrs_of(args))} trials)...", file=sys.stderr, flush=True)
        r = run_arm(arm, args)
        results.append(r)
        print(f"{arm}: makespan {r['makespan_s']:.1f} s, {r['cpu_s']:.1f} CPU-s, "
              f"{r['trials_finished_exact']} trials exact, exit {r['exit_code']}"
              + (f"\n{r['log_tail']}" if not r["ok"] else ""), file=sys.stderr, flush=True)  # fmt: skip
    print(table(results))
    roles = next((r["by_role"] for r in results if r.get("by_role")), None)
    if roles is not None:
        print(role_table(roles))
    command = "python benchmarks/sweep_vs.py " + " ".join(sys.argv[1:])
    payload = {
        "command": command.strip(),
        "when": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": {
            "cores": psutil.cpu_count(),
            "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "workload": {
            "lrs": lrs_of(args),
            "items": args.items,
            "clip_s": args.clip_s,
            "epochs": args.epochs,
            "batch": 64,
            "private_workers": args.private_workers,
        },
        "load_after": os.getloadavg(),
        "results": results,
    }
    label = f"-{args.label}" if args.label else ""
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"sweep_vs{label}.json").write_text(json.dumps(payload, indent=1) + "\n")
    loads = ", ".join(f"{r['arm']} {r['load_before'][0]:.1f}" for r in results)
    other = ", ".join(f"{r['arm']} {r['other_load_cpu_s']:.0f}" for r in results)
    machine = f"{psutil.cpu_count()} cores, {payload['machine']['platform']}"
    (args.out / f"sweep_vs{label}.md").write_text(
        f"# One sweep, three tools ({payload['when']})\n\n`{payload['command']}`: "
        f"{len(lrs_of(args))} trials, {args.items} items x {args.epochs} epochs; {machine}."
        f"\n\n{table(results)}\n\n1-min load average before each arm: {loads}. CPU-s used by the rest of the "
        f"machine during each arm: {other}. CPU-s counted by cgroup: "
        f"{', '.join(sorted({r['cgroup'] for r in results}))}.\n"
        + (f"\nWhere the tandem arm's CPU went, by role (the kernel's figures per process):\n\n"
           f"{role_table(roles)}\n" if roles is not None else "")
    )  # fmt: skip
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
