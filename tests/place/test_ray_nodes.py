"""tandem on a Ray cluster of two separate nodes (:mod:`tests.place.nodes`), with the
daemon's defaults: a sweep of share jobs and plain jobs over both nodes, each share job
beside its producer; a daemon killed mid-sweep and restarted losing nothing and running
nothing twice; a cancel that reaches the other node; each node measured where it is; a share
group that needs a second producer; a supervisor whose actor dies; last, the head's loss.
The nodes' loss (a dead node, a partition, a node cut off from the disk too) is
:mod:`tests.place.test_ray_nodes_lost`, on a cluster of its own."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from tandem.bench.ray_nodes import NodesCluster
from tests.place.conftest import Cli
from tests.place.nodes import (
    PLAIN,
    held_within_nodes,
    ls,
    node_of,
    start_daemon,
    wait_for,
)
from tests.timing import scaled, until


@pytest.mark.tracked  # the one test here whose jobs are MLflow runs, as users get them
def test_a_sweep_runs_on_both_nodes_each_share_job_beside_its_producer_and_survives_a_daemon_kill(
    on_cluster: Cli, cluster: NodesCluster
) -> None:
    cli = on_cluster
    cli("share", "define", "ds", "--dataset", "data.py:make", "--batch-size", "4")
    share = [cli.submit("--share", "ds", "--", sys.executable, "reader.py", "0.6") for _ in range(6)]
    plain = [cli.submit("--", "sh", "-c", PLAIN.format(6)) for _ in range(6)]
    ids = share + plain
    # Mid-sweep (some ended, some running, some waiting): the daemon is killed, and restarted.
    wait_for(
        lambda: sum(j["state"] == "succeeded" for j in ls(cli).values()) >= 2,
        240,
        lambda: cli("ls").stdout,
    )
    held_within_nodes(cli)
    before = ls(cli)
    assert any(before[i]["state"] == "running" for i in ids), cli("ls").stdout
    os.kill(cli.daemon_pid() or 0, signal.SIGKILL)
    # A local daemon would lose sight of the jobs on the cluster: refused, saying how to start.
    r = cli("daemon", "start", "--backend", "local", check=False)
    assert r.returncode == 2 and f"tandem daemon start --backend ray --address {cluster.address}" in r.stderr
    start_daemon(cli, cluster, flags=())  # without flags: the kept configuration, Ray's
    done = time.monotonic() + scaled(400)
    while time.monotonic() < done and any(ls(cli)[i]["state"] != "succeeded" for i in ids):
        held_within_nodes(cli)
        time.sleep(1)
    jobs = ls(cli)
    assert all(jobs[i]["state"] == "succeeded" for i in ids), cli("ls").stdout
    # Each ran exactly once: one attempt, one start of its program.
    assert all(len(jobs[i]["attempts"]) == 1 for i in ids), cli("ls").stdout
    starts = sorted(int(line) for line in (cli.tmp / "runs.txt").read_text().split())
    assert starts == sorted(ids)
    # Both nodes ran jobs; every share job read a whole epoch from its group's producer on
    # the node it ran on, which is where tandem placed it and a producer of its share.
    assert {node_of(jobs[i]) for i in ids} == {"head", "worker"}, cli("ls").stdout
    producers = [j for j in jobs.values() if j["role"] == "producer"]
    where = {node_of(p) for p in producers}
    assert len(where) == len(producers), cli("ls").stdout  # a second one only on another node
    rows = [line.split() for line in (cli.tmp / "read.txt").read_text().splitlines()]
    assert sorted(int(r[0]) for r in rows) == share
    for job_id, host, _pid, n in rows:
        assert host == node_of(jobs[int(job_id)]) and host in where, (job_id, host, where)
        assert int(n) == 64
    for host in where:  # the jobs of a node read its one producer
        assert len({r[2] for r in rows if r[1] == host}) <= 1, rows
    assert f"{node_of(jobs[plain[0]])}/" in cli("ls").stdout  # ls names the node: node/cuda:i


def test_a_cancel_reaches_a_job_on_the_other_node_within_5_s(on_cluster: Cli) -> None:
    cli = on_cluster
    ids = [cli.submit("--cpus", "1", "--", "sh", "-c", PLAIN.format(120)) for _ in range(4)]
    wait_for(lambda: all(j["state"] == "running" for j in ls(cli).values()), 120, lambda: cli("ls").stdout)
    jobs = ls(cli)
    (remote, *_) = [i for i in ids if node_of(jobs[i]) == "worker"]
    asked = time.monotonic()
    cli("cancel", str(remote))
    wait_for(lambda: cli.job(remote)["state"] != "running", 5, lambda: cli("show", str(remote)).stdout)
    assert time.monotonic() - asked < scaled(5)
    assert cli.job(remote)["state"] == "cancelled"
    # A supervisor on the worker killed, no result written: its job ends lost, never stays running.
    (other, *_) = [i for i in ids if node_of(jobs[i]) == "worker" and i != remote]
    folder = f"{cli.state / 'jobs' / str(other)}/"  # its attempts' folders (not job 1x's for job 1)

    def shims() -> list[psutil.Process]:
        return [p for p in psutil.process_iter(["cmdline"]) if "tandem.place.run.supervisor.shim" in " ".join(
            p.info["cmdline"] or ()) and folder in " ".join(p.info["cmdline"] or ())]  # fmt: skip

    # "running" is said once its actor is asked to start it: the supervisor may come later.
    (shim,) = until(shims, 60, lambda: f"no supervisor of job {other}: {cli('show', str(other)).stdout}")
    # Killed once its program runs (its first line is in runs.txt): a supervisor killed before
    # it started the job is another case (the attempt is lost, never started, and run again).
    runs = cli.tmp / "runs.txt"
    started = lambda: runs.exists() and str(other) in runs.read_text().split()  # noqa: E731
    until(started, 60, lambda: f"job {other}'s program never started: {cli('show', str(other)).stdout}")
    shim.kill()
    wait_for(lambda: cli.job(other)["state"] != "running", 60, lambda: cli("show", str(other)).stdout)
    job = cli.job(other)
    said = (
        job["state"],
        job["cause"],
        [(a["state"], a.get("cause")) for a in job["attempts"]],
        cli("show", str(other)).stdout,
    )
    assert job["state"] == "failed" and "supervisor died" in job["cause"], said
    cli("cancel", "--all")


def test_each_node_is_measured_where_it_is_a_full_worker_sends_jobs_to_the_head(
    on_cluster: Cli, cluster: NodesCluster, tmp_path: Path
) -> None:
    """Each node's agent measures it: RAM used on the worker by something tandem did not
    start (another tenant, in the worker's 4 GB) keeps jobs off it, which its reservations
    alone would have spread there."""
    if not cluster.mem_limited:
        pytest.skip("no memory cgroup can be made here: the nodes share one RAM")
    cli = on_cluster

    def nodes() -> dict[str, dict]:
        return {n["name"]: n for n in cli.status()["nodes"]}

    wait_for(
        lambda: all(n["measured_free"] is not None for n in nodes().values()),
        60,
        lambda: f"no agent answered: {nodes()}",
    )
    assert "measured" in cli("daemon", "status").stdout
    held = tmp_path / "held"
    tenant = f"import time; b = b'x' * 3_000_000_000; open({str(held)!r}, 'w'); time.sleep(600)"
    hog = cluster.nodes[1].run([sys.executable, "-c", tenant])
    try:
        wait_for(held.exists, 60, lambda: "the worker's other tenant did not take its RAM")
        wait_for(
            lambda: nodes()["worker"]["measured_free"]["ram"] < 10**9,
            30,
            lambda: f"the worker's agent does not see its RAM taken: {nodes()['worker']}",
        )
        assert nodes()["head"]["measured_free"]["ram"] > 2 * 10**9, nodes()["head"]
        # GPU jobs of declared compute: the host's compute gate (CPU-only jobs; this machine's
        # two cores are both nodes' in truth) leaves them be, as does the GPU's (no NVML on a
        # fake GPU): RAM alone decides.
        need = ("--cpus", "1", "--mem", "1G", "--gpus", "1", "--gpu-mem", "1G", "--gpu-share", "40")
        ids = [cli.submit(*need, "--", "sh", "-c", PLAIN.format(30)) for _ in range(2)]
        wait_for(lambda: all(ls(cli)[i]["state"] == "running" for i in ids), 120, lambda: cli("ls").stdout)
        assert {node_of(ls(cli)[i]) for i in ids} == {"head"}, cli("ls").stdout
    finally:
        hog.kill()
        hog.wait()
        cli("cancel", "--all")


def test_a_share_group_larger_than_its_node_gets_a_second_producer_on_the_other(on_cluster: Cli) -> None:
    """A share group whose jobs' RAM one 4 GB node cannot hold: once its jobs have found no
    room beside its producer for a while, a second producer of the share starts on the other
    node, and each job reads the producer of the node it runs on."""
    cli = on_cluster
    cli("share", "define", "big", "--dataset", "data.py:make", "--batch-size", "4")
    ids = [
        cli.submit("--share", "big", "--mem", "1500M", "--", sys.executable, "reader.py", "1.0")
        for _ in range(5)
    ]
    assert cli("wait", *map(str, ids), timeout=400).returncode == 0, cli("ls").stdout
    jobs = ls(cli)
    assert all(len(jobs[i]["attempts"]) == 1 for i in ids), cli("ls").stdout
    producers = [j for j in jobs.values() if j["role"] == "producer" and j["share"] == "big"]
    assert len(producers) == 2 and {node_of(p) for p in producers} == {"head", "worker"}, cli("ls").stdout
    second = max(producers, key=lambda p: p["id"])
    assert "have no room for it" in cli("show", str(second["id"])).stdout
    rows = [line.split() for line in (cli.tmp / "read.txt").read_text().splitlines()]
    mine = [r for r in rows if int(r[0]) in ids]
    assert sorted(int(r[0]) for r in mine) == ids
    for job_id, host, _pid, n in mine:
        assert host == node_of(jobs[int(job_id)]) and int(n) == 64, (job_id, host)
    assert {r[1] for r in mine} == {"head", "worker"}, mine  # both producers fed jobs
    for host in ("head", "worker"):  # one producer a node: its jobs read the same one
        assert len({r[2] for r in mine if r[1] == host}) == 1, mine


def test_a_supervisor_whose_actor_dies_stops_its_job(on_cluster: Cli) -> None:
    """The actor's process killed (its node's Ray stopped, say): its supervisor and job end
    with it (Ray ends a dead worker's children; where it is set not to, the kernel's death
    signal tells the supervisor, which stops its job), and the attempt ends: never a job
    left running beside its rerun."""
    cli = on_cluster
    job_id = cli.submit("--cpus", "1", "--retries", "0", "--", "sh", "-c", PLAIN.format(300))
    wait_for(lambda: cli.job(job_id)["state"] == "running", 120, lambda: cli("ls").stdout)
    folder = str(cli.state / "jobs" / str(job_id))
    wait_for(lambda: _sleeping(folder), 30, lambda: "no supervisor and job seen")
    shim = _shim_of(folder)
    assert shim is not None
    job = shim.children(recursive=True)
    shim.parent().kill()  # the actor's worker process
    wait_for(
        lambda: not any(map(_alive, (shim, *job))),
        15,
        lambda: (
            f"still running: {[p for p in (shim, *job) if _alive(p)]}; its supervisor's log: "
            + (Path(folder) / "shim.log").read_text()[-2000:]
        ),
    )
    wait_for(lambda: cli.job(job_id)["state"] != "running", 60, lambda: cli("show", str(job_id)).stdout)
    assert cli.job(job_id)["state"] == "failed", cli("show", str(job_id)).stdout


def _alive(p: psutil.Process) -> bool:
    """Running, not ended (a zombie whose parent, the node's first process, does not reap it)."""
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _sleeping(folder: str) -> bool:
    shim = _shim_of(folder)
    return shim is not None and any(c.name() == "sleep" for c in shim.children(recursive=True))


def _shim_of(folder: str) -> psutil.Process | None:
    for p in psutil.process_iter(["cmdline"]):
        line = " ".join(p.info["cmdline"] or ())
        if "tandem.place.run.supervisor.shim" in line and folder in line:
            return p
    return None


def test_the_heads_loss_is_said_on_every_command(on_cluster: Cli, cluster: NodesCluster) -> None:
    """Last of the module: the head dies. Ray ends the daemon, a driver on it; every command
    then says that the cluster does not answer and how to start again once it is back."""
    cli = on_cluster
    assert "does not answer" not in cli("ls").stderr
    cluster.nodes[0].kill()
    wait_for(lambda: "does not answer" in cli("ls").stderr, 120, lambda: cli("ls").stderr)
    said = cli("ls").stderr
    assert f"tandem daemon start --backend ray --address {cluster.address}" in said, said
    assert "does not answer" in cli("show", "1", check=False).stderr
