"""NVIDIA MPS for collocated jobs: one MPS control daemon per GPU, started on first need.

MPS (Multi-Process Service) lets several processes share a GPU's compute at once instead of
time-slicing it, and caps each client's device memory and share of the SMs. The job manager
runs one control daemon per GPU rather than one for all: a fatal fault in one client takes
down every client of that MPS server, so a daemon per GPU keeps the damage on that GPU. Each
daemon sees only its GPU (``CUDA_VISIBLE_DEVICES`` = its UUID) and has its own pipe and log
directories under the tandem runtime directory; a client reaches it by the same directories.

Where MPS cannot be had (no ``nvidia-cuda-mps-control``, not permitted, another user's server
holds the GPU, the daemon does not come up) the manager says why once and the jobs share the
GPU plainly: :meth:`MpsManager.ensure` answers ``None`` and ``why_not`` keeps the reason.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import re
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("tandem.place")

BINARY = "nvidia-cuda-mps-control"
MIB = 1024 * 1024
MAX_SOCKET_PATH = 107  # bytes in sockaddr_un.sun_path, less its terminating NUL
_SAFE_NAME = re.compile(r"[A-Za-z0-9._-]+")  # old MIG UUIDs ("MIG-GPU-.../1/0") have slashes
_POLL_S = 0.02  # how often start() and stop() look at the control socket


@dataclass(frozen=True)
class MpsDirs:
    """The directories a daemon and its clients must agree on."""

    pipe: Path  # CUDA_MPS_PIPE_DIRECTORY: holds the daemon's "control" socket
    log: Path  # CUDA_MPS_LOG_DIRECTORY: control.log and server.log

    @property
    def control(self) -> Path:
        """The control daemon's Unix socket; it exists while the daemon runs."""
        return self.pipe / "control"


def mps_dirs(runtime_dir: Path, gpu_uuid: str) -> MpsDirs:
    """``<runtime_dir>/mps/<uuid>/{pipe,log}``, or a short hash of the UUID in place of it where
    the UUID is not a plain file name or the control socket's path would not fit in a sockaddr.
    """
    base = Path(runtime_dir) / "mps"
    name = gpu_uuid
    if not _SAFE_NAME.fullmatch(name) or _path_len(base / name / "pipe" / "control") > MAX_SOCKET_PATH:
        name = hashlib.sha256(gpu_uuid.encode()).hexdigest()[:12]
    return MpsDirs(pipe=base / name / "pipe", log=base / name / "log")


def _path_len(path: Path) -> int:
    return len(os.fsencode(path))


def daemon_command(binary: str) -> list[str]:
    """The command that starts a control daemon (it forks into the background and returns)."""
    return [binary, "-d"]


def daemon_env(base: Mapping[str, str], gpu_uuid: str, dirs: MpsDirs) -> dict[str, str]:
    """The environment of one GPU's control daemon, and of the ``quit`` sent to it.

    Other ``CUDA_MPS_*`` variables of ``base`` are left out: set on a daemon they become the
    default of every client (a thread percentage or memory limit meant for one job).
    """
    env = {key: value for key, value in base.items() if not key.startswith("CUDA_MPS_")}
    env["CUDA_VISIBLE_DEVICES"] = gpu_uuid
    env["CUDA_MPS_PIPE_DIRECTORY"] = str(dirs.pipe)
    env["CUDA_MPS_LOG_DIRECTORY"] = str(dirs.log)
    return env


