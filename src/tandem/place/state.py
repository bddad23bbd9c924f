"""The job manager's state: jobs, attempts, measured peaks and events in one SQLite file.

``$TANDEM_STATE_DIR`` (default ``$XDG_STATE_HOME/tandem``, else ``~/.local/state/tandem``)
holds ``place.db`` and a directory per job with each attempt's spec, output and result.
The daemon is the only writer; ``tandem ls|show|logs|wait`` read the file directly
(write-ahead logging lets them read while the daemon writes), so they work while no
daemon is running. The directory is private (0700), as is the database.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path
from typing import Any

from tandem.place.model import QUEUED, JobSpec
from tandem.place.paths import StateError, private_dir, state_dir, state_dir_path  # noqa: F401 (re-exported)
from tandem.place.records import Attempt, Job, Share
from tandem.share.spec import ShareSpec

_NOT_ENDED = ("queued", "running", "retrying")

SCHEMA_VERSION = 3

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT, job_key TEXT NOT NULL, command TEXT NOT NULL, cwd TEXT NOT NULL, env TEXT NOT NULL,
    cpus REAL NOT NULL, mem INTEGER NOT NULL, gpus INTEGER NOT NULL, gpu_mem INTEGER,
    gpu_share INTEGER, priority INTEGER NOT NULL, retries INTEGER NOT NULL,
    share TEXT, "group" TEXT, after TEXT NOT NULL DEFAULT '[]', token TEXT,
    state TEXT NOT NULL, cause TEXT, cause_line TEXT, exit_code INTEGER, signal TEXT,
    submitted REAL NOT NULL, queued_at REAL, started REAL, ended REAL,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    escalation INTEGER NOT NULL DEFAULT 0,
    peak_mem INTEGER, peak_gpu_mem INTEGER, energy_joules REAL, mlflow_run_id TEXT,
    reason TEXT, updated REAL
);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state);
CREATE TABLE IF NOT EXISTS attempts (
    job_id INTEGER NOT NULL, n INTEGER NOT NULL, state TEXT NOT NULL,
    placement TEXT NOT NULL, started REAL NOT NULL, ended REAL,
    exit_code INTEGER, signal TEXT, cause TEXT, cause_line TEXT,
    shim_pid INTEGER, shim_ctime REAL, pid INTEGER, pid_ctime REAL,
    peak_mem INTEGER, peak_gpu_mem INTEGER, cpu_seconds REAL, mlflow_run_id TEXT,
    PRIMARY KEY (job_id, n)
);
CREATE TABLE IF NOT EXISTS peaks (
    job_key TEXT PRIMARY KEY, peak_mem INTEGER, peak_gpu_mem INTEGER, run_s REAL, updated REAL
);
CREATE TABLE IF NOT EXISTS shares (
    name TEXT PRIMARY KEY, spec TEXT NOT NULL, defined REAL NOT NULL,
    pid INTEGER, ctime REAL, started REAL, cpus REAL, error TEXT
);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT, t REAL NOT NULL, job_id INTEGER, kind TEXT NOT NULL,
    detail TEXT NOT NULL DEFAULT ''
);
"""


def _shares_as_specs(db: sqlite3.Connection) -> None:
    """Schema 1 kept a share as ``tandem share serve`` arguments: rebuild it as a spec."""
    from tandem.share.spec import ShareSpec

    old = db.execute("SELECT name, serve_args, cpus, mem, defined FROM shares").fetchall()
    db.execute("DROP TABLE shares")
    db.execute(_SCHEMA[_SCHEMA.index("CREATE TABLE IF NOT EXISTS shares") :].split(";")[0])
    for name, serve_args, cpus, mem, defined in old:
        args, values = json.loads(serve_args), {}
        flags = {"--window": "window", "--policy": "policy", "--batch-size": "batch_size", "--seed": "seed"}
        flags |= {"--num-workers": "num_workers", "--device": "device"}
        for i, arg in enumerate(args):
            if arg in ("--dataset", "--loader", "--images"):
                values["source"], values["ref"] = arg[2:], args[i + 1]
            elif arg in flags:
                values[flags[arg]] = args[i + 1] if arg in ("--policy", "--device") else int(args[i + 1])
            elif arg == "--shuffle":
                values["shuffle"] = True
        spec = ShareSpec(name=name, cpus=cpus, mem=mem, **values)
        db.execute(
            "INSERT INTO shares (name, spec, defined) VALUES (?, ?, ?)", (name, spec.to_json(), defined)
        )


