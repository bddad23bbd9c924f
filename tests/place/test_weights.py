"""CPU weights on the real cgroup hierarchy of this host: an attempt's supervisor enters a
cgroup of its own (its job is born inside), the daemon reweighs a producer's, and the
cgroups go at the end or at the next daemon's start. Skipped where no cpu cgroup can be
written (the fallback, nice 0, is the loader workers' default: tests/share)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tandem.place.run.supervisor import weights
from tests.timing import scaled

pytestmark = pytest.mark.skipif(not weights.available()[0], reason=weights.available()[1])

_SUPERVISOR = """
import sys, time
from tandem.place.run.supervisor import weights
group = weights.enter(sys.argv[1], float(sys.argv[2]))
print(group.path if group else "none", flush=True)
sys.stdin.readline()  # the test looks, then lets it end
if group is not None:
    group.close()
print("closed", flush=True)
"""


def _cpu_cgroup(pid: int) -> str:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _n, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return path
    return ""


def _weight_file(path: Path) -> Path:
    return path / "cpu.weight" if (path / "cpu.weight").exists() else path / "cpu.shares"


def test_an_attempt_is_weighted_reweighed_and_its_cgroup_removed() -> None:
    name = f"{os.getuid()}-test-{os.getpid()}-{time.monotonic_ns()}"
    proc = subprocess.Popen(
        [sys.executable, "-c", _SUPERVISOR, name, "1"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        line = proc.stdout.readline().strip()
        assert line != "none", "a cpu cgroup is writable here, yet none was entered"
        path = Path(line)
        assert path.name == weights.PREFIX + name
        assert _cpu_cgroup(proc.pid).endswith(path.name), "the supervisor is not in its cgroup"
        assert int(_weight_file(path).read_text()) == weights.DEFAULT_SHARES  # a job: the default
        # the daemon reweighs a producer as its consumers come: three jobs' worth
        assert weights.set_weight(proc.pid, 3)
        assert int(_weight_file(path).read_text()) == 3 * weights.DEFAULT_SHARES
        assert not weights.set_weight(os.getpid(), 3), "a process in no tandem cgroup was weighted"
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "closed"
        assert proc.wait(30) == 0
        assert not path.exists(), "the attempt's cgroup outlived it"
    finally:
        proc.kill()
        proc.wait()


def test_sweep_removes_empty_leftovers_only() -> None:
    parent = weights._v1_parent()
    if parent is None:
        pytest.skip("cgroup v2: the attempt's own cgroup carries the weight; nothing to sweep")
    left = parent / f"{weights.PREFIX}{os.getuid()}-gone-{os.getpid()}"
    left.mkdir()
    busy = parent / f"{weights.PREFIX}{os.getuid()}-busy-{os.getpid()}"
    busy.mkdir()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (busy / "cgroup.procs").write_text(str(sleeper.pid))
        assert weights.sweep() >= 1
        assert not left.exists(), "an empty leftover cgroup was kept"
        assert busy.exists(), "a cgroup with a live process in it was removed"
    finally:
        sleeper.kill()
        sleeper.wait()
        for path in (left, busy):
            try:
                path.rmdir()
            except OSError:
                pass


def test_under_the_manager_a_producer_weighs_as_much_as_its_running_jobs(cli, tmp_path: Path) -> None:
    """Two jobs of a share group: each in a cpu cgroup of its own at the default weight, their
    producer's at twice it while both run; every cgroup goes when its attempt ends."""
    (tmp_path / "toy_data.py").write_text("import torch\n\ndef make():\n    return [torch.zeros(1)] * 64\n")
    stop = tmp_path / "stop"
    cli("daemon", "start", "--cpus", "2", "--no-track", "--no-host-load", "--settle", "0.3", "--grace", "1")
    cli("share", "define", "toy", "--dataset", "toy_data.py:make", "--batch-size", "4", "--cpus", "0.5")
    cpu_line = "grep -E '^[0-9]+:([^:]*,)?cpu(,[^:]*)?:' /proc/self/cgroup"
    said = f"{cpu_line} > {tmp_path}/at.$$ && mv {tmp_path}/at.$$ {tmp_path}/cg.$$"
    job = f"{said}; while [ ! -e {stop} ]; do sleep 0.2; done"
    ids = [cli.submit("--share", "toy", "--cpus", "0.5", "--", "sh", "-c", job) for _ in range(2)]
    for i in ids:
        cli.wait_state(i, {"running"})
    deadline = time.monotonic() + scaled(30)
    while len(found := list(tmp_path.glob("cg.*"))) < 2:
        assert time.monotonic() < deadline, "the jobs did not say where they run"
        time.sleep(0.1)
    groups = {f.read_text().strip().rsplit("/", 1)[-1] for f in found}
    assert len(groups) == 2 and all(g.startswith(weights.PREFIX) for g in groups), groups
    parent = weights._v1_parent()
    if parent is not None:
        for g in groups:
            assert int((parent / g / "cpu.shares").read_text()) == weights.DEFAULT_SHARES
    supervisor = _producer_supervisor(cli.state)
    deadline = time.monotonic() + scaled(30)
    while (weight := _weight_of(supervisor)) != 2 * weights.DEFAULT_SHARES:
        assert time.monotonic() < deadline, f"the producer weighs {weight}, not two jobs' worth"
        time.sleep(0.2)
    stop.touch()
    assert cli("wait", *map(str, ids), timeout=60).returncode == 0
    if parent is not None:
        while any((parent / g).exists() for g in groups):
            assert time.monotonic() < deadline + scaled(30), "a job's cgroup outlived its attempt"
            time.sleep(0.2)


