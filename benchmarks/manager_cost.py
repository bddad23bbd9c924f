"""What the job manager itself costs: its processes' CPU time against its jobs', on the
README's sweep.

The sweep is the README's "A first shared sweep", run as printed (both taken from README.md at
run time): its ``train.py`` (a plain PyTorch script whose ``DataLoader`` is tandem's drop-in,
over a dataset whose items cost CPU; the loss logged to MLflow each epoch) written into an
empty folder, and its ``bash`` block (``tandem submit --group lr-sweep --grid lr=... --
python train.py {lr}``, ``tandem ls``, ``tandem wait``, ``tandem report group:lr-sweep``) run
there by ``bash`` in a fresh ``HOME`` (so a fresh state directory, ``~/.local/state/tandem``,
and a fresh MLflow store in it) with a private ``TANDEM_RUNTIME_DIR``; then ``tandem daemon
stop``, which returns once the daemon has ended and its MLflow helper has written every run.
The daemon runs with its defaults; the trainings' loaders ask it for one producer of their
data. It measures whichever ``tandem`` Python imports: ``PYTHONPATH=<a checkout>/src``
measures another commit's.

**How CPU time is attributed**, exactly (the kernel's figures, never a sample's):

- This process is a child subreaper (``PR_SET_CHILD_SUBREAPER``), so every process of the
  sweep is its descendant, orphans included (the daemon, once the ``tandem`` command that
  started it exits). Each child that ends is read as a zombie (``/proc/PID/stat``: its own
  CPU and its reaped children's) before it is reaped (``wait4``: the total).
  *All* = the sum of those totals: every CPU-second of the sweep's processes.
- *Commands* = the ``bash`` that ran the block (with every ``tandem`` command it ran) and
  ``tandem daemon stop``.
- *Jobs* = each job's process tree, training and producer (the loading that every job would
  otherwise do itself) apart: the kernel's total of a supervisor's reaped children, which is
  its job's tree (``/proc/PID/stat`` fields ``cutime + cstime``, read every 0.1 s while the
  supervisor lives and final once it has reaped its job; where no read fell between the
  reap and the supervisor's exit, the same kernel total as the supervisor itself wrote it
  in ``result.json``).
- *Manager* = All - Commands - Jobs: the daemon, every supervisor's own CPU, the MLflow
  helper and anything else they started. The daemon's own CPU is exact (read as a zombie);
  the helper's too when it outlives the daemon (else its last read); the supervisors' is
  the rest.

    python benchmarks/manager_cost.py [--out benchmarks/results]

Writes ``manager_cost.json`` and ``manager_cost.md`` to ``--out``; exits 1 where the target
is not met. Target (issue 49): the manager at most 3% of the training jobs' CPU.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

import tandem
from tandem.place.run.supervisor.files import SHIM_LOG
from tandem.place.run.supervisor.proctrack import FORKSERVER_MODULE as FORKSERVER

ROOT = Path(__file__).resolve().parent
REPO = ROOT.parent
CLK = os.sysconf("SC_CLK_TCK")
PR_SET_CHILD_SUBREAPER = 36
TARGET = 0.03


def readme_sweep() -> tuple[str, str]:
    """The README's sweep as printed: its ``train.py`` and its block of commands."""
    text = (REPO / "README.md").read_text()
    script = next(
        (b for b in re.findall(r"```python\n(.*?)```", text, re.S) if b.startswith("# train.py")), None
    )
    block = next(
        (b for b in re.findall(r"```bash\n(.*?)```", text, re.S) if "tandem submit --group" in b), None
    )
    if script is None or block is None:
        raise SystemExit(
            "README.md has no sweep (a ```python block '# train.py' and a ```bash 'tandem submit --group')"
        )
    return script, block


