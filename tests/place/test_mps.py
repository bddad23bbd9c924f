"""MPS daemons per GPU: command and environment construction, and the daemon's life cycle driven
against fake ``nvidia-cuda-mps-control`` scripts (there is no GPU here), including every way the
start can fail and fall back to plain sharing."""

from __future__ import annotations

import logging
import shlex
import socket
import stat
import time
from pathlib import Path

import pytest

from tandem.place.run.services.mps import (
    MAX_SOCKET_PATH,
    MpsDirs,
    MpsManager,
    MpsServer,
    client_env,
    daemon_command,
    daemon_env,
    mps_dirs,
)
from tests.timing import scaled

GPU_A = "GPU-8d5c6f3e-2b7a-4c1d-9e0f-1a2b3c4d5e6f"
GPU_B = "GPU-f00dcafe-1234-5678-9abc-def012345678"
GIB = 1024**3

# Stands in for nvidia-cuda-mps-control: "-d" records how it was started and creates the
# control socket's path, as the real daemon does once it listens; without arguments it reads
# commands from stdin and "quit" removes the socket, as the real daemon does when it exits.
FAKE_MPS = """\
#!/bin/sh
record={record}
if [ "$1" = "-d" ]; then
    printf 'start\\targv=%s\\tuuid=%s\\tpipe=%s\\tlog=%s\\tpct=%s\\tmem=%s\\n' "$0 $*" \\
        "$CUDA_VISIBLE_DEVICES" "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY" \\
        "$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" "$CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" >> "$record"
    : > "$CUDA_MPS_PIPE_DIRECTORY/control"
    exit 0
fi
while read -r command; do
    if [ "$command" = quit ]; then
        rm -f "$CUDA_MPS_PIPE_DIRECTORY/control"
        printf 'quit\\tuuid=%s\\tpipe=%s\\n' "$CUDA_VISIBLE_DEVICES" "$CUDA_MPS_PIPE_DIRECTORY" >> "$record"
    fi
done
"""


def _script(path: Path, text: str) -> str:
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def record(tmp_path) -> Path:
    return tmp_path / "record.tsv"


@pytest.fixture
def fake_mps(tmp_path, record) -> str:
    return _script(tmp_path / "nvidia-cuda-mps-control", FAKE_MPS.format(record=shlex.quote(str(record))))


@pytest.fixture
def runtime(runtime_dir) -> Path:
    return Path(runtime_dir)  # tests/conftest.py's short private directory


def _calls(record: Path) -> list[dict[str, str]]:
    """The fake's record: one dict per call, with "call" = "start" or "quit"."""
    if not record.exists():
        return []
    calls = []
    for line in record.read_text().splitlines():
        call, *fields = line.split("\t")
        calls.append({"call": call, **dict(field.split("=", 1) for field in fields)})
    return calls


def _warnings(caplog) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.name == "tandem.place" and r.levelno == logging.WARNING
    ]


# --- construction --------------------------------------------------------------------------


def test_daemon_command():
    assert daemon_command("/usr/bin/nvidia-cuda-mps-control") == ["/usr/bin/nvidia-cuda-mps-control", "-d"]


def test_mps_dirs():
    dirs = mps_dirs(Path("/run/user/1000/tandem"), GPU_A)
    assert dirs == MpsDirs(
        pipe=Path(f"/run/user/1000/tandem/mps/{GPU_A}/pipe"),
        log=Path(f"/run/user/1000/tandem/mps/{GPU_A}/log"),
    )
    assert dirs.control == Path(f"/run/user/1000/tandem/mps/{GPU_A}/pipe/control")


def test_mps_dirs_hash_the_uuid_when_the_socket_path_would_be_too_long():
    runtime = Path("/home/someone-with-a-long-name/.local/state/tandem-runtime")
    assert len(str(runtime / "mps" / GPU_A / "pipe" / "control")) > MAX_SOCKET_PATH
    a, b = mps_dirs(runtime, GPU_A), mps_dirs(runtime, GPU_B)
    assert len(str(a.control)) <= MAX_SOCKET_PATH and GPU_A not in str(a.pipe)
    assert a.pipe.parent == a.log.parent and a.pipe.parent.parent == runtime / "mps"
    assert a == mps_dirs(runtime, GPU_A)  # the same GPU, the same place, in every tandem daemon
    assert a.pipe != b.pipe


def test_mps_dirs_hash_an_old_mig_uuid():
    dirs = mps_dirs(Path("/tmp/t"), "MIG-GPU-8d5c6f3e-2b7a-4c1d-9e0f-1a2b3c4d5e6f/1/0")
    assert dirs.pipe.parent.parent == Path("/tmp/t/mps")  # no slash of the UUID made a directory


