"""A Ray node measured where it is: its agent (:class:`~tandem.place.run.launchers.ray_backend.NodeAgent`,
here run in this process with NVML answering as the recorded H100 host of
:mod:`tests.watch.test_nvml`) samples its host and GPUs; the daemon's
:class:`~tandem.place.devices.Monitor` keeps each node's last sample and answers for the
node's GPUs by the daemon's own uuids: readings for admission, a job's GPU memory by its
pids there, the energy counter; a sample gone stale is no reading."""

from __future__ import annotations

import time

import pytest

from tandem.place.devices import STALE_S, GpuSample, Monitor, NodeSample
from tandem.place.model import Capacity, GpuInfo, NodeInfo
from tandem.place.resources import Resources
from tandem.place.run.launchers.ray_backend import NodeAgent
from tests.watch.test_nvml import FakeNvml

GiB = 1 << 30


def test_an_agent_samples_its_host_and_gpus_by_nvml_index() -> None:
    agent = NodeAgent(30.0, 5.0, every_s=0.05, lib=FakeNvml())
    try:
        _samples_host_and_gpus(agent)
    finally:
        agent.stop()  # its thread ends (it would reset psutil's CPU base for the tests after)


def _samples_host_and_gpus(agent: NodeAgent) -> None:
    first = agent.read()
    assert first.mem_available is not None and first.mem_available > 0
    deadline = time.monotonic() + 30
    while (sample := agent.read()) is first or sample.gpus[0].activity_mean is None:
        assert time.monotonic() < deadline, "the agent's thread never sampled again"
        time.sleep(0.05)
    assert sorted(sample.gpus)[:3] == [0, 1, 2]
    gpu = sample.gpus[1]
    assert gpu.mem_used == 10 * GiB and gpu.process_mem == {777: 3 * GiB}
    assert gpu.activity_mean == pytest.approx(0.55) and gpu.energy_mj is not None
    assert sample.cpu_mean is not None and 0.0 <= sample.cpu_mean <= 1.0
    assert sample.cpus >= 1 and 0.0 <= sample.age_s < 30


def _cluster_monitor() -> Monitor:
    gpus = (
        GpuInfo(0, "aaaa:0", 80 * GiB, node="aaaa", local=0),
        GpuInfo(1, "bbbb:0", 80 * GiB, node="bbbb", local=0),
    )
    nodes = (
        NodeInfo("aaaa", "head", Resources(2, 4 * GiB)),
        NodeInfo("bbbb", "worker", Resources(2, 4 * GiB)),
    )
    return Monitor(Capacity(Resources(4, 8 * GiB), gpus, nodes), 30.0, None)


def test_the_daemon_keeps_each_node_s_sample_and_reads_its_gpus_by_the_daemon_s_uuids() -> None:
    monitor = _cluster_monitor()
    assert monitor.node("bbbb") is None and monitor.readings() == {}, "nothing heard: no reading"
    gpu = GpuSample(20 * GiB, 0.4, 0.9, 123_456, {41: 6 * GiB, 42: 2 * GiB})
    monitor.take("bbbb", NodeSample(GiB, 0.5, 0.75, {0: gpu}))
    assert monitor.node("bbbb") == NodeSample(GiB, 0.5, 0.75, {0: gpu})
    reading = monitor.readings()["bbbb:0"]
    assert (reading.mem_used, reading.activity_mean, reading.activity_p95) == (20 * GiB, 0.4, 0.9)
    assert "aaaa:0" not in monitor.readings(), "the head's agent has not answered"
    assert monitor.job_gpu_mem("bbbb:0", [41, 99]) == 6 * GiB  # its pids on that node
    assert monitor.job_gpu_mem("aaaa:0", [41]) == 0
    assert monitor.energy_mj("bbbb:0") == 123_456 and monitor.energy_mj("aaaa:0") is None
    # A sample dated by its age (an agent whose sampler fails hands out an old one).
    monitor.take("bbbb", NodeSample(GiB, 0.5, 0.75, {0: gpu}, age_s=STALE_S + 1))
    assert monitor.node("bbbb") is None
    monitor.take("bbbb", NodeSample(GiB, 0.5, 0.75, {0: gpu}))
    # A sample not renewed within STALE_S is no reading: the node is admitted on reservations.
    received, sample = monitor.nodes["bbbb"]
    monitor.nodes["bbbb"] = (received - STALE_S - 1, sample)
    assert monitor.node("bbbb") is None and monitor.readings() == {}
    assert monitor.energy_mj("bbbb:0") is None
