"""The state file's tables, derived from the records, and how an older file is brought up to date.

The ``jobs``, ``attempts`` and ``shares`` tables are made from the fields the records declare
(:mod:`tandem.place.records`, :mod:`tandem.place.fields`); ``peaks``, ``events`` and ``meta``
hold no record and are written out here (``peaks``: what each learning key was measured
to use: RAM and GPU memory peaks, the recent runs' cores). :data:`MIGRATIONS` takes a file of schema ``n`` to
``n + 1``; :func:`missing_columns` says which declared fields a file still lacks after them
(a field added to a record without its migration is caught when the state is opened, and by
the tests, not by a failing INSERT in a user's daemon).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tandem.place.fields import meta, reader, same, sql_declaration, stored_fields, to_column
from tandem.place.model import WAITING_STATES
from tandem.place.records import Attempt, Job, Share

SCHEMA_VERSION = 9

# Each record's table: its name and what is declared beyond its columns.
TABLES: dict[type, tuple[str, str]] = {
    Job: ("jobs", ""),
    Attempt: ("attempts", "PRIMARY KEY (job_id, n)"),
    Share: ("shares", ""),
}


def create_table(cls: type) -> str:
    name, extra = TABLES[cls]
    columns = [sql_declaration(f) for f in stored_fields(cls)] + ([extra] if extra else [])
    return f"CREATE TABLE IF NOT EXISTS {name} (\n    " + ",\n    ".join(columns) + "\n)"


SCHEMA = ";\n".join(
    [
        "CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT NOT NULL)",
        *(create_table(cls) for cls in TABLES),
        "CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state)",
        "CREATE TABLE IF NOT EXISTS peaks (job_key TEXT PRIMARY KEY, peak_mem INTEGER, "
        "peak_gpu_mem INTEGER, run_s REAL, updated REAL, cpu_runs TEXT)",
        "CREATE TABLE IF NOT EXISTS events (id INTEGER PRIMARY KEY AUTOINCREMENT, t REAL NOT NULL, "
        "job_id INTEGER, kind TEXT NOT NULL, detail TEXT NOT NULL DEFAULT '')",
    ]
)

# What a learning key's runs were measured to use (the largest peaks seen; its recent runs' cores).
RECORD_PEAK = (
    "INSERT INTO peaks (job_key, peak_mem, peak_gpu_mem, run_s, updated) VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT(job_key) DO UPDATE SET "
    "peak_mem = max(coalesce(excluded.peak_mem, 0), coalesce(peak_mem, 0)), "
    "peak_gpu_mem = max(coalesce(excluded.peak_gpu_mem, 0), coalesce(peak_gpu_mem, 0)), "
    "run_s = excluded.run_s, updated = excluded.updated"
)
RECORD_CORES = (
    "INSERT INTO peaks (job_key, cpu_runs, updated) VALUES (?, ?, ?) "
    "ON CONFLICT(job_key) DO UPDATE SET cpu_runs = excluded.cpu_runs, updated = excluded.updated"
)

# A sweep's waiting jobs that read no share, bound to a drop-in loader's (its ids: one JSON
# list, since a sweep's may be more than SQLite's variables); the ids bound.
BIND_SHARE = (
    'UPDATE jobs SET share = ?, "group" = coalesce("group", ?), updated = ? '
    "WHERE id IN (SELECT value FROM json_each(?)) "
    f"AND share IS NULL AND role = 'job' AND state IN ({', '.join(map(repr, sorted(WAITING_STATES)))}) "
    "RETURNING id"
)


def columns_of(cls: type, *, listed: bool = False, queued: bool = False) -> str:
    """The quoted column list of ``cls``'s stored fields: all, or only those read when
    jobs are listed (``listed``) or by a scheduling pass (``queued``)."""
    chosen = [
        f.name
        for f in stored_fields(cls)
        if (not listed or meta(f, "listed")) and (not queued or meta(f, "queued"))
    ]
    return ", ".join(f'"{c}"' for c in chosen)


def row_values(record: Any, **overrides: Any) -> dict[str, Any]:
    """A record's stored fields as its columns hold them (``overrides`` replace values)."""
    values = {f.name: getattr(record, f.name) for f in stored_fields(type(record))}
    return encode(type(record), values | overrides)


