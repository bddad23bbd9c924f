"""The Ray backend against a real local Ray head with declared fake GPUs (this machine has
none): jobs run as Ray tasks, and each GPU's memory, declared as a custom resource, is
reserved per job, so two jobs that do not fit one GPU together never share it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.place.test_daemon import FAST
from tests.timing import scaled, until

pytest.importorskip("ray")

RAY = [sys.executable, "-m", "ray.scripts.scripts"]


@pytest.fixture
def ray_head(tmp_path: Path, cli):
    """A Ray head (2 cores, 2 fake GPUs of 16 GiB each), stopped after the test: only its own
    processes (those of its temp directory), never another Ray of this machine."""
    env = dict(cli.env, RAY_AUTH_MODE="disabled")  # a throw-away local cluster
    cli.env.update(RAY_AUTH_MODE="disabled")
    temp = Path(f"/tmp/rt-{os.getpid()}")  # Ray's socket paths must stay short
    port = str(20000 + os.getpid() % 20000)
    resources = '{"tandem_gpu_mem_mib_0": 16384, "tandem_gpu_mem_mib_1": 16384}'
    args = [
        *RAY, "start", "--head", "--block", "--num-cpus", "2", "--num-gpus", "2", "--resources", resources,
        "--port", port, "--temp-dir", str(temp), "--include-dashboard", "false", "--disable-usage-stats",
    ]  # fmt: skip
    log = tmp_path / "ray.log"
    with open(log, "ab") as out:
        head = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + scaled(120)
    while "Ray runtime started" not in log.read_text(errors="replace"):
        assert head.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
        time.sleep(0.2)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        cli.stop_daemon()
        head.send_signal(signal.SIGTERM)  # `ray start --block` stops the processes it started
        try:
            head.wait(timeout=scaled(60))
        except subprocess.TimeoutExpired:
            head.kill()
        for p in psutil.process_iter(["cmdline"]):  # and any of them that outlived it
            if str(temp) in " ".join(p.info["cmdline"] or ()):
                p.kill()
        subprocess.run(["rm", "-rf", str(temp)], check=False)


def test_jobs_run_as_ray_tasks_with_gpu_memory_reserved(cli, ray_head, tmp_path: Path) -> None:
    cli(
        "daemon",
        "start",
        "--backend",
        "ray",
        "--address",
        ray_head,
        "--policy",
        "first-fit",
        *FAST,
        timeout=120,
    )
    status = cli.json("daemon", "status")
    assert status["backend"] == "ray"
    # Its one node (this machine) is measured by the agent the daemon made there.
    deadline = time.monotonic() + scaled(60)
    while (node := cli.json("daemon", "status")["nodes"][0])["measured_free"] is None:
        assert time.monotonic() < deadline, f"the node's agent never answered: {node}"
        time.sleep(0.3)
    assert -1e-6 <= node["measured_free"]["cores"] <= node["total"]["cores"] + 1e-6, node
    assert [g["mem_bytes"] for g in status["capacity"]["gpus"]] == [16 << 30, 16 << 30]
    log = tmp_path / "spans.log"
    # Each job logs when it ran, on which GPU, and who started its supervisor (a Ray actor).
    script = (
        f'echo "start $(date +%s.%N) $CUDA_VISIBLE_DEVICES" >> {log}; '
        "w=$(awk '{print $4}' /proc/$PPID/stat); tr '\\0' ' ' < /proc/$w/cmdline; echo; "
        f'sleep 4; echo "end $(date +%s.%N) $CUDA_VISIBLE_DEVICES" >> {log}'
    )
    ids = [cli.submit("--gpus", "1", "--gpu-mem", "10G", "--", "sh", "-c", script) for _ in range(3)]
    r = cli("submit", "--gpus", "1", "--gpu-mem", "20G", "--", "true", check=False)
    assert r.returncode == 2 and "largest GPU has 16.0G" in r.stderr
    assert cli("wait", *map(str, ids), timeout=120).returncode == 0
    spans: dict[str, list[tuple[float, float]]] = {}
    starts: list[tuple[float, str]] = []
    for line in log.read_text().splitlines():
        kind, t, gpu = line.split()
        if kind == "start":
            starts.append((float(t), gpu))
        else:
            start = min((s for s in starts if s[1] == gpu), key=lambda s: abs(float(t) - 4 - s[0]))
            starts.remove(start)
            spans.setdefault(gpu, []).append((start[0], float(t)))
    assert sorted(spans) == ["0", "1"]  # both GPUs used
    for gpu, runs in spans.items():  # 10G + 10G > 16G: never two jobs on one GPU at once
        runs.sort()
        assert all(a[1] <= b[0] + 0.05 for a, b in zip(runs, runs[1:])), (gpu, runs)
    for job_id in ids:
        job = cli.job(job_id)
        assert job["state"] == "succeeded"
        assert "ray::" in cli("logs", str(job_id)).stdout  # the supervisor's parent: a Ray worker
        attempt = job["attempts"][0]["placement"]
        assert attempt["gpu_mem_bytes"] == 10 << 30


def test_ray_backend_without_a_cluster_is_a_clear_error(cli) -> None:
    r = cli(
        "daemon",
        "start",
        "--foreground",
        "--backend",
        "ray",
        "--address",
        "127.0.0.1:1",
        "--no-track",
        check=False,
        timeout=180,
    )
    assert r.returncode == 1 and "no Ray cluster answers at 127.0.0.1:1" in r.stderr
    r = cli("daemon", "start", "--address", "127.0.0.1:1", check=False)
    assert r.returncode == 2 and "--backend ray" in r.stderr
    # The Ray configuration is kept: a start without --backend is the same daemon again (a
    # dead Ray daemon's queue never runs on one machine unasked), here with its cluster gone.
    r = cli("daemon", "start", "--foreground", check=False, timeout=180)
    assert r.returncode == 1 and "no Ray cluster answers at 127.0.0.1:1" in r.stderr, r.stderr
    cli("daemon", "start", "--backend", "local", "--cpus", "1", "--no-track")  # asked: it switches
    assert cli.json("daemon", "status")["backend"] == "local"


def test_two_nodes_each_gpu_memory_on_its_own_node(cli, tmp_path: Path, monkeypatch) -> None:
    """A head with a 16 GiB GPU and a second node with an 8 GiB one (``ray.cluster_utils``):
    10 GiB jobs can only go to the head's GPU and queue there; a 7 GiB job does not fit
    beside one (10 + 7 > 16) and, best fit, goes to the other node whatever the timing.
    The daemon chooses, and Ray enforces it on the node it is pinned to."""
    from ray.cluster_utils import Cluster

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    cli.env.update(RAY_AUTH_MODE="disabled")
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "num_gpus": 1, "resources": {"tandem_gpu_mem_mib_0": 16384}},
    )
    try:
        second = cluster.add_node(num_cpus=2, num_gpus=1, resources={"tandem_gpu_mem_mib_0": 8192})
        cluster.wait_for_nodes()
        cli(
            "daemon",
            "start",
            "--backend",
            "ray",
            "--address",
            cluster.address,
            "--policy",
            "best-fit",
            *FAST,
            timeout=120,
        )
        gpus = {g["mem_bytes"]: g for g in cli.json("daemon", "status")["capacity"]["gpus"]}
        assert sorted(gpus) == [8 << 30, 16 << 30]
        log = tmp_path / "spans.log"
        stamp = 'echo "$TANDEM_JOB_ID {} $(date +%s.%N)" >> ' + str(log)
        job = f"{stamp.format('start')}; sleep 1.5; {stamp.format('end')}"
        big = [
            cli.submit("--gpus", "1", "--gpu-mem", "10G", "--cpus", "0.5", "--", "sh", "-c", job)
            for _ in range(2)
        ]
        small = cli.submit("--gpus", "1", "--gpu-mem", "7G", "--cpus", "0.5", "--", "sh", "-c", job)
        assert cli("wait", *map(str, [*big, small]), timeout=120).returncode == 0
        nodes = {j: cli.job(j)["attempts"][0]["placement"] for j in [*big, small]}
        big_gpu = gpus[16 << 30]["uuid"]
        assert all(nodes[j]["gpu_uuids"] == [big_gpu] for j in big)
        assert nodes[small]["gpu_uuids"] == [gpus[8 << 30]["uuid"]]
        assert gpus[8 << 30]["uuid"].startswith(second.node_id[:12])  # pinned to the node that has it
        times = {}
        for line in log.read_text().splitlines():
            job_id, kind, t = line.split()
            times.setdefault(int(job_id), {})[kind] = float(t)
        first, then = sorted(big, key=lambda j: times[j]["start"])
        assert times[first]["end"] <= times[then]["start"] + 0.05  # 10G + 10G > 16G: one after the other
    finally:
        cli.stop_daemon()
        cluster.shutdown()


def test_the_daemon_s_own_ray_head_outlives_it_and_the_next_daemon_follows_its_job(
    cli, tmp_path: Path
) -> None:
    """``--backend ray`` without ``--address``: the daemon's head is a ``ray start`` of its
    own, which a SIGKILL of the daemon leaves running (a ``ray.init()`` head died with it,
    and every job ran again): the next daemon, without flags, connects to it again and
    follows the job to its end, started once; a clean stop with no job running stops the
    head, its processes only, as does a switch to the local backend."""
    import json

    from tandem.place.run.services import ray_head

    try:
        cli("daemon", "start", "--backend", "ray", "--no-track", *FAST, timeout=scaled(240))
        head = json.loads((cli.state / ray_head.HEAD_FILE).read_text())
        # It lets in only its user's processes: a client without the token is refused.
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
        stranger = subprocess.run(
            [sys.executable, "-c", f"import ray; ray.init(address={head['address']!r})"],
            env=env, capture_output=True, text=True, timeout=scaled(120),
        )  # fmt: skip
        assert stranger.returncode != 0 and "InvalidAuthToken" in stranger.stderr, stranger.stderr[-2000:]
        # It runs until released, once the next daemon follows it (not a guessed length).
        held = f"while [ ! -e {tmp_path / 'release'} ]; do sleep 0.2; done"
        job = cli.submit("--", "sh", "-c", f"echo $TANDEM_JOB_ATTEMPT >> {tmp_path / 'runs.txt'}; {held}")
        deadline = time.monotonic() + scaled(120)
        while not (tmp_path / "runs.txt").exists():
            assert time.monotonic() < deadline, cli("ls").stdout
            time.sleep(0.2)
        os.kill(cli.daemon_pid() or 0, signal.SIGKILL)
        assert psutil.pid_exists(head["pid"]), "the head died with the daemon"
        cli("daemon", "start", timeout=scaled(240))  # the kept configuration: Ray, its own head
        assert json.loads((cli.state / ray_head.HEAD_FILE).read_text()) == head  # the same head
        until(lambda: cli.job(job)["state"] == "running", 60, lambda: cli("ls").stdout)
        (tmp_path / "release").write_text("")
        assert cli("wait", str(job), timeout=scaled(120)).returncode == 0, cli("ls").stdout
        shown = cli.job(job)
        assert shown["state"] == "succeeded" and len(shown["attempts"]) == 1, shown
        assert (tmp_path / "runs.txt").read_text().split() == ["1"]  # started once
        cli("daemon", "stop")
        until(lambda: not (cli.state / ray_head.HEAD_FILE).exists(), 60, lambda: "the head was not stopped")
        left = [
            p
            for p in psutil.process_iter(["cmdline"])
            if head["temp_dir"] in " ".join(p.info["cmdline"] or ())
        ]
        assert not left, left
        # A daemon killed with no job running, then a switch to the local backend: its head ends.
        cli("daemon", "start", *FAST, timeout=scaled(240))
        again = json.loads((cli.state / ray_head.HEAD_FILE).read_text())
        assert again["temp_dir"] != head["temp_dir"]  # a new head: the first was stopped
        os.kill(cli.daemon_pid() or 0, signal.SIGKILL)
        cli("daemon", "start", "--backend", "local", "--cpus", "1", *FAST)
        assert not (cli.state / ray_head.HEAD_FILE).exists()
        until(lambda: not psutil.pid_exists(again["pid"]), 60, lambda: "the head's ray start runs on")
    finally:
        cli.stop_daemon()
        ray_head.stop(cli.state)  # whatever a failure left
