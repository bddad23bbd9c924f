"""Local IPC plumbing shared by tandem's processes: the private runtime directory and framed
Unix sockets.

Every tandem endpoint on a host (a ``tandem.share`` producer today, the job manager's daemon
next) is a ``SOCK_SEQPACKET`` Unix socket in one private directory: ``$TANDEM_RUNTIME_DIR``,
else ``$XDG_RUNTIME_DIR/tandem``, else ``/tmp/tandem-<uid>``. The directory is created with
mode 0700 and refused if another user owns it or could replace it (a folder on the way to it
another user's, or writable by others and not sticky), so only the same user can reach an
endpoint; nothing listens on a network interface.

Seqpacket keeps message boundaries (one ``send_packet`` is one ``recv_packet``), carries file
descriptors (``SCM_RIGHTS``) and shows each side the other's death at once as end-of-file, so
no heartbeats are needed. What the packets mean is each subsystem's protocol, not this
module's (see :mod:`tandem.share.protocol`).

Sockets stay in blocking mode and every call first tries without waiting (``MSG_DONTWAIT``):
a packet that is already there costs one system call. Python's own socket timeouts would
``poll()`` before every send and receive, and ``settimeout()`` costs two ``fcntl()`` calls;
on a busy or virtualised host each is tens of microseconds on the hand-off path.
"""

from __future__ import annotations

import array
import os
import select
import socket
import stat
import struct
from pathlib import Path

MAX_PACKET = 1 << 16  # control messages are small; a producer's statistics are the largest
MAX_FDS = 4
SUN_PATH_MAX = 107  # sockaddr_un.sun_path is 108 bytes including the terminating NUL
_FDS_SPACE = socket.CMSG_SPACE(MAX_FDS * array.array("i").itemsize)


class RuntimeDirError(OSError):
    """The runtime directory or a socket path in it cannot be used safely."""


def runtime_dir() -> Path:
    """The private (0700) directory of this user's tandem sockets, created if needed. Where
    the shared default ``/tmp/tandem-<uid>`` cannot be this user's (another user made it
    first, or a link), a private one of its own is used instead (:mod:`tandem._runtime`)."""
    explicit = os.environ.get("TANDEM_RUNTIME_DIR")
    if explicit:
        return private_dir(Path(explicit), "runtime directory", "TANDEM_RUNTIME_DIR")
    if os.environ.get("XDG_RUNTIME_DIR"):
        path = Path(os.environ["XDG_RUNTIME_DIR"]) / "tandem"
        return private_dir(path, "runtime directory", "TANDEM_RUNTIME_DIR")
    shared = Path("/tmp") / f"tandem-{os.getuid()}"
    try:
        return private_dir(shared, "runtime directory", "TANDEM_RUNTIME_DIR")
    except RuntimeDirError as refused:
        from tandem._runtime import fallback_runtime_dir

        try:
            return fallback_runtime_dir(shared, str(refused))
        except OSError as exc:
            raise RuntimeDirError(f"{refused}; and no private one can be made in its place ({exc})") from None


def private_dir(path: Path, what: str, setting: str, error: type[Exception] = RuntimeDirError) -> Path:
    """``path``, private to this user: created here with mode 0700, or, if it exists, a real
    directory (not a symbolic link) of this user's that no one else may enter. What is in it
    (sockets, job environments) is this user's alone. An existing directory is never
    changed: one that is shared (``/tmp``, mode 1777), another user's, or a link (which
    another user could have planted in a shared directory) is refused with ``error``; so is
    one that another user could replace, through a folder above it (:func:`_trusted_way`).
    ``what`` and ``setting`` (the variable that moves it) name it in the message."""
    fix = f"set {setting} to a directory of your own"
    path = Path(os.path.abspath(path))
    _trusted_way(path, what, fix, error)  # before anything is made there
    try:
        _make_parents(path)
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:  # a parent this user may not write in (or a file where a folder is)
        raise error(f"cannot create {what} {path} ({exc.strerror}: {exc.filename}); {fix}") from None
    _trusted_way(path, what, fix, error)  # and the folders made just now (one of another's in between)
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        raise error(
            f"{what} {path} is a symbolic link; tandem uses no link there (another user could "
            f"have made it): {fix}"
        )
    if not stat.S_ISDIR(info.st_mode):
        raise error(f"{what} {path} is not a directory; {fix}")
    if info.st_uid != os.getuid():
        raise error(f"{what} {path} belongs to uid {info.st_uid}, not to you (uid {os.getuid()}); {fix}")
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077:
        # A directory others write in (/tmp, mode 1777) is theirs too: never "chmod" it.
        shared = mode & (stat.S_ISVTX | stat.S_IWOTH | stat.S_IWGRP)
        also = "" if shared else f", or make this one yours alone (chmod 700 {path})"
        raise error(
            f"{what} {path} is open to other users (mode {mode:04o}); tandem keeps "
            f"sockets and job environments there, so it must be private: {fix}{also}"
        )
    return path