def test_daemon_env():
    dirs = mps_dirs(Path("/run/t"), GPU_A)
    base = {
        "PATH": "/usr/bin:/bin",
        "HOME": "/home/ana",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",  # meant for one job, never for a daemon
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=1024M",
        "CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps",
    }
    env = daemon_env(base, GPU_A, dirs)
    assert env == {
        "PATH": "/usr/bin:/bin",
        "HOME": "/home/ana",
        "CUDA_VISIBLE_DEVICES": GPU_A,
        "CUDA_MPS_PIPE_DIRECTORY": f"/run/t/mps/{GPU_A}/pipe",
        "CUDA_MPS_LOG_DIRECTORY": f"/run/t/mps/{GPU_A}/log",
    }
    assert base["CUDA_VISIBLE_DEVICES"] == "0,1"  # not changed in place


def test_client_env():
    dirs = mps_dirs(Path("/run/t"), GPU_A)
    assert client_env(GPU_A, dirs, 4 * GIB, 50) == {
        "CUDA_VISIBLE_DEVICES": GPU_A,
        "CUDA_MPS_PIPE_DIRECTORY": f"/run/t/mps/{GPU_A}/pipe",
        "CUDA_MPS_LOG_DIRECTORY": f"/run/t/mps/{GPU_A}/log",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4096M",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50",
    }
    assert client_env(GPU_A, dirs, None, None) == {
        "CUDA_VISIBLE_DEVICES": GPU_A,
        "CUDA_MPS_PIPE_DIRECTORY": f"/run/t/mps/{GPU_A}/pipe",
        "CUDA_MPS_LOG_DIRECTORY": f"/run/t/mps/{GPU_A}/log",
    }


@pytest.mark.parametrize(
    ("mem", "limit"),
    [(4 * GIB, "0=4096M"), (4 * GIB + 1, "0=4097M"), (1, "0=1M"), (1536 * 1024**2 - 5, "0=1536M")],
)
def test_pinned_limit_rounds_up_to_mib(mem, limit):
    env = client_env(GPU_A, mps_dirs(Path("/run/t"), GPU_A), mem, None)
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == limit
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in env


@pytest.mark.parametrize("pct", [1, 100])
def test_thread_percentage_bounds(pct):
    env = client_env(GPU_A, mps_dirs(Path("/run/t"), GPU_A), None, pct)
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == str(pct)


@pytest.mark.parametrize("pct", [0, 101, -5, 50.5, True])
def test_thread_percentage_validated(pct):
    with pytest.raises(ValueError, match=r"thread percentage must be a whole number from 1 to 100, got"):
        client_env(GPU_A, mps_dirs(Path("/run/t"), GPU_A), None, pct)


@pytest.mark.parametrize("mem", [0, -1])
def test_memory_limit_validated(mem):
    with pytest.raises(ValueError, match="GPU memory limit must be a positive number of bytes"):
        client_env(GPU_A, mps_dirs(Path("/run/t"), GPU_A), mem, None)


# --- fallback when MPS cannot be had -------------------------------------------------------


def test_missing_binary_falls_back_and_warns_once(runtime, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing there
    caplog.set_level(logging.INFO, logger="tandem.place")
    manager = MpsManager(runtime)
    assert manager.why_not is None
    assert manager.ensure(GPU_A) is None
    assert manager.ensure(GPU_A) is None
    assert manager.ensure(GPU_B) is None
    assert manager.why_not == "nvidia-cuda-mps-control not found on PATH"
    assert _warnings(caplog) == [
        "MPS not used, GPUs are shared without it: nvidia-cuda-mps-control not found on PATH"
    ]
    manager.release_idle(set())
    manager.stop_all()  # nothing to stop, nothing raised


def test_disabled_manager_starts_nothing(runtime, fake_mps, record, caplog):
    manager = MpsManager(runtime, binary=fake_mps, enabled=False)
    assert manager.ensure(GPU_A) is None
    assert manager.why_not == "MPS is turned off"
    assert _calls(record) == [] and _warnings(caplog) == []


def test_start_refused_falls_back_with_the_reason(runtime, tmp_path, caplog):
    binary = _script(
        tmp_path / "refuse",
        "#!/bin/sh\necho 'nvidia-cuda-mps-control: permission denied' >&2\nexit 1\n",
    )
    manager = MpsManager(runtime, binary=binary)
    assert manager.ensure(GPU_A) is None
    assert manager.ensure(GPU_B) is None
    assert "permission denied" in manager.why_not and "exited with 1" in manager.why_not
    assert len(_warnings(caplog)) == 1 and "permission denied" in _warnings(caplog)[0]
    assert manager.servers[GPU_A].running is False


def test_control_socket_never_appears(runtime, tmp_path):
    binary = _script(tmp_path / "silent", "#!/bin/sh\nexit 0\n")
    # A scaled limit: `sh -c 'exit 0'` itself may take over 0.5 s to return on a busy machine.
    limit = scaled(0.5)
    server = MpsServer(GPU_A, runtime, binary=binary, start_timeout=limit)
    began = time.monotonic()
    assert server.start() is False
    assert limit <= time.monotonic() - began < scaled(2.0)
    assert not server.running
    assert f"did not appear within {limit:g} s" in server.why_not
    assert str(server.dirs.control) in server.why_not


def test_daemon_command_that_never_returns(runtime, tmp_path):
    binary = _script(tmp_path / "stuck", "#!/bin/sh\nexec sleep 30\n")
    server = MpsServer(GPU_A, runtime, binary=binary, start_timeout=0.5)
    began = time.monotonic()
    assert server.start() is False
    assert time.monotonic() - began < scaled(3.0)
    assert server.why_not == f"{binary} -d did not return within 0.5 s"


def test_binary_that_cannot_run(runtime, tmp_path):
    server = MpsServer(GPU_A, runtime, binary=str(tmp_path / "gone"))
    assert server.start() is False
    assert server.why_not.startswith(f"cannot run {tmp_path / 'gone'}:")


# --- the life cycle, against the fake daemon -----------------------------------------------


def test_start_and_stop_one_server(runtime, fake_mps, record, monkeypatch):
    monkeypatch.setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "10")  # the tandem daemon's own, not for MPS
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    server = MpsServer(GPU_A, runtime, binary=fake_mps)
    assert server.start() is True
    assert server.running and server.why_not == "" and server.alive()
    [start] = _calls(record)
    assert start == {
        "call": "start",
        "argv": f"{fake_mps} -d",
        "uuid": GPU_A,
        "pipe": str(runtime / "mps" / GPU_A / "pipe"),
        "log": str(runtime / "mps" / GPU_A / "log"),
        "pct": "",
        "mem": "",
    }
    for directory in (runtime / "mps", runtime / "mps" / GPU_A, server.dirs.pipe, server.dirs.log):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert server.start() is True and len(_calls(record)) == 1  # already running: not started twice
    server.stop()
    assert not server.running and not server.alive()
    assert _calls(record)[1] == {"call": "quit", "uuid": GPU_A, "pipe": str(server.dirs.pipe)}
    server.stop()  # already stopped: nothing sent
    assert len(_calls(record)) == 2


