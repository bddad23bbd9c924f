"""Starts on a nearly full disk, on a real small filesystem (a tmpfs, root only): a supervisor
whose first write fails never starts its job and tells the daemon over its socket, which puts
the job back in the queue and holds starts until the disk takes writes; with 120 or 160 KB
free while four jobs start, each runs once when space returns, none fails."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tandem import _ipc
from tandem.place import diskwait, protocol
from tandem.place.run.supervisor.files import AttemptSpec, save
from tests.place.test_robust import queued_behind_a_blocker, small_disk  # noqa: F401 (a fixture)
from tests.timing import scaled


def _fill(disk: Path, leave_kb: int = 0) -> Path:
    filler = disk / "filler"
    subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=4k"], capture_output=True)  # until full
    if leave_kb:
        os.truncate(filler, filler.stat().st_size - leave_kb * 1024)
    return filler


OLDER = protocol.Failure("refused: unknown request 'not-started'; this daemon knows submit", refused=True)


@pytest.mark.parametrize(
    "replies",
    [
        # The first report meets a disk that refuses the daemon's record: it is sent again.
        [protocol.Failure("disk full", disk=True), protocol.PutBack("retrying")],
        # An older daemon, which will never understand it: not sent again.
        [OLDER],
    ],
    ids=["recorded-on-the-second-try", "older-daemon"],
)
def test_a_supervisor_whose_first_write_fails_puts_its_job_back_unstarted(
    small_disk: Path,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    replies: list,
) -> None:
    adir = small_disk / "jobs" / "7" / "2"
    adir.mkdir(parents=True)
    ran = tmp_path / "ran"
    runtime = Path(f"/tmp/tt-ds-{os.getpid()}")
    runtime.mkdir(mode=0o700, exist_ok=True)
    sock_path = runtime / "d.sock"
    sock_path.unlink(missing_ok=True)
    command = [sys.executable, "-c", f"open({str(ran)!r}, 'w')"]
    spec = AttemptSpec(command, str(tmp_path), {}, job_id=7, attempt=2, socket=str(sock_path), track=False)
    save(adir, spec)
    listener = _ipc.listen(sock_path)
    listener.setblocking(True)
    heard: list[dict] = []

    def daemon() -> None:
        for reply in replies:
            conn, _ = listener.accept()
            with conn:
                data, fds = _ipc.recv_packet(conn, timeout=scaled(30))
                heard.append(protocol.unpack(data, fds))
                _ipc.send_packet(conn, protocol.encode(protocol.to_wire(reply)))

    helper = threading.Thread(target=daemon, daemon=True)
    helper.start()
    filler = _fill(small_disk)
    try:
        assert diskwait.probe(small_disk) is not None  # the disk refuses writes
        shim = subprocess.run(
            [sys.executable, "-m", "tandem.place.run.supervisor.shim", str(adir)],
            capture_output=True,
            text=True,
            timeout=scaled(60),
        )
        assert shim.returncode == 75, shim.stderr  # not started: put back
        assert "Traceback" not in shim.stderr and "not started" in shim.stderr, shim.stderr
        assert not ran.exists(), "the job ran although its supervisor could not write"
        helper.join(scaled(10))
        assert [h["op"] for h in heard] == ["not-started"] * len(replies), heard
        report = protocol.read_request(heard[0])
        assert isinstance(report, protocol.NotStarted) and (report.job_id, report.attempt) == (7, 2)
        assert "No space left" in report.why, report.why
        # The daemon's hold: while the disk refuses a probe write, and not after.
        monkeypatch.setattr(diskwait, "HOLD_S", 0.0)
        wait = diskwait.DiskWait(small_disk)
        wait.hold(report.why)
        assert "waits for disk space" in (wait.reason() or "")
        filler.unlink()
        assert wait.reason() is None
    finally:
        listener.close()
        filler.unlink(missing_ok=True)
        subprocess.run(["rm", "-rf", str(runtime)], check=False)


@pytest.mark.parametrize("free_kb", [120, 160])
def test_four_jobs_that_start_with_little_disk_left_each_run_once_when_space_returns(
    cli,
    tmp_path: Path,
    small_disk: Path,  # noqa: F811
    free_kb: int,
) -> None:
    held = queued_behind_a_blocker(cli, tmp_path, small_disk)
    tandem, out, ids = held.tandem, held.out, held.ids
    filler = _fill(small_disk, free_kb)
    held.end_the_blocker()  # the daemon starts the four with free_kb left
    deadline = time.monotonic() + 5.0  # the daemon's passes on the full disk: none of the four fails
    while time.monotonic() < deadline:
        listed = json.loads(tandem("ls", "--json").stdout or "[]")
        assert not [j for j in listed if j["state"] == "failed"], listed
        time.sleep(0.2)
    filler.unlink()
    r = tandem("wait", *ids, timeout=120)
    assert r.returncode == 0, (r.stdout, r.stderr, tandem("ls").stdout)
    ran = out.read_text().split()
    assert sorted(ran) == sorted(ids) and len(ran) == 4, "each of the four ran, once"
    tandem("daemon", "stop")
