"""The daemon inside a real cgroup of 1 core and 3 GiB (as a container, a Slurm allocation or
a systemd slice gives it): it reports and packs what it was given, refuses more, and an
out-of-memory kill in a small cgroup is recognised from the counters (no kernel log needed)
and retried. Making cgroups needs root and a writable cgroup mount: skipped otherwise."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tandem.place.run.supervisor.cgroups import Cgroups
from tests.place.conftest import TANDEM, Cli
from tests.place.test_daemon import FAST
from tests.timing import scaled, until

GIB = 1 << 30


class Cgroup:
    """A cgroup (v1: one per controller; v2: one) with a CPU quota and a memory limit."""

    def __init__(self, name: str, cpus: float, mem: int) -> None:
        groups = Cgroups()
        v1 = {c: m.point for m in groups.mounts if not m.v2 for c in ("cpu", "memory") if c in m.controllers}
        v2 = next((m.point for m in groups.mounts if m.v2), None)
        self.dirs: list[Path] = []
        if os.geteuid() != 0:
            pytest.skip("making a cgroup needs root (as in CI without it)")
        if len(v1) == 2:
            self.dirs = [v1["cpu"] / name, v1["memory"] / name]
            self._mkdirs()
            self._write(self.dirs[0] / "cpu.cfs_period_us", "100000")
            self._write(self.dirs[0] / "cpu.cfs_quota_us", str(int(cpus * 100000)))
            self._write(self.dirs[1] / "memory.limit_in_bytes", str(mem))
        elif v2 is not None and {"cpu", "memory"} <= set(_read(v2 / "cgroup.controllers").split()):
            self._write(v2 / "cgroup.subtree_control", "+cpu +memory")
            self.dirs = [v2 / name]
            self._mkdirs()
            self._write(self.dirs[0] / "cpu.max", f"{int(cpus * 100000)} 100000")
            self._write(self.dirs[0] / "memory.max", str(mem))
        else:
            pytest.skip("no cgroup mount with both the cpu and memory controllers here")

    def _mkdirs(self) -> None:
        for d in self.dirs:
            try:
                d.mkdir()
            except OSError as exc:
                self.remove()
                pytest.skip(f"cannot make a cgroup here ({exc})")

    def _write(self, path: Path, text: str) -> None:
        try:
            path.write_text(text)
        except OSError as exc:
            self.remove()
            pytest.skip(f"cannot set {path} ({exc})")

    def run(self, args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
        """``args`` run inside the cgroup (and what it starts: a background daemon too)."""
        enter = "; ".join(f"echo $$ > {d / 'cgroup.procs'}" for d in self.dirs)
        return subprocess.run(
            ["sh", "-c", f'{enter}; exec "$@"', "sh", *args],
            env=env,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=scaled(60),
        )

    def remove(self) -> None:
        """Whatever is left in it (and in the cgroups made inside it, as the supervisor makes
        one per job) moves to its parent; then it goes, innermost first."""
        for top in self.dirs:
            if not top.is_dir():
                continue
            inner = sorted((d for d in top.rglob("*") if d.is_dir()), key=lambda d: -len(d.parts))
            for d in [*inner, top]:
                self._remove_one(d, top.parent)

    @staticmethod
    def _remove_one(d: Path, parent: Path) -> None:
        deadline = time.monotonic() + scaled(20)
        while d.is_dir():
            for pid in _read(d / "cgroup.procs").split():
                try:
                    (parent / "cgroup.procs").write_text(pid)
                except OSError:
                    pass  # it has just ended
            try:
                d.rmdir()
            except OSError:
                assert time.monotonic() < deadline, f"{d} would not go"
                time.sleep(0.1)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


@pytest.fixture
def cgroup_1core_3g(cli: Cli) -> Iterator[Cgroup]:
    group = Cgroup(f"tandemtest-{os.getpid()}-limits", cpus=1.0, mem=3 * GIB)
    yield group
    cli.stop_daemon()  # the daemon and its jobs run inside: they end before the cgroup goes
    group.remove()


def test_inside_a_1_core_3g_cgroup_the_daemon_reports_and_packs_1_core_and_3g(
    cli: Cli, cgroup_1core_3g: Cgroup
) -> None:
    group = cgroup_1core_3g
    daemon = [*TANDEM, "daemon", "start"]
    r = group.run([*daemon, "--cpus", "2", "--no-track"], cli.env, cli.tmp)
    assert r.returncode == 2 and "cgroup's CPU quota of 1 cores" in r.stderr, r.stderr
    r = group.run([*daemon, "--mem", "4G", "--no-track"], cli.env, cli.tmp)
    assert r.returncode == 2 and "cgroup's memory limit of 3.0G" in r.stderr, r.stderr

    r = group.run([*daemon, *FAST], cli.env, cli.tmp)
    assert r.returncode == 0, r.stderr
    status = until(
        lambda: (s := cli.json("daemon", "status"))["used"]["measured_free"] and s,
        30,
        "the host never measured",
    )
    assert status["capacity"]["total"]["cores"] == 1 and status["capacity"]["total"]["ram"] == 3 * GIB, status
    assert status["used"]["measured_free"]["ram"] <= 3 * GIB, "free RAM is what the limit leaves"
    text = cli("daemon", "status").stdout
    assert "cores 0/1 reserved" in text and "RAM 0B/3.0G reserved, " in text and " free " in text, text

    # More than it was given is refused; what it was given is packed, one core at a time.
    refused = cli("submit", "--cpus", "2", "--", "true", check=False)
    assert refused.returncode == 2 and "the manager has 1" in refused.stderr, refused.stderr
    stop = cli.tmp / "stop"
    wait = f"while [ ! -e {stop} ]; do sleep 0.05; done"
    first = cli.submit("--cpus", "1", "--mem", "1G", "--", "sh", "-c", wait)
    second = cli.submit("--cpus", "1", "--mem", "1G", "--", "sh", "-c", wait)
    cli.wait_state(first, {"running"})
    # The pass that started the first may have come before the second was submitted: the
    # second's reason is the one the daemon gives once it has looked at it.
    deadline = time.monotonic() + scaled(20)
    while "not yet looked at" in (job := cli.job(second))["reason"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert job["state"] == "queued" and "cores: needs 1, 0 of 1 free" in job["reason"], job
    stop.touch()
    assert cli("wait", str(first), str(second), timeout=120).returncode == 0


def test_an_oom_kill_in_a_small_cgroup_is_a_host_oom_and_retried(cli: Cli) -> None:
    """The job outgrows a 600 MiB cgroup; the kernel kills it (SIGKILL). The supervisor reads
    the kill from its memory cgroup's counter: a host OOM, retried as any other."""
    group = Cgroup(f"tandemtest-{os.getpid()}-oom", cpus=1.0, mem=600 << 20)
    try:
        r = group.run([*TANDEM, "daemon", "start", *FAST], cli.env, cli.tmp)
        assert r.returncode == 0, r.stderr
        grow = "chunks = []\nwhile True:\n    chunks.append(b'x' * (64 << 20))\n"
        (cli.tmp / "grow.py").write_text(grow)
        job_id = cli.submit("--cpus", "0.5", "--retries", "1", "--", sys.executable, "grow.py")
        deadline = time.monotonic() + scaled(60)
        while (job := cli.job(job_id))["state"] not in ("retrying", "oom") and len(job["attempts"]) < 2:
            assert time.monotonic() < deadline, job
            time.sleep(0.2)
        first = job["attempts"][0]
        assert first["state"] == "oom" and first["signal"] == "SIGKILL", first
        assert first["cause"].startswith("host out of memory (oom_kill in its memory cgroup"), first
        assert "retry" in cli("show", str(job_id)).stdout, "retried, as any out-of-memory ending"
    finally:
        cli.stop_daemon()
        group.remove()
