"""Where producers are found on this host: socket and lock files in the private runtime directory.

Layout: ``<runtime dir>/<name>.sock`` (the producer's listening socket) and
``<runtime dir>/<name>.lock`` (holds the producer's pid; the producer keeps an exclusive
``flock`` on it for its whole life). The kernel drops the flock when the producer dies,
SIGKILL included, so "is the lock free?" is an exact liveness test. A producer sweeps
the files of dead producers when it starts, and ``tandem share ls`` ignores them.

The runtime directory (private to this user, see :mod:`tandem._ipc`) is shared with
tandem's other local endpoints; the share files are the ``*.sock``/``*.lock`` pairs in it.
"""

from __future__ import annotations

import fcntl
import os
import re
from dataclasses import dataclass
from pathlib import Path

from tandem import _ipc
from tandem.share.errors import ProducerExists, ShareError

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def validate_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(
            f"invalid producer name {name!r}: use 1-64 characters from letters, digits, "
            "'.', '_' and '-', starting with a letter or digit"
        )
    return name


def runtime_dir() -> Path:
    try:
        return _ipc.runtime_dir()
    except _ipc.RuntimeDirError as exc:
        raise ShareError(str(exc)) from None


def socket_path(name: str) -> Path:
    try:
        return _ipc.socket_file(f"{validate_name(name)}.sock")
    except _ipc.RuntimeDirError as exc:
        raise ShareError(str(exc)) from None


def lock_path(name: str) -> Path:
    return runtime_dir() / f"{validate_name(name)}.lock"


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip() or "0") or None
    except (OSError, ValueError):
        return None


class Registration:
    """The producer's claim on a name: an flock held for the producer's lifetime."""

    def __init__(self, name: str, public: str | None = None):
        self.name = validate_name(name)
        self.lock_path = lock_path(name)
        # A public share listens where other users reach it (its lock stays here: its liveness).
        self.socket_path = socket_path(name) if public is None else Path(public)
        self._fd: int | None = None

    def acquire(self) -> None:
        sweep_stale()
        while True:
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                pid = _read_pid(self.lock_path)
                raise ProducerExists(
                    f"a producer named {self.name!r} is already serving on this host"
                    + (f" (pid {pid})" if pid else "")
                    + "; stop it or choose another name"
                ) from None
            # A sweeper may have unlinked the file between our open and our lock: only
            # the lock on the inode that the path names now counts.
            try:
                same = os.fstat(fd).st_ino == os.stat(self.lock_path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        try:
            self.socket_path.unlink()  # a dead producer's socket of the same name
        except FileNotFoundError:
            pass

    def release(self) -> None:
        if self._fd is None:
            return
        for path in (self.socket_path, self.lock_path):
            try:
                path.unlink()
            except FileNotFoundError:
                pass
        os.close(self._fd)
        self._fd = None


def _is_live(lock: Path) -> bool:
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops a lock we may have taken
    return False


def sweep_stale() -> list[str]:
    """Remove the socket and lock files of producers that died without cleaning up."""
    swept = []
    directory = runtime_dir()
    for lock in directory.glob("*.lock"):
        fd = None
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except (BlockingIOError, FileNotFoundError):
            if fd is not None:
                os.close(fd)
            continue
        try:
            if os.fstat(fd).st_ino != os.stat(lock).st_ino:
                continue
            name = lock.stem
            (directory / f"{name}.sock").unlink(missing_ok=True)
            lock.unlink(missing_ok=True)
            swept.append(name)
        except FileNotFoundError:
            pass
        finally:
            os.close(fd)
    for sock in directory.glob("*.sock"):  # a socket without any lock file is an orphan
        if not (directory / f"{sock.stem}.lock").exists():
            sock.unlink(missing_ok=True)
            swept.append(sock.stem)
    return swept


@dataclass(frozen=True)
class ProducerEntry:
    name: str
    pid: int | None
    socket_path: Path


def live_producers() -> list[ProducerEntry]:
    """Producers that are alive on this host now, by name."""
    directory = runtime_dir()
    found = []
    for lock in sorted(directory.glob("*.lock")):
        if _is_live(lock):
            found.append(ProducerEntry(lock.stem, _read_pid(lock), directory / f"{lock.stem}.sock"))
    return found