def stat(pid: int) -> tuple[int, float, float, int] | None:
    """``/proc/PID/stat``: parent, own CPU-s, reaped children's CPU-s, start tick (None: gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    rest = data[data.rindex(b")") + 2 :].split()
    own = (int(rest[11]) + int(rest[12])) / CLK
    kids = (int(rest[13]) + int(rest[14])) / CLK
    return int(rest[1]), own, kids, int(rest[19])


def cmdline(pid: int) -> list[str]:
    """``pid``'s command line; for a supervisor forked by the daemon's fork server (whose
    command line it keeps), the one it would have had on its own (``... shim ATTEMPT_DIR``:
    the folder of the ``shim.log`` its stdout is), so that it is read as the others are."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []
    if FORKSERVER in argv:
        try:
            out = os.readlink(f"/proc/{pid}/fd/1")
        except OSError:
            out = ""
        if out.endswith("/" + SHIM_LOG):
            return [*argv[:-1], SUPERVISOR, out.removesuffix("/" + SHIM_LOG)]
    return argv


SUPERVISOR = "tandem.place.run.supervisor.shim"
ROLES = (
    ("tandem.place.daemon", "daemon"),
    (SUPERVISOR, "supervisor"),
    # its own CPU is the jobs' warm imports (torch, MLflow: supervisor/warm.py), done once for
    # them all; the supervisors it forks are read as supervisors (cmdline)
    (FORKSERVER, "supervisors' fork server"),
    ("tandem.place.run.metrics.tracking", "mlflow helper"),
    ("serve-spec", "producer"),
)


@dataclass
class Proc:
    pid: int
    start: int
    role: str
    argv: list[str]
    own: float = 0.0  # CPU-s of the process itself (last read, or final as a zombie)
    kids: float = 0.0  # CPU-s of its reaped children (likewise)
    total: float | None = None  # wait4's total, where this process reaped it
    status: int | None = None  # and its wait status
    final: bool = False  # own and kids read as a zombie
    ppid: int = 0  # its parent when first seen (an orphan's later parent is this script)


