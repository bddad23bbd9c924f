"""tandem on a Ray cluster of separate nodes (:mod:`tests.place.nodes`) losing them: a
node's death, its jobs run again on the head; a partitioned node's jobs followed to their
end; a node cut off from the cluster and the disk, its jobs stopped before they run again.
On a cluster of its own, beside :mod:`tests.place.test_ray_nodes` (its work): Ray's
timeouts are waited side by side."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tandem.bench.ray_nodes import NodesCluster
from tests.place.conftest import Cli, attempt_dir
from tests.place.nodes import (
    HELD,
    ls,
    node_of,
    wait_for,
)


def test_a_dead_node_s_jobs_run_again_on_the_head(on_cluster: Cli, cluster: NodesCluster) -> None:
    """After the tests that need the worker: it dies (every process of it at once)."""
    cli = on_cluster
    ids = [cli.submit("--cpus", "1", "--", "sh", "-c", HELD) for _ in range(4)]
    wait_for(lambda: all(j["state"] == "running" for j in ls(cli).values()), 120, lambda: cli("ls").stdout)
    on_worker = [i for i in ids if node_of(ls(cli)[i]) == "worker"]
    assert len(on_worker) == 2
    cluster.nodes[1].kill()
    # Once the worker's attempts are lost, the jobs on the head end, making room for the reruns.
    wait_for(
        lambda: all(ls(cli)[i]["attempts"][0]["state"] == "lost" for i in on_worker),
        120,
        lambda: cli("ls").stdout,
    )
    (cli.tmp / "release").write_text("")
    assert cli("wait", *map(str, ids), timeout=400).returncode == 0, cli("ls").stdout
    jobs = ls(cli)
    for i in on_worker:
        first, again = jobs[i]["attempts"]
        assert first["state"] == "lost" and "node worker is gone" in first["cause"], first
        assert again["state"] == "succeeded" and again["placement"]["node"] == "head", again
        assert "cut off" not in cli("show", str(i)).stdout, "a dead node's job is no partition's"
    nodes = cli.status()["nodes"]
    assert [n["alive"] for n in nodes if n["name"] == "worker"] == [False]
    assert "node worker: gone" in cli("daemon", "status").stdout


# Ticks into ticks-NAME.txt until the test writes ``release`` (every ticker) or
# ``release-NAME`` (this one), at most 5 minutes.
TICKER = (
    "import os, socket, sys, time\n"
    "end, mine = time.time() + 300, f'release-{sys.argv[1]}'\n"
    "with open(f'ticks-{sys.argv[1]}.txt', 'a', buffering=1) as f:\n"
    "    while time.time() < end and not (os.path.exists('release') or os.path.exists(mine)):\n"
    "        f.write(f'{socket.gethostname()} {time.time()}\\n')\n"
    "        time.sleep(0.2)\n"
)


def test_a_partitioned_node_s_jobs_run_once_followed_to_their_end(
    on_cluster: Cli, cluster: NodesCluster
) -> None:
    """A node cut off from the others (its network down; it runs on, the filesystem still
    shared): Ray takes it for dead within seconds, but its jobs' supervisors still write, so
    the daemon follows them there to their end instead of running them again beside
    themselves: every job succeeds, each ran once, and the cut-off is said. After the
    dead-node test: a node of its own joins first."""
    cli = on_cluster
    island = cluster.add_node("island")

    def nodes() -> dict[str, dict]:
        return {n["name"]: n for n in cli.status()["nodes"]}

    wait_for(lambda: nodes().get("island", {}).get("alive"), 60, lambda: cli("daemon", "status").stdout)
    (cli.tmp / "ticker.py").write_text(TICKER)
    # GPU jobs of declared compute (the host's compute gate sees this machine's two cores busy
    # for every node): two on each node.
    need = ("--cpus", "1", "--gpus", "1", "--gpu-mem", "1G", "--gpu-share", "25")
    # Each runs until released once the cut-off is seen (on a loaded machine Ray may take half
    # a minute to call the cut node dead, and the jobs must still run then).
    ids = [cli.submit(*need, "--", sys.executable, "ticker.py", str(k)) for k in range(4)]
    wait_for(lambda: all(j["state"] == "running" for j in ls(cli).values()), 120, lambda: cli("ls").stdout)
    on_island = [i for i in ids if node_of(ls(cli)[i]) == "island"]
    assert len(on_island) == 2, cli("ls").stdout

    def ticking(k: int) -> bool:
        path = cli.tmp / f"ticks-{k}.txt"
        return path.exists() and node_of(ls(cli)[ids[k]]) in path.read_text()

    wait_for(lambda: all(ticking(k) for k in range(4)), 120, lambda: cli("ls").stdout)  # each program runs
    island.cut()
    try:
        wait_for(lambda: not nodes()["island"]["alive"], 60, lambda: cli("daemon", "status").stdout)
        wait_for(
            lambda: all(any(e.startswith("cut off") for e in cli.events(i)) for i in on_island),
            60,
            lambda: cli("show", str(on_island[0])).stdout,
        )
        (cli.tmp / "release").write_text("")  # the island still shares the filesystem
        assert cli("wait", *map(str, ids), timeout=400).returncode == 0, cli("ls").stdout
    finally:
        island.heal()
    jobs = ls(cli)
    for k, i in enumerate(ids):
        ticks = (cli.tmp / f"ticks-{k}.txt").read_text().split()
        assert jobs[i]["state"] == "succeeded" and len(jobs[i]["attempts"]) == 1, jobs[i]
        assert set(ticks[::2]) == {node_of(jobs[i])}, "one copy, where it was placed"


def test_a_node_cut_off_from_the_cluster_and_the_disk_stops_its_jobs_before_they_run_again(
    on_cluster: Cli, cluster: NodesCluster
) -> None:
    """A node that loses both the cluster (its network down) and the shared state directory
    (its attempts' folders refuse new files: ``chattr +i``, which stops root too): its
    supervisors fall silent, so its jobs run again elsewhere after 15 s; each supervisor
    fenced itself first (no heartbeat written for 8 s, no Ray head), so no job ran in two
    places at once. After the partition test: a node of its own joins first."""
    cli = on_cluster
    moat = cluster.add_node("moat")

    def alive() -> set[str]:
        return {n["name"] for n in cli.status()["nodes"] if n["alive"]}

    wait_for(lambda: "moat" in alive(), 60, lambda: cli("daemon", "status").stdout)
    (cli.tmp / "ticker.py").write_text(TICKER)
    need = ("--cpus", "1", "--gpus", "1", "--gpu-mem", "1G", "--gpu-share", "25")
    # Each runs until released: the others as soon as the node is cut (their room is where
    # the cut-off jobs run again), the cut-off ones once their second copy ticks elsewhere.
    ids = [cli.submit(*need, "--", sys.executable, "ticker.py", f"m{k}") for k in range(2 * len(alive()))]

    def on_moat() -> list[int]:
        jobs = ls(cli)
        return [k for k, i in enumerate(ids) if jobs[i]["state"] == "running" and node_of(jobs[i]) == "moat"]

    wait_for(lambda: len(on_moat()) == 2, 120, lambda: cli("ls").stdout)
    there = on_moat()
    wait_for(lambda: all((cli.tmp / f"ticks-m{k}.txt").exists() for k in there), 60, lambda: cli("ls").stdout)
    folders = [str(attempt_dir(cli.state, ids[k])) for k in there]
    if subprocess.run(["chattr", "+i", *folders], capture_output=True).returncode != 0:
        pytest.skip("chattr +i does not work on this filesystem: its disk cannot be taken away")
    moat.cut()
    try:
        for k in set(range(len(ids))) - set(there):
            (cli.tmp / f"release-m{k}").write_text("")

        def again_elsewhere(k: int) -> bool:
            ticks = (cli.tmp / f"ticks-m{k}.txt").read_text().split()
            return any(host != "moat" for host in ticks[::2])

        wait_for(lambda: all(again_elsewhere(k) for k in there), 180, lambda: cli("ls").stdout)
        for k in there:
            (cli.tmp / f"release-m{k}").write_text("")
        assert cli("wait", *map(str, ids), timeout=400).returncode == 0, cli("ls").stdout
    finally:
        subprocess.run(["chattr", "-i", *folders], check=False)
        moat.heal()
    jobs = ls(cli)
    for k in there:
        first, again = jobs[ids[k]]["attempts"]
        assert first["state"] == "lost" and again["state"] == "succeeded", jobs[ids[k]]
        ticks = [line.split() for line in (cli.tmp / f"ticks-m{k}.txt").read_text().splitlines()]
        cut_off = [float(t) for host, t in ticks if host == "moat"]
        elsewhere = [float(t) for host, t in ticks if host != "moat"]
        # The cut-off copy stopped before the copy elsewhere began: never two at once.
        assert cut_off and elsewhere and max(cut_off) < min(elsewhere), (max(cut_off), min(elsewhere))
        assert max(cut_off) - min(cut_off) < 40, "the cut-off copy ran to its end"
