"""The files of one attempt, as typed records: the one definition of what the daemon, the
supervisor (:mod:`tandem.place.run.supervisor.shim`) and the Ray actor pass each other.

Everything goes through the attempt's folder (``<state dir>/jobs/<job>/<n>.<random>/``: a name
no other attempt has, of this database or a lost one), each record written whole (write,
then rename), so a reader sees the old file or the new one, never a part:

=================  =============  ===============================================
file               written by     record
=================  =============  ===============================================
``spec.json``      daemon         :class:`AttemptSpec`: what to run and how
``shim.json``      supervisor     :class:`ShimInfo`: its pid, start time, machine (first)
``started.json``   supervisor     :class:`Started`: the job's pid, group, cgroup, marker
``usage.json``     supervisor     :class:`Usage`: the job's processes and memory, each sample
``result.json``    supervisor     :class:`Result`: how it ended, peaks
``output.log``     supervisor     the job's stdout and stderr (capped and rotated)
``metrics.jsonl``  supervisor     the run's points, tags and artifacts, for MLflow
``mlflow.json``    MLflow helper  :class:`RunRef`: the attempt's MLflow run, once made
``shim.log``       supervisor     its own stdout and stderr (:data:`SHIM_LOG`)
=================  =============  ===============================================
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import signal
import sqlite3
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from tandem.dirs import StateDirError

R = TypeVar("R")

SHIM_LOG = "shim.log"  # the supervisor's stdout and stderr, whoever started it

# The signal a supervisor under a Ray actor asks the kernel for when the actor's process
# dies (PR_SET_PDEATHSIG; the actor names its pid in ORPHAN_PARENT): its node's Ray stopped
# or the actor was ended, and the daemon runs the job again elsewhere, so it stops its job
# at once and writes no result (:mod:`tandem.place.run.supervisor.shim`).
ORPHAN_SIGNAL = signal.SIGUSR1
ORPHAN_PARENT = "TANDEM_SUPERVISOR_PARENT"
ORPHAN_GRACE_S = 2.0  # the time its job has to stop then


# A record is made anew, never through a link or into a pipe, and read only from a plain file:
# a system manager (root) writes and reads its users' MLflow queues in their own folders
# (tandem.place.run.metrics.tracking, as them), where they could put either.
NEW_FILE = (
    os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
)  # made anew, never through a link
MAX_RECORD = 1 << 20  # bytes: a record is far smaller; a larger file is none


def open_plain(path: Path, flags: int, uid: int | None = None, mode: int = 0o600) -> int:
    """``path`` opened (a descriptor) never through a link, never waiting on a pipe, a plain
    file only (of user ``uid``'s, where given): what a user put in a folder of theirs cannot
    stall or redirect root's reads and writes there. OSError otherwise."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or (uid is not None and st.st_uid != uid):
        os.close(fd)
        raise OSError(errno.EPERM, "not a plain file of theirs", str(path))
    os.set_blocking(fd, True)
    return fd


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``path`` whole: a reader sees the old file or the new one, never a part."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.unlink(missing_ok=True)  # left by an earlier process of this pid
        with os.fdopen(os.open(tmp, NEW_FILE, 0o666), "w") as f:
            f.write(json.dumps(data))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk must not also leave half a file behind
        raise


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        with os.fdopen(open_plain(path, os.O_RDONLY), "rb") as f:
            data = json.loads(f.read(MAX_RECORD + 1))
    except (OSError, ValueError, RecursionError):  # absent, partial; or made to be no record
        return None
    return data if isinstance(data, dict) else None


DAEMON_FILE = "daemon.json"


@dataclass(frozen=True)
class DaemonFile:
    """What a daemon says of itself in its state directory's ``daemon.json`` (written as it
    starts to listen, by it alone; read by clients, readers and supervisors): which process
    (``pid``, its start time ``ctime``) serves which database (``db_id``, ``db_file``: its
    identity on disk), where it listens (a shell with another runtime directory, cron's,
    finds it there), and the MLflow store its jobs' runs are in (None: not tracked)."""

    pid: int
    ctime: float | None = None
    started: float = 0.0
    socket: str = ""
    store: str | None = None
    db_id: str = ""
    db_file: str | None = None

    def save(self, state_dir: Path) -> None:
        write_json(state_dir / DAEMON_FILE, dataclasses.asdict(self))

    @classmethod
    def read(cls, state_dir: Path) -> DaemonFile | None:
        """The last daemon's record; None where none was written (or it cannot be read)."""
        data = read_json(state_dir / DAEMON_FILE)
        if data is None:
            return None
        known = {f.name for f in dataclasses.fields(cls)}
        try:
            record = cls(**{k: v for k, v in data.items() if k in known})
        except TypeError:
            return None
        return record if isinstance(record.pid, int) and not isinstance(record.pid, bool) else None


def hold(folder: Path) -> Path:
    """A path to ``folder`` that follows it where it is moved (the supervisor's: a lost
    database's folders are set aside while their jobs run): its open descriptor's, in Linux's
    ``/proc``, never a folder made at its old path since; ``folder`` itself where there is none."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)  # kept open as long as the process runs
    held = Path(f"/proc/self/fd/{fd}")
    try:
        return held if os.path.samefile(held, folder) else folder
    except OSError:  # no /proc
        return folder


def moved_from(held: Path, path: Path) -> str | None:
    """Where the folder :func:`hold` gave ``held`` for is now, if no longer at ``path``."""
    try:
        now = os.readlink(held) if held != path else str(path)
    except OSError:
        return None
    return None if now == str(path) else now


def save(directory: Path, record: Any) -> None:
    """Write ``record`` to its file in ``directory`` (OSError if it cannot be written)."""
    write_record(directory / record.FILE, record)


def load(directory: Path, cls: type[R]) -> R | None:
    """The record of type ``cls`` in ``directory``; None if absent, partial or not of this
    version's shape."""
    return read_record(directory / cls.FILE, cls)  # type: ignore[attr-defined]


def read_record(path: Path, cls: type[R]) -> R | None:
    """The record of type ``cls`` (a dataclass) in ``path``; None if absent, partial or not
    of this version's shape (a field it does not know is left out)."""
    data = read_json(path)
    if data is None:
        return None
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    try:
        return cls(**{k: v for k, v in data.items() if k in known})
    except TypeError:
        return None


@dataclass(frozen=True)
class AttemptSpec:
    FILE: ClassVar[str] = "spec.json"
    command: list[str]
    cwd: str
    env: dict[str, str]
    job_id: int = 0
    attempt: int = 1
    name: str = ""
    grace_s: float = 10.0  # between SIGTERM and SIGKILL
    interval_s: float = 1.0  # between samples
    log_max: int = 64 << 20  # bytes of output kept on disk
    socket: str | None = None  # the daemon's, to wake it when the result is there
    track: bool = True  # write the run's points to metrics.jsonl for MLflow
    # wait for the attempt's MLflow run (mlflow.json) and tell the job its id before it starts
    mlflow_env: bool = False
    db_id: str = ""  # the state database the attempt is of (tandem.place.identity)
    # Variables the job takes from the node its supervisor runs on, not from its submitter's
    # shell (under Ray: where that node keeps its sockets, so its jobs find its producers)
    node_env: tuple[str, ...] = ()
    # Who the job runs as (a system manager's job: its submitter); None: as the supervisor.
    user: int | None = None
    group: int | None = None
    groups: tuple[int, ...] = ()


@dataclass(frozen=True)
class ShimInfo:
    FILE: ClassVar[str] = "shim.json"
    pid: int
    ctime: float | None
    host: str
    # Written again just before the job starts: how to find its processes should the
    # supervisor be killed before it could write Started (the job would run on unseen).
    marker: str | None = None
    cgroup: str | None = None


@dataclass(frozen=True)
class Started:
    FILE: ClassVar[str] = "started.json"
    pid: int
    ctime: float | None
    pgid: int
    started: float
    marker: str  # TANDEM_JOB_MARKER: every descendant inherits it
    cgroup: str | None = None  # the job's own cgroup v2, where one could be made


@dataclass(frozen=True)
class Usage:
    FILE: ClassVar[str] = "usage.json"
    t: float
    pids: list[int]
    mem: int
    peak_mem: int
    cpu_seconds: float
    cpu_percent: float | None = None


@dataclass(frozen=True)
class Result:
    FILE: ClassVar[str] = "result.json"
    kind: str  # failures' kinds: ok, exit, signal, gpu_oom, host_oom, cancelled, lost, ...
    state: str
    exit_code: int | None
    signal: str | None
    cause: str | None
    line: str | None
    started: float
    ended: float
    peak_mem: int | None = None
    cpu_seconds: float | None = None
    notes: list[str] = field(default_factory=list)  # what the supervisor could not do (a full disk)


@dataclass(frozen=True)
class RunRef:
    """The attempt's MLflow run, as the manager's MLflow helper made it: where and which
    (or, with ``error``, why there is none)."""

    FILE: ClassVar[str] = "mlflow.json"
    uri: str = ""
    run_id: str = ""
    experiment: str = ""
    error: str | None = None


# The MLflow queue (``state/track``): the daemon's records of each attempt's run, which the
# MLflow helper (tandem.place.run.metrics.tracking_helper) serves, and the helper's own. Each
# names its file in the queue by the run's key (job-attempt: tandem.place.run.metrics.tracking).


@dataclass(frozen=True)
class RunStart:
    """The daemon: an attempt (or a share's producer: no job) started; open its run."""

    NAME: ClassVar[str] = "{key}.start.json"  # kept while the run is open
    name: str
    spool: str  # the attempt's spool of points, which the helper forwards
    started: float  # seconds since the epoch
    job_id: int | None = None
    attempt: int | None = None
    tags: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)  # the job's sweep point


