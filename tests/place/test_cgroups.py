"""The cgroup limits where the job manager runs, read from cgroup files: v1 (this test machine's layout,
recorded from it), v2 (a systemd host, a Slurm-like nested limit), a v1 container whose
mount's root is its own cgroup, and the OOM-kill counters; each on a fake root directory
holding real files' formats. The daemon inside a real cgroup: tests/place/test_limits_live.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tandem.place.resources import Cap
from tandem.place.run.supervisor import cgroups, failures

GIB = 1 << 30

# Recorded on this project's test machine (Linux 6.18, cgroup v1 with a v2 "unified" mount).
V1_MOUNTINFO = """\
23 1 0:22 / / rw,relatime - overlay overlay rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
V1_CGROUP = """\
9:name=systemd:/
8:pids:/
4:memory:/process_api/7a32/tandemtest
3:cpuset:/
2:cpuacct:/
1:cpu:/tandemtest
0::/
"""
V1_MEMORY_STAT = """\
cache 3096576
rss 1961984
inactive_anon 1835008
inactive_file 757760
active_file 2338816
hierarchical_memory_limit 3221225472
total_cache 3096576
total_rss 1961984
total_inactive_file 757760
"""
V1_OOM_CONTROL = "oom_kill_disable 0\nunder_oom 0\noom_kill {n}\n"
V1_UNLIMITED = "9223372036854771712\n"

V2_MOUNTINFO = """\
24 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw
30 24 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate
"""
V2_MEMORY_STAT = (
    "anon 1610612736\nfile 536870912\nkernel 8388608\nactive_file 268435456\ninactive_file 268435456\n"
)
V2_EVENTS = "low 0\nhigh 0\nmax 31\noom 2\noom_kill {n}\noom_group_kill 0\n"


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def _v1(root: Path, quota: str = "100000\n", limit: str = f"{3 * GIB}\n") -> Path:
    mem = "sys/fs/cgroup/memory"
    return _write(
        root,
        {
            "proc/self/mountinfo": V1_MOUNTINFO,
            "proc/self/cgroup": V1_CGROUP,
            "proc/vmstat": "nr_free_pages 5905028\noom_kill 7\nnuma_hit 1\n",
            "sys/fs/cgroup/cpuacct/cpuacct.usage": "2627154796761\n",
            "sys/fs/cgroup/unified/cpu.stat": "usage_usec 2620604892\n",
            "sys/fs/cgroup/cpu/cpu.cfs_quota_us": "-1\n",
            "sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000\n",
            "sys/fs/cgroup/cpu/tandemtest/cpu.cfs_quota_us": quota,
            "sys/fs/cgroup/cpu/tandemtest/cpu.cfs_period_us": "100000\n",
            f"{mem}/memory.limit_in_bytes": V1_UNLIMITED,
            f"{mem}/process_api/memory.limit_in_bytes": V1_UNLIMITED,
            f"{mem}/process_api/7a32/memory.limit_in_bytes": V1_UNLIMITED,
            f"{mem}/process_api/7a32/tandemtest/memory.limit_in_bytes": limit,
            f"{mem}/process_api/7a32/tandemtest/memory.usage_in_bytes": f"{GIB + 757760}\n",
            f"{mem}/process_api/7a32/tandemtest/memory.stat": V1_MEMORY_STAT,
            f"{mem}/process_api/7a32/tandemtest/memory.oom_control": V1_OOM_CONTROL.format(n=0),
        },
    )


def test_v1_quota_and_memory_limit_of_the_process_s_own_cgroups(tmp_path: Path) -> None:
    root = _v1(tmp_path)
    assert cgroups.Cgroups(root=root).cpu_seconds() is None, "cpuacct at the top: the host's, not its own"
    got = cgroups.limits(root=root)
    # 1 GiB used, of which the reclaimable page cache (inactive_file) does not count.
    assert got == Cap(1.0, 3 * GIB)
    assert cgroups.Cgroups(root=root).memory() == (3 * GIB, 2 * GIB)


def test_v1_no_limits_read_as_none_and_a_fractional_quota_as_cores(tmp_path: Path) -> None:
    assert cgroups.limits(root=_v1(tmp_path / "a", quota="-1\n", limit=V1_UNLIMITED)) == Cap()
    assert cgroups.limits(root=_v1(tmp_path / "b", quota="150000\n")).cores == 1.5


