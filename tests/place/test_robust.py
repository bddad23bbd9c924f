"""The job manager under faults and misuse, with real processes (a stopped daemon: one in
this process that does not answer, tests/place/inproc.py): escaped processes,
restarts that keep the configuration, another runtime directory, unsafe directories, a
stopped daemon, idle connections, large requests, retried submits, a
share group on two cores with the defaults, capped logs and a full disk."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from tests.place.conftest import attempt_dir
from tests.place.test_daemon import FAST, SHORT, _gone
from tests.timing import scaled, until


def _with_arg(arg: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if arg in (p.info.get("cmdline") or []):
            found.append(p)
    return found


def test_processes_that_left_the_session_end_with_the_job_and_with_a_cancel(cli) -> None:
    cli("daemon", "start", "--cpus", "2", *FAST)
    # Arguments of this run's own: another run's process (a run killed before its cancel) is
    # not this job's to end.
    ended, cancelling = f"601.{os.getpid()}", f"602.{os.getpid()}"
    done = cli.submit("--", "bash", "-c", f"( setsid sleep {ended} & ); sleep 1")
    cancelled = cli.submit("--", "bash", "-c", f"( setsid sleep {cancelling} & ); sleep 300")
    assert cli("wait", str(done), timeout=60).returncode == 0
    assert _gone([p.pid for p in _with_arg(ended)]), "a process that left the session outlived its job"
    deadline = time.monotonic() + scaled(20)
    while not _with_arg(cancelling):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    cli("cancel", str(cancelled))
    assert cli("wait", str(cancelled), timeout=60, check=False).returncode == 4  # cancelled
    assert _gone([p.pid for p in _with_arg(cancelling)]), "a process that left the session outlived a cancel"


def test_a_restarted_daemon_keeps_its_configuration_and_any_runtime_dir_finds_it(cli, tmp_path: Path) -> None:
    cli("daemon", "start", "--cpus", "1", "--mem", "2G", "--policy", "first-fit", "--no-track", *SHORT)
    os.kill(cli.daemon_pid(), signal.SIGKILL)
    time.sleep(0.5)
    job = cli.submit("--cpus", "0.5", "--", "true")  # starts a new daemon
    status = cli.json("daemon", "status")
    assert status["policy"] == "first-fit" and status["capacity"]["total"]["cores"] == 1
    assert status["capacity"]["total"]["ram"] == 2 << 30
    assert cli("wait", str(job), timeout=60).returncode == 0
    # A shell with another runtime directory (cron: no XDG_RUNTIME_DIR) reaches the same daemon.
    other = dict(cli.env, TANDEM_RUNTIME_DIR=f"/tmp/tt-other-{os.getpid()}")
    try:
        run = subprocess.run(
            [sys.executable, "-m", "tandem.cli", "submit", "--cpus", "0.5", "--", "true"],
            env=other,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert run.returncode == 0, run.stderr
        status = subprocess.run(
            [sys.executable, "-m", "tandem.cli", "daemon", "status", "--json"],
            env=other,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert status.returncode == 0 and '"first-fit"' in status.stdout
    finally:
        shutil.rmtree(other["TANDEM_RUNTIME_DIR"], ignore_errors=True)


def _ls_with_state_dir(cli, state: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tandem.cli", "ls"],
        env=dict(cli.env, TANDEM_STATE_DIR=str(state)),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_shared_or_linked_directories_are_refused_and_left_as_they_are(cli, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    r = _ls_with_state_dir(cli, shared)
    assert r.returncode == 2 and "open to other users" in r.stderr and "Traceback" not in r.stderr
    assert (shared.stat().st_mode & 0o7777) == 0o1777  # not chmodded
    assert "chmod" not in r.stderr, "a directory others write in (/tmp) is not to be made one's own"
    readable = tmp_path / "readable"  # one's own, readable by others: that one may be chmodded
    readable.mkdir(mode=0o755)
    os.chmod(readable, 0o755)
    r = _ls_with_state_dir(cli, readable)
    assert r.returncode == 2 and f"chmod 700 {readable}" in r.stderr, r.stderr
    target = tmp_path / "mine"
    target.mkdir(mode=0o700)
    link = tmp_path / "planted"
    link.symlink_to(target)
    r = subprocess.run(
        [sys.executable, "-m", "tandem.cli", "submit", "--", "true"],
        env=dict(cli.env, TANDEM_RUNTIME_DIR=str(link)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode != 0 and "symbolic link" in r.stderr
    assert list(target.iterdir()) == []  # nothing put there


def test_a_stopped_daemon_is_a_clear_message_and_its_own_exit_code(inproc, monkeypatch) -> None:
    """A daemon that takes connections and never answers (stopped: SIGSTOP), in this
    process: its socket is not served while the commands run. Their waits for an answer
    (10 s, 120 s for a cancel) are cut to 1 s: what is tested is what they say when it runs out."""
    from tandem.place import client

    h = inproc("--cpus", "2", *FAST)
    job = h.submit("--", "sleep", "30")
    real = client.request_at
    monkeypatch.setattr(
        client,
        "request_at",
        lambda path, message, timeout, state_dir=None: real(path, message, 1.0, state_dir),
    )
    for args in (("wait", str(job)), ("daemon", "status"), ("cancel", str(job))):
        r = h.cli(*args, check=False, answering=False)
        assert r.returncode == 69, (args, r.returncode, r.stderr)
        assert "did not answer" in r.stderr and "Traceback" not in r.stderr


def test_idle_connections_do_not_block_the_daemon(cli) -> None:
    from tandem import _ipc
    from tandem.place.client import daemon_socket

    cli("daemon", "start", "--cpus", "2", *FAST)
    idle = []
    for _ in range(30):
        s = _ipc.new_socket()
        s.connect(str(daemon_socket(cli.state)))
        idle.append(s)
    try:
        t0 = time.monotonic()
        cli("daemon", "status")
        assert time.monotonic() - t0 < scaled(10)  # it was 30 x 2 s
    finally:
        for s in idle:
            s.close()


def test_a_large_environment_and_a_retried_submit(cli, tmp_path: Path) -> None:
    from tandem.place.client import submit
    from tandem.place.model import JobSpec

    cli("daemon", "start", "--cpus", "2", *FAST)
    big = "x" * 100_000  # 8 of these: 800 KB, over the 64 KB packet (one variable may hold 128 KB)
    out = tmp_path / "len.txt"
    env = dict(cli.env, BIG=big, **{f"BIG{i}": big for i in range(7)})
    r = subprocess.run(
        [sys.executable, "-m", "tandem.cli", "submit", "--", "sh", "-c", f'printf %s "$BIG" | wc -c > {out}'],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert cli("wait", r.stdout.strip(), timeout=60).returncode == 0
    assert int(out.read_text()) == len(big)
    spec = JobSpec(["true"], str(tmp_path), {}, token="retry-me")
    first = submit(cli.state, spec)
    again = submit(cli.state, spec)  # as after a lost answer: the same token
    assert again.id == first.id and first.new and not again.new
    assert [j["id"] for j in cli.json("ls", "--all")].count(first.id) == 1


def test_a_share_group_with_the_defaults_runs_on_two_cores(inproc, tmp_path: Path, monkeypatch) -> None:
    """`share define` with its defaults, then two `submit --share` of half a core on a daemon
    of 2 cores and no other flag: the producer's reservation leaves room, both run at once
    beside it and end. (In this process: what is tested is the reservations' fit; the reads
    of a real share group are test_daemon's and test_auto_share's.)"""
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "hx_data.py").write_text("def make():\n    return list(range(64))\n")
    h = inproc("--cpus", "2")
    h.cli("share", "define", "hxds", "--dataset", "hx_data:make", "--batch-size", "50", "--shuffle")
    ids = [h.submit("--cpus", "0.5", "--share", "hxds", "--", "python", "reader.py") for _ in range(2)]
    h.run_until(lambda: all(h.state_of(i) == "running" for i in ids), within=60)
    (producer,) = [j for j in h.json("ls") if j["role"] == "producer"]
    assert producer["state"] == "running", producer
    reserved = sum(h.job(j)["reservation"]["cpus"] for j in (*ids, producer["id"]))
    assert reserved <= 2 + 1e-6, reserved
    for i in ids:
        h.finish(i)
    h.run_until(lambda: h.ended(*ids, producer["id"]), within=60)
    assert all(h.state_of(i) == "succeeded" for i in (*ids, producer["id"]))


def test_a_chatty_job_s_log_is_capped(cli, tmp_path: Path) -> None:
    cli("daemon", "start", "--cpus", "2", "--log-max", "1M", *FAST)
    job = cli.submit("--", sys.executable, "-c", "import sys\nfor i in range(200000): print('x' * 100)")
    assert cli("wait", str(job), timeout=120).returncode == 0
    adir = attempt_dir(cli.state, job)
    on_disk = sum(p.stat().st_size for p in adir.glob("output.log*"))
    assert on_disk <= (1 << 20) + (1 << 16), on_disk  # 20 MB printed
    assert cli("logs", str(job)).stdout.rstrip().endswith("x" * 100)  # the newest output is kept


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 6 MB tmpfs (root only): a state directory's disk that a test can fill."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem needs root")
    small = tmp_path / "small"
    small.mkdir(mode=0o700)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m,mode=0700", "tmpfs", str(small)]).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield small
    finally:
        subprocess.run(["umount", "-l", str(small)])


def test_a_full_state_filesystem_kills_no_job_and_leaves_none_running(
    cli, tmp_path: Path, small_disk: Path
) -> None:
    small = small_disk
    state = small / "state"
    env = dict(cli.env, TANDEM_STATE_DIR=str(state))

    def tandem(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "tandem.cli", *args],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )

    # The reservations alone decide (two jobs at once, whatever else loads the machine).
    assert tandem("daemon", "start", "--cpus", "2", "--no-host-load", *FAST).returncode == 0
    stop = tmp_path / "stop"
    script = (
        f"import os, time\nwhile not os.path.exists({str(stop)!r}):\n"
        "    print('working', flush=True); time.sleep(0.05)"
    )
    ids = [
        tandem("submit", "--cpus", "0.5", "--", sys.executable, "-c", script).stdout.strip() for _ in range(2)
    ]
    until(
        lambda: len(list((state / "jobs").glob("*/1.*/started.json"))) == 2, 60, lambda: tandem("ls").stdout
    )
    pids = [json.loads(p.read_text())["pid"] for p in (state / "jobs").glob("*/1.*/started.json")]
    filler = small / "filler"
    subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=64k"], capture_output=True)  # until full
    # Jobs, supervisors and the daemon all meet ENOSPC while the jobs go on printing.
    for output in (state / "jobs").glob("*/1.*/output.log"):
        size = output.stat().st_size
        until(
            lambda o=output, n=size: not psutil.pid_exists(pids[0]) or o.stat().st_size >= n, 10, "no output"
        )
    assert all(psutil.pid_exists(p) for p in pids), "a job died of the full disk"
    stop.touch()  # the jobs end while the disk is still full
    until(lambda: not any(psutil.pid_exists(p) for p in pids), 60, "the jobs ended", every=0.1)
    filler.unlink()
    r = tandem("wait", *ids)
    assert r.returncode == 0, (r.stderr, tandem("ls").stdout)
    assert all(j["state"] == "succeeded" for j in json.loads(tandem("ls", "--json").stdout))
    tandem("daemon", "stop")


@dataclass
class QueuedBehindABlocker:
    """A daemon on ``small_disk`` with a job holding both cores and four jobs queued behind it,
    each of which appends its id to ``out`` when it runs."""

    tandem: Callable[..., subprocess.CompletedProcess]
    state: Path
    stop: Path
    out: Path
    blocker: str
    ids: list[str]

    def end_the_blocker(self) -> None:
        """The blocker ends, and the daemon starts the four (on whatever disk is left)."""
        self.stop.touch()
        pid = json.loads((attempt_dir(self.state, self.blocker) / "started.json").read_text())["pid"]
        until(lambda: not psutil.pid_exists(pid), 60, "the blocker ended", every=0.1)


def queued_behind_a_blocker(cli, tmp_path: Path, small_disk: Path) -> QueuedBehindABlocker:
    state = small_disk / "state"
    env = dict(cli.env, TANDEM_STATE_DIR=str(state))

    def tandem(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "tandem.cli", *args], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=scaled(timeout))  # fmt: skip

    assert tandem("daemon", "start", "--cpus", "2", "--no-host-load", *FAST).returncode == 0
    stop, out = tmp_path / "stop", tmp_path / "ran"
    hold = f"import os, time\nwhile not os.path.exists({str(stop)!r}):\n    time.sleep(0.05)"
    blocker = tandem("submit", "--cpus", "2", "--", sys.executable, "-c", hold).stdout.strip()
    until(
        lambda: (attempt_dir(state, blocker) / "started.json").exists(),
        60,
        "the blocker did not start",
        every=0.1,
    )
    once = f"open({str(out)!r}, 'a').write(__import__('os').environ['TANDEM_JOB_ID'] + '\\n')"
    ids = [
        tandem("submit", "--cpus", "0.5", "--", sys.executable, "-c", once).stdout.strip() for _ in range(4)
    ]
    return QueuedBehindABlocker(tandem, state, stop, out, blocker, ids)


def test_a_full_disk_while_jobs_start_loses_none(cli, tmp_path: Path, small_disk: Path) -> None:
    """Jobs that start while the state's disk is full are neither failed nor left running
    without a process: once space returns, every one runs and succeeds, once."""
    small = small_disk
    held = queued_behind_a_blocker(cli, tmp_path, small)
    tandem, out, ids = held.tandem, held.out, held.ids
    filler = small / "filler"
    subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=64k"], capture_output=True)  # until full
    r = tandem("submit", "--cpus", "0.5", "--", "true")  # taken, or refused saying why: never a traceback
    assert r.returncode in (0, 75) and "Traceback" not in r.stderr, r.stderr
    assert r.returncode == 0 or "would not take it" in r.stderr, r.stderr
    if r.returncode == 0:
        ids.append(r.stdout.strip())
    held.end_the_blocker()  # the daemon starts the four on a full disk
    # A few of the daemon's passes on the full disk: none of the four may fail meanwhile.
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        listed = json.loads(tandem("ls", "--json").stdout or "[]")
        assert not [j for j in listed if j["state"] == "failed"], listed
        time.sleep(0.2)
    filler.unlink()
    r = tandem("wait", *ids, timeout=120)
    assert r.returncode == 0, (r.stdout, r.stderr, tandem("ls").stdout)
    ran = out.read_text().split()
    assert sorted(ran) == sorted(ids[:4]) and len(ran) == 4, "each of the four ran, once"
    tandem("daemon", "stop")


def test_submits_while_the_daemon_is_killed_every_third_all_land_once(cli, tmp_path: Path) -> None:
    """12 submits through 4 daemon SIGKILLs (before every third): each submit starts a
    daemon where none answers, and its token keeps a retried one from making a second job."""
    cli("daemon", "start", "--cpus", "2", *FAST)
    out = tmp_path / "ran"
    ids, kills = [], 0
    for i in range(12):
        if i % 3 == 0:  # before the 1st, 4th, 7th and 10th submit
            pid = cli.daemon_pid()
            assert pid is not None and psutil.pid_exists(pid), "a submit started the daemon again"
            os.kill(pid, signal.SIGKILL)
            kills += 1
        ids.append(cli.submit("--cpus", "0.1", "--", "sh", "-c", f"echo $TANDEM_JOB_ID >> {out}"))
    assert kills == 4 and len(set(ids)) == 12
    r = cli("wait", *map(str, ids), timeout=300)
    assert r.returncode == 0, (r.stdout, r.stderr)
    ran = out.read_text().split()
    assert sorted(map(int, ran)) == sorted(ids), "each job ran, once"


def test_daemon_stop_returns_once_the_daemon_and_its_mlflow_helper_have_ended(cli, tmp_path: Path) -> None:
    cli("daemon", "start", "--cpus", "2", *SHORT)
    job = cli.submit("--", "echo", "hi")
    assert cli("wait", str(job)).returncode == 0
    helper_file = cli.state / "track" / "helper.pid"
    until(helper_file.exists, 60, "the MLflow helper wrote its job's run", every=0.1)
    daemon, helper = cli.daemon_pid(), int(helper_file.read_text())
    r = cli("daemon", "stop")
    assert "daemon stopped" in r.stderr
    gone = [
        not psutil.pid_exists(p) or psutil.Process(p).status() == psutil.STATUS_ZOMBIE
        for p in (daemon, helper)
    ]
    assert gone == [True, True], "stopped means ended, the helper with nothing left to write too"


def test_no_job_starts_while_the_cluster_does_not_answer(inproc) -> None:
    """A launcher whose machines do not answer (a Ray cluster's head gone): a start would
    ask them and could block the daemon, so no job starts, each saying why; once they
    answer again, the queue runs."""
    h = inproc("--cpus", "2", *FAST)
    h.launcher.trouble = "the Ray cluster does not answer (since 12:00:00)"
    job = h.submit("--cpus", "1", "--", "sleep", "30")
    h.run_until(lambda: "does not answer" in (h.job(job).get("reason") or ""), within=30)
    assert h.state_of(job) == "queued" and not h.launcher.runs
    h.launcher.trouble = None
    h.wait_state(job, {"running"}, within=30)
