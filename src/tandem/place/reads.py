"""Reading the job manager's state: what ``tandem ls|show|wait``, the dashboard and each
scheduling pass ask of it (:class:`StateReads`), and the readers' own connection
(:class:`StateReader`): read-only, it never makes, migrates or moves anything, and says when
the database was lost or replaced (:mod:`tandem.place.identity`). The writes, and the
writer's connection, are :mod:`tandem.place.state`'s."""

from __future__ import annotations

import json
import os
import sqlite3
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tandem.place.identity import DB_FILE, StateLost, file_id, missing, replaced, serving_daemon
from tandem.place.model import QUEUED, RETRYING, RUNNING
from tandem.place.paths import StateError, connect_read_only, private_dir, state_dir, unreadable
from tandem.place.records import Attempt, Job, Share
from tandem.place.schema import SCHEMA, SCHEMA_VERSION, columns_of, decode, decode_all

NOT_ENDED = (QUEUED, RUNNING, RETRYING)
_LISTED = columns_of(Job, listed=True)  # not the environment: most of a row, and secrets
_QUEUED = columns_of(Job, queued=True)  # a queue of thousands is read every pass


@dataclass(frozen=True)
class LogPart:
    """What an attempt wrote since a reader's last look (:meth:`StateReads.log_parts`):
    ``data`` from byte ``offset`` of its ``output.log`` (the file ``inode``: another one
    than the reader saw is a rotation, read from its start), and ``older``, the part rotated
    away to ``output.log.1``, the first time the reader sees the attempt (else None)."""

    n: int
    inode: int
    offset: int
    data: bytes
    older: bytes | None

    @property
    def end(self) -> int:
        """Where the reader's next look starts in this file."""
        return self.offset + len(self.data)


# How much of a log one look returns: a follower gets the rest at its next look.
LOG_READ_MAX = 8 << 20
Seen = dict[int, tuple[int, int]]  # attempt n -> (inode, end) of its output.log shown so far


def log_looks(read: Callable[[int, Seen], list[LogPart]], job_id: int, seen: Seen) -> Iterator[list[LogPart]]:
    """Each look ``read(job_id, seen)`` (a reader's ``log_parts``) gives, again while one
    came back full (:data:`LOG_READ_MAX`): everything written so far. The caller moves
    ``seen`` past each look's parts before it asks for the next."""
    while True:
        parts = read(job_id, seen)
        yield parts
        if not any(len(part.data) >= LOG_READ_MAX for part in parts):
            return


def read_log_parts(folders: list[tuple[int, Path]], seen: Seen) -> list[LogPart]:
    """Each attempt's output since ``seen`` (attempt ``n`` -> the ``(inode, end)`` shown of
    it); ``folders``: each attempt's ``n`` and folder, in order."""
    parts = []
    for n, folder in folders:
        older = None
        if n not in seen:
            try:
                older = (folder / "output.log.1").read_bytes()
            except OSError:
                older = b""
        try:
            with open(folder / "output.log", "rb") as f:
                inode = os.fstat(f.fileno()).st_ino
                known_inode, offset = seen.get(n, (inode, 0))
                if known_inode != inode:
                    offset = 0
                f.seek(offset)
                data = f.read(LOG_READ_MAX)
        except OSError:
            inode, offset, data = 0, 0, b""
        parts.append(LogPart(n, inode, offset, data, older))
    return parts


