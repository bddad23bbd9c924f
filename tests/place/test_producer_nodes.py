"""A share group over the nodes of a Ray cluster (issue 35, point 3), in-process
(tests/place/inproc.py: the daemon's real state, admission and producers, a fake launcher
whose cluster is two nodes): the group's jobs go where its producer runs; when that node has
no room for the rest, a second producer of the share starts on the other node, which takes
them; each job runs on a node where a producer of its share runs; the second producer ends
once its node's jobs have; nodes of one host (``ray.cluster_utils``) get no second one (a
producer is found by its share's name on its host)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tandem.place.model import Capacity, NodeInfo
from tandem.place.resources import Resources

from .inproc import FakeClock, FakeLauncher, InProc

GiB = 1 << 30
DATASET = "def make():\n    return list(range(8))\n"


@dataclass
class NodesLauncher(FakeLauncher):
    """The fake launcher over a cluster of ``nodes`` (what Ray would list each pass)."""

    nodes: tuple[NodeInfo, ...] = field(default_factory=tuple)

    def refresh(self, capacity: Capacity) -> bool:
        alive = [n for n in self.nodes if n.alive]
        return capacity.refresh(Capacity(sum((n.total for n in alive), Resources()), (), self.nodes))


def _on_nodes(tmp_path: Path, monkeypatch: Any, hosts: tuple[str, str]) -> InProc:
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "pn_data.py").write_text(DATASET)
    clock = FakeClock()
    nodes = tuple(NodeInfo(f"id-{i}", host, Resources(2.0, 4 * GiB)) for i, host in enumerate(hosts))
    launcher = NodesLauncher(clock, 1.0, nodes=nodes)
    h = InProc(tmp_path, monkeypatch, ("--cpus", "2", "--mem", "4G", "--settle", "0.3"), launcher, clock)
    h.step(0.5)
    assert h.daemon.capacity.nodes == nodes
    h.cli("share", "define", "toy", "--dataset", "pn_data:make", "--batch-size", "4", "--mem", "512M")
    return h


def _producers(h: InProc) -> list[dict[str, Any]]:
    return [j for j in h.json("ls", "--all") if j["role"] == "producer"]


def _node(job: dict[str, Any]) -> str | None:
    return job["attempts"][-1]["placement"]["node"] if job["attempts"] else None


@pytest.fixture
def two_hosts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    h = _on_nodes(tmp_path, monkeypatch, ("head", "worker"))
    yield h
    h.close()


def test_a_full_node_s_share_group_goes_on_with_a_second_producer_on_the_other_node(
    two_hosts: InProc,
) -> None:
    h = two_hosts
    # 1 GiB a job, 4 GiB nodes with 5 % kept free and the producer's 512 MiB: three a node.
    ids = [h.submit("--share", "toy", "--cpus", "0.25", "--mem", "1G", "--", "true") for _ in range(6)]
    h.run_until(lambda: all(h.state_of(i) == "running" for i in ids), within=30)
    producers = _producers(h)
    assert len(producers) == 2, producers
    assert all(p["state"] == "running" for p in producers), producers
    assert {_node(p) for p in producers} == {"head", "worker"}  # one on each node
    jobs = {j["id"]: j for j in h.json("ls", "--all")}
    # Every job runs where a producer of its share runs: three on each node.
    assert sorted(_node(jobs[i]) for i in ids) == ["head"] * 3 + ["worker"] * 3
    second = max(producers, key=lambda p: p["id"])
    first = min(producers, key=lambda p: p["id"])
    # ls's share line names both, each with its node.
    line = f"share toy: producers job {first['id']} ({_node(first)}), job {second['id']} ({_node(second)})"
    assert line in h.cli("ls").stdout, h.cli("ls").stdout
    shown = h.cli("show", str(second["id"])).stdout
    assert "its producers' nodes (head) have no room for it" in shown, shown
    # The second node's jobs end: its producer is stopped after its linger, the first runs on.
    for i in ids:
        if _node(jobs[i]) == _node(second):
            h.finish(i)
    assert h.wait_state(second["id"], {"succeeded", "failed", "cancelled"}, within=60) == "succeeded"
    assert h.state_of(first["id"]) == "running"
    # A job of the share submitted now goes to the head, beside the producer left.
    later = h.submit("--share", "toy", "--cpus", "0.25", "--mem", "256M", "--", "true")
    h.run_until(lambda: h.state_of(later) == "running", within=30)
    assert _node(h.job(later)) == _node(first) and len(_producers(h)) == 2


def test_nodes_of_one_host_get_no_second_producer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    h = _on_nodes(tmp_path, monkeypatch, ("box", "box"))  # ray.cluster_utils: one host name
    try:
        ids = [h.submit("--share", "toy", "--cpus", "0.25", "--mem", "1G", "--", "true") for _ in range(6)]
        h.run_until(lambda: sum(h.state_of(i) == "running" for i in ids) == 3, within=30)
        h.step(5.0)
        assert len(_producers(h)) == 1
        waiting = [i for i in ids if h.state_of(i) != "running"]
        assert len(waiting) == 3 and all("RAM" in h.job(i)["reason"] for i in waiting), h.cli("ls").stdout
    finally:
        h.close()
