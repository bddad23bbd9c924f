"""The job manager's state: jobs, attempts, what was learnt and events in one SQLite file.

``$TANDEM_STATE_DIR`` (default ``$XDG_STATE_HOME/tandem``, else ``~/.local/state/tandem``)
holds ``place.db`` and a folder per job with each attempt's spec, output and result.
:class:`State` is the one writer, and only the daemon opens it, once it holds the state
directory's lock: it alone makes the file (with a random id, :mod:`tandem.place.identity`),
migrates it, and sets aside the folders of a lost database's jobs. ``tandem ls|show|logs|wait``,
the dashboard and :mod:`tandem.jobs` open it read-only (:class:`~tandem.place.reads.StateReader`;
write-ahead logging lets them read while the daemon writes), so they work while no daemon
runs, and never make, change or move anything. The directory and database are private (0700).

A job's ``state`` changes only here, by the transitions of :data:`TRANSITIONS` (``start``,
``requeue``, ``retry``, ``finish``, ``fail``, ``cancel``): each writes the job's row, its
attempt's and its event in one transaction, only from the states the table allows (a job
moved on meanwhile is :class:`IllegalTransition`). Tables: :mod:`tandem.place.schema`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sqlite3
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tandem.dirs import private_file
from tandem.place import clock, model
from tandem.place.identity import file_id, new_db_id, opening_new
from tandem.place.model import (
    CANCELLED,
    FAILED,
    OOM,
    PRUNED,
    QUEUED,
    RETRYING,
    RUNNING,
    SUCCEEDED,
    JobSpec,
    Peer,
)
from tandem.place.paths import (  # noqa: F401 (re-exported)
    StateError,
    private_dir,
    set_aside_lost_jobs,
    state_dir,
    state_dir_path,
    unreadable,
)
from tandem.place.reads import NOT_ENDED, StateReader, StateReads  # noqa: F401 (re-exported)
from tandem.place.records import Attempt, Job, Share
from tandem.place.schema import (
    BIND_SHARE,
    MIGRATIONS,
    RECORD_CORES,
    RECORD_PEAK,
    SCHEMA,
    SCHEMA_VERSION,
    encode,
    missing_columns,
    row_values,
)
from tandem.share.spec import ShareSpec

log = logging.getLogger(__name__)

_NOT_ENDED = NOT_ENDED
_WAITING = (QUEUED, RETRYING)

# Every way a job's state changes: the transition, the states it may leave, and those it may
# reach (the tests enumerate it). Nothing else writes a job's state.
TRANSITIONS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "start": (_WAITING, (RUNNING,)),  # an attempt recorded, its supervisor about to start
    "requeue": ((RUNNING,), _WAITING),  # its attempt never ran (or no attempt was recorded)
    "retry": ((RUNNING,), (RETRYING,)),  # its attempt ended; it is tried again (escalated)
    "finish": ((RUNNING,), (SUCCEEDED, FAILED, OOM, CANCELLED, PRUNED)),  # its last attempt ended
    "fail": (_NOT_ENDED, (FAILED,)),  # it cannot run (its producer died, it could not start)
    "cancel": (_NOT_ENDED, (CANCELLED,)),  # cancelled before any attempt of it ran
}


class IllegalTransition(StateError):
    """A transition from a state the table does not allow it from (the job moved on)."""


class State(StateReads):
    """The writer's connection to ``place.db`` (the daemon's, under its lock; a test's),
    which makes the file if there is none. Errors that mean the file cannot be used become
    :class:`StateError` with what to do."""

    def __init__(self, directory: Path | None = None, timeout: float = 10.0) -> None:
        self.dir = private_dir(directory) if directory is not None else state_dir()
        self.path = self.dir / "place.db"
        self.jobs_dir = self.dir / "jobs"
        self.commits = 0  # transactions this connection committed (see version())
        try:
            fresh = opening_new(self.dir)  # refused: read-only, or a kept copy not put back
            private_file(self.path)  # 0600 from the start (it holds every job's environment)
            self.db = sqlite3.connect(self.path, timeout=timeout, isolation_level=None)
            self.db.row_factory = sqlite3.Row
            self.db.execute("PRAGMA journal_mode=WAL")
            # Each acknowledged submit and state change reaches the disk before it is answered
            # (NORMAL may lose the last commits on power loss or a filesystem error).
            self.db.execute("PRAGMA synchronous=FULL")
            self.db.executescript(SCHEMA + ";")
            self._check_version()
            self.id = self._database_id()
            self.file = file_id(self.path)  # what the daemon checks its file against (identity.moved)
            if fresh:
                self._set_aside_lost_jobs()
            # After any migration: an old file's jobs table has neither column before it.
            self.db.execute("CREATE UNIQUE INDEX IF NOT EXISTS jobs_token ON jobs(token)")
            self.db.execute("CREATE INDEX IF NOT EXISTS jobs_updated ON jobs(updated)")
        except sqlite3.DatabaseError as exc:
            raise self._error(exc) from None

    def _set_aside_lost_jobs(self) -> None:
        said = set_aside_lost_jobs(self.dir, self.path)
        if said is not None:
            log.warning("%s", said)
            self.event(None, "lost-state", said)

    def _database_id(self) -> str:
        """The database's id: made with it (or, for one made by an older tandem, now)."""
        if (row := self.db.execute("SELECT v FROM meta WHERE k = 'id'").fetchone()) is None:
            self.db.execute("INSERT OR IGNORE INTO meta VALUES ('id', ?)", (new_db_id(),))
            row = self.db.execute("SELECT v FROM meta WHERE k = 'id'").fetchone()
        return str(row[0])

    def _error(self, exc: sqlite3.Error) -> StateError:
        return unreadable(self.path, exc)  # locked, read-only, corrupt: each with what to do

    def _check_version(self) -> None:
        row = self.db.execute("SELECT v FROM meta WHERE k='schema'").fetchone()
        if row is None:
            self.db.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
            return
        version = int(row[0])
        if version > SCHEMA_VERSION:
            raise StateError(
                f"state file {self.path} is from a newer tandem (schema {row[0]}, this one "
                f"reads {SCHEMA_VERSION}); upgrade tandem or set TANDEM_STATE_DIR elsewhere"
            )
        if version < SCHEMA_VERSION:
            self._migrate(version)
        missing = missing_columns(self.db)
        if missing:  # a field declared in a record without its migration: a bug of tandem's
            raise StateError(
                f"state file {self.path} (schema {SCHEMA_VERSION}) has no column for {', '.join(missing)}: "
                "this tandem lacks a migration; report it, or set TANDEM_STATE_DIR elsewhere"
            )

    def _migrate(self, version: int) -> None:
        """Bring a state file written by an older tandem up to this schema, step by step, in
        one transaction (a reader of the old schema never sees half a migration)."""
        with self.transaction() as db:
            for step in range(version, SCHEMA_VERSION):
                for change in MIGRATIONS[step]:
                    db.execute(change) if isinstance(change, str) else change(db)
            db.execute("UPDATE meta SET v = ? WHERE k = 'schema'", (str(SCHEMA_VERSION),))

    def close(self) -> None:
        self.db.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        try:
            self.db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise self._error(exc) from None
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        else:
            self.db.execute("COMMIT")
            self.commits += 1

    def version(self) -> tuple[int, int]:
        """Changes as this connection knows them: its own commits, and SQLite's
        ``data_version`` (others'). Equal twice: nothing was written in between."""
        return self.commits, self.db.execute("PRAGMA data_version").fetchone()[0]

    def _write(self, sql: str, args: tuple = ()) -> None:
        """One statement in a transaction of its own."""
        with self.transaction() as db:
            db.execute(sql, args)

    def query(self, sql: str, args: tuple = ()) -> list[sqlite3.Row]:
        try:
            return self.db.execute(sql, args).fetchall()
        except sqlite3.DatabaseError as exc:
            raise self._error(exc) from None

    # --- jobs: submitted, and changed only by the named transitions ------------------------

    def add_job(self, spec: JobSpec, gpus: int, now: float, owner: Peer | None = None) -> tuple[int, bool]:
        """Queue a submitted job (``owner``: its submitter); its id, and whether it is new (a
        submit retried with the same token gets the job the first one made)."""
        with self.transaction() as db:
            return self._add_job(db, spec, gpus, now, owner=owner)

    def add_jobs(
        self,
        specs: list[JobSpec],
        gpus: int | list[int],
        now: float,
        alike: str = "",
        owner: Peer | None = None,
    ) -> list[tuple[int, bool]]:
        """Queue several jobs (a sweep's, ``tandem.jobs.submit_many``'s): one transaction,
        all of them or none; ``gpus`` each one's (one figure: all the same); ``alike``: the
        learning key they share (a sweep template's, :func:`tandem.place.sweep.alike_key`)."""
        each = gpus if isinstance(gpus, list) else [gpus] * len(specs)
        with self.transaction() as db:
            return [
                self._add_job(db, spec, g, now, alike=alike, owner=owner)
                for spec, g in zip(specs, each, strict=True)
            ]

    def add_producer(self, spec: JobSpec, gpus: int, now: float, key: str, owner: int | None = None) -> int:
        """Queue a share group's producer: a job row of role producer (the daemon's own),
        run as ``owner`` (its share's first reader's user; None: the daemon's)."""
        with self.transaction() as db:
            job_id = self._add_job(db, spec, gpus, now, "a share group's producer", key)[0]
            db.execute(
                "UPDATE jobs SET role = ?, owner = ? WHERE id = ?", (model.PRODUCER_ROLE, owner, job_id)
            )
            if owner is not None:  # as its reader's newest job: their primary group and groups
                row = db.execute(
                    "SELECT owner_gid, owner_groups FROM jobs WHERE owner = ? AND role = 'job' "
                    "AND owner_gid IS NOT NULL ORDER BY id DESC LIMIT 1",
                    (owner,),
                ).fetchone()
                if row is not None:
                    db.execute("UPDATE jobs SET owner_gid = ?, owner_groups = ? WHERE id = ?", (*row, job_id))
            return job_id

    def _add_job(
        self,
        db: sqlite3.Connection,
        spec: JobSpec,
        gpus: int,
        now: float,
        detail: str = "",
        alike: str = "",
        owner: Peer | None = None,
    ) -> tuple[int, bool]:
        if spec.token:
            known = db.execute(
                "SELECT id FROM jobs WHERE token = ? AND owner IS ?",
                (spec.token, owner.uid if owner else None),
            ).fetchone()
            if known is not None:
                return int(known[0]), False
        key, times = spec.job_key, {"submitted": now, "queued_at": now, "updated": now}
        who = (
            {}
            if owner is None
            else {"owner": owner.uid, "owner_gid": owner.gid, "owner_groups": list(owner.groups)}
        )
        values = row_values(
            Job(**spec.to_dict()), gpus=gpus, job_key=key, learn_key=alike or key, **times, **who
        )
        del values["id"]
        job_id = _insert(db, "jobs", values)
        self._event(db, job_id, "submitted", detail)
        return job_id, True

    def _move(self, db: sqlite3.Connection, transition: str, job_id: int, to: str, **values: Any) -> None:
        """The one writer of a job's ``state``: ``job_id`` to ``to`` by ``transition``, only
        from the states :data:`TRANSITIONS` allows it from (in the caller's transaction)."""
        leaves, reaches = TRANSITIONS[transition]
        if to not in reaches:
            raise IllegalTransition(f"{transition} cannot take a job to {to!r} (only {', '.join(reaches)})")
        values = encode(Job, {**values, "state": to, "updated": clock.now()})
        sets = ", ".join(f'"{k}" = ?' for k in values)
        marks = ", ".join("?" for _ in leaves)
        sql = f"UPDATE jobs SET {sets} WHERE id = ? AND state IN ({marks})"
        if db.execute(sql, (*values.values(), job_id, *leaves)).rowcount != 1:
            row = db.execute("SELECT state FROM jobs WHERE id = ?", (job_id,)).fetchone()
            now = row[0] if row else "unknown"
            raise IllegalTransition(
                f"job {job_id}: cannot {transition} it from {now} (only from {', '.join(leaves)})"
            )

    @staticmethod
    def _event(db: sqlite3.Connection, job_id: int | None, kind: str, detail: str = "") -> None:
        db.execute(
            "INSERT INTO events (t, job_id, kind, detail) VALUES (?, ?, ?, ?)",
            (clock.now(), job_id, kind, detail),
        )

    def start(self, attempt: Attempt, first_start: float | None, detail: str) -> None:
        """Its attempt ``attempt.n`` recorded and the job running (its supervisor starts next)."""
        with self.transaction() as db:
            self._move(
                db, "start", attempt.job_id, RUNNING, started=first_start or attempt.started, reason=None
            )
            _insert(db, "attempts", row_values(attempt))
            self._event(db, attempt.job_id, "started", detail)

    def requeue(self, job_id: int, n: int | None, why: str, now: float) -> None:
        """Back to the queue: its attempt ``n`` (if one was recorded) never ran; every attempt
        of it still open ends with it (``lost``: none runs)."""
        with self.transaction() as db:
            db.execute(
                "UPDATE attempts SET state = 'lost', ended = ?, cause = ? WHERE job_id = ? AND ended IS NULL",
                (now, why, job_id),
            )
            to = RETRYING if n is not None and n > 1 else QUEUED
            self._move(db, "requeue", job_id, to, queued_at=now)
            self._event(db, job_id, "requeued", f"attempt {n} {why}" if n is not None else why)

    def retry(
        self,
        job_id: int,
        n: int,
        attempt: dict[str, Any],
        job: dict[str, Any],
        detail: str,
        notes: Iterable[str] = (),
    ) -> None:
        """Its attempt ``n`` ended (``attempt``: how) and it will be tried again (``job``: the
        fields that change, its escalated reservation among them)."""
        with self.transaction() as db:
            self._attempt_ended(db, "retry", job_id, n, RETRYING, attempt, {**job, "queued_at": clock.now()})
            self._event(db, job_id, "retry", detail)
            for note in notes:
                self._event(db, job_id, "note", note)

    def finish(
        self,
        job_id: int,
        n: int,
        state: str,
        attempt: dict[str, Any],
        job: dict[str, Any],
        detail: str,
        notes: Iterable[str] = (),
        selections: dict[str, str | None] | None = None,
    ) -> None:
        """Its last attempt ``n`` ended (``attempt``: how) and so did the job, in ``state``.
        ``selections``: a share's selection job's, by share (None: it left none), which
        those shares serve from now on."""
        with self.transaction() as db:
            self._attempt_ended(db, "finish", job_id, n, state, attempt, job)
            self._event(db, job_id, state, detail)
            for note in notes:
                self._event(db, job_id, "note", note)
            for share, sel_id in (selections or {}).items():
                if sel_id is None:
                    self._event(db, job_id, "note", f"made no selection for share {share!r}")
                    continue
                db.execute("UPDATE shares SET selection = ? WHERE name = ?", (sel_id, share))
                self._event(db, job_id, "note", f"made selection {sel_id} of share {share!r}")

    def fail(self, job_id: int, cause: str, now: float, attempt: int | None = None) -> None:
        """It cannot run, and no attempt of it is running (``attempt``: one recorded that
        never started, ended with it)."""
        with self.transaction() as db:
            if attempt is not None:
                self._set_attempt(db, job_id, attempt, state="lost", ended=now, cause=cause)
            self._move(db, "fail", job_id, FAILED, ended=now, cause=cause, reason=None)
            self._event(db, job_id, FAILED, cause)

    def cancel(self, job_id: int, cause: str, detail: str, now: float, attempt: int | None = None) -> None:
        """Cancelled before it ran (``attempt``: the one recorded that never started)."""
        with self.transaction() as db:
            if attempt is not None:
                self._set_attempt(db, job_id, attempt, state="lost", ended=now, cause="never started")
            self._cancel(db, job_id, cause, detail, now)

    def cancel_waiting(self, job_ids: list[int], cause: str, detail: str, now: float) -> None:
        """Cancel waiting jobs, all in one transaction (a sweep's thousands at once)."""
        with self.transaction() as db:
            for job_id in job_ids:
                self._cancel(db, job_id, cause, detail, now)

    def _cancel(self, db: sqlite3.Connection, job_id: int, cause: str, detail: str, now: float) -> None:
        self._move(
            db, "cancel", job_id, CANCELLED, ended=now, cause=cause, cancel_requested=True, reason=None
        )
        self._event(db, job_id, "cancelled", detail)

    def update_job(self, job_id: int, **values: Any) -> None:
        """Fields of a job other than its state (its run id, a cancel asked for)."""
        if "state" in values:
            raise ValueError("a job's state changes only through a transition (State.start, finish, ...)")
        values = encode(Job, {**values, "updated": clock.now()})
        sets = ", ".join(f'"{k}" = ?' for k in values)
        self._write(f"UPDATE jobs SET {sets} WHERE id = ?", (*values.values(), job_id))

    def set_reasons(self, reasons: dict[int, str]) -> None:
        """Why each waiting job waits (the daemon's pass), one transaction for all."""
        now = clock.now()  # only the rows whose reason changed: a live view is sent what changed
        with self.transaction() as db:
            db.executemany(
                "UPDATE jobs SET reason = ?, updated = ? WHERE id = ? AND reason IS NOT ?",
                [(r, now, i, r) for i, r in reasons.items()],
            )

    # --- attempts -------------------------------------------------------------------------

    def update_attempt(self, job_id: int, n: int, **values: Any) -> None:
        """Fields of a running attempt other than its end (its supervisor's pid, its node)."""
        if "state" in values or "ended" in values:
            raise ValueError("an attempt ends only with its job's transition (State.finish, retry, requeue)")
        with self.transaction() as db:
            self._set_attempt(db, job_id, n, **values)

    def _attempt_ended(
        self, db: sqlite3.Connection, transition: str, job_id: int, n: int, to: str, attempt: dict, job: dict
    ) -> None:
        """Attempt ``n`` ended (``attempt``: how) and the job moves on by ``transition``."""
        self._set_attempt(db, job_id, n, **attempt)
        self._move(db, transition, job_id, to, **job)

    @staticmethod
    def _set_attempt(db: sqlite3.Connection, job_id: int, n: int, **values: Any) -> None:
        values = encode(Attempt, values)
        sets = ", ".join(f'"{k}" = ?' for k in values)
        db.execute(f"UPDATE attempts SET {sets} WHERE job_id = ? AND n = ?", (*values.values(), job_id, n))

    # --- measured peaks, events, settings -------------------------------------------------

    def record_peak(self, job_key: str, peak_mem: int | None, peak_gpu_mem: int | None, run_s: float) -> None:
        self._write(RECORD_PEAK, (job_key, peak_mem, peak_gpu_mem, run_s, clock.now()))

    def record_cores(self, key: str, runs: list[float]) -> None:
        """The cores learning key ``key``'s recent runs used: a restarted daemon knows them."""
        self._write(RECORD_CORES, (key, json.dumps(runs), clock.now()))

    def event(self, job_id: int | None, kind: str, detail: str = "") -> None:
        with self.transaction() as db:
            self._event(db, job_id, kind, detail)

    def set_setting(self, key: str, value: str) -> None:
        self._write(
            "INSERT INTO meta VALUES (?, ?) ON CONFLICT(k) DO UPDATE SET v = excluded.v", (key, value)
        )

    # --- shared datasets (tandem share define) ------------------------------------------------

    def define_share(
        self, spec: ShareSpec, select_job: JobSpec | None = None, gpus: int = 0, owner: Peer | None = None
    ) -> int | None:
        """Define (or redefine) a share, with the selection it serves when one was given
        (``spec.selection``). ``select_job``: the job that makes its selection, queued in the
        same transaction (its id is returned and kept in the spec)."""
        now = clock.now()
        with self.transaction() as db:
            job_id = None
            if select_job is not None:  # a define retried with its token: the job it made
                what = f"makes the selection of share {spec.name!r}"
                job_id, _ = self._add_job(db, select_job, gpus, now, what, owner=owner)
                spec = dataclasses.replace(spec, select_job=job_id)
            _insert(  # a redefinition: the same row, its spec and selection replaced
                db,
                "shares",
                row_values(
                    Share(spec.name, spec, now, selection=spec.selection, owner=owner.uid if owner else None)
                ),
                "ON CONFLICT(name) DO UPDATE SET spec = excluded.spec, defined = excluded.defined, "
                "selection = excluded.selection",  # its owner stays (a redefinition is the owner's)
            )
        return job_id

    def bind_share(self, job_ids: list[int], name: str, group: str) -> list[int]:
        """Of ``job_ids``, those waiting with no share now read ``name`` (of no group: in ``group``)."""
        with self.transaction() as db:
            bound = db.execute(BIND_SHARE, (name, group, clock.now(), json.dumps(job_ids)))
            return sorted(r[0] for r in bound)

    def remove_share(self, name: str) -> list[int]:
        """Remove ``name``'s definition unless a job not yet ended reads it: those jobs (the
        check and the delete in one transaction: no job can start reading it between them)."""
        marks = ", ".join("?" for _ in _NOT_ENDED)
        with self.transaction() as db:
            users = [
                r[0]
                for r in db.execute(
                    f"SELECT id FROM jobs WHERE share = ? AND role = 'job' AND state IN ({marks})",
                    (name, *_NOT_ENDED),
                )
            ]
            if not users:
                db.execute("DELETE FROM shares WHERE name = ?", (name,))
        return users


def _insert(db: sqlite3.Connection, table: str, values: dict[str, Any], conflict: str = "") -> int:
    """One row of ``values`` (column: value, as :func:`tandem.place.schema.row_values` makes
    them) into ``table``; its rowid."""
    cols, marks = ", ".join(f'"{k}"' for k in values), ", ".join("?" for _ in values)
    sql = f"INSERT INTO {table} ({cols}) VALUES ({marks}) {conflict}".rstrip()
    return int(db.execute(sql, tuple(values.values())).lastrowid or 0)
