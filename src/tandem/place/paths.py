"""Where the job manager's state lives: the state directory of :mod:`tandem.dirs` (its one
way in), with a refusal raised as the manager's :class:`StateError`."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path

from tandem.dirs import StateDirError, state_dir_path
from tandem.dirs import state_dir as _open
from tandem.place.run.supervisor.fence import unreachable
from tandem.place.run.supervisor.files import DaemonFile

__all__ = [
    "StateError", "StateReadOnly", "private_dir", "read_only", "set_aside_lost_jobs",
    "state_dir", "state_dir_path",
]  # fmt: skip

# In the state directory: the daemon's kept configuration; why its Ray cluster does not answer.
CONFIG_FILE = "daemon-config.json"
RAY_TROUBLE = "ray-trouble.txt"


class StateError(StateDirError):
    """The state cannot be used (its directory refused; its file corrupt, locked, newer)."""


class StateReadOnly(StateError):
    """Nothing can be written in the state directory: it is read, but no daemon starts there."""


def state_dir() -> Path:
    """The private directory of the job manager's state, created if needed."""
    return private_dir(state_dir_path())


def private_dir(path: Path) -> Path:
    """``path`` as a private state directory (:func:`tandem.dirs.state_dir`): it holds each
    job's environment (tokens, keys) and the commands the supervisor runs."""
    try:
        return _open(path)
    except StateDirError as exc:
        raise StateError(str(exc)) from None


def read_only(directory: Path) -> str | None:
    """Why nothing can be written in the state directory ``directory`` (a read-only mount,
    or no write permission: root passes the latter), or None. In one sentence, with what to do."""
    try:
        mounted = bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
    except OSError:
        return None
    if not mounted and os.access(directory, os.W_OK):
        return None
    return (
        f"the state directory {directory} is read-only "
        f"({'its filesystem is mounted read-only' if mounted else 'you may not write in it'}): "
        "`tandem ls`, `show`, `logs` and `wait` read it, but no daemon can start or queue a job "
        "there; make it writable (remount it read-write, or `chmod u+w` it), or set "
        "TANDEM_STATE_DIR to another directory"
    )


def connect_read_only(path: Path, timeout: float) -> sqlite3.Connection:
    """A read-only connection to the state database ``path`` (``mode=ro``: it never makes
    the file). Where its directory cannot be written (a read-only mount), SQLite cannot make
    the write-ahead log's index (``-shm``): the file is then read as it is (``immutable``:
    nothing can change it there), unless a log beside it holds changes it would miss."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=timeout)
    try:
        db.execute("PRAGMA schema_version").fetchone()  # opens the file and its log
        return db
    except sqlite3.Error as exc:
        db.close()
        said = read_only(path.parent) if "unable to open" in str(exc) else None
        wal = path.with_name(f"{path.name}-wal")
        if said is None:
            raise
        if wal.exists() and wal.stat().st_size:
            raise StateReadOnly(
                f"{said}; and the last changes of {path} are in {wal}, which SQLite reads only "
                f"with its index ({path.name}-shm), not there: make it writable to read them"
            ) from None
    return sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True, timeout=timeout)


def unreadable(path: Path, exc: sqlite3.Error) -> StateError:
    """The error of a state database ``path`` SQLite would not open or read (``exc``), with
    what to do: only a file SQLite finds damaged is said to be corrupt (never one it could
    not open because its directory is read-only or locked)."""
    text = str(exc)
    if "locked" in text or "busy" in text:
        return StateError(
            f"state file {path} is locked by another process ({text}); wait for it, or find it with: "
            f"fuser {path}"
        )
    if any(word in text.lower() for word in ("not a database", "malformed", "encrypted")):
        return StateError(
            f"state file {path} cannot be read ({text}); it may be corrupt. Move it away "
            f"(mv {path} {path}.bad) to start with an empty queue"
        )
    said = read_only(path.parent)
    if said is not None:
        return StateReadOnly(f"{said} ({path}: {text})")
    return StateError(f"state file {path} cannot be read ({text}): see that it and {path.parent} are yours")


def set_aside_lost_jobs(directory: Path, database: Path) -> str | None:
    """A new database beside the directories of jobs it does not know (the database was
    lost: deleted, or never reached the disk): those directories, and their MLflow queue, are
    moved aside, never read as the new jobs' (whose ids start again at 1). What happened, to
    be said, or None."""
    jobs = directory / "jobs"
    try:
        known = [d for d in jobs.iterdir() if d.is_dir()]
    except FileNotFoundError:
        return None
    if not known:
        return None
    aside = directory / f"jobs.lost-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    try:
        os.rename(jobs, aside)
    except FileNotFoundError:  # another process opening the same new database did it
        return None
    try:  # their MLflow queue too: its keys (job-attempt) would be the new jobs'
        os.rename(directory / "track", aside / "track")
    except FileNotFoundError:
        pass
    running = _still_running(aside)
    return (
        f"the state database {database} is new, but {jobs} held {len(known)} jobs' directories "
        f"(the database was lost?): they are kept in {aside}; new jobs' ids start again at 1"
        + (
            f". {len(running)} of those jobs still run, known to no queue now (supervisor pids "
            f"{', '.join(map(str, running))}): their files, results too, go on into {aside}"
            if running
            else ""
        )
    )


def _still_running(aside: Path) -> list[int]:
    """The pids of the supervisors still running over attempts set aside (each writes into its
    own folder wherever it is moved: :mod:`tandem.place.run.supervisor.shim`)."""
    from tandem.place.run.supervisor.files import ShimInfo, load
    from tandem.place.run.supervisor.proctrack import same_process

    found = []
    for folder in aside.glob("*/*"):
        shim = load(folder, ShimInfo) if not (folder / "result.json").exists() else None
        if shim is not None and same_process(shim.pid, shim.ctime):
            found.append(shim.pid)
    return sorted(found)


def cluster_trouble(state_dir: Path) -> str | None:
    """What every command says while the Ray cluster of ``state_dir``'s daemon does not
    answer, or None: what the daemon wrote (it runs, but Ray does not answer it), or, where
    the daemon is gone (Ray ends a driver whose node's Ray died: the head's loss ends a
    daemon on the head), that its cluster's address does not answer either. Cheap: files
    and, only for a Ray daemon that is not running, one connection."""
    try:
        said = (state_dir / RAY_TROUBLE).read_text().strip()
    except OSError:
        said = ""
    if said:
        return said
    daemon = DaemonFile.read(state_dir)
    try:
        kept = json.loads((state_dir / CONFIG_FILE).read_text())
    except (OSError, ValueError):
        return None
    if daemon is None or not isinstance(kept, dict):
        return None
    pid = daemon.pid
    address = kept.get("address")
    if kept.get("backend") != "ray" or not address:
        return None
    try:
        os.kill(pid, 0)
        return None  # its daemon runs (and says what Ray does not answer it)
    except ProcessLookupError:
        pass
    except PermissionError:
        return None
    why = unreachable(str(address), timeout=0.5)
    if why is None:
        return None
    return (
        f"no daemon serves {state_dir} and its Ray cluster at {address} does not answer ({why}): the "
        f"jobs on it are not followed; once it is back: tandem daemon start --backend ray --address {address}"
    )
