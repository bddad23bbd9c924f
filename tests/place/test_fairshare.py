"""Fair share between a system manager's users (pure, :mod:`tandem.place.fairshare`): use
decays as Slurm's fair-share factor does, the user with the least use goes first and a pass
interleaves users, per-user limits say why a job waits, and one user's order is unchanged."""

from __future__ import annotations

import math

import pytest

from tandem.place.fairshare import PROJECTED_S, Held, UserLimits, Users, decayed_use, fair_order, host_share
from tandem.place.policies import HostSlot, Limits, MostFreeMemory
from tandem.place.resources import Reservation, Resources
from tandem.place.scheduler import NodeSlot, Waiting, plan_nodes

HOUR = 3600.0


def test_use_decays_by_half_each_half_life() -> None:
    now = 10 * HOUR
    recent = decayed_use([Held(1, 1.0, now - 60, now)], now)[1]
    assert recent == pytest.approx(60, rel=1e-2)  # a core of the host for a minute, just now
    old = decayed_use([Held(1, 1.0, now - HOUR - 60, now - HOUR)], now)[1]
    assert old == pytest.approx(recent / 2, rel=1e-6)  # the same minute an hour ago: half
    running = decayed_use([Held(2, 0.5, now - 60, None)], now)[2]
    assert running == pytest.approx(30, rel=1e-2)  # still running: counted up to now
    assert decayed_use([Held(3, 1.0, now + 5, None)], now)[3] == 0.0  # not started yet


def test_the_user_with_least_use_goes_first_and_a_pass_interleaves() -> None:
    jobs = [("a", i) for i in range(4)] + [("b", i) for i in range(2)]  # the scheduler's order
    owner = {"a": 1, "b": 2}
    out = fair_order(jobs, lambda j: owner[j[0]], lambda j: 0.5, {1: 100.0, 2: 0.0})
    # b has used least; each of its jobs counts PROJECTED_S of its weight (30), still under a's 100
    assert 2 * 0.5 * PROJECTED_S < 100.0
    assert out == [("b", 0), ("b", 1), *[("a", i) for i in range(4)]]  # a's own order kept
    same = fair_order(jobs, lambda j: 1, lambda j: 0.5, {})
    assert same == jobs  # one user: unchanged


def test_equal_users_alternate() -> None:
    jobs = [("a", i) for i in range(3)] + [("b", i) for i in range(3)]
    out = fair_order(jobs, lambda j: 1 if j[0] == "a" else 2, lambda j: 1.0, {})
    assert [j[0] for j in out] == ["a", "b", "a", "b", "a", "b"]


def test_user_limits_say_why() -> None:
    limits = UserLimits(jobs=2, cores=3.0, gpu_mem=8 << 30)
    assert limits.over((2, 1.0, 0), (1.0, 0)) == "user limit: 2 of --max-jobs-per-user 2 running"
    assert "--max-cores-per-user 3" in (limits.over((1, 2.5, 0), (1.0, 0)) or "")
    assert "--max-gpu-mem-per-user 8.0G" in (limits.over((1, 0.0, 6 << 30), (0.0, 4 << 30)) or "")
    assert limits.over((1, 1.0, 0), (1.0, 0)) is None
    assert not UserLimits().any()


def _waiting(job_id: int, owner: int, cores: float = 1.0) -> Waiting:
    return Waiting(job_id, 0, float(job_id), Reservation(Resources(cores=cores)), owner=owner)


def test_a_pass_starts_the_second_users_first_job_before_the_first_users_third() -> None:
    """The judged case on a 2-core host: six one-core jobs of one user, then two of another,
    while two of the first user's run."""
    host = Resources(cores=2.0, ram=4 << 30)
    queue = [_waiting(i, 1001) for i in range(3, 7)] + [_waiting(i, 1002) for i in (7, 8)]
    slot = HostSlot(total=host, reserved=Resources(cores=1.0))  # one of user 1001's two ended
    users = Users({1001: 120.0}, {1001: [1, 1.0, 0]}, UserLimits(), host)
    plan = plan_nodes(queue, [NodeSlot("", slot, [])], MostFreeMemory(), Limits(host_load=False), 0.0, users)
    assert [p.job_id for p in plan.placements] == [7]
    assert math.isclose(host_share(Resources(cores=1.0), host), 0.5)
    limited = Users({}, {1002: [1, 1.0, 0]}, UserLimits(jobs=1), host)
    plan = plan_nodes(
        queue,
        [NodeSlot("", HostSlot(total=host), [])],
        MostFreeMemory(),
        Limits(host_load=False),
        0.0,
        limited,
    )
    assert plan.reasons[7] == "user limit: 1 of --max-jobs-per-user 1 running"
    assert [p.job_id for p in plan.placements] == [3]  # its user's one, and the limit holds the rest
    assert plan.reasons[4] == "user limit: 1 of --max-jobs-per-user 1 running"