def test_stop_never_raises_on_a_dead_server(runtime, fake_mps, record, tmp_path):
    server = MpsServer(GPU_A, runtime, binary=fake_mps)
    server.stop()  # never started
    assert server.start()
    server.dirs.control.unlink()  # the daemon died
    server.stop()
    assert not server.running and [c["call"] for c in _calls(record)] == ["start"]

    assert server.start()
    Path(fake_mps).unlink()  # and now the binary is gone as well
    server.stop(timeout=1.0)
    assert not server.running


def test_stale_control_file_is_replaced(runtime, fake_mps, record):
    server = MpsServer(GPU_A, runtime, binary=fake_mps)
    server.dirs.pipe.mkdir(parents=True)
    server.dirs.control.write_text("")  # left by a daemon that died: nothing listens
    assert server.start() is True
    assert [c["call"] for c in _calls(record)] == ["start"]


def test_live_daemon_is_taken_over(runtime, fake_mps, record):
    server = MpsServer(GPU_A, runtime, binary=fake_mps)
    server.dirs.pipe.mkdir(parents=True)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(server.dirs.control))  # a daemon of an earlier tandem daemon, still serving
        listener.listen()
        assert server.start() is True
    assert server.running and _calls(record) == []  # not started a second time


def test_one_server_per_gpu(runtime, fake_mps, record, caplog):
    manager = MpsManager(runtime, binary=fake_mps)
    a, b = manager.ensure(GPU_A), manager.ensure(GPU_B)
    assert a is not None and b is not None and a is not b
    assert manager.ensure(GPU_A) is a and manager.ensure(GPU_B) is b
    assert a.dirs.pipe != b.dirs.pipe and a.dirs.log != b.dirs.log
    starts = [c for c in _calls(record) if c["call"] == "start"]
    assert [(c["uuid"], c["pipe"]) for c in starts] == [(GPU_A, str(a.dirs.pipe)), (GPU_B, str(b.dirs.pipe))]
    assert a.client_env(GIB, 30)["CUDA_MPS_PIPE_DIRECTORY"] == str(a.dirs.pipe)
    assert manager.why_not is None and _warnings(caplog) == []


def test_release_idle_then_stop_all(runtime, fake_mps, record):
    manager = MpsManager(runtime, binary=fake_mps)
    a, b = manager.ensure(GPU_A), manager.ensure(GPU_B)
    manager.release_idle({GPU_A})
    assert a.running and a.alive()
    assert not b.running and not b.alive()
    assert [c["uuid"] for c in _calls(record) if c["call"] == "quit"] == [GPU_B]

    assert manager.ensure(GPU_B) is b and b.running  # needed again: started again
    manager.stop_all()
    assert not a.running and not b.running and not a.alive() and not b.alive()
    quits = [c["uuid"] for c in _calls(record) if c["call"] == "quit"]
    assert sorted(quits) == sorted([GPU_B, GPU_A, GPU_B])


def test_daemon_that_died_is_started_again(runtime, fake_mps, record):
    manager = MpsManager(runtime, binary=fake_mps)
    server = manager.ensure(GPU_A)
    server.dirs.control.unlink()  # killed behind our back
    assert manager.ensure(GPU_A) is server and server.alive()
    assert [c["call"] for c in _calls(record)] == ["start", "start"]
