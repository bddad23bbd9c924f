"""Whether a share is served on this host, and by which process, and the spec a drop-in
loader writes for the producer it starts: what tandem's other packages (the CLI's ``tandem
share auto``) read of share's registry and auto-serving, whose modules are internal."""

from __future__ import annotations

from tandem.share._autoserve import AutoSpec
from tandem.share._registry import _is_live, _read_pid, lock_path

__all__ = ["AutoSpec", "served", "server_pid"]


def served(name: str) -> bool:
    """Does a producer serve share ``name`` on this host now (this user's runtime directory)?"""
    return _is_live(lock_path(name))


def server_pid(name: str) -> int | None:
    """The process id share ``name``'s lock names (its producer's), or None without one."""
    return _read_pid(lock_path(name))
