"""tandem on a Ray cluster of two separate nodes, with the daemon's defaults: how long a
sweep of share jobs and plain jobs takes on both nodes, how fast a cancel reaches the other
node, how fast a node's death is noticed and its jobs run again, and how long a killed
daemon's restart takes to take up every running attempt.

The cluster is :class:`tandem.bench.ray_nodes.NodesCluster`: a head and a worker (2 cores,
4 GB, one fake 16 GiB GPU each) in their own network, pid, mount and UTS namespaces on this
machine (root only), Ray's health checks at 1 s x 3. Phases, one after the other, each on a
fresh state directory:

1. **sweep**: ``tandem share define ds --dataset data.py:make --batch-size 4``, 8 jobs
   ``--share ds`` (each reads its epoch of 64 items, 0.3 s a batch) and 8 plain jobs
   (``sleep 6``), all submitted at once: the makespan, the jobs on each node, and the
   most running at once.
2. **daemon kill**: 4 jobs of 1 core (``sleep 30``) running on both nodes; the daemon
   SIGKILLed and started again: how long ``tandem daemon start`` took, and that each job
   ran once.
3. **cancel**: ``tandem cancel`` of a job running on the worker: seconds from the command's
   start to ``cancelled``.
4. **node death**: 4 jobs of 1 core (``sleep 20``) on both nodes; the worker killed (every
   process of it): seconds until its jobs are back in the queue, and until all succeeded.

    sudo python benchmarks/ray_nodes.py [--out benchmarks/results]

Writes ``ray_nodes.json`` and ``ray_nodes.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tandem.bench.ray_nodes import NodesCluster, can_make_nodes

TANDEM = [sys.executable, "-m", "tandem.cli"]
DATASET = "import torch\n\ndef make():\n    return [torch.tensor([float(i)]) for i in range(64)]\n"
READER = (
    "import time\nfrom tandem.share import Consumer\n"
    "with Consumer.from_env(batch_size=8) as c:\n    for b in c:\n        time.sleep(0.3)\n"
)


class Tandem:
    """The ``tandem`` command for one state directory, the daemon started in the head's network."""

    def __init__(self, root: Path, cluster: NodesCluster) -> None:
        self.dir, self.cluster = root, cluster
        root.mkdir(parents=True)
        (root / "data.py").write_text(DATASET)
        (root / "reader.py").write_text(READER)
        self.env = dict(os.environ, TANDEM_STATE_DIR=str(root / "state"), TANDEM_RUNTIME_DIR=str(root / "rt"))
        self.env.update(RAY_AUTH_MODE="disabled")

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        r = subprocess.run(
            [*TANDEM, *args], env=self.env, capture_output=True, text=True, cwd=self.dir, timeout=600
        )
        if check and r.returncode != 0:
            raise RuntimeError(f"tandem {' '.join(args)}: {r.stderr[-2000:]}")
        return r

    def start(self) -> float:
        t = time.monotonic()
        argv = ["daemon", "start", "--backend", "ray", "--address", self.cluster.address]
        r = subprocess.run(
            self.cluster.in_head([*TANDEM, *argv]), env=self.env, capture_output=True, text=True
        )
        if r.returncode != 0:
            raise RuntimeError(r.stderr[-2000:])
        return time.monotonic() - t

    def jobs(self) -> dict[int, dict]:
        return {j["id"]: j for j in json.loads(self("ls", "--json", "--all").stdout)}

    def submit(self, *args: str) -> int:
        return int(self("submit", *args).stdout)

    def until(self, what, timeout: float = 600) -> float:
        t, deadline = time.monotonic(), time.monotonic() + timeout
        while not what():
            if time.monotonic() > deadline:
                raise RuntimeError(self("ls").stdout)
            time.sleep(0.1)
        return time.monotonic() - t

    def stop(self) -> None:
        self("cancel", "--all", check=False)
        self("daemon", "stop", check=False)


def node_of(job: dict) -> str | None:
    return job["attempts"][-1]["placement"]["node"] if job["attempts"] else None


def sweep(t: Tandem) -> dict:
    t.start()
    t("share", "define", "ds", "--dataset", "data.py:make", "--batch-size", "4")
    began = time.monotonic()
    ids = [t.submit("--share", "ds", "--", sys.executable, "reader.py") for _ in range(8)]
    ids += [t.submit("--", "sleep", "6") for _ in range(8)]
    most = 0

    def done() -> bool:
        nonlocal most
        jobs = t.jobs()
        most = max(most, sum(jobs[i]["state"] == "running" for i in ids))
        return all(jobs[i]["state"] == "succeeded" for i in ids)

    t.until(done)
    jobs = t.jobs()
    nodes = [node_of(jobs[i]) for i in ids]
    return {
        "makespan_s": round(time.monotonic() - began, 1),
        "jobs_per_node": {n: nodes.count(n) for n in sorted(set(map(str, nodes)))},
        "most_running_at_once": most,
        "producers_on": producers_on(jobs),
    }


def producers_on(jobs: dict[int, dict]) -> list[str]:
    """The nodes the share's producers ran on, one entry each."""
    return sorted(str(node_of(j)) for j in jobs.values() if j["role"] == "producer")


