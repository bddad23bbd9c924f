"""The typed records and the wire: JobSpec's checks, the daemon's kept configuration, a
request over the packet limit through a memory file, the supervisor's files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tandem import _ipc
from tandem.place import protocol
from tandem.place.config import DaemonConfig
from tandem.place.model import JobSpec
from tandem.place.policies import Limits
from tandem.place.resources import Cap, Resources
from tandem.place.run.supervisor.files import Result, Usage, load, save


def test_jobspec_round_trip_and_problems() -> None:
    spec = JobSpec(["python", "train.py"], "/w", {"A": "1"}, name="r18", cpus=0.5, group="g", after=[3])
    assert JobSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    assert spec.job_key == "name:r18" and spec.problem() is None
    with pytest.raises(ValueError, match="unknown job field"):
        JobSpec.from_dict({**spec.to_dict(), "grp": "old"})
    bad = {
        "no command given": JobSpec([]),
        "--priority": JobSpec(["x"], priority=10**30),
        "--cpus": JobSpec(["x"], cpus=float("nan")),
        "--mem": JobSpec(["x"], mem=10**40),
        "printable": JobSpec(["x"], name="a\x1b[2Jb"),
        "--retries": JobSpec(["x"], retries=1000),
    }
    for words, job in bad.items():
        assert words in (job.problem() or ""), (words, job.problem())


def test_daemon_config_is_kept_and_read_back(tmp_path: Path) -> None:
    assert DaemonConfig.load(tmp_path) == DaemonConfig()  # nothing kept: the defaults
    config = DaemonConfig(cap=Cap(1.5, 2 << 30), policy="first-fit", limits=Limits(settle_s=3.0), mps=True)
    config.save(tmp_path)
    assert DaemonConfig.load(tmp_path) == config
    (tmp_path / "daemon-config.json").write_text("{not json")
    assert DaemonConfig.load(tmp_path) == DaemonConfig()  # unreadable: the defaults, not a crash


def test_a_request_over_the_packet_limit_travels_in_a_memory_file() -> None:
    message = {"op": "submit", "job": {"env": {"BIG": "x" * (3 * _ipc.MAX_PACKET)}}}
    data, fds = protocol.pack(message)
    assert len(data) < _ipc.MAX_PACKET and len(fds) == 1
    assert protocol.unpack(data, list(fds)) == message
    with pytest.raises(OSError):
        os.fstat(fds[0])  # unpack closed it
    small, none = protocol.pack({"op": "status"})
    assert none == () and protocol.unpack(small, []) == {"op": "status"}
    with pytest.raises(ValueError, match="without its file"):
        protocol.unpack(json.dumps({"op": "submit", "body": "fd"}).encode(), [])


def test_every_request_and_reply_is_a_record_that_survives_the_wire() -> None:
    """What the client sends is what the daemon reads, and back, nested records included."""
    job = JobSpec(["python", "train.py"], "/tmp", {"A": "1"}, cpus=0.5, after=[3], token="t")
    for message in (protocol.Submit(job), protocol.Cancel([1, 2]), protocol.Status(), protocol.Stop()):
        wire = json.loads(protocol.encode(protocol.to_wire(message)))
        assert wire["op"] == message.OP and protocol.read_request(wire) == message
    status = protocol.DaemonStatus(
        pid=1, policy="packing", state_dir="/s", started=2.0, limits={"settle_s": 30.0}, mps=False,
        backend="local", tracking=None, jobs={"queued": 1},
        capacity=protocol.CapacityReport(
            Resources(2.0, 1 << 30), [protocol.GpuCapacity(0, "GPU-x", 80 << 30)]),
        used=protocol.Use(Resources(0.5), None, 1, [protocol.GpuUse(0, 1, 1 << 30, None, None, True)]),
    )  # fmt: skip
    replies = {"status": status, "submit": protocol.Submitted(7, False), "stop": protocol.Stopping(),
               "cancel": protocol.Cancelled([1], [9], [])}  # fmt: skip
    for op, reply in replies.items():
        wire = json.loads(protocol.encode(protocol.to_wire(reply)))
        assert wire["ok"] is True and protocol.read_reply(op, wire) == reply
    assert isinstance(protocol.read_reply("status", status_wire := protocol.to_wire(status)).used.gpus[0],
                      protocol.GpuUse) and status_wire["used"]["gpus"][0]["probing"] is True  # fmt: skip
    refused = protocol.read_reply("submit", protocol.to_wire(protocol.Failure("refused: too big", True)))
    assert refused == protocol.Failure("refused: too big", refused=True)
    with pytest.raises(
        protocol.ProtocolError, match="unknown request 'frobnicate'; this daemon knows submit"
    ):
        protocol.read_request({"op": "frobnicate"})
    with pytest.raises(protocol.ProtocolError, match="not a job: unknown job field"):
        protocol.read_request({"op": "submit", "job": {"comand": ["x"]}})
    with pytest.raises(protocol.ProtocolError, match="Submitted"):
        protocol.read_reply("submit", {"ok": True})  # no id


def test_a_dropin_loaders_request_carries_an_auto_share_and_its_job() -> None:
    from tandem.share.spec import ShareSpec

    spec = ShareSpec("auto-0123456789abcdef", "auto", "/run/x.managed.spec", batch_size=6, shuffle=True)
    ask = protocol.AutoShare(12, spec)
    wire = json.loads(protocol.encode(protocol.to_wire(ask)))
    assert protocol.read_request(wire) == ask
    answer = protocol.AutoShared(spec.name, 13, [14, 15])
    assert protocol.read_reply("auto-share", protocol.to_wire(answer)) == answer
    with pytest.raises(protocol.ProtocolError, match="source auto"):
        protocol.read_request({**wire, "spec": {**wire["spec"], "source": "dataset"}})
    with pytest.raises(protocol.ProtocolError, match="its id"):
        protocol.read_request({**wire, "job_id": "12"})


def test_the_supervisor_files_are_typed_and_a_partial_one_is_none(tmp_path: Path) -> None:
    usage = Usage(1.0, [1, 2], 10, 20, 0.5, None)
    save(tmp_path, usage)
    assert load(tmp_path, Usage) == usage
    assert load(tmp_path, Result) is None  # absent
    (tmp_path / Result.FILE).write_text('{"kind": "ok"')  # cut short
    assert load(tmp_path, Result) is None
    (tmp_path / Result.FILE).write_text('{"kind": "ok"}')  # another version's shape
    assert load(tmp_path, Result) is None


def test_a_pass_sees_what_each_waiting_job_s_program_used_at_start(tmp_path: Path) -> None:
    """The admission's view of the queue, from the state file: a job of a program measured
    before carries that start-up into the scheduler (the queue's columns include its command)."""
    import time

    from tandem.place.active import UNSEEN_STARTUP_CORES, Startup
    from tandem.place.admission import Admission
    from tandem.place.devices import Monitor
    from tandem.place.model import Capacity
    from tandem.place.producers import Producers
    from tandem.place.state import State

    d = tmp_path / "state"
    d.mkdir(mode=0o700)
    state = State(d)
    capacity = Capacity(Resources(2.0, 8 << 30))
    startup = Startup()
    startup.seen(["python", "-m", "train"], 1.0)
    admission = Admission(
        state,
        capacity,
        Limits(),
        Monitor(capacity, 30.0, None),
        Producers(state, capacity, DaemonConfig(), startup.learned),
        startup,
    )
    for command in (["python", "-m", "train", "--lr", "1"], ["sleep", "3"]):
        state.add_job(JobSpec(command, "/", {}, cpus=0.25, gpu_share=30), 0, time.time())
    reasons: dict[int, str] = {}
    waiting = admission.waiting(state.queue(("queued",)), {}, {}, reasons)
    # The measured program at what it took; one never seen at a core, until its first sample.
    assert [w.startup_cpus for w in waiting] == [1.0, UNSEEN_STARTUP_CORES] and reasons == {}
    assert [w.need.resources.gpu_share for w in waiting] == [30, 30]  # declared compute reaches the scheduler
