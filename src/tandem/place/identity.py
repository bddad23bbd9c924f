"""Which database the state is, and whether it is still the one its daemon serves.

A state database gets a random id when the daemon makes it (``meta.id``). The daemon writes
that id, and the file's identity on disk (device and inode), in ``daemon.json``; each
attempt's spec records it (:class:`~tandem.place.run.supervisor.files.AttemptSpec`: which database a
folder's attempt is of), and each attempt's folder has a name no other attempt has
(:func:`attempt_folder`). A reader compares them: a database that was removed under its
daemon, replaced by another file, or lost while no daemon ran (the jobs' folders are there,
their records are not) is said, never read as if it were the state, and never made anew by
a reader (only the daemon makes one, under its lock, setting the old jobs' folders aside).

The daemon checks, before each batch of requests and each tick, that ``place.db`` is still
the file it writes: removed or replaced under it, it keeps a copy of its records
(``place.db.saved-*``) and stops, saying so (:class:`StateMoved`), rather than write on into
a file no one reads; its running jobs go on. While that copy is there and no database is, no
daemon starts an empty queue (:func:`check_may_start`, which also refuses a read-only state
directory): ``tandem daemon restore`` puts it back (:func:`restore_saved`).

A daemon is alive when its pid still runs as the process that started then (its start time
in clock ticks, :func:`~tandem.place.run.supervisor.proctrack.create_time`) and belongs to this user:
never by a command line, which any user's process may show.
"""

from __future__ import annotations

import os
import secrets
import sqlite3
import time
from pathlib import Path

import psutil

from tandem.dirs import private_file
from tandem.place.paths import StateError, StateReadOnly, read_only
from tandem.place.run.supervisor.files import DaemonFile
from tandem.place.run.supervisor.proctrack import same_process

DB_FILE = "place.db"
SAVED_GLOB = "place.db.saved-*"  # a daemon's copy of a database removed under it


class StateMoved(RuntimeError):
    """The state database was removed or replaced under the daemon, which stopped (what
    happened, where its records were kept, and what to do)."""


class StateLost(StateError):
    """The state database was removed or replaced under its daemon, or lost: nothing is read
    as the state, and nothing is made in its place (what happened and what to do)."""


def new_db_id() -> str:
    """A database's id, made once when the daemon creates it."""
    return secrets.token_hex(8)


def attempt_folder(n: int) -> str:
    """A name for attempt ``n``'s folder that no other attempt has had, of this database or
    a lost one (whose job ids were the same): a lost database's supervisor, still running,
    never writes into a new job's folder, nor is its result read as a new job's."""
    return f"{n}.{secrets.token_hex(6)}"


def moved(path: Path, opened: str | None) -> str | None:
    """What happened to the database file ``path`` a writer opened as ``opened``
    (:func:`file_id`), if it is no longer there: writing on would write into no file anyone
    reads."""
    now = file_id(path)
    if now == opened:
        return None
    return "removed" if now is None else "replaced by another file"


def file_id(path: Path) -> str | None:
    """``device:inode`` of ``path`` (None: there is no such file). A file removed and made
    again, or replaced by a rename, has another."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return f"{st.st_dev}:{st.st_ino}"


def own_process(pid: int | None, ctime: float | None) -> bool:
    """Is ``pid`` the process that started at ``ctime``, alive, and this user's?"""
    if not same_process(pid, ctime):
        return False
    try:
        return psutil.Process(pid).uids().real == os.getuid()
    except psutil.Error:
        return False


def serving_daemon(directory: Path) -> DaemonFile | None:
    """The record of the daemon serving ``directory`` (``daemon.json``: pid, start time, the
    database's id and file), if that daemon's process is alive; None if none is. The one
    read-only answer to "does a daemon serve here" (:func:`tandem.place.client.is_running`
    asks it instead, over its socket)."""
    info = DaemonFile.read(directory)
    if info is None or not own_process(info.pid, info.ctime):
        return None
    return info


def _job_folders(directory: Path) -> int:
    try:
        return sum(1 for d in (directory / "jobs").iterdir() if d.is_dir())
    except OSError:
        return 0


def _saved_hint(directory: Path) -> str:
    saved = sorted(directory.glob(SAVED_GLOB))
    if not saved:
        return ""
    return (
        f" The daemon kept its records in {saved[-1]}: `tandem daemon restore` puts them back "
        "(no daemon starts until then); to start an empty queue instead (the jobs' folders set "
        "aside, jobs.lost-*), move that copy out of the state directory."
    )


def restorable(directory: Path) -> Path | None:
    """The newest copy a daemon kept of a database removed under it (``place.db.saved-*``),
    while no database is there; None otherwise."""
    if (directory / DB_FILE).exists():
        return None
    saved = sorted(directory.glob(SAVED_GLOB))
    return saved[-1] if saved else None