_MAX_LINKS = 40  # symbolic links followed on the way, as the kernel's limit


def _make_parents(path: Path) -> None:
    """The missing folders above ``path``, made 0755 less the umask: never writable by others
    (a umask of 002 would make them so), as the way to a private directory must not be."""
    missing = []
    folder = path.parent
    while not os.path.lexists(folder):
        missing.append(folder)
        folder = folder.parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, 0o755)
        except FileExistsError:
            pass


def _trusted_way(path: Path, what: str, fix: str, error: type[Exception]) -> None:
    """Refuse (``error``, naming the folder) a way to ``path`` through a folder that another
    user could change: every existing folder above it, from ``/`` down, with each symbolic
    link on the way followed, must be this user's or root's, and no one else may write in it
    (a group of this user's alone aside) unless it is sticky, as ``/tmp`` is: there only an
    entry's owner may move it, and each entry on the way is checked as its own folder (this
    user's or root's). A link on the way must be this user's or root's too. Where the way
    stops (a folder not made yet, or one this user may not enter) the rest is made by this
    user, or refused by the system."""
    parts = list(path.parts[1:-1])  # the folders above it; the last part is checked by the caller
    here, links = Path("/"), 0
    _trusted_dir(here, os.lstat(here), what, path, fix, error)
    while parts:
        name = parts.pop(0)
        if name in ("", "."):
            continue
        if name == "..":
            here = here.parent
            continue
        step = here / name
        try:
            info = os.lstat(step)
        except OSError:  # missing (made by this user next), or not to be entered (refused then)
            return
        if stat.S_ISLNK(info.st_mode):
            if info.st_uid not in (os.getuid(), 0):
                raise error(
                    f"{what} {path}: {step} on the way is a symbolic link of {_who(info.st_uid)}, who "
                    f"could point it anywhere; {fix}"
                )
            links += 1
            if links > _MAX_LINKS:
                raise error(f"{what} {path}: too many symbolic links on the way (at {step}); {fix}")
            target = Path(os.readlink(step))
            if target.is_absolute():
                here = Path("/")
            parts = [*target.parts[1 if target.is_absolute() else 0 :], *parts]
            continue
        if not stat.S_ISDIR(info.st_mode):
            raise error(f"{what} {path}: {step} on the way is not a directory; {fix}")
        _trusted_dir(step, info, what, path, fix, error)
        here = step


def _trusted_dir(
    folder: Path, info: os.stat_result, what: str, path: Path, fix: str, error: type[Exception]
) -> None:
    """Refuse ``folder`` on the way to ``path`` if another user could change what is in it."""
    me = os.getuid()
    if info.st_uid not in (me, 0):
        raise error(
            f"{what} {path}: {folder} on the way belongs to {_who(info.st_uid)}, not to you or root, "
            f"who could replace what is in it; {fix}"
        )
    mode = stat.S_IMODE(info.st_mode)
    if mode & stat.S_ISVTX or not mode & (stat.S_IWGRP | stat.S_IWOTH):
        return
    if not mode & stat.S_IWOTH and info.st_uid == me and _own_group(info.st_gid):
        return  # writable by a group of this user's alone (a umask of 002 with user groups)
    others = "other users" if mode & stat.S_IWOTH else "its group"
    raise error(
        f"{what} {path}: {folder} on the way is writable by {others} (mode {mode:04o}) and not "
        f"sticky as /tmp is, so they could replace what is in it; {fix}"
    )


def _own_group(gid: int) -> bool:
    """Is ``gid`` this user's own group (named after it, its primary group, no other member)?"""
    import grp
    import pwd

    try:
        me, group = pwd.getpwuid(os.getuid()), grp.getgrgid(gid)
    except KeyError:
        return False
    return gid == me.pw_gid and group.gr_name == me.pw_name and set(group.gr_mem) <= {me.pw_name}


