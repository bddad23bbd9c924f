"""A system manager (root) at work in a user's own folder: as that user, and in folders of its own.

A system manager's users' MLflow runs are in their folders (``tandem.dirs.system_users_dir()/
<uid>/``), which they may change as they like: a link put where root writes would make root
write anywhere. So root's reads and writes there are made with the user's file-system identity
(:func:`acting_as`: Linux's ``setfsuid``/``setfsgid``, which hold for the calling thread only),
and may do there only what the user may; what root must hand them (a job's spool of points, its
log) goes into a folder of root's beside it (:func:`user_folders`), as a file they own.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import shutil
import sqlite3
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil

from tandem.place.run.supervisor.files import NEW_FILE, open_plain

Owner = tuple[int, int]  # (uid, gid): a system manager's user, as their jobs run
AS_ROOT: Owner = (0, 0)  # back to root's own, within a block as a user

_libc = ctypes.CDLL(None, use_errno=True)
# setgroups(2) as a system call: the kernel sets one thread's groups (glibc's setgroups would
# set every thread's). Root's groups are left out while acting as a user: their files only.
_SYS_SETGROUPS = {"x86_64": 116, "aarch64": 159}.get(platform.machine())


def _set_groups(groups: list[int]) -> bool:
    if _SYS_SETGROUPS is None:
        return False
    array = (ctypes.c_uint * max(1, len(groups)))(*groups)
    return _libc.syscall(_SYS_SETGROUPS, ctypes.c_size_t(len(groups)), array) == 0


@contextlib.contextmanager
def acting_as(owner: Owner | None) -> Iterator[None]:
    """The block's file operations in this thread checked as ``owner``'s, with their group
    and none of root's supplementary ones (None: as this process's own). PermissionError
    where the identity cannot be taken (not root, or a machine whose call is not known here)."""
    if owner is None:
        yield
        return
    uid, gid = owner
    groups = os.getgroups()
    if not _set_groups([]):
        raise PermissionError(f"cannot act as user {uid}: this thread's groups cannot be set here")
    # Each call returns the identity before it; one that fails changes nothing (and returns it).
    old_gid = _libc.setfsgid(gid)
    old_uid = _libc.setfsuid(uid)
    try:
        if _libc.setfsuid(uid) != uid or _libc.setfsgid(gid) != gid:
            raise PermissionError(f"cannot act as user {uid} (group {gid}): not root")
        yield
    finally:
        _libc.setfsuid(old_uid)
        _libc.setfsgid(old_gid)
        _set_groups(groups)


MAX_VALUE = 1 << 20  # the longest string, blob or row root's read of a user's store takes


@contextlib.contextmanager
def read_store(db: Path, owner: Owner | None, limit_s: float) -> Iterator[sqlite3.Connection]:
    """A read-only connection to the SQLite file ``db`` (an MLflow store), its statements
    stopped past ``limit_s`` seconds in all. ``owner``: a user's store, theirs to change: the
    file opened as them, a plain file of theirs only (never a link or a pipe), and given to
    SQLite by a name of root's (:func:`_root_name`: SQLite opens a file by its name again,
    and resolves ``/proc/self/fd/N`` back to theirs); read as it is (``immutable``: no other
    file of theirs opened; a write of theirs meanwhile may make it fail); its schema untrusted
    (``trusted_schema`` off: a view or trigger of theirs calls no function with side effects)
    and no value over ``MAX_VALUE`` bytes. OSError where it cannot be opened so."""
    name = None
    if owner is not None:
        with acting_as(owner):
            fd = open_plain(db, os.O_RDONLY, owner[0])
        try:
            name = _root_name(fd, db.parent.parent)
        finally:
            os.close(fd)
        uri = f"{name.as_uri()}?mode=ro&immutable=1"
    else:
        uri = f"{db.resolve().as_uri()}?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=0.2)
        try:
            if owner is not None:
                conn.execute("PRAGMA trusted_schema = OFF")
                if conn.execute("PRAGMA trusted_schema").fetchone() != (0,):  # SQLite before 3.31
                    raise OSError(f"{db}: this SQLite cannot read a store of another user's safely")
                if hasattr(conn, "setlimit"):  # Python 3.11+
                    conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE)
            deadline = time.monotonic() + limit_s
            conn.set_progress_handler(lambda: int(time.monotonic() > deadline), 10_000)  # nonzero: stop it
            yield conn
        finally:
            conn.close()
    finally:
        if name is not None:
            name.unlink(missing_ok=True)


_AT_FDCWD, _AT_EMPTY_PATH = -100, 0x1000


def _root_name(fd: int, folder: Path) -> Path:
    """A new name in ``folder`` (root's own, on the same file system) for the file open as
    ``fd``: a hard link made to the descriptor itself (linkat's AT_EMPTY_PATH), so that the
    name is of the very file checked, in a folder no one else may change."""
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
        raise PermissionError(f"{folder}: not a folder of root's alone")
    for left in folder.glob(".read-*.db"):  # a reader that died before removing its name
        with contextlib.suppress(ValueError, OSError):
            if not psutil.pid_exists(int(left.name.split("-")[1])):
                left.unlink()
    name = folder / f".read-{os.getpid()}-{threading.get_ident()}-{time.monotonic_ns()}.db"
    if _libc.linkat(fd, b"", _AT_FDCWD, os.fsencode(name), _AT_EMPTY_PATH) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"cannot name the file read: {os.strerror(err)}", str(name))
    return name


def touch_theirs(path: Path, owner: Owner | None) -> None:
    """``path`` made (or left) as an empty marker, through :func:`~tandem.place.run.supervisor.
    files.open_plain` (of ``owner``'s, where given)."""
    os.close(open_plain(path, os.O_WRONLY | os.O_CREAT, None if owner is None else owner[0]))


def _root_folder(path: Path) -> Path:
    """``path`` made (0711: its users pass through, never list) or found as root's own folder."""
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o711)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0:
        raise PermissionError(f"{path}: not a folder of root's")
    os.chmod(path, 0o711)
    return path


def user_folders(users: Path, owner: Owner) -> tuple[Path, Path]:
    """``(theirs, handed)`` of a system manager's user under ``users``: ``<uid>/mlflow`` (theirs,
    0700: their MLflow store and its helper's queue) and ``<uid>/spool`` (root's, 0711: the
    files root hands them, each theirs). PermissionError where either is not as it must be."""
    uid, gid = owner
    users.parent.mkdir(mode=0o711, parents=True, exist_ok=True)
    top = _root_folder(_root_folder(users) / str(uid))
    handed = _root_folder(top / "spool")
    theirs = top / "mlflow"
    try:
        theirs.mkdir(mode=0o700)
        os.chown(theirs, uid, gid)  # root's folder above: no one else had a way in meanwhile
    except FileExistsError:
        pass
    st = os.lstat(theirs)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid:
        raise PermissionError(f"{theirs}: not a folder of user {uid}'s")
    return theirs, handed


def job_folder_path(users: Path, uid: int, key: str) -> Path:
    """Where :func:`job_folder` makes user ``uid``'s folder of attempt ``key``."""
    return users / str(uid) / "jobs" / key


def job_folder(users: Path, owner: Owner, key: str) -> Path:
    """The folder of one attempt of a system manager's user's job that the job may write
    (``$TANDEM_JOB_DIR``: what it leaves the manager, as a share's selection job its id):
    ``<uid>/jobs/<key>``, theirs (0700), made new in a folder of root's. The manager reads it
    as them (:func:`acting_as`) and removes it once the attempt has ended."""
    uid, gid = owner
    users.parent.mkdir(mode=0o711, parents=True, exist_ok=True)
    folder = job_folder_path(users, uid, key)
    jobs = _root_folder(_root_folder(_root_folder(users) / str(uid)) / folder.parent.name)
    if os.path.lexists(folder):  # a lost database's attempt of the same key: set aside, then gone
        aside = jobs / f".gone-{key}-{os.getpid()}-{time.monotonic_ns()}"
        os.rename(folder, aside)
        remove_theirs(aside, owner)
    folder.mkdir(mode=0o700)
    os.chown(folder, uid, gid)  # made by root in root's folder: no one else had a way in
    return folder


REMOVE_S = 300.0  # what the removal of a user's folder may take (a tree of millions of files)


def remove_theirs(folder: Path, owner: Owner) -> None:
    """Remove ``folder`` (a user's, in a folder of root's) and all it holds, beside the caller:
    its contents by a ``rm -r`` run as them (whatever they put there: links are removed, never
    followed; a tree of any depth or width costs the manager no time, nor stack), then the
    folder itself, as root, once empty."""
    uid, gid = owner

    def remove() -> None:
        try:
            subprocess.run(
                ["rm", "-rf", "--one-file-system", "--", str(folder)],
                user=uid, group=gid, extra_groups=[], env={"PATH": "/usr/bin:/bin"}, cwd="/",
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                timeout=REMOVE_S, check=False,
            )  # fmt: skip
        except (OSError, subprocess.SubprocessError):
            pass
        with contextlib.suppress(OSError):
            os.rmdir(folder)  # theirs could not: it is in root's

    threading.Thread(target=remove, name=f"remove {folder.name}", daemon=True).start()


def hand_over(path: Path, handed: Path, owner: Owner) -> None:
    """``path`` (a file of root's, in a folder of root's) made ``owner``'s to read (0600) as
    ``handed`` (in their folder of root's: :func:`user_folders`), the same file: root goes on
    writing it by its own path, which they cannot reach or change."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.fchown(fd, *owner)
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
    handed.unlink(missing_ok=True)  # a lost database's attempt of the same key
    os.link(path, handed)


def copy_over(path: Path, handed: Path, owner: Owner) -> None:
    """A copy of ``path`` (root's, as it is now) for ``owner`` to read, as ``handed``."""
    handed.unlink(missing_ok=True)
    if not path.is_file():
        return
    with open(path, "rb") as src, os.fdopen(os.open(handed, NEW_FILE, 0o600), "wb") as dst:
        os.fchown(dst.fileno(), *owner)
        shutil.copyfileobj(src, dst)