def check_may_start(directory: Path) -> None:
    """Before a daemon starts in ``directory`` (``tandem daemon start``, a submit that finds
    none, the daemon's own opening of the state): :class:`StateReadOnly` where nothing can be
    written there; :class:`StateLost` where a database removed under its daemon has a copy
    not put back: a new, empty queue would hide its queued and running jobs."""
    said = read_only(directory)
    if said is not None:
        raise StateReadOnly(said)
    saved = restorable(directory)
    if saved is not None:
        raise StateLost(
            f"the state database {directory / DB_FILE} was removed under its daemon, which kept its "
            f"records in {saved}: run `tandem daemon restore` to put them back and go on with its jobs "
            "(no daemon starts an empty queue while that copy is there)"
        )


def opening_new(directory: Path) -> bool:
    """The writer, before it opens the state: refused where no daemon may start
    (:func:`check_may_start`); else whether it makes a new database."""
    check_may_start(directory)
    return not (directory / DB_FILE).exists()


def restore_saved(directory: Path) -> str:
    """``tandem daemon restore``: the newest kept copy (``place.db.saved-*``) made the state
    database again, while no daemon runs (under its lock) and none is there; what was done."""
    from filelock import FileLock, Timeout

    if (said := read_only(directory)) is not None:
        raise StateReadOnly(said)
    lock = FileLock(str(directory / "daemon.lock"), mode=0o600)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise StateError(f"a daemon serves {directory}: nothing to restore while it runs") from None
    try:
        saved = restorable(directory)
        if saved is None:
            there = (directory / DB_FILE).exists()
            raise StateError(
                f"nothing to restore in {directory}: "
                + (f"{directory / DB_FILE} is there" if there else f"no {SAVED_GLOB} copy is there")
            )
        for suffix in ("-wal", "-shm"):  # the removed file's log: never read as its copy's
            if (directory / f"{DB_FILE}{suffix}").exists():
                os.rename(directory / f"{DB_FILE}{suffix}", saved.with_name(f"{saved.name}.old{suffix}"))
        os.chmod(saved, 0o600)
        os.rename(saved, directory / DB_FILE)
    finally:
        lock.release()
    return (
        f"restored {directory / DB_FILE} from {saved}: the next daemon (`tandem daemon start`, or a "
        "submit) goes on with its jobs"
    )


def missing(directory: Path, daemon: DaemonFile | None) -> str | None:
    """Why a missing database is not simply a new state directory (said to a reader), or
    None: none was made yet and no job's folder is there."""
    path = directory / DB_FILE
    if daemon is not None:
        return (
            f"the state database {path} was removed while the daemon (pid {daemon.pid}) serves "
            f"{directory}: its jobs' records are not there, and none is made in its place. The daemon "
            "stops when it sees it (its running jobs go on), keeping a copy of its records; then "
            "`tandem daemon restore`." + _saved_hint(directory)
        )
    folders = _job_folders(directory)
    if not folders:
        return None
    return (
        f"the state database {path} is missing, but {directory / 'jobs'} holds {folders} jobs' "
        "folders: it was lost (deleted, or never written out)."
        + (
            _saved_hint(directory)
            or " `tandem daemon start` sets those folders aside (jobs.lost-*) and starts an empty queue."
        )
    )


def replaced(path: Path, db_id: str | None, daemon: DaemonFile | None) -> str | None:
    """Why the database at ``path`` (its id ``db_id``) is not the one its live daemon
    serves, or None (no daemon runs, or it is that one)."""
    if daemon is None or not daemon.db_file:
        return None
    if file_id(path) == daemon.db_file and (db_id == daemon.db_id or not daemon.db_id):
        return None
    return (
        f"the state database {path} was replaced while the daemon (pid {daemon.pid}) serves it: "
        "the daemon writes another file, and what this one holds is not its jobs' state. "
        "Restart the daemon (`tandem daemon stop; tandem daemon start`) to serve this file."
    )


def keep_records(db: sqlite3.Connection, path: Path, how: str) -> str:
    """The daemon's database ``path`` was removed or replaced (``how``) under it: a copy of
    its records, from the connection it still has open, beside it (``place.db.saved-*``);
    what happened and what to do, to be said."""
    saved = path.with_name(f"{path.name}.saved-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        private_file(saved)  # 0600: it holds every job's environment
        copy = sqlite3.connect(saved)
        try:
            db.backup(copy)  # the file it had open is still read through the connection
        finally:
            copy.close()
        kept = f"its records are kept in {saved}: " + (
            "`tandem daemon restore` puts them back (no daemon starts until then)"
            if how == "removed"
            else "to go on with them rather than the file now there, move that file away, then "
            "`tandem daemon restore`"
        )
    except (OSError, sqlite3.Error) as exc:
        saved.unlink(missing_ok=True)
        kept = f"its records could not be kept ({exc})" + (
            ": the next daemon sets the jobs' folders aside (jobs.lost-*) and starts an empty queue"
            if how == "removed"
            else ""
        )
    return (
        f"the state database {path} was {how} while the daemon served it: the daemon stopped "
        f"(its running jobs go on); {kept}"
    )