# _MIGRATIONS[n]: what takes schema n to n + 1 (CREATE TABLE IF NOT EXISTS above only makes
# what is missing, not what an old table lacks): SQL statements, or functions of the database.
_MIGRATIONS: dict[int, list[Any]] = {
    1: [
        "ALTER TABLE jobs ADD COLUMN reason TEXT",
        "ALTER TABLE jobs ADD COLUMN token TEXT",
        'ALTER TABLE jobs RENAME COLUMN grp TO "group"',
        "CREATE UNIQUE INDEX IF NOT EXISTS jobs_token ON jobs(token)",
        _shares_as_specs,
    ],
    2: [
        "ALTER TABLE jobs ADD COLUMN updated REAL",
        "UPDATE jobs SET updated = coalesce(ended, started, submitted)",
    ],
}


def _decode_share(row: sqlite3.Row) -> Share:
    values = dict(zip(row.keys(), tuple(row)))
    values["spec"] = ShareSpec.from_json(values["spec"])
    return Share(**values)


_JSON_FIELDS = {"command", "env", "after", "placement"}
# Every column of jobs but the environment: what listing needs (the environment is most of
# a row, and secrets; only a launch reads it).
_LIST_COLUMNS = ", ".join(f'"{f.name}"' for f in fields(Job) if f.name not in ("env", "attempts"))


# What a scheduling pass reads of each waiting job: not its directory or environment (a
# queue of thousands is read every pass); its command names its program (its start-up).
_QUEUE_COLUMNS = ", ".join(f'"{c}"' for c in (
    "id", "job_key", "command", "state", "submitted", "queued_at", "priority", "cpus", "mem", "gpus",
    "gpu_mem", "gpu_share", "share", "after", "escalation", "cancel_requested", "retries", "started",
))  # fmt: skip
_EMPTY = {"[]": list, "{}": dict}  # most jobs' after and such: no JSON parse for them


def _decode(cls: type, row: sqlite3.Row) -> Any:
    values = dict(zip(row.keys(), row))
    for k in _JSON_FIELDS.intersection(values):
        text = values[k]
        values[k] = _EMPTY[text]() if text in _EMPTY else json.loads(text)
    if "cancel_requested" in values:
        values["cancel_requested"] = bool(values["cancel_requested"])
    return cls(**values)


