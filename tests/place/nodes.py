"""What the Ray tests on separate nodes share (:mod:`tests.place.test_ray_nodes`, the
cluster's work, and :mod:`tests.place.test_ray_nodes_lost`, its nodes' loss): a module's
cluster of two nodes (:class:`tandem.bench.ray_nodes.NodesCluster`: a head and a worker, 2
cores, 4 GB and one fake GPU each, in their own network, pid, mount and UTS namespaces), a
daemon on it for each test, the jobs they run and how they read the daemon. Two modules, two
clusters: each runs on a worker of its own (``--dist loadfile``), so that the minutes that
Ray's timeouts take are waited side by side. Root only (network namespaces); skipped where
nodes cannot be made (not root), unless ``TANDEM_REQUIRE_NODES=1`` (as ``.ci/run`` sets it)."""

from __future__ import annotations

import os
import subprocess

import pytest

from tandem.bench.ray_nodes import NodesCluster, can_make_nodes
from tests.place.conftest import TANDEM, Cli
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
