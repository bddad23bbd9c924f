"""Placement over the nodes of a Ray cluster (:func:`tandem.place.scheduler.plan_nodes`,
pure): each job on one node where it fits, a sweep spread over the nodes, a share group's
jobs on its producer's node, what Ray holds never more than a node has, and a job of
unknown GPU memory on a GPU no one measures is no probe that would hold the GPU for good."""

from __future__ import annotations

from tandem.place.policies import GpuSlot, HostSlot, Limits, make_policy
from tandem.place.resources import Resources
from tandem.place.scheduler import NodeSlot, Waiting, fits_a_node, plan_nodes
from tests.place.needs import waiting

GiB = 1 << 30
LIMITS = Limits()


def node(name: str, cpus: float = 2.0, gpus: int = 0, unmeasured: bool = True, base: int = 0) -> NodeSlot:
    slots = [GpuSlot(base + i, f"{name}:{i}", 16 * GiB, unmeasured=unmeasured) for i in range(gpus)]
    return NodeSlot(f"id-{name}", HostSlot(Resources(cpus, 4 * GiB)), slots, name, cpus_held=0.0)


def job(i: int, cpus: float = 1.0, gpus: int = 0, **kw) -> Waiting:
    return waiting(i, 0, float(i), cpus, 256 << 20, gpus, kw.pop("gpu_mem", None), **kw)


def where(queue, nodes) -> dict[int, str]:
    out = plan_nodes(queue, nodes, make_policy("packing"), LIMITS, 100.0)
    return {p.job_id: p.node for p in out.placements}


def test_a_sweep_spreads_over_the_nodes_and_each_job_goes_to_one_that_has_room() -> None:
    placed = where([job(i) for i in range(6)], [node("head"), node("worker")])
    assert sorted(placed) == [0, 1, 2, 3]  # 2 cores a node, 1 a job: four start
    assert sorted(placed.values()) == ["id-head", "id-head", "id-worker", "id-worker"]


def test_a_share_group_s_jobs_go_only_where_its_producer_runs() -> None:
    queue = [job(i, cpus=0.5, share="ds", share_jobs=0, nodes={"id-worker": 0}) for i in range(3)]
    assert set(where(queue, [node("head"), node("worker")]).values()) == {"id-worker"}
    out = plan_nodes(queue, [node("head")], make_policy("packing"), LIMITS, 100.0)
    assert not out.placements and "producer's node" in out.reasons[0]  # its node is gone


def test_ray_never_holds_more_cores_than_a_node_has_while_tandem_s_cores_are_elastic() -> None:
    # 6 jobs of one share group on a 2-core node (four a core may run together): Ray is asked
    # for what it has unreserved, then for none.
    queue = [job(i, cpus=1.0, share="ds", share_jobs=0, nodes={"id-head": 0}) for i in range(6)]
    out = plan_nodes(queue, [node("head")], make_policy("packing"), LIMITS, 100.0)
    assert len(out.placements) == 6
    assert [p.cores_held for p in out.placements] == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]


def test_a_job_of_unknown_gpu_memory_on_an_unmeasured_gpu_is_no_probe() -> None:
    nodes = [node("head", cpus=8, gpus=1)]
    out = plan_nodes([job(i, gpus=1) for i in range(3)], nodes, make_policy("packing"), LIMITS, 100.0)
    assert [(p.gpus, p.probe) for p in out.placements] == [((0,), False)] * 3  # all three share it
    measured = [node("head", cpus=8, gpus=1, unmeasured=False)]
    out = plan_nodes([job(i, gpus=1) for i in range(3)], measured, make_policy("packing"), LIMITS, 100.0)
    assert [(p.gpus, p.probe) for p in out.placements] == [((0,), True)]  # a probe holds it


def test_a_job_larger_than_every_node_is_refused_naming_the_largest() -> None:
    nodes = [node("head", cpus=2), node("big", cpus=4)]
    assert fits_a_node(job(0, cpus=3), nodes) is None  # the big node takes it
    why = fits_a_node(job(0, cpus=6), nodes)
    assert why is not None and "largest node, big" in why and "4" in why


def test_a_share_group_with_producers_on_two_nodes_fills_each_to_its_own_bound() -> None:
    # Four a core run together per node: 2-core nodes take 8 each; the head already runs 6 of
    # the group, so 2 more go there and the rest to the worker, where its second producer runs.
    queue = [
        job(i, cpus=1.0, share="ds", share_jobs=6, nodes={"id-head": 6, "id-worker": 0}) for i in range(12)
    ]
    out = plan_nodes(queue, [node("head"), node("worker")], make_policy("packing"), LIMITS, 100.0)
    placed = [p.node for p in out.placements]
    assert placed.count("id-head") == 2 and placed.count("id-worker") == 8, placed
    assert sorted(out.short) == [10, 11] and all("worker" in out.reasons[i] for i in (10, 11))


def test_a_share_s_next_producer_goes_only_to_a_node_its_nodes_allow() -> None:
    producer = job(0, cpus=0.5, nodes={"id-worker": 0})  # its share's first producer runs on the head
    assert where([producer], [node("head"), node("worker")]) == {0: "id-worker"}
    out = plan_nodes([producer], [node("head")], make_policy("packing"), LIMITS, 100.0)
    assert not out.placements and out.short == [0] and "no live node" in out.reasons[0]