def _producer_supervisor(state: Path) -> int:
    """The pid of the supervisor the daemon started the share's producer (a job) under."""
    from tandem.place.producers import newest
    from tandem.place.state import StateReader

    deadline = time.monotonic() + scaled(30)
    while True:
        reader = StateReader(state)
        try:
            producer = newest(reader, "toy")
        finally:
            reader.close()
        if producer is not None and producer.attempts and producer.attempts[-1].shim_pid:
            return producer.attempts[-1].shim_pid
        assert time.monotonic() < deadline, "no producer supervisor"
        time.sleep(0.2)


def _weight_of(pid: int) -> int | None:
    name = _cpu_cgroup(pid).rsplit("/", 1)[-1]
    parent = weights._v1_parent()
    if parent is None or not name.startswith(weights.PREFIX):
        return None
    return int((parent / name / "cpu.shares").read_text())


def test_the_mlflow_helper_forwards_at_a_tenth_of_a_jobs_weight(cli, tmp_path: Path) -> None:
    """The daemon's MLflow helper makes runs at START_WEIGHT (their jobs wait), then forwards
    samples in a cgroup that weighs a tenth of a job's: nice 10 alone counts only within the
    daemon's session where the kernel groups by session (autogroup). Its cgroup goes with it."""
    from tandem.place.run.metrics import tracking

    if weights._v1_parent() is None:  # the helper is weighted in a v1 cgroup only (else nice 10)
        pytest.skip("no writable v1 cpu cgroup")
    stop = tmp_path / "stop"
    cli("daemon", "start", "--cpus", "2", "--no-host-load", "--settle", "0.3", "--grace", "1")
    job = cli.submit("--cpus", "0.5", "--", "sh", "-c", f"while [ ! -e {stop} ]; do sleep 0.2; done")
    cli.wait_state(job, {"running"})
    helper = None
    deadline = time.monotonic() + scaled(60)
    while (helper := tracking.helper_pid(cli.state)) is None or _weight_of(helper) != _shares(0.1):
        weight = _weight_of(helper) if helper is not None else None
        assert time.monotonic() < deadline, f"the helper ({helper}) weighs {weight}"
        time.sleep(0.2)
    name = _cpu_cgroup(helper).rsplit("/", 1)[-1]
    stop.touch()
    assert cli("wait", str(job), timeout=60).returncode == 0
    cli("daemon", "stop")
    parent = weights._v1_parent()
    assert parent is not None
    deadline = time.monotonic() + scaled(60)
    while (parent / name).exists():
        assert time.monotonic() < deadline, "the helper's cgroup outlived it"
        time.sleep(0.2)


def _shares(weight: float) -> int:
    return max(2, round(weights.DEFAULT_SHARES * weight))


def test_four_cpu_bound_half_core_jobs_run_at_once_on_two_cores(cli, tmp_path: Path) -> None:
    """Four jobs of ``--cpus 0.5`` that each spin a whole core (CPU-bound, as a training loop
    with nothing to wait on): the first two use the idle cores beyond their half, and under
    CPU weights the kernel gives the next ones their halves back, so all four run at once
    (at most 2 did when that use held them back). Without the host-load gate: what is
    tested is the jobs' own use, and on a host busy from outside that gate rightly holds
    them back (the unit test of the policy covers both together)."""
    release = tmp_path / "release"
    spin = f"import os\nwhile not os.path.exists({str(release)!r}):\n    pass\n"
    (tmp_path / "spin.py").write_text(spin)
    cli("daemon", "start", "--cpus", "2", "--no-track", "--no-host-load", "--settle", "0.3", "--grace", "1")
    ids = [cli.submit("--cpus", "0.5", "--", sys.executable, "spin.py") for _ in range(4)]
    try:
        deadline = time.monotonic() + scaled(90)
        while sum(cli.job(i)["state"] == "running" for i in ids) < 4:
            assert time.monotonic() < deadline, cli("ls").stdout
            time.sleep(0.2)
        reserved = json.loads(cli("daemon", "status", "--json").stdout)["used"]["reserved"]["cores"]
        assert reserved <= 2 + 1e-9, reserved
    finally:
        release.write_text("")
    assert cli("wait", *map(str, ids), timeout=120).returncode == 0, cli("ls").stdout