def client_env(
    gpu_uuid: str, dirs: MpsDirs, gpu_mem_bytes: int | None, thread_percent: int | None
) -> dict[str, str]:
    """The variables that make a job an MPS client of its GPU's daemon, with its limits.

    The client sees its GPU as device 0 (its ``CUDA_VISIBLE_DEVICES`` names only that one), so
    the memory limit is ``0=<MiB>M``, rounded up to whole MiB.
    """
    env = {
        "CUDA_VISIBLE_DEVICES": gpu_uuid,
        "CUDA_MPS_PIPE_DIRECTORY": str(dirs.pipe),
        "CUDA_MPS_LOG_DIRECTORY": str(dirs.log),
    }
    if gpu_mem_bytes is not None:
        if isinstance(gpu_mem_bytes, bool) or not isinstance(gpu_mem_bytes, int) or gpu_mem_bytes <= 0:
            raise ValueError(f"GPU memory limit must be a positive number of bytes, got {gpu_mem_bytes!r}")
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={math.ceil(gpu_mem_bytes / MIB)}M"
    if thread_percent is not None:
        if (
            isinstance(thread_percent, bool)
            or not isinstance(thread_percent, int)
            or not 1 <= thread_percent <= 100
        ):
            raise ValueError(
                f"MPS thread percentage must be a whole number from 1 to 100, got {thread_percent!r}"
            )
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(thread_percent)
    return env


def _listening(path: Path) -> bool:
    """Whether a daemon answers on the Unix socket ``path`` (a leftover file does not)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        try:
            sock.connect(os.fsencode(path))
        except OSError:
            return False
    return True


def _mkdir_private(path: Path) -> None:
    path.mkdir(mode=0o700, exist_ok=True)
    path.chmod(0o700)  # mkdir's mode is masked by the umask, and an existing one keeps its own


class MpsServer:
    """The MPS control daemon of one GPU."""

    def __init__(
        self,
        gpu_uuid: str,
        runtime_dir: Path,
        binary: str | None = None,
        start_timeout: float = 10.0,
    ):
        self.gpu_uuid = gpu_uuid
        self.runtime_dir = Path(runtime_dir)
        self.dirs = mps_dirs(self.runtime_dir, gpu_uuid)
        self.binary = binary if binary is not None else shutil.which(BINARY)
        self.start_timeout = start_timeout
        self.running = False
        self.why_not = ""  # why the last start() failed; "" when it did not

    def __repr__(self) -> str:
        return f"MpsServer({self.gpu_uuid!r}, running={self.running})"

    def client_env(self, gpu_mem_bytes: int | None, thread_percent: int | None) -> dict[str, str]:
        """:func:`client_env` for a job on this server's GPU."""
        return client_env(self.gpu_uuid, self.dirs, gpu_mem_bytes, thread_percent)

    def alive(self) -> bool:
        """Whether the daemon's control socket is there (it goes when the daemon quits or dies)."""
        return self.dirs.control.exists()

    def _fail(self, why: str) -> bool:
        self.running = False
        self.why_not = why
        return False

    def start(self) -> bool:
        """Start the daemon and wait for its control socket; False (and ``why_not``) on failure."""
        if self.running and self.alive():
            return True
        self.running = False
        self.why_not = ""
        if self.binary is None:
            return self._fail(f"{BINARY} not found on PATH")
        if _path_len(self.dirs.control) > MAX_SOCKET_PATH:
            return self._fail(f"the MPS pipe path {self.dirs.control} is longer than a Unix socket allows")
        try:
            for directory in (
                self.dirs.pipe.parent.parent,
                self.dirs.pipe.parent,
                self.dirs.pipe,
                self.dirs.log,
            ):
                _mkdir_private(directory)
        except OSError as e:
            return self._fail(f"cannot create the MPS directories: {e}")
        if self.dirs.control.exists():
            if _listening(self.dirs.control):
                # A daemon left by an earlier tandem daemon still serves this GPU: its clients
                # may still run, so it is taken over rather than restarted.
                log.info("MPS daemon for %s already running; using it", self.gpu_uuid)
                self.running = True
                return True
            self.dirs.control.unlink(missing_ok=True)  # stale: a daemon that died
        deadline = time.monotonic() + self.start_timeout
        # The daemon's output goes to a file, not a pipe: the daemonized child may keep its
        # inherited stdout open, and reading a pipe to its end would then never return.
        out_path = self.dirs.log / "tandem-start.out"
        try:
            with open(out_path, "w+b") as out:
                result = subprocess.run(
                    daemon_command(self.binary),
                    env=daemon_env(os.environ, self.gpu_uuid, self.dirs),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    timeout=self.start_timeout,
                    start_new_session=True,  # a Ctrl-C at the tandem daemon's terminal is not for it
                )
                out.seek(0)
                output = out.read(4096).decode("utf-8", errors="replace").strip()
        except subprocess.TimeoutExpired:
            return self._fail(f"{self.binary} -d did not return within {self.start_timeout:g} s")
        except OSError as e:
            return self._fail(f"cannot run {self.binary}: {e}")
        if result.returncode != 0:
            detail = f": {output}" if output else ""
            return self._fail(f"{self.binary} -d exited with {result.returncode}{detail}")
        while not self.alive():
            if time.monotonic() >= deadline:
                detail = f" ({output})" if output else ""
                return self._fail(
                    f"the MPS control socket {self.dirs.control} did not appear within "
                    f"{self.start_timeout:g} s{detail}; see {self.dirs.log / 'control.log'}"
                )
            time.sleep(_POLL_S)
        self.running = True
        log.info("MPS daemon started for %s (pipe %s)", self.gpu_uuid, self.dirs.pipe)
        return True

    def stop(self, timeout: float = 10.0) -> None:
        """Ask the daemon to quit and wait (bounded) for its socket to go. Never raises."""
        self.running = False
        if self.binary is None or not self.alive():
            return  # never started, or already gone: nothing to tell
        deadline = time.monotonic() + timeout
        try:
            subprocess.run(
                [self.binary],
                input=b"quit\n",
                env=daemon_env(os.environ, self.gpu_uuid, self.dirs),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=timeout,
            )
        except (OSError, subprocess.SubprocessError) as e:
            log.warning("could not stop the MPS daemon for %s: %s", self.gpu_uuid, e)
            return
        # "quit" lets the daemon finish on its own; a new start must not find the old socket.
        while self.alive() and time.monotonic() < deadline:
            time.sleep(_POLL_S)
        if self.alive():
            log.warning("the MPS daemon for %s has not quit after %g s", self.gpu_uuid, timeout)