@dataclass
class Watcher:
    """Every descendant of this process, read from /proc every ``interval`` s (a full
    scan for new ones every 5th time)."""

    interval: float = 0.1
    procs: dict[tuple[int, int], Proc] = field(default_factory=dict)
    timeline: list[tuple[float, dict[str, float]]] = field(default_factory=list)  # each second
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    thread: threading.Thread | None = None  # what runs it, from start() to finish()

    def start(self) -> None:
        """Watch from now on, in a thread of this process."""
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def finish(self) -> None:
        """Stop watching (its figures stay)."""
        self.stop.set()
        if self.thread is not None:
            self.thread.join()

    def role_of(self, pid: int, parent: Proc | None, argv: list[str]) -> str:
        line = " ".join(argv)
        if parent is not None and FORKSERVER in line and parent.role in ("supervisor", "job", "producer"):
            # a warm job (a fork of its supervisor: supervisor/warm.py), or a fork of one
            return "job" if parent.role == "supervisor" else parent.role
        for needle, role in ROLES:
            if needle in line:
                return role
        if parent is None:
            return "commands"
        if parent.role == "supervisor":
            return "job"
        if parent.role in ("daemon", "mlflow helper"):
            return "manager, other"
        return parent.role  # a job's or producer's children are theirs; a command's, the command's

    def scan(self) -> None:
        parents: dict[int, tuple[int, int]] = {}
        for entry in os.scandir("/proc"):
            if entry.name.isdigit() and (s := stat(int(entry.name))) is not None:
                parents[int(entry.name)] = (s[0], s[3])
        me, mine = os.getpid(), {}
        alive = {(p.pid, p.start): p for p in self.procs.values()}
        changed = True
        while changed:  # descendants of this process: parent chains that end here
            changed = False
            for pid, (ppid, start) in parents.items():
                if pid in mine:
                    continue
                if ppid == me or ppid in mine or (pid, start) in alive:
                    mine[pid] = start
                    changed = True
        by_pid = {p.pid: p for p in self.procs.values()}
        with self.lock:
            for pid, start in mine.items():
                if (pid, start) not in self.procs:
                    argv = cmdline(pid)
                    parent = by_pid.get(parents[pid][0])
                    proc = Proc(pid, start, self.role_of(pid, parent, argv), argv, ppid=parents[pid][0])
                    self.procs[(pid, start)] = by_pid[pid] = proc
            # One read between its fork and its exec had its parent's command line (a
            # supervisor taken for its daemon, and so its job for the manager's): each live
            # one's command line again, and every role anew, parents (started first) first.
            for p in sorted(self.procs.values(), key=lambda p: p.start):
                if p.final:
                    continue
                if (argv := cmdline(p.pid)) and mine.get(p.pid) == p.start:
                    p.argv = argv
                p.role = self.role_of(p.pid, by_pid.get(p.ppid), p.argv)

    def read(self) -> None:
        with self.lock:
            for p in self.procs.values():
                if p.final:
                    continue
                s = stat(p.pid)
                if s is not None and s[3] == p.start:
                    p.own, p.kids = s[1], s[2]

    def run(self) -> None:
        n, t0 = 0, time.monotonic()
        while not self.stop.wait(self.interval):
            if n % 5 == 0:
                self.scan()
            self.read()
            if n % 10 == 0:  # each role's own CPU so far: what is paid once, what per second
                roles: dict[str, float] = {}
                with self.lock:
                    for p in self.procs.values():
                        roles[p.role] = roles.get(p.role, 0.0) + p.own
                self.timeline.append((round(time.monotonic() - t0, 1), roles))
            n += 1

    def reap(self, pid: int) -> Proc | None:
        """Read zombie ``pid`` (a child of this process) and reap it."""
        s = stat(pid)
        argv = cmdline(pid)
        _, status, ru = os.wait4(pid, 0)
        if s is None:
            return None
        with self.lock:
            p = self.procs.get((pid, s[3]))
            if p is None:  # started and ended between two scans
                p = Proc(pid, s[3], self.role_of(pid, None, argv), argv)
                self.procs[(pid, s[3])] = p
            p.own, p.kids, p.final = s[1], s[2], True
            p.total = ru.ru_utime + ru.ru_stime
            p.status = status
        return p

    def reap_one(self) -> tuple[int, Proc | None] | None:
        """One ended child of this process read as a zombie, then reaped: its pid and record;
        None where none has ended (ChildProcessError where it has no child)."""
        info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        if info is None:
            return None
        return info.si_pid, self.reap(info.si_pid)


def reap_until(w: Watcher, done: callable, deadline: float) -> None:  # type: ignore[valid-type]
    """Reap this process's ending children (each read as a zombie first) until ``done()``."""
    while not done():
        if time.monotonic() > deadline:
            raise SystemExit("the sweep did not end in time")
        try:
            reaped = w.reap_one()
        except ChildProcessError:
            reaped = None
        if reaped is None:
            time.sleep(0.05)


def prepare(work: Path, script: str) -> dict[str, str]:
    """The user's side of the sweep in ``work``: the README's ``train.py``, a fresh ``HOME``,
    a private runtime directory; the environment the block runs in."""
    (work / "train.py").write_text(script)
    home, runtime = work / "home", work / "run"
    home.mkdir()
    runtime.mkdir(mode=0o700)
    drop = ("TANDEM_STATE_DIR", "XDG_STATE_HOME", "MLFLOW_TRACKING_URI", "XDG_RUNTIME_DIR")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(
        HOME=str(home),
        TANDEM_RUNTIME_DIR=str(runtime),
        PATH=f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}",
    )
    return env


