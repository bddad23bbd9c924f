"""tandem on a Ray cluster of two separate nodes (:mod:`tests.place.ray_nodes`: a head and
a worker, 2 cores, 4 GB and one fake GPU each, in their own network, pid, mount and UTS
namespaces), with the daemon's defaults: a sweep of share jobs and plain jobs over both
nodes, each share job beside its producer; a daemon killed mid-sweep and restarted losing
nothing and running nothing twice; a cancel that reaches the other node; a node's death,
its jobs run again on the head. Root only (network namespaces); the tests stop only the Ray
processes they started. Skipped where nodes cannot be made (not root), unless
``TANDEM_REQUIRE_NODES=1`` (as ``.ci/run`` sets it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tandem.bench.ray_nodes import NodesCluster, can_make_nodes
from tests.leftovers import note_cluster
from tests.place.conftest import TANDEM, Cli, _cli_in, attempt_dir
from tests.timing import scaled, until

pytest.importorskip("ray")
if (why := can_make_nodes()) is not None:
    if os.environ.get("TANDEM_REQUIRE_NODES") == "1":  # CI runs as root: they must run there
        raise RuntimeError(f"TANDEM_REQUIRE_NODES=1 but separate nodes cannot be made here: {why}")
    pytest.skip(why, allow_module_level=True)

DATASET = "import torch\n\ndef make():\n    return [torch.tensor([float(i)]) for i in range(64)]\n"
# A share job: reads its epoch slowly (the sweep overlaps), then says where it ran, which
# producer fed it and how much; each start of it is one line in runs.txt.
READER = (
    "import os, socket, sys, time\n"
    "from tandem.share import Consumer\n"
    "open('runs.txt', 'a').write(os.environ['TANDEM_JOB_ID'] + '\\n')\n"
    "c = Consumer.from_env(batch_size=8)\n"
    "n = 0\n"
    "for b in c:\n"
    "    n += int(b.shape[0])\n"
    "    time.sleep(float(sys.argv[1]))\n"
    "with open('read.txt', 'a') as f:\n"
    "    f.write(f\"{os.environ['TANDEM_JOB_ID']} {socket.gethostname()} {c.producer_pid} {n}\\n\")\n"
    "c.close()\n"
)
PLAIN = "echo $TANDEM_JOB_ID >> runs.txt; hostname; sleep {}"
# A plain job that runs until the test writes ``release`` in its folder (the nodes share the
# filesystem): as long as the test needs it running, not a guessed length.
HELD = "echo $TANDEM_JOB_ID >> runs.txt; hostname; while [ ! -e release ]; do sleep 0.2; done"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodesCluster]:
    root = tmp_path_factory.mktemp("nodes")
    note_cluster(root)  # undone at the session's end if this process cannot (interrupted)
    c = NodesCluster(root)
    try:
        c.add_node("head")
        c.add_node("worker")
        yield c
    finally:
        c.close()


@pytest.fixture
def on_cluster(cluster: NodesCluster, tmp_path: Path) -> Iterator[Cli]:
    """A state directory whose daemon (started in the head's network) runs on ``cluster``."""
    gen = _cli_in(tmp_path)
    cli = next(gen)
    cli.env.update(RAY_AUTH_MODE="disabled", **cluster.ray_env)  # as the nodes have it
    (tmp_path / "data.py").write_text(DATASET)
    (tmp_path / "reader.py").write_text(READER)
    start_daemon(cli, cluster)
    try:
        yield cli
    finally:
        next(gen, None)


def start_daemon(cli: Cli, cluster: NodesCluster, flags: tuple[str, ...] | None = None) -> None:
    flags = ("--backend", "ray", "--address", cluster.address) if flags is None else flags
    argv = cluster.in_head([*TANDEM, "daemon", "start", *flags])
    r = subprocess.run(argv, env=cli.env, capture_output=True, text=True, timeout=scaled(180), cwd=cli.tmp)
    assert r.returncode == 0, r.stderr[-3000:]


def ls(cli: Cli) -> dict[int, dict]:
    """Every job as ``tandem ls --json --all`` has it, read in this process (it is polled:
    an interpreter a look would keep a core of the two busy)."""
    return {j["id"]: j for j in cli.rows()}


def node_of(job: dict) -> str | None:
    return job["attempts"][-1]["placement"]["node"] if job["attempts"] else None


def wait_for(what, timeout: float, message) -> None:
    until(what, timeout, message, every=0.3)  # each look runs the CLI: not more often


def held_within_nodes(cli: Cli) -> None:
    """What Ray holds and what tandem reserves on each live node fit it: Ray never has to
    queue an attempt that tandem shows running."""
    for n in cli.status()["nodes"]:
        if n["alive"]:
            assert n["cpus_held"] <= n["total"]["cores"] + 1e-6, n
            assert n["reserved"]["ram"] <= n["total"]["ram"], n


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
