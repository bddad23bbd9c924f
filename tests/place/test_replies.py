"""Replies of any size: a reply over the packet limit travels in a memory file, so a sweep of
20,000 points and a ``cancel --all`` of them exit 0 with what they did; a sweep retried with
its token (its reply lost, its daemon restarted) is told the jobs and group it made, never
made twice."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import psutil
import pytest

from tandem import _ipc
from tandem.place import packets, protocol
from tests.timing import scaled


def test_a_reply_over_the_packet_limit_travels_in_a_memory_file() -> None:
    reply = protocol.Cancelled(cancelled=list(range(100_000, 200_000)), unknown=[7], ended=[8])
    wire = protocol.to_wire(reply)
    data, fds = protocol.pack(wire)
    assert len(data) < _ipc.MAX_PACKET and len(fds) == 1
    stub = json.loads(data)  # what an older client, which cannot read the file, is told
    assert stub["ok"] is False and "update" in stub["error"]
    assert protocol.read_reply("cancel", protocol.unpack(data, list(fds))) == reply
    with pytest.raises(OSError):
        os.fstat(fds[0])  # unpack closed it
    small, none = protocol.pack(protocol.to_wire(protocol.Submitted(3)))
    assert none == () and protocol.read_reply("submit", protocol.unpack(small, [])) == protocol.Submitted(3)


def test_a_sweep_of_20000_points_and_cancel_all_exit_0(inproc) -> None:
    h = inproc("--cpus", "1")  # in this process: the replies cross its real socket
    t0 = time.monotonic()
    out = h.cli(
        "submit", "--cpus", "1", "--name", "p{i}", "--grid", "i=1..20000", "--", "sleep", "600"
    ).stdout
    submitted = time.monotonic() - t0
    assert out.splitlines()[1] == "submitted 20000 job(s): 1-20000", out
    listed = h.json("ls", "--all", "--limit", "30000")
    assert len(listed) == 20000 and len({j["group"] for j in listed}) == 1  # made once
    t0 = time.monotonic()
    out = h.cli("cancel", "--all").stdout
    cancelled = time.monotonic() - t0
    assert out.strip() == "cancelled 20000 jobs (1-20000)", out
    assert all(j["state"] == "cancelled" for j in h.json("ls", "--all", "--limit", "30000"))
    print(f"20,000 points: submit {submitted:.1f} s, cancel --all {cancelled:.1f} s")


def test_a_sweep_whose_reply_was_lost_is_told_the_same_jobs_by_a_restarted_daemon(cli, tmp_path) -> None:
    """The daemon commits the sweep and dies before it answers: the client's retry (the same
    token) starts a daemon, which answers from the database with the jobs and group made."""
    from tandem.place.client import daemon_socket, submit_sweep
    from tandem.place.model import JobSpec

    cli("daemon", "start", "--cpus", "1", "--no-track")
    cli("submit", "--cpus", "1", "--", sys.executable, "-c", "import time; time.sleep(600)")  # holds the core
    spec = JobSpec(["echo", "{i}"], str(tmp_path), {}, cpus=1, token="sweep-retry-me")
    points = [{"i": i} for i in range(12_000)]  # its ids: over the packet limit
    request = protocol.to_wire(protocol.SubmitSweep(spec, points, []))
    data, body = protocol.pack(request)
    with _ipc.new_socket() as sock:  # sent, its answer never read: as a client cut off mid-request
        sock.connect(str(daemon_socket(cli.state)))
        _ipc.send_packet(sock, data, body)
    _ipc.close_fds(list(body))
    deadline = time.monotonic() + scaled(60)
    while len(cli.json("ls")) < 12_001:
        assert time.monotonic() < deadline, "the sweep was not made"
        time.sleep(0.2)
    pid = cli.daemon_pid()
    assert pid is not None
    proc = psutil.Process(pid)
    proc.send_signal(signal.SIGKILL)
    proc.wait(scaled(10))
    reply = submit_sweep(cli.state, spec, points, [], timeout=scaled(60))  # starts a daemon
    listed = cli.json("ls")
    assert len(listed) == 12_001, "the retry made jobs again"
    made = sorted(j["id"] for j in listed if j["group"] == reply.group)
    assert reply.ids == made and len(made) == 12_000
    assert cli.daemon_pid() != pid


def test_a_reply_too_large_even_for_a_memory_file_is_a_clear_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(packets, "MAX_BODY", 1 << 17)  # where pack reads it
    with pytest.raises(ValueError, match="reply of .* bytes is over the"):
        protocol.pack(protocol.to_wire(protocol.Cancelled(cancelled=list(range(100_000)))))