def encode(cls: type, values: dict[str, Any]) -> dict[str, Any]:
    """Some of ``cls``'s fields as their columns hold them."""
    by_name = {f.name: f for f in stored_fields(cls)}
    return {k: to_column(by_name[k], v) for k, v in values.items()}


@functools.cache
def _readers(cls: type) -> dict[str, Callable[[Any], Any]]:
    return {f.name: reader(f) for f in stored_fields(cls)}


def decode(cls: type, row: sqlite3.Row | Mapping[str, Any]) -> Any:
    """The record a row (all or some of its columns) holds."""
    return decode_all(cls, [row])[0]


@functools.cache
def _unread(cls: type, names: tuple[str, ...]) -> tuple[dict[str, Any], tuple[tuple[str, Any], ...]] | None:
    """The fields of ``cls`` a query of ``names`` leaves out: their defaults, and their default
    factories (called for each record); None where one has neither (the record's own
    constructor then says so)."""
    defaults, factories = {}, []
    for f in dataclasses.fields(cls):
        if f.name in names:
            continue
        if f.default is not dataclasses.MISSING:
            defaults[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            factories.append((f.name, f.default_factory))
        else:
            return None
    return defaults, tuple(factories)


def decode_all(cls: type, rows: Sequence[sqlite3.Row | Mapping[str, Any]]) -> list[Any]:
    """The records rows of one query hold (their columns looked up once, not per row; only
    the columns kept otherwise than as they are converted). A plain record (no slots, no
    ``__post_init__``) is filled in directly, not through its constructor: ``tandem ls``
    decodes ten thousand rows, and the generated ``__init__`` of 50 fields is most of it."""
    if not rows:
        return []
    names = tuple(rows[0].keys())
    readers = _readers(cls)
    convert = [(k, readers[k]) for k in names if readers[k] is not same]
    unread = None if hasattr(cls, "__slots__") or hasattr(cls, "__post_init__") else _unread(cls, names)
    out = []
    for row in rows:
        values = dict(row) if isinstance(row, Mapping) else dict(zip(names, row))  # a reply's, or the file's
        for k, read in convert:
            if (v := values[k]) is not None:
                values[k] = read(v)
        if unread is None:
            out.append(cls(**values))
            continue
        defaults, factories = unread
        record: Any = object.__new__(cls)
        record.__dict__.update(defaults, **values)
        for name, factory in factories:
            record.__dict__[name] = factory()
        out.append(record)
    return out


def missing_columns(db: sqlite3.Connection) -> list[str]:
    """``table.column`` of every declared field the file has no column for."""
    missing = []
    for cls, (table, _) in TABLES.items():
        have = {r[1] for r in db.execute(f"PRAGMA table_info({table})")}
        missing += [f"{table}.{f.name}" for f in stored_fields(cls) if f.name not in have]
    return missing


def _shares_as_specs(db: sqlite3.Connection) -> None:
    """Schema 1 kept a share as ``tandem share serve`` arguments: rebuild it as a spec."""
    from tandem.share.spec import ShareSpec

    old = db.execute("SELECT name, serve_args, cpus, mem, defined FROM shares").fetchall()
    db.execute("DROP TABLE shares")
    db.execute(
        "CREATE TABLE shares (name TEXT PRIMARY KEY, spec TEXT NOT NULL, defined REAL NOT NULL, "
        "pid INTEGER, ctime REAL, started REAL, cpus REAL, error TEXT)"
    )
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


def _selections_in_state(db: sqlite3.Connection) -> None:
    """Schema 3 kept a share's selection in its spec (``--selection``) or beside the
    selection's files (what its selection job made): the share's column holds it now."""
    db.execute("ALTER TABLE shares ADD COLUMN selection TEXT")
    for name, spec_json in db.execute("SELECT name, spec FROM shares").fetchall():
        given = json.loads(spec_json).get("selection")
        if given:
            db.execute("UPDATE shares SET selection = ? WHERE name = ?", (given, name))


def _attempt_folders(db: sqlite3.Connection) -> None:
    """Schema 4 named an attempt's folder by its number alone (a file older than the
    attempts table has it from the schema already)."""
    if "folder" not in {r[1] for r in db.execute("PRAGMA table_info(attempts)")}:
        db.execute("ALTER TABLE attempts ADD COLUMN folder TEXT")


def _learning_keys(db: sqlite3.Connection) -> None:
    """Schema 5 learnt a job's use under its own key, and its cores in the daemon's memory
    only: a job's learning key (its own, for the jobs already made) and each key's recent
    runs' cores (``peaks.cpu_runs``; a file older than the peaks table has it already)."""
    if "learn_key" not in {r[1] for r in db.execute("PRAGMA table_info(jobs)")}:
        db.execute("ALTER TABLE jobs ADD COLUMN learn_key TEXT NOT NULL DEFAULT ''")
        db.execute("UPDATE jobs SET learn_key = job_key")
    if "cpu_runs" not in {r[1] for r in db.execute("PRAGMA table_info(peaks)")}:
        db.execute("ALTER TABLE peaks ADD COLUMN cpu_runs TEXT")


def _job_roles(db: sqlite3.Connection) -> None:
    """Schema 6 had only submitted jobs, and a share's row held its running producer (pid,
    ctime, started, cpus, error): each job is of role "job", and from schema 7 a share
    group's producer is a job row of role "producer", so those columns go (the table made
    again: an old SQLite has no DROP COLUMN)."""
    if "role" not in {r[1] for r in db.execute("PRAGMA table_info(jobs)")}:
        db.execute("ALTER TABLE jobs ADD COLUMN role TEXT NOT NULL DEFAULT 'job'")
    if "pid" in {r[1] for r in db.execute("PRAGMA table_info(shares)")}:
        db.execute("ALTER TABLE shares RENAME TO shares_6")
        db.execute(create_table(Share))
        kept = columns_of(Share)
        db.execute(f"INSERT INTO shares ({kept}) SELECT {kept} FROM shares_6")
        db.execute("DROP TABLE shares_6")


def _pruning(db: sqlite3.Connection) -> None:
    """Schema 8 prunes a sweep's trials: a job's rule (``prune``, ``metric``) and what it
    decided (``pruned``, ``pruned_rung``); a table an earlier step made anew has them."""
    have = {r[1] for r in db.execute("PRAGMA table_info(jobs)")}
    for name, kind in (("prune", "TEXT"), ("metric", "TEXT"), ("pruned", "TEXT"), ("pruned_rung", "INTEGER")):
        if name not in have:
            db.execute(f"ALTER TABLE jobs ADD COLUMN {name} {kind}")


def _owners(db: sqlite3.Connection) -> None:
    """Schema 9 keeps who submitted each job and defined each share (a system manager's
    users); rows made before are the daemon's own user's (None)."""
    have = {r[1] for r in db.execute("PRAGMA table_info(jobs)")}
    for name, kind in (
        ("owner", "INTEGER"),
        ("owner_gid", "INTEGER"),
        ("owner_groups", "TEXT NOT NULL DEFAULT '[]'"),
    ):
        if name not in have:
            db.execute(f"ALTER TABLE jobs ADD COLUMN {name} {kind}")
    if "owner" not in {r[1] for r in db.execute("PRAGMA table_info(shares)")}:
        db.execute("ALTER TABLE shares ADD COLUMN owner INTEGER")


# MIGRATIONS[n]: what takes schema n to n + 1 (CREATE TABLE IF NOT EXISTS only makes what
# is missing, not what an old table lacks): SQL statements, or functions of the database.
MIGRATIONS: dict[int, list[Any]] = {
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
    3: [
        "ALTER TABLE jobs ADD COLUMN params TEXT NOT NULL DEFAULT '{}'",
        _selections_in_state,
    ],
    4: [_attempt_folders],
    5: [_learning_keys],
    6: [_job_roles],
    7: [_pruning],
    8: [_owners],
}

assert set(MIGRATIONS) == set(range(1, SCHEMA_VERSION)), "a schema version without its migration"
assert all(dataclasses.is_dataclass(cls) for cls in TABLES)