class StateReads(ABC):
    """The queries of the state (one connection, ``query``): the writer's
    (:class:`tandem.place.state.State`) and the readers' (:class:`StateReader`), which set
    the folders declared here."""

    dir: Path
    jobs_dir: Path

    @abstractmethod
    def query(self, sql: str, args: tuple = ()) -> list[sqlite3.Row]:
        """The rows of ``sql`` on this side's connection."""

    def attempt_dir(self, attempt: Attempt) -> Path:
        """The folder of ``attempt`` (its spec, output, result)."""
        return self.jobs_dir / str(attempt.job_id) / (attempt.folder or str(attempt.n))

    def log_parts(self, job_id: int, seen: Seen) -> list[LogPart]:
        """Job ``job_id``'s output, each attempt's since ``seen`` (:func:`read_log_parts`)."""
        return read_log_parts([(a.n, self.attempt_dir(a)) for a in self.attempts(job_id)], seen)

    def job(self, job_id: int, attempts: bool = True) -> Job | None:
        rows = self.query("SELECT * FROM jobs WHERE id = ?", (job_id,))
        if not rows:
            return None
        job = decode(Job, rows[0])
        if attempts:
            job.attempts = self.attempts(job_id)
        return job

    def jobs(
        self,
        states: tuple[str, ...] | None = None,
        attempts: bool = False,
        env: bool = False,
        last: int | None = None,
        before: int | None = None,
        group: str | None = None,
        shares: tuple[str, ...] | None = None,
        changed_since: float | None = None,
    ) -> list[Job]:
        """Jobs in these ``states`` (all: None), by id. ``env``: with their stored environment
        (only a launch needs it; it is most of a row). ``last``: only the newest N (before
        job id ``before``, for paging). ``group``, ``shares``: of those only. ``changed_since``:
        only those whose row changed at or after that time (a live view's update)."""
        where: list[str] = []
        args: list[str | int | float] = []
        if states:
            where.append(f"state IN ({', '.join('?' for _ in states)})")
            args += list(states)
        if group is not None:
            where.append('"group" = ?')
            args.append(group)
        if shares is not None:
            where.append(f"share IN ({', '.join('?' for _ in shares) or 'NULL'})")
            args += list(shares)
        if changed_since is not None:
            where.append("updated >= ?")
            args.append(changed_since)
        if before is not None:
            where.append("id < ?")
            args.append(before)
        sql = f"SELECT {'*' if env else _LISTED} FROM jobs"
        sql += f" WHERE {' AND '.join(where)}" if where else ""
        if last is not None:
            sql = f"SELECT * FROM ({sql} ORDER BY id DESC LIMIT {int(last)})"
        rows = self.query(sql + " ORDER BY id", tuple(args))
        jobs = decode_all(Job, rows)
        if attempts:
            self._with_attempts(jobs)
        return jobs

    def _with_attempts(self, jobs: list[Job]) -> None:
        """Give each of ``jobs`` its attempts (one query a 500 jobs)."""
        by_job: dict[int, list[Attempt]] = {}
        for a in self.attempts_of([j.id for j in jobs]):
            by_job.setdefault(a.job_id, []).append(a)
        for j in jobs:
            j.attempts = by_job.get(j.id, [])

    def queue(self, states: tuple[str, ...]) -> list[Job]:
        """The jobs in these states with what a scheduling pass needs of them (by id)."""
        marks = ", ".join("?" for _ in states)
        sql = f"SELECT {_QUEUED} FROM jobs WHERE state IN ({marks}) ORDER BY id"
        return decode_all(Job, self.query(sql, states))

    def changed_since(self, t: float) -> list[Job]:
        """Jobs of any state whose row changed at or after ``t``, with what a scheduling pass
        needs of them: how a pass keeps its queue without reading all of it again."""
        sql = f"SELECT {_QUEUED} FROM jobs WHERE updated >= ? ORDER BY id"
        return decode_all(Job, self.query(sql, (t,)))

    def attempts_since(self, t: float, limit: int = 2000) -> list[Attempt]:
        """Attempts running at or after ``t`` (a timeline's window), newest first, at most
        ``limit``."""
        sql = "SELECT * FROM attempts WHERE ended IS NULL OR ended >= ? ORDER BY started DESC LIMIT ?"
        return [decode(Attempt, r) for r in self.query(sql, (t, limit))]

    def owners(self, job_ids: set[int]) -> dict[int, int | None]:
        """Each of these jobs' owner (its submitter's uid)."""
        rows = self.query(
            "SELECT id, owner FROM jobs WHERE id IN (SELECT value FROM json_each(?))",
            (json.dumps(sorted(job_ids)),),
        )
        return {int(r[0]): r[1] for r in rows}

    def counts(self) -> dict[str, int]:
        """How many jobs are in each state."""
        return {row[0]: row[1] for row in self.query("SELECT state, count(*) FROM jobs GROUP BY state")}

    def ended_of(self, job_ids: set[int]) -> dict[int, tuple[str, float | None]]:
        """``id -> (state, ended)`` of these jobs (one query)."""
        if not job_ids:
            return {}
        marks = ", ".join("?" for _ in job_ids)
        rows = self.query(f"SELECT id, state, ended FROM jobs WHERE id IN ({marks})", tuple(job_ids))
        return {row["id"]: (row["state"], row["ended"]) for row in rows}

    def any_before(self, job_id: int) -> bool:
        """Is there a job older than ``job_id`` (another page for ``ls --all``)?"""
        return bool(self.query("SELECT 1 FROM jobs WHERE id < ? LIMIT 1", (job_id,)))

    def attempts(self, job_id: int) -> list[Attempt]:
        rows = self.query("SELECT * FROM attempts WHERE job_id = ? ORDER BY n", (job_id,))
        return [decode(Attempt, r) for r in rows]

    def attempts_of(self, job_ids: list[int]) -> list[Attempt]:
        out: list[Attempt] = []
        for i in range(0, len(job_ids), 500):  # SQLite's limit on bound values
            chunk = job_ids[i : i + 500]
            marks = ", ".join("?" for _ in chunk)
            sql = f"SELECT * FROM attempts WHERE job_id IN ({marks}) ORDER BY job_id, n"
            out += decode_all(Attempt, self.query(sql, tuple(chunk)))
        return out

    def peak(self, job_key: str) -> sqlite3.Row | None:
        rows = self.query("SELECT * FROM peaks WHERE job_key = ?", (job_key,))
        return rows[0] if rows else None

    def peaks(self) -> list[sqlite3.Row]:
        return self.query("SELECT * FROM peaks")

    def learnt_cores(self) -> dict[str, list[float]]:
        """Every learning key's recent runs' cores (:meth:`tandem.place.state.State.record_cores`)."""
        rows = self.query("SELECT job_key, cpu_runs FROM peaks WHERE cpu_runs IS NOT NULL")
        return {r[0]: [float(c) for c in json.loads(r[1])] for r in rows}

    def events(self, job_id: int) -> list[sqlite3.Row]:
        return self.query("SELECT t, kind, detail FROM events WHERE job_id = ? ORDER BY id", (job_id,))

    def setting(self, key: str) -> str | None:
        rows = self.query("SELECT v FROM meta WHERE k = ?", (key,))
        return rows[0][0] if rows else None

    def share(self, name: str) -> Share | None:
        rows = self.query("SELECT * FROM shares WHERE name = ?", (name,))
        return decode(Share, rows[0]) if rows else None

    def shares(self) -> list[Share]:
        return [decode(Share, r) for r in self.query("SELECT * FROM shares ORDER BY name")]

    def private_runs(self, job_keys: list[str], owner: int | None = None) -> dict[str, Job]:
        """The last succeeded job of each of these keys that read no share (a job loading for
        itself), with its attempts: what a sweep's report compares sharing against. ``owner``:
        of that user's jobs only (one with none: the daemon's own user's)."""
        out: dict[str, Job] = {}
        mine = "" if owner is None else "AND coalesce(owner, ?) = ? "
        for i in range(0, len(job_keys), 400):  # SQLite's limit on bound values
            chunk = job_keys[i : i + 400]
            marks = ", ".join("?" for _ in chunk)
            sql = (
                f"SELECT {_LISTED} FROM jobs WHERE job_key IN ({marks}) AND coalesce(share, '') = '' "
                f"AND state = 'succeeded' {mine}ORDER BY id"
            )
            args = (*chunk, *(() if owner is None else (os.getuid(), owner)))
            out.update((job.job_key, job) for job in decode_all(Job, self.query(sql, args)))
        self._with_attempts(list(out.values()))
        return out

    def share_users(self, name: str) -> list[int]:
        """The jobs not yet ended that read ``name``."""
        marks = ", ".join("?" for _ in NOT_ENDED)
        rows = self.query(f"SELECT id FROM jobs WHERE share = ? AND state IN ({marks})", (name, *NOT_ENDED))
        return [r[0] for r in rows]