def test_v2_the_tightest_limit_over_the_ancestors_binds(tmp_path: Path) -> None:
    """A Slurm job's limit set on the job, its step a child without one; a slice's quota
    tighter than the job's: the least of each, free memory from the cgroup whose limit binds."""
    job = "sys/fs/cgroup/system.slice/slurmstepd.scope/job_42"
    root = _write(
        tmp_path,
        {
            "proc/self/mountinfo": V2_MOUNTINFO,
            "proc/self/cgroup": "0::/system.slice/slurmstepd.scope/job_42/step_0/user/task_0\n",
            "sys/fs/cgroup/cpu.max": "max 100000\n",  # the root has none; a slice has one
            "sys/fs/cgroup/system.slice/cpu.max": "800000 100000\n",
            "sys/fs/cgroup/system.slice/memory.max": "max\n",
            f"{job}/cpu.max": "200000 100000\n",
            f"{job}/memory.max": f"{3 * GIB}\n",
            f"{job}/memory.current": f"{2 * GIB + 268435456}\n",
            f"{job}/memory.stat": V2_MEMORY_STAT,
            f"{job}/step_0/user/task_0/cpu.max": "max 100000\n",
            f"{job}/step_0/user/task_0/memory.max": "max\n",
            f"{job}/step_0/user/task_0/memory.events": V2_EVENTS.format(n=3),
            f"{job}/step_0/user/task_0/cpu.stat": "usage_usec 2620604892\nuser_usec 2246112835\n",
        },
    )
    assert cgroups.Cgroups(root=root).cpu_seconds() == 2620.604892
    assert cgroups.limits(root=root) == Cap(2.0, 3 * GIB)
    assert cgroups.Cgroups(root=root).memory() == (3 * GIB, GIB)
    assert cgroups.Cgroups(root=root).oom_kill_file() == root / f"{job}/step_0/user/task_0/memory.events"


def test_a_v1_container_whose_mount_root_is_its_own_cgroup(tmp_path: Path) -> None:
    """Docker without a cgroup namespace: /proc/self/cgroup names /docker/ID, which is the
    mount's root, so its files are at the mount point itself."""
    root = _write(
        tmp_path,
        {
            "proc/self/mountinfo": (
                "700 650 0:40 /docker/ab12 /sys/fs/cgroup/cpu,cpuacct ro - cgroup cgroup rw,cpu,cpuacct\n"
                "701 650 0:41 /docker/ab12 /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory\n"
            ),
            "proc/self/cgroup": "12:memory:/docker/ab12\n4:cpu,cpuacct:/docker/ab12\n",
            "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "50000\n",
            "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n",
            "sys/fs/cgroup/memory/memory.limit_in_bytes": f"{GIB}\n",
            "sys/fs/cgroup/memory/memory.usage_in_bytes": f"{GIB // 4}\n",
            "sys/fs/cgroup/memory/memory.stat": "total_inactive_file 0\n",
            "sys/fs/cgroup/cpu,cpuacct/cpuacct.usage": "2627154796761\n",
        },
    )
    assert cgroups.Cgroups(root=root).cpu_seconds() == 2627.154796761, "the container's own use"
    assert cgroups.limits(root=root) == Cap(0.5, GIB)
    assert cgroups.Cgroups(root=root).memory() == (GIB, 3 * GIB // 4)


def test_no_cgroup_files_at_all_is_no_limit_not_an_error(tmp_path: Path) -> None:
    assert cgroups.limits(root=tmp_path) == Cap()
    watch = cgroups.OomWatch(root=tmp_path)
    assert watch.kills() is None


def test_oom_kills_come_from_the_most_precise_counter_readable(tmp_path: Path) -> None:
    root = _v1(tmp_path)
    oom_control = root / "sys/fs/cgroup/memory/process_api/7a32/tandemtest/memory.oom_control"
    watch = cgroups.OomWatch(root=root)
    assert watch.kills() == (0, "in its memory cgroup")
    oom_control.write_text(V1_OOM_CONTROL.format(n=1))
    (root / "proc/vmstat").write_text("oom_kill 9\n")
    assert watch.kills() == (1, "in its memory cgroup")

    # The job's own cgroup v2 with its memory controller: counted from 0, preferred.
    own = _write(tmp_path / "own", {"memory.events": V2_EVENTS.format(n=0)})
    watch.add_job_cgroup(own)
    (own / "memory.events").write_text(V2_EVENTS.format(n=1))
    assert watch.kills() == (1, "in its own cgroup")

    # Only the host's counter (a v2 host whose root cgroup has none): its delta.
    host_only = _write(tmp_path / "host", {"proc/vmstat": "oom_kill 4\n"})
    watch = cgroups.OomWatch(root=host_only)
    (host_only / "proc/vmstat").write_text("oom_kill 5\n")
    assert watch.kills() == (1, "on the host")


@pytest.mark.parametrize(
    ("kills", "where", "cause"),
    [
        (1, "in its memory cgroup", "host out of memory (oom_kill in its memory cgroup)"),
        (1, "on the host", "host out of memory (oom_kill on the host)"),
        (0, "on the host", "killed by SIGKILL"),
    ],
)
def test_a_sigkill_with_an_oom_kill_counted_is_a_host_oom(kills: int, where: str, cause: str) -> None:
    ending = failures.classify(-9, "epoch 3\n", oom_kills=kills, oom_where=where)
    assert ending.cause == cause
    assert ending.retryable == (kills > 0)
    # Exit 1 with an OOM kill counted elsewhere is not an OOM: only a SIGKILL is.
    assert failures.classify(1, "ValueError: x\n", oom_kills=kills, oom_where=where).kind == "exit"