@dataclass(frozen=True)
class RunEnd:
    """The attempt ended (said by the daemon, or by the helper where no daemon will): close
    its run with this, once its spool is forwarded."""

    NAME: ClassVar[str] = "{key}.end.json"
    status: str  # MLflow's: FINISHED, FAILED, KILLED
    tags: dict[str, str]
    log_file: str
    summary: dict[str, float]
    ended: float | None = None  # seconds since the epoch
    by_helper: bool = False  # no daemon said it: one may yet (tracking_ends)


@dataclass(frozen=True)
class RunOpen:
    """The helper's progress on an open run: its id, and how far into the spool it is."""

    NAME: ClassVar[str] = "{key}.open.json"
    run_id: str
    offset: int = 0


@dataclass(frozen=True)
class RunClosed:
    """A run the helper closed with no daemon's end: kept for an end a daemon writes later."""

    NAME: ClassVar[str] = "{key}.closed.json"
    run_id: str
    t: float  # when it was closed, seconds since the epoch


@dataclass(frozen=True)
class RunMade:
    """The helper's answer to the daemon: the run it made for an attempt, or why none."""

    NAME: ClassVar[str] = "done/{key}.json"
    job_id: int | None
    attempt: int | None
    final: bool  # its last answer: the run is closed, or will not be made
    run_id: str | None = None
    error: str | None = None