class StateReader(StateReads):
    """A read-only connection to ``place.db`` (``tandem ls|show|logs|wait``, the dashboard,
    :mod:`tandem.jobs`). Where there is no database yet, an empty state (nothing is made);
    where it was lost, or removed or replaced under its daemon, :class:`StateLost` saying
    so; errors that mean the file cannot be read, :class:`StateError` with what to do."""

    def __init__(self, directory: Path | None = None, timeout: float = 10.0) -> None:
        self.dir = private_dir(directory) if directory is not None else state_dir()
        self.path = self.dir / DB_FILE
        self.jobs_dir = self.dir / "jobs"
        daemon = serving_daemon(self.dir)
        self.file = file_id(self.path)
        if self.file is None:
            said = missing(self.dir, daemon)
            if said is not None:
                raise StateLost(said)
            self.db = _empty()  # no state yet: nothing to read, and nothing made here
            self.id = None
            return
        try:
            # mode=ro: never makes the file (a reader opening it just as it went away gets an
            # error, not a new database); its write-ahead log is read as the daemon left it.
            self.db = connect_read_only(self.path, timeout)
            self.db.row_factory = sqlite3.Row
            version, self.id = self._meta()
        except sqlite3.DatabaseError as exc:
            raise self._error(exc) from None
        if version is None:  # made this instant by the daemon, its tables not yet there
            self.db.close()
            self.db = _empty()
            return
        if version != SCHEMA_VERSION:
            self.db.close()
            newer = version > SCHEMA_VERSION
            raise StateError(
                f"state file {self.path} is of schema {version}, this tandem reads {SCHEMA_VERSION}: "
                + (
                    "upgrade tandem, or set TANDEM_STATE_DIR elsewhere"
                    if newer
                    else "the daemon brings it up to date when it starts with this tandem "
                    "(`tandem daemon stop; tandem daemon start`)"
                )
            )
        said = replaced(self.path, self.id, daemon)
        if said is not None:
            self.db.close()
            raise StateLost(said)

    def _meta(self) -> tuple[int | None, str | None]:
        try:
            rows = dict(self.db.execute("SELECT k, v FROM meta WHERE k IN ('schema', 'id')").fetchall())
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return None, None
            raise
        schema = rows.get("schema")
        return (int(schema) if schema is not None else None), rows.get("id")

    def stale(self) -> bool:
        """Is ``place.db`` no longer the file this connection reads (removed, replaced, or
        made since by a daemon)? A long-lived reader (the dashboard) opens it again."""
        return file_id(self.path) != self.file

    def query(self, sql: str, args: tuple = ()) -> list[sqlite3.Row]:
        if self.file is not None and self.stale():  # what an open file shows after it was removed
            said = missing(self.dir, serving_daemon(self.dir)) or (
                f"the state database {self.path} was removed or replaced since it was opened; read it again"
            )
            raise StateLost(said)
        try:
            return self.db.execute(sql, args).fetchall()
        except sqlite3.DatabaseError as exc:
            raise self._error(exc) from None

    def _error(self, exc: sqlite3.Error) -> StateError:
        return unreadable(self.path, exc)

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> StateReader:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def _empty() -> sqlite3.Connection:
    """An empty state in memory: what a state directory without a database reads as."""
    db = sqlite3.connect(":memory:", check_same_thread=False)
    db.row_factory = sqlite3.Row
    db.executescript(SCHEMA + ";")
    return db