def sweep(work: Path, env: dict[str, str], block: str) -> dict:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise SystemExit("cannot become a child subreaper (Linux only)")
    w = Watcher()
    w.start()
    t0 = time.monotonic()
    bash = subprocess.Popen(["bash", "-c", block], cwd=work, env=env)
    reap_until(w, lambda: any(p.pid == bash.pid and p.final for p in w.procs.values()), t0 + 3600)
    wall = time.monotonic() - t0
    bash.returncode = 0  # reaped above (its exit status is not what is measured)
    stop = subprocess.Popen(["tandem", "daemon", "stop"], cwd=work, env=env)
    reap_until(w, lambda: any(p.pid == stop.pid and p.final for p in w.procs.values()), t0 + 3700)

    def nothing_left() -> bool:
        try:
            return os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None and not any(
                psutil.Process().children()
            )
        except ChildProcessError:
            return True

    reap_until(w, nothing_left, time.monotonic() + 300)
    w.finish()
    return {
        "wall_s": wall,
        "procs": list(w.procs.values()),
        "bash": bash.pid,
        "stop": stop.pid,
        "timeline": w.timeline,
    }


def account(run: dict) -> dict:
    from tandem.place.run.supervisor.files import read_json

    procs: list[Proc] = run["procs"]
    everything = sum(p.total for p in procs if p.total is not None)
    commands = sum(p.total for p in procs if p.pid in (run["bash"], run["stop"]) and p.total is not None)
    jobs: list[dict] = []
    for p in procs:
        if p.role != "supervisor":
            continue
        attempt = Path(p.argv[-1])
        result = read_json(attempt / "result.json") or {}
        spec = read_json(attempt / "spec.json") or {}
        written = result.get("cpu_seconds")
        tree = p.kids if p.kids > 0 else written
        jobs.append(
            {
                # a share's producer is a job row of its own ("producer NAME", serve-spec)
                "what": "producer"
                if "serve-spec" in spec.get("command", [])
                else f"job {spec.get('job_id')}",
                "name": spec.get("name"),
                "state": result.get("state"),
                "tree_cpu_s": tree,
                "read_from": "/proc (reaped children)" if p.kids > 0 else "result.json",
                "result_json_cpu_s": written,
                "supervisor_cpu_s": p.own,
            }
        )
    # A job's or producer's orphan that this process reaped is theirs as well.
    orphans = sum(p.total or 0.0 for p in procs if p.role in ("job", "producer") and p.total is not None)
    training = sum(j["tree_cpu_s"] or 0.0 for j in jobs if j["what"] != "producer")
    producer = sum(j["tree_cpu_s"] or 0.0 for j in jobs if j["what"] == "producer")
    # What the fork server did itself: the imports each warm job would have done (and forks)
    warm = sum(p.own for p in procs if p.role == "supervisors' fork server")
    manager = everything - commands - training - producer - orphans - warm
    daemon = [p for p in procs if p.role == "daemon"]
    helper = [p for p in procs if p.role == "mlflow helper"]
    parts = {
        "daemon": sum(p.own for p in daemon),
        "daemon_exact": all(p.final for p in daemon),
        "mlflow_helper": sum(p.own for p in helper),
        "mlflow_helper_exact": all(p.final for p in helper),
        "supervisors_read": sum(j["supervisor_cpu_s"] for j in jobs),
        "other_read": sum(p.own for p in procs if p.role == "manager, other"),
    }
    parts["supervisors"] = manager - parts["daemon"] - parts["mlflow_helper"] - parts["other_read"]
    return {
        "wall_s": run["wall_s"],
        "all_cpu_s": everything,
        "commands_cpu_s": commands,
        "training_cpu_s": training + orphans,
        "producer_cpu_s": producer,
        "warm_imports_cpu_s": warm,
        "manager_cpu_s": manager,
        "manager_parts": parts,
        "ratio_to_training": manager / (training + orphans + warm) if training else None,
        "ratio_to_jobs_and_producer": manager / (training + orphans + producer + warm) if training else None,
        "jobs": jobs,
        "processes": [
            {
                "pid": p.pid,
                "role": p.role,
                "own_s": p.own,
                "kids_s": p.kids,
                "final": p.final,
                "argv": p.argv[:6],
            }
            for p in procs
        ],
        "block_exit_status": next((p.status for p in procs if p.pid == run["bash"]), None),
        "timeline": run["timeline"],
    }