QueueRecord = RunStart | RunEnd | RunOpen | RunClosed | RunMade


def queued(q: Path, key: str, cls: type[QueueRecord]) -> Path:
    """The file of ``cls``'s record of run ``key`` in the MLflow queue ``q``."""
    return q / cls.NAME.format(key=key)


def queued_keys(q: Path, cls: type[QueueRecord]) -> list[str]:
    """The keys of the runs with a record of ``cls`` in ``q``, in order."""
    head, _, tail = cls.NAME.partition("{key}")
    return sorted(p.name.removesuffix(tail) for p in (q / head).glob(f"*{tail}"))


def write_record(path: Path, record: Any) -> None:
    """Write ``record`` (a dataclass) to ``path`` whole."""
    write_json(path, dataclasses.asdict(record))


# What a write says when the disk will not take it (full, failing, read-only, over quota).
_DISK_ERRNOS = {errno.ENOSPC, errno.EIO, errno.EROFS, errno.EDQUOT}
_DISK_WORDS = (
    "disk is full",
    "disk i/o error",
    "readonly database",
    "read-only file system",
    "no space left",
)


def disk_trouble(exc: BaseException) -> bool:
    """Did ``exc`` come from a disk that will not take writes now (full, failing, read-only)?
    Such a failure is the disk's, not the job's: the job waits and is tried again."""
    if isinstance(exc, OSError) and exc.errno in _DISK_ERRNOS:
        return True
    if isinstance(exc, (sqlite3.OperationalError, StateDirError)):
        return any(word in str(exc).lower() for word in _DISK_WORDS)
    return False
