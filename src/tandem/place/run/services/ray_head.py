"""The daemon's own Ray head on one server: ``tandem daemon start --backend ray`` without
``--address``.

A head that ``ray.init()`` starts shares its driver's fate: a daemon killed with SIGKILL
took Ray and every attempt's actor with it, and the next daemon ran them all again. So the
daemon starts the head as ``ray start --head --block`` in a session of its own, which
outlives it, keeps where it is (``ray-head.json`` in the state's private directory: its
address, its temporary directory, the pid and start time of its ``ray start``), and the
next daemon of the state directory connects to that head again while it answers
(:func:`ensure`). A clean ``tandem daemon stop`` with no attempt running stops it
(:func:`stop`): its ``ray start`` is ended, and what outlived it is found by its temporary
directory, never another Ray of this machine.

It lets in only the processes of its user: Ray's token authentication (``RAY_AUTH_MODE=token``)
with a token in a 0600 file of the state's private directory (:func:`auth_env`), which the
daemon, the head and every Ray process they start read; without it any local user could
join the head as a node of their own and run code as this one.

The head declares what the daemon may hand out: its cores (whole: ``ray start`` takes no
fraction), and each GPU with its memory as ``tandem_gpu_mem_mib_<NVML index>``, so that
the node's agent's readings (by NVML index) are each GPU's own also under ``--gpus``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psutil

from tandem._safepath import module_command
from tandem.place.model import GpuInfo
from tandem.place.paths import private_dir
from tandem.place.run.launchers.ray_backend import GPU_MEM_RESOURCE, MIB
from tandem.place.run.supervisor.fence import unreachable
from tandem.place.run.supervisor.files import read_json, write_json
from tandem.place.run.supervisor.proctrack import create_time, same_process

HEAD_FILE = "ray-head.json"  # in the state's private directory
TOKEN_FILE = "ray-token"  # the head's authentication token, 0600, beside it
LOG_FILE = "ray-head.log"
START_S = 120.0  # what a head may take to start on a loaded machine
STOP_S = 30.0
RAY = module_command("ray.scripts.scripts")
TEMP_PREFIX = "/tmp/tandem-ray-"  # Ray's socket paths must stay short: not in the state directory
log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class LocalHead:
    """Where the daemon's head is, and the ``ray start`` process that holds it."""

    address: str
    temp_dir: str
    pid: int
    ctime: float
    cpus: int = 0  # what it declares
    gpus: tuple[int, ...] = ()  # its GPUs' NVML indices


def ensure(state_dir: Path, cpus: float, gpus: tuple[GpuInfo, ...]) -> LocalHead:
    """The head the state directory's daemons share: the kept one while its ``ray start``
    runs and it answers, else a new one (what is left of the old one stopped first)."""
    kept = _kept(state_dir)
    if kept is not None:
        if same_process(kept.pid, kept.ctime):  # its attempts may run: waited for, never stopped
            deadline = time.monotonic() + START_S
            while (why := unreachable(kept.address, 5.0)) is not None:
                if time.monotonic() > deadline or not same_process(kept.pid, kept.ctime):
                    raise RuntimeError(
                        f"the daemon's Ray head ({kept.address}, pid {kept.pid}) does not answer ({why}); "
                        f"its log: {private_dir(state_dir) / LOG_FILE}"
                    )
                time.sleep(1.0)
        elif unreachable(kept.address, 5.0) is not None:  # its `ray start` is gone, and so is Ray
            stop(state_dir)  # what outlived it
            return _start(state_dir, cpus, gpus)
        # else its `ray start` is gone but its Ray answers: its attempts' actors run on in it
        declared = _declared(cpus, gpus)
        if (kept.cpus, tuple(kept.gpus)) != declared:
            log.warning(
                "the daemon's Ray head declares %d cores and GPUs %s, not %d and %s: it keeps them "
                "until `tandem daemon stop` with no job running",
                kept.cpus, list(kept.gpus), declared[0], list(declared[1]),
            )  # fmt: skip
        return kept
    return _start(state_dir, cpus, gpus)


def _declared(cpus: float, gpus: tuple[GpuInfo, ...]) -> tuple[int, tuple[int, ...]]:
    """What a head for ``cpus`` and ``gpus`` declares: whole cores (at least one), the GPUs'
    NVML indices."""
    return max(1, math.floor(cpus)), tuple(g.index for g in gpus)


def stop(state_dir: Path) -> bool:
    """Stop the state directory's head, if one is kept: its ``ray start`` asked to end its
    processes, then any that outlived it killed. Whether one was kept."""
    kept = _kept(state_dir)
    if kept is None:
        return False
    if same_process(kept.pid, kept.ctime):
        try:
            os.kill(kept.pid, signal.SIGTERM)  # `ray start --block` stops the processes it started
            psutil.Process(kept.pid).wait(STOP_S)
        except (ProcessLookupError, psutil.NoSuchProcess):
            pass
        except psutil.TimeoutExpired:
            os.kill(kept.pid, signal.SIGKILL)
    for p in psutil.process_iter(["cmdline"]):  # what outlived it: named by its directory
        try:
            if kept.temp_dir in " ".join(p.info["cmdline"] or ()):
                p.kill()
        except psutil.Error:
            pass
    shutil.rmtree(kept.temp_dir, ignore_errors=True)
    (private_dir(state_dir) / HEAD_FILE).unlink(missing_ok=True)
    return True


def _kept(state_dir: Path) -> LocalHead | None:
    """The kept head, or None (none kept, or a record not of ours: nothing is stopped by it,
    as its directory names the processes :func:`stop` kills)."""
    data = read_json(private_dir(state_dir) / HEAD_FILE)
    try:
        head = LocalHead(**data) if data is not None else None
    except TypeError:
        return None
    if head is None or not re.fullmatch(rf"{re.escape(TEMP_PREFIX)}[A-Za-z0-9_]+", head.temp_dir):
        return None
    return head


def auth_env(state_dir: Path) -> dict[str, str]:
    """What a process needs in its environment to talk to the state directory's head: the
    token's mode and file (made 0600 the first time)."""
    path = private_dir(state_dir) / TOKEN_FILE
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(path)}


def _start(state_dir: Path, cpus: float, gpus: tuple[GpuInfo, ...]) -> LocalHead:
    private = private_dir(state_dir)
    temp = tempfile.mkdtemp(prefix=Path(TEMP_PREFIX).name, dir=Path(TEMP_PREFIX).parent)
    port = _free_port()
    cores, indices = _declared(cpus, gpus)
    resources = {GPU_MEM_RESOURCE.format(g.index): g.mem_total // MIB for g in gpus}
    args = [
        *RAY, "start", "--head", "--block", "--port", str(port),
        "--num-cpus", str(cores), "--num-gpus", str(len(gpus)),
        "--resources", json.dumps(resources), "--temp-dir", temp,
        "--include-dashboard", "false", "--disable-usage-stats",
    ]  # fmt: skip
    log = private / LOG_FILE
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            args,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, **auth_env(state_dir)},
        )
    head = LocalHead(f"127.0.0.1:{port}", temp, proc.pid, create_time(proc.pid) or 0.0, cores, indices)
    write_json(private / HEAD_FILE, dataclasses.asdict(head))  # before it answers: a stop finds it
    deadline = time.monotonic() + START_S
    while "Ray runtime started" not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-2000:]
            stop(state_dir)
            raise RuntimeError(f"could not start a local Ray head (ray start --head): {tail}")
        time.sleep(0.2)
    return head


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