class MpsManager:
    """The MPS daemons of all GPUs of one tandem daemon: started on first need, stopped when idle.

    A GPU whose daemon failed to start is not tried again (each try could cost the start
    timeout on every placement); its jobs share it plainly. Thread-safe.
    """

    def __init__(self, runtime_dir: Path, binary: str | None = None, enabled: bool = True):
        self.runtime_dir = Path(runtime_dir)
        self.binary = binary if binary is not None else shutil.which(BINARY)
        self.enabled = enabled
        self.why_not: str | None = None if enabled else "MPS is turned off"
        self.servers: dict[str, MpsServer] = {}
        self._failed: set[str] = set()
        self._warned = False
        self._lock = threading.Lock()

    def ensure(self, gpu_uuid: str) -> MpsServer | None:
        """The running MPS server of this GPU, started now if need be; None to share it plainly."""
        if not self.enabled:
            return None
        with self._lock:
            if gpu_uuid in self._failed:
                return None
            server = self.servers.get(gpu_uuid)
            if server is None:
                server = self.servers[gpu_uuid] = MpsServer(gpu_uuid, self.runtime_dir, self.binary)
            if server.start():
                return server
            self._failed.add(gpu_uuid)
            if self.why_not is None:
                self.why_not = server.why_not
            if not self._warned:
                self._warned = True
                log.warning("MPS not used, GPUs are shared without it: %s", server.why_not)
            else:
                log.info("MPS not used on %s: %s", gpu_uuid, server.why_not)
            return None

    def release_idle(self, busy_uuids: set[str]) -> None:
        """Stop the daemons of GPUs that no collocated job uses any more."""
        with self._lock:
            for uuid, server in self.servers.items():
                if uuid not in busy_uuids and server.running:
                    server.stop()

    def stop_all(self) -> None:
        """Stop every daemon this manager started (at the tandem daemon's exit)."""
        with self._lock:
            for server in self.servers.values():
                if server.running:
                    server.stop()