def table(r: dict) -> str:
    parts = r["manager_parts"]
    exact = {True: "exact", False: "last read"}
    n_jobs = sum(1 for j in r["jobs"] if j["what"] != "producer")
    rows = [
        (f"training jobs ({n_jobs} trees)", r["training_cpu_s"], ""),
        ("producer (its tree)", r["producer_cpu_s"], ""),
        ("warm imports (the fork server)", r["warm_imports_cpu_s"], "torch and MLflow, once for every job"),
        ("manager: all of it", r["manager_cpu_s"], f"{100 * (r['ratio_to_training'] or 0):.2f}% of training"),
        ("  daemon", parts["daemon"], exact[parts["daemon_exact"]]),
        (
            f"  supervisors ({len(r['jobs'])})",
            parts["supervisors"],
            f"the rest; read: {parts['supervisors_read']:.2f}",
        ),
        ("  MLflow helper", parts["mlflow_helper"], exact[parts["mlflow_helper_exact"]]),
        ("  other", parts["other_read"], ""),
        ("the block's commands", r["commands_cpu_s"], "tandem submit, ls, wait, report, daemon stop"),
    ]
    lines = ["| | CPU-s | |", "|---|---:|---|"]
    lines += [f"| {a} | {b:.2f} | {c} |" for a, b, c in rows]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=ROOT / "results")
    ap.add_argument("--label", default="", help="suffix of the result files")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (state, logs, data)")
    args = ap.parse_args()
    script, block = readme_sweep()
    load_before = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="manager-cost-"))
    env = prepare(work, script)
    print(f"work dir {work}; the README's sweep:\n{block}", file=sys.stderr)
    run = sweep(work, env, block)
    r = account(run)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    if r["block_exit_status"] != 0 or any(
        j["state"] != "succeeded" for j in r["jobs"] if j["what"] != "producer"
    ):
        print(
            f"the sweep did not succeed (bash: wait status {r['block_exit_status']}): no figure",
            file=sys.stderr,
        )
        return 1
    ok = r["ratio_to_training"] is not None and r["ratio_to_training"] <= TARGET
    print(table(r))
    print(
        f"manager {r['manager_cpu_s']:.2f} CPU-s = {100 * r['ratio_to_training']:.2f}% of the training jobs' "
        f"{r['training_cpu_s']:.1f} CPU-s "
        f"({100 * r['ratio_to_jobs_and_producer']:.2f}% with the producer's); "
        f"target <= {100 * TARGET:g}%: {'met' if ok else 'NOT met'}; sweep wall {r['wall_s']:.0f} s"
    )
    label = f"-{args.label}" if args.label else ""
    args.out.mkdir(parents=True, exist_ok=True)
    payload = {
        "command": "python benchmarks/manager_cost.py",
        "sweep": block,
        "train_py": script,
        "machine": {
            "cores": psutil.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "tandem": str(Path(tandem.__file__).parent),  # which checkout was measured
        "load_before": load_before,
        "target": TARGET,
        "met": ok,
        **r,
    }
    (args.out / f"manager_cost{label}.json").write_text(json.dumps(payload, indent=1, default=str) + "\n")
    (args.out / f"manager_cost{label}.md").write_text(
        f"# The job manager's own CPU on the README's sweep ({payload['when']})\n\n"
        f"`{payload['command']}` (tandem from `{payload['tandem']}`), {psutil.cpu_count()} cores; "
        f"sweep wall {r['wall_s']:.0f} s.\n\n" + table(r) + "\n"
    )
    print(f"wrote {args.out / f'manager_cost{label}.json'}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