def big_group(t: Tandem) -> dict:
    """A share group whose jobs' RAM one node cannot hold (1.5 GB each on 4 GB nodes)."""
    t.start()
    t("share", "define", "big", "--dataset", "data.py:make", "--batch-size", "4")
    began = time.monotonic()
    ids = [t.submit("--share", "big", "--mem", "1500M", "--", sys.executable, "reader.py") for _ in range(6)]
    t.until(lambda: all(t.jobs()[i]["state"] == "succeeded" for i in ids))
    jobs = t.jobs()
    nodes = [str(node_of(jobs[i])) for i in ids]
    return {
        "makespan_s": round(time.monotonic() - began, 1),
        "jobs_per_node": {n: nodes.count(n) for n in sorted(set(nodes))},
        "producers_on": producers_on(jobs),
    }


def daemon_kill(t: Tandem) -> dict:
    t.start()
    ids = [t.submit("--cpus", "1", "--", "sleep", "30") for _ in range(4)]
    t.until(lambda: all(j["state"] == "running" for j in t.jobs().values()))
    pid = json.loads((t.dir / "state" / "daemon.json").read_text())["pid"]
    os.kill(pid, signal.SIGKILL)
    restart = t.start()
    t.until(lambda: all(t.jobs()[i]["state"] == "succeeded" for i in ids))
    jobs = t.jobs()
    return {"restart_s": round(restart, 1), "attempts_per_job": sorted(len(jobs[i]["attempts"]) for i in ids)}


def cancel(t: Tandem) -> dict:
    ids = [t.submit("--cpus", "1", "--", "sleep", "120") for _ in range(4)]
    t.until(lambda: all(t.jobs()[i]["state"] == "running" for i in ids))
    remote = next(i for i, j in t.jobs().items() if i in ids and node_of(j) == "worker")
    began = time.monotonic()
    t("cancel", str(remote))
    t.until(lambda: t.jobs()[remote]["state"] == "cancelled")
    took = time.monotonic() - began
    t("cancel", "--all")
    return {"cancel_on_the_worker_s": round(took, 2)}


def node_death(t: Tandem) -> dict:
    ids = [t.submit("--cpus", "1", "--", "sleep", "20") for _ in range(4)]
    t.until(lambda: all(t.jobs()[i]["state"] == "running" for i in ids))
    remote = [i for i, j in t.jobs().items() if i in ids and node_of(j) == "worker"]
    t.cluster.nodes[1].kill()
    noticed = t.until(lambda: all(t.jobs()[i]["state"] != "running" for i in remote))
    finished = noticed + t.until(lambda: all(t.jobs()[i]["state"] == "succeeded" for i in ids))
    jobs = t.jobs()
    return {
        "requeued_after_s": round(noticed, 1),
        "all_succeeded_after_s": round(finished, 1),
        "ran_again_on": sorted({str(node_of(jobs[i])) for i in remote}),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    if (why := can_make_nodes()) is not None:
        print(f"ray_nodes: {why}", file=sys.stderr)
        return 2
    results: dict = {"command": "python benchmarks/ray_nodes.py", "when": time.strftime("%Y-%m-%d %H:%M UTC")}
    with tempfile.TemporaryDirectory() as tmp:
        cluster = NodesCluster(Path(tmp) / "nodes")
        try:
            cluster.add_node("head")
            cluster.add_node("worker")
            phases = (
                ("sweep", sweep),
                ("big_group", big_group),
                ("daemon_kill", daemon_kill),
                ("cancel", cancel),
            )
            for name, phase in phases:
                t = Tandem(Path(tmp) / name, cluster)
                try:
                    results[name] = phase(t) if name != "cancel" else (t.start(), phase(t))[1]
                finally:
                    t.stop()
                print(name, results[name], flush=True)
            t = Tandem(Path(tmp) / "node_death", cluster)
            t.start()
            try:
                results["node_death"] = node_death(t)
            finally:
                t.stop()
            print("node_death", results["node_death"], flush=True)
        finally:
            cluster.close()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ray_nodes.json").write_text(json.dumps(results, indent=2) + "\n")
    s, k, c, d = results["sweep"], results["daemon_kill"], results["cancel"], results["node_death"]
    b = results["big_group"]
    md = [
        "# tandem on two Ray nodes (separate namespaces, 2 cores and 4 GB each, defaults)",
        "",
        f"`{results['command']}`, {results['when']}",
        "",
        "| phase | measured |",
        "|---|---|",
        f"| sweep: 8 share + 8 plain jobs | {s['makespan_s']} s; jobs per node {s['jobs_per_node']}; "
        f"at most {s['most_running_at_once']} running at once; producers on {s['producers_on']} |",
        f"| share group of 6 jobs of 1.5 GB (more than a node holds) | {b['makespan_s']} s; jobs per "
        f"node {b['jobs_per_node']}; producers on {b['producers_on']} |",
        f"| daemon SIGKILL, restart | `daemon start` {k['restart_s']} s; "
        f"attempts per job {k['attempts_per_job']} |",
        f"| cancel of a job on the worker | {c['cancel_on_the_worker_s']} s to `cancelled` |",
        f"| worker killed | its jobs requeued after {d['requeued_after_s']} s, all succeeded after "
        f"{d['all_succeeded_after_s']} s, ran again on {d['ran_again_on']} |",
        "",
    ]
    (args.out / "ray_nodes.md").write_text("\n".join(md))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
