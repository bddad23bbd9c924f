"""A private runtime directory where the shared default, ``/tmp/tandem-<uid>``, cannot be
this user's (another user made it first, or planted a link there): a fresh ``mkdtemp``
directory (0700, a name no one can guess ahead), which every process of this user finds
again through a link in their own cache directory, as PulseAudio does.

The link, ``$XDG_CACHE_HOME/tandem/runtime-<host>`` (else ``~/.cache/...``), names the host:
a home shared between machines keeps one per machine, as ``/tmp`` is. It is read and made
under an exclusive lock of that private directory, so processes starting at once agree on one
directory; one that is gone (``/tmp`` cleaned, a reboot) is replaced by a new one. Making
one is said once, on stderr.
"""

from __future__ import annotations

import fcntl
import os
import socket
import stat
import sys
import tempfile
from pathlib import Path


def _pointer() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "tandem" / f"runtime-{socket.gethostname()}"


def _usable(path: Path) -> bool:
    """A real directory of this user's that no one else may enter."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o077


def fallback_runtime_dir(shared: Path, refused: str) -> Path:
    """This user's own runtime directory in place of ``shared`` (refused: ``refused`` says
    why); ``OSError`` saying why where none can be made either."""
    pointer = _pointer()
    pointer.parent.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(pointer.parent, 0o700)
    except FileExistsError:
        pass
    if not _usable(pointer.parent):  # the link must be of no one else's making
        raise OSError(f"{pointer.parent} is not a private directory of yours")
    lock = os.open(pointer.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            kept = Path(os.readlink(pointer))
        except OSError:
            kept = None
        if kept is not None and kept.name.startswith(f"{shared.name}-") and _usable(kept):
            return kept
        made = Path(tempfile.mkdtemp(prefix=f"{shared.name}-", dir=shared.parent))
        link = pointer.with_name(f".{pointer.name}.{os.getpid()}")
        try:
            os.unlink(link)
        except FileNotFoundError:
            pass
        os.symlink(made, link)
        os.replace(link, pointer)
        print(
            f"tandem: {refused}; using the private runtime directory {made} instead "
            f"(found again through {pointer})",
            file=sys.stderr,
            flush=True,
        )
        return made
    finally:
        os.close(lock)  # the lock goes with it