class State:
    """One connection to ``place.db``. Errors that mean the file cannot be used become
    :class:`StateError` with what to do."""

    def __init__(self, directory: Path | None = None, timeout: float = 10.0) -> None:
        self.dir = private_dir(directory) if directory is not None else state_dir()
        self.path = self.dir / "place.db"
        self.jobs_dir = self.dir / "jobs"
        try:
            fresh = not self.path.exists()
            self.db = sqlite3.connect(self.path, timeout=timeout, isolation_level=None)
            if fresh:
                os.chmod(self.path, 0o600)
            self.db.row_factory = sqlite3.Row
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.executescript(_SCHEMA)
            self._check_version()
            # After any migration: an old file's jobs table has neither column before it.
            self.db.execute("CREATE UNIQUE INDEX IF NOT EXISTS jobs_token ON jobs(token)")
            self.db.execute("CREATE INDEX IF NOT EXISTS jobs_updated ON jobs(updated)")
        except sqlite3.DatabaseError as exc:
            raise self._error(exc) from None

    def _error(self, exc: sqlite3.Error) -> StateError:
        text = str(exc)
        if "locked" in text or "busy" in text:
            return StateError(
                f"state file {self.path} is locked by another process ({text}); "
                "wait for it, or find it with: fuser " + str(self.path)
            )
        return StateError(
            f"state file {self.path} cannot be read ({text}); it may be corrupt. Move it away "
            f"(mv {self.path} {self.path}.bad) to start with an empty queue"
        )

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

    def _migrate(self, version: int) -> None:
        """Bring a state file written by an older tandem up to this schema, step by step, in
        one transaction (a reader of the old schema never sees half a migration)."""
        with self.transaction() as db:
            for step in range(version, SCHEMA_VERSION):
                for change in _MIGRATIONS[step]:
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

    def _write(self, sql: str, args: tuple = ()) -> None:
        """One statement in a transaction of its own."""
        with self.transaction() as db:
            db.execute(sql, args)

    def query(self, sql: str, args: tuple = ()) -> list[sqlite3.Row]:
        try:
            return self.db.execute(sql, args).fetchall()
        except sqlite3.DatabaseError as exc:
            raise self._error(exc) from None

    # --- jobs -----------------------------------------------------------------------------

    def add_job(self, spec: JobSpec, gpus: int, now: float) -> tuple[int, bool]:
        """Queue a submitted job; its id, and whether it is new (a submit retried with the
        same token gets the job the first one made)."""
        values = {
            **spec.to_dict(),
            "gpus": gpus,
            "job_key": spec.job_key,
            "state": QUEUED,
            "submitted": now,
            "queued_at": now,
            "updated": now,
        }
        values = {k: (json.dumps(v) if k in _JSON_FIELDS else v) for k, v in values.items()}
        cols = ", ".join(f'"{k}"' for k in values)
        marks = ", ".join("?" for _ in values)
        with self.transaction() as db:
            if spec.token:
                known = db.execute("SELECT id FROM jobs WHERE token = ?", (spec.token,)).fetchone()
                if known is not None:
                    return int(known[0]), False
            cur = db.execute(f"INSERT INTO jobs ({cols}) VALUES ({marks})", tuple(values.values()))
            job_id = int(cur.lastrowid or 0)
            db.execute("INSERT INTO events (t, job_id, kind) VALUES (?, ?, 'submitted')", (now, job_id))
        return job_id, True

    def update_job(self, job_id: int, **values: Any) -> None:
        values = {k: (json.dumps(v) if k in _JSON_FIELDS else v) for k, v in values.items()}
        values["updated"] = time.time()
        sets = ", ".join(f'"{k}" = ?' for k in values)
        self._write(f"UPDATE jobs SET {sets} WHERE id = ?", (*values.values(), job_id))

    def set_reasons(self, reasons: dict[int, str]) -> None:
        """Why each waiting job waits (the daemon's pass), one transaction for all."""
        now = time.time()  # only the rows whose reason changed: a live view is sent what changed
        with self.transaction() as db:
            db.executemany(
                "UPDATE jobs SET reason = ?, updated = ? WHERE id = ? AND reason IS NOT ?",
                [(r, now, i, r) for i, r in reasons.items()],
            )

    def job(self, job_id: int, attempts: bool = True) -> Job | None:
        rows = self.query("SELECT * FROM jobs WHERE id = ?", (job_id,))
        if not rows:
            return None
        job = _decode(Job, rows[0])
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
        where, args = [], []
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
        sql = f"SELECT {'*' if env else _LIST_COLUMNS} FROM jobs"
        sql += f" WHERE {' AND '.join(where)}" if where else ""
        if last is not None:
            sql = f"SELECT * FROM ({sql} ORDER BY id DESC LIMIT {int(last)})"
        rows = self.query(sql + " ORDER BY id", tuple(args))
        jobs = [_decode(Job, r) for r in rows]
        if attempts and jobs:
            by_job: dict[int, list[Attempt]] = {}
            for a in self.attempts_of([j.id for j in jobs]):
                by_job.setdefault(a.job_id, []).append(a)
            for j in jobs:
                j.attempts = by_job.get(j.id, [])
        return jobs

    def queue(self, states: tuple[str, ...]) -> list[Job]:
        """The jobs in these states with what a scheduling pass needs of them (by id)."""
        marks = ", ".join("?" for _ in states)
        sql = f"SELECT {_QUEUE_COLUMNS} FROM jobs WHERE state IN ({marks}) ORDER BY id"
        return [_decode(Job, r) for r in self.query(sql, states)]

    def attempts_since(self, t: float, limit: int = 2000) -> list[Attempt]:
        """Attempts running at or after ``t`` (a timeline's window), newest first, at most
        ``limit``."""
        sql = "SELECT * FROM attempts WHERE ended IS NULL OR ended >= ? ORDER BY started DESC LIMIT ?"
        return [_decode(Attempt, r) for r in self.query(sql, (t, limit))]

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

    # --- attempts -------------------------------------------------------------------------

    def attempts(self, job_id: int) -> list[Attempt]:
        rows = self.query("SELECT * FROM attempts WHERE job_id = ? ORDER BY n", (job_id,))
        return [_decode(Attempt, r) for r in rows]

    def attempts_of(self, job_ids: list[int]) -> list[Attempt]:
        out: list[Attempt] = []
        for i in range(0, len(job_ids), 500):  # SQLite's limit on bound values
            chunk = job_ids[i : i + 500]
            marks = ", ".join("?" for _ in chunk)
            sql = f"SELECT * FROM attempts WHERE job_id IN ({marks}) ORDER BY job_id, n"
            out += [_decode(Attempt, r) for r in self.query(sql, tuple(chunk))]
        return out

    def add_attempt(self, attempt: Attempt) -> None:
        values = {k: (json.dumps(v) if k in _JSON_FIELDS else v) for k, v in attempt.__dict__.items()}
        cols = ", ".join(values)
        marks = ", ".join("?" for _ in values)
        self._write(f"INSERT INTO attempts ({cols}) VALUES ({marks})", tuple(values.values()))

    def update_attempt(self, job_id: int, n: int, **values: Any) -> None:
        values = {k: (json.dumps(v) if k in _JSON_FIELDS else v) for k, v in values.items()}
        sets = ", ".join(f"{k} = ?" for k in values)
        self._write(f"UPDATE attempts SET {sets} WHERE job_id = ? AND n = ?", (*values.values(), job_id, n))

    # --- measured peaks, events, settings -------------------------------------------------

    def peak(self, job_key: str) -> sqlite3.Row | None:
        rows = self.query("SELECT * FROM peaks WHERE job_key = ?", (job_key,))
        return rows[0] if rows else None

    def record_peak(self, job_key: str, peak_mem: int | None, peak_gpu_mem: int | None, run_s: float) -> None:
        self._write(
            "INSERT INTO peaks VALUES (?, ?, ?, ?, ?) ON CONFLICT(job_key) DO UPDATE SET "
            "peak_mem = max(coalesce(excluded.peak_mem, 0), coalesce(peak_mem, 0)), "
            "peak_gpu_mem = max(coalesce(excluded.peak_gpu_mem, 0), coalesce(peak_gpu_mem, 0)), "
            "run_s = excluded.run_s, updated = excluded.updated",
            (job_key, peak_mem, peak_gpu_mem, run_s, time.time()),
        )

    def event(self, job_id: int | None, kind: str, detail: str = "") -> None:
        self._write(
            "INSERT INTO events (t, job_id, kind, detail) VALUES (?, ?, ?, ?)",
            (time.time(), job_id, kind, detail),
        )

    def events(self, job_id: int) -> list[sqlite3.Row]:
        return self.query("SELECT t, kind, detail FROM events WHERE job_id = ? ORDER BY id", (job_id,))

    def setting(self, key: str) -> str | None:
        rows = self.query("SELECT v FROM meta WHERE k = ?", (key,))
        return rows[0][0] if rows else None

    def set_setting(self, key: str, value: str) -> None:
        self._write(
            "INSERT INTO meta VALUES (?, ?) ON CONFLICT(k) DO UPDATE SET v = excluded.v", (key, value)
        )

    # --- shared datasets (tandem share define) ------------------------------------------------

    def define_share(self, spec: ShareSpec) -> None:
        self._write(
            "INSERT INTO shares (name, spec, defined) VALUES (?, ?, ?) "
            "ON CONFLICT(name) DO UPDATE SET spec = excluded.spec, defined = excluded.defined, "
            "error = NULL",
            (spec.name, spec.to_json(), time.time()),
        )

    def share(self, name: str) -> Share | None:
        rows = self.query("SELECT * FROM shares WHERE name = ?", (name,))
        return _decode_share(rows[0]) if rows else None

    def shares(self) -> list[Share]:
        return [_decode_share(r) for r in self.query("SELECT * FROM shares ORDER BY name")]

    def share_users(self, name: str) -> list[int]:
        """The jobs not yet ended that read ``name``."""
        marks = ", ".join("?" for _ in _NOT_ENDED)
        rows = self.query(f"SELECT id FROM jobs WHERE share = ? AND state IN ({marks})", (name, *_NOT_ENDED))
        return [r[0] for r in rows]

    def remove_share(self, name: str) -> None:
        self._write("DELETE FROM shares WHERE name = ?", (name,))

    def set_producer(
        self,
        name: str,
        pid: int | None,
        ctime: float | None,
        cpus: float | None = None,
        error: str | None = None,
    ) -> None:
        self._write(
            "UPDATE shares SET pid = ?, ctime = ?, started = ?, cpus = ?, error = ? WHERE name = ?",
            (pid, ctime, time.time() if pid else None, cpus, error, name),
        )

    def attempt_dir(self, job_id: int, n: int) -> Path:
        return self.jobs_dir / str(job_id) / str(n)