def _who(uid: int) -> str:
    import pwd

    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def socket_file(filename: str, subdir: str | None = None) -> Path:
    """``runtime_dir() / [subdir /] filename``, refused if too long for a Unix socket address.

    The top level belongs to ``tandem.share`` (its sweeper removes sockets there that have no
    lock file); every other subsystem keeps its sockets in a ``subdir`` of its own."""
    directory = runtime_dir()
    if subdir is not None:
        directory = directory / subdir
        directory.mkdir(mode=0o700, exist_ok=True)
    path = directory / filename
    if len(os.fsencode(path)) > SUN_PATH_MAX:
        raise RuntimeDirError(
            f"socket path {path} is longer than {SUN_PATH_MAX} bytes, the limit of Unix "
            "sockets; set TANDEM_RUNTIME_DIR to a shorter directory"
        )
    return path


def new_socket() -> socket.socket:
    return socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)


def listen(path: Path, backlog: int = 64) -> socket.socket:
    """A non-blocking listening socket at ``path``, readable and writable by this user only."""
    sock = new_socket()
    old_umask = os.umask(0o177)
    try:
        sock.bind(str(path))
    except BaseException:
        sock.close()
        raise
    finally:
        os.umask(old_umask)
    sock.listen(backlog)
    sock.setblocking(False)
    return sock


def _wait(sock: socket.socket, events: int, timeout: float | None) -> None:
    poller = select.poll()
    poller.register(sock, events | select.POLLERR | select.POLLHUP)
    if not poller.poll(None if timeout is None else max(0, int(timeout * 1000))):
        raise TimeoutError(f"no progress on the socket within {timeout:g} s")


def send_packet(
    sock: socket.socket, data: bytes, fds: tuple[int, ...] = (), timeout: float | None = 2.0
) -> None:
    """Send ``data`` (and optionally file descriptors) as one packet."""
    if len(data) > MAX_PACKET:
        raise ValueError(f"packet of {len(data)} bytes exceeds {MAX_PACKET}")
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    while True:
        try:
            sock.sendmsg([data], ancillary, socket.MSG_DONTWAIT)
            return
        except BlockingIOError:
            _wait(sock, select.POLLOUT, timeout)


def recv_packet(sock: socket.socket, timeout: float | None = None) -> tuple[bytes, list[int]]:
    """Receive one packet and the file descriptors it carries (close-on-exec).

    A closed or reset connection raises ``EOFError``; nothing within ``timeout`` seconds
    raises ``TimeoutError``.
    """
    reset: ConnectionResetError | None = None
    while True:
        try:
            # recvmsg itself: socket.recv_fds ignores its flags argument on Python < 3.12
            data, ancillary, _flags, _addr = sock.recvmsg(
                MAX_PACKET, _FDS_SPACE, socket.MSG_DONTWAIT | socket.MSG_CMSG_CLOEXEC
            )
            break
        except BlockingIOError:
            _wait(sock, select.POLLIN, timeout)
        except ConnectionResetError as exc:
            # Linux reports a peer that closed with our packets unread (ECONNRESET, once)
            # before the packets it had sent us: read on for those (a producer's End, say).
            if reset is not None:
                raise EOFError("connection reset by peer") from exc
            reset = exc
    if reset is not None and not data:
        raise EOFError("connection reset by peer") from reset
    fds: list[int] = []
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            received = array.array("i")
            received.frombytes(payload[: len(payload) - len(payload) % received.itemsize])
            fds += received
    if not data:
        close_fds(fds)
        raise EOFError("peer closed the connection")
    return data, fds


def peer_uid(sock: socket.socket) -> int:
    """The user at the other end of a connected Unix socket, as the kernel says (``SO_PEERCRED``)."""
    size = struct.calcsize("3i")
    return int(struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, size))[1])


def peer_credentials(sock: socket.socket) -> tuple[int, int, int, tuple[int, ...]]:
    """Who is at the other end of a connected Unix socket, as the kernel says (``SO_PEERCRED``,
    taken when it connected): ``(pid, uid, gid, supplementary groups)``, the groups read from
    ``/proc/<pid>/status`` (empty where it is gone or hidden)."""
    size = struct.calcsize("3i")
    pid, uid, gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, size))
    groups: tuple[int, ...] = ()
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("Groups:"):
                    groups = tuple(int(g) for g in line.split()[1:])
                    break
    except (OSError, ValueError):
        pass
    return pid, uid, gid, groups


def close_fds(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
