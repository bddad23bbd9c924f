"""What the dashboard shows, read from the job manager's state and the runs' MLflow store.

Every read asks for what one page or one update shows: a page of jobs, one job, the jobs
changed since a time, a log from an offset. A job is the object of ``tandem ls --json`` /
``show --json`` (:func:`tandem.place.views.job_json`), which never holds its environment.
MLflow's SQLite file is read directly, read-only (importing MLflow costs seconds of CPU).
Each thread has its own connections (SQLite's rule); the server's threads reuse theirs.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from tandem.place import WAITING_STATES, Attempt, Share, StateReader, job_json, producer_status

MAX_POINTS = 2000  # a metric series is downsampled to at most this many points
MAX_KEYS = 5000  # a run's metrics shown at most (a store of another user's may say millions)
LOG_CHUNK = 64 << 10  # a log read returns at most this many bytes
PAGE = 100


MAX_ID = 2**63 - 1  # SQLite's integers: a larger id names no job (and must not reach SQLite)


class NotFound(LookupError):
    pass


class Reader:
    """Reads of one state directory (and its MLflow store, where it is a SQLite file)."""

    remote = False  # its file read here (a system manager's, through its socket: tandem.web.remote)

    def __init__(self, state_dir: Path, mlflow_db: Path | None) -> None:
        self.state_dir = state_dir
        self.mlflow_db = mlflow_db
        self._local = threading.local()

    # --- connections --------------------------------------------------------------------------

    @property
    def state(self) -> StateReader:
        """This thread's read-only connection, opened again once ``place.db`` is another file
        (made by a daemon since; or removed, which the new one says)."""
        st = getattr(self._local, "state", None)
        if st is not None and st.stale():
            st.close()
            st = self._local.state = None
        if st is None:
            st = self._local.state = StateReader(self.state_dir)
        return st

    def _runs(self) -> sqlite3.Connection | None:
        db = getattr(self._local, "runs", None)
        if db is None and self.mlflow_db is not None and self.mlflow_db.exists():
            db = self._local.runs = sqlite3.connect(f"file:{self.mlflow_db}?mode=ro", uri=True)
        return db

    # --- jobs -----------------------------------------------------------------------------------

    def jobs(
        self,
        states: tuple[str, ...] | None = None,
        before: int | None = None,
        limit: int = PAGE,
        group: str | None = None,
    ) -> dict[str, Any]:
        """A page of jobs, newest first, and the id to ask for the next (older) page."""
        limit = max(1, min(int(limit), 1000))
        page = self.state.jobs(states, attempts=True, last=limit, before=before, group=group)
        page.reverse()
        now = time.time()
        older = page[-1].id if page and self.state.any_before(page[-1].id) else None
        return {"jobs": [job_json(j, now) for j in page], "next_before": older}

    def job(self, job_id: int) -> dict[str, Any]:
        job = self.state.job(job_id)
        if job is None:
            raise NotFound(f"no job {job_id}")
        data = job_json(job)
        share = self.state.share(job.share) if job.share else None
        data["selection"] = share.selection if share is not None else None  # as show --json
        data["events"] = [dict(r) for r in self.state.events(job_id)]
        return data

    def changed(self, since: float) -> list[dict[str, Any]]:
        """Every job whose row changed at or after ``since`` (a live update)."""
        now = time.time()
        return [job_json(j, now) for j in self.state.jobs(attempts=True, changed_since=since)]

    def waiting(self, limit: int = PAGE) -> dict[str, Any]:
        """The queue: how many wait, and the newest ``limit`` of them with why each waits."""
        now = time.time()
        jobs = self.state.jobs(tuple(WAITING_STATES), attempts=True, last=limit)
        counts = self.state.counts()
        return {
            "waiting": sum(counts.get(s, 0) for s in WAITING_STATES),
            "jobs": [job_json(j, now) for j in jobs],
        }

    def counts(self) -> dict[str, int]:
        return self.state.counts()

    def version(self) -> tuple[int, ...]:
        """What changes when the state file does: its and its write-ahead log's size and
        time (the same in every thread, unlike a connection's ``data_version``)."""
        out: list[int] = []
        for suffix in ("", "-wal"):
            try:
                st = os.stat(f"{self.state.path}{suffix}")
                out += [st.st_mtime_ns, st.st_size]
            except FileNotFoundError:
                out += [0, 0]
        return tuple(out)

    def timeline(self, window_s: float = 3600.0) -> list[dict[str, Any]]:
        """The attempts that ran in the last ``window_s`` s: where (GPUs) and when."""
        return [attempt_span(a) for a in self.state.attempts_since(time.time() - window_s)]

    def shares(self) -> list[dict[str, Any]]:
        out = []
        for share in self.state.shares():
            producer = producer_status(self.state, share.name)  # a job row of its own
            # A producer outside the manager serves it: the job row found is the one that
            # ended as not needed, never named as its producer (tandem.place.outside).
            outside = producer.outside
            out.append(
                share_row(
                    share,
                    producer_job=None if outside else producer.job,
                    outside_pid=outside,
                    producer_pid=producer.pid,
                    cpus=producer.cpus,
                    started=producer.started,
                    error=producer.error,
                    jobs=self.state.share_users(share.name),
                )
            )
        return out

    def selections_of(self, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The data selections these jobs trained on (through their share groups), each once,
        with the report ``tandem select report`` gives (``report_for``, in
        :mod:`tandem.select.report`): every job that trained on it counts, of whatever group
        (a break-even is the selection's, not the page's); ``share``: the shares of these jobs
        that serve it."""
        from tandem.select import SelectError, load
        from tandem.select.report import report_for

        by_selection: dict[str, list[str]] = {}
        for name in sorted({j["share"] for j in jobs if j["share"]}):
            share = self.state.share(name)
            if share is not None and share.selection:
                by_selection.setdefault(share.selection, []).append(name)
        out = []
        for sel_id, names in sorted(by_selection.items()):
            try:
                sel = load(sel_id)
            except SelectError as exc:
                out.append({"id": sel_id, "share": ", ".join(names), "error": str(exc)})
                continue
            out.append({**report_for(sel, self.state), "share": ", ".join(names)})
        return out

    # --- a job's output -----------------------------------------------------------------------

    def log(self, job_id: int, offset: int = 0, attempt: int | None = None) -> dict[str, Any]:
        """The job's output from byte ``offset`` of its (last) attempt's log, at most
        :data:`LOG_CHUNK` bytes; ``offset`` is where to go on. A log rotated since (shorter
        than the offset) is read again from its start."""
        job = self.state.job(job_id)
        if job is None:
            raise NotFound(f"no job {job_id}")
        if not job.attempts:
            return {"job": job_id, "attempt": None, "offset": 0, "text": "", "more": False}
        n = attempt if attempt is not None else job.attempts[-1].n
        chosen = next((a for a in job.attempts if a.n == n), None)
        if chosen is None:
            raise NotFound(f"job {job_id} has no attempt {n}")
        path = self.state.attempt_dir(chosen) / "output.log"
        try:
            with open(path, "rb") as f:
                size = f.seek(0, 2)
                if not 0 <= offset <= size:  # rotated since (shorter), or nonsense: from the start
                    offset = 0
                f.seek(offset)
                data = f.read(LOG_CHUNK)
        except FileNotFoundError:
            size, data = 0, b""
        end = offset + len(data)
        return {
            "job": job_id,
            "attempt": n,
            "offset": end,
            "text": data.decode(errors="replace"),
            "more": end < size,
        }

    # --- a run's metrics (MLflow's tables) ------------------------------------------------------

    @contextlib.contextmanager
    def _store(self, owner: int | None) -> Iterator[sqlite3.Connection | None]:
        """The store of the runs of ``owner``'s jobs (None where this page has none of theirs):
        here one, this user's, whoever the owner (a daemon's jobs are its user's)."""
        yield self._runs()

    def metric_keys(self, run_id: str, owner: int | None = None) -> list[str]:
        with self._store(owner) as db:
            if db is None:
                return []
            rows = db.execute(
                "SELECT key FROM latest_metrics WHERE run_uuid = ? ORDER BY key LIMIT ?", (run_id, MAX_KEYS)
            )
            return [r[0] for r in rows]

    def latest(self, run_id: str, owner: int | None = None) -> dict[str, float]:
        with self._store(owner) as db:
            if db is None:
                return {}
            sql = "SELECT key, value FROM latest_metrics WHERE run_uuid = ? LIMIT ?"
            rows = db.execute(sql, (run_id, MAX_KEYS))
            return {k: v for k, v in rows}

    def metrics(
        self,
        run_id: str,
        keys: list[str] | None = None,
        max_points: int = MAX_POINTS,
        after_ms: int = 0,
        owner: int | None = None,
    ) -> dict[str, list[list[float]]]:
        """``key -> [[time s, value], ...]`` of a run (of ``owner``'s job), each series averaged
        into at most ``max_points`` time buckets; only points after ``after_ms`` (a live update)."""
        with self._store(owner) as db:
            return {} if db is None else _by_time(db, run_id, keys, max_points, after_ms)

    def steps(
        self,
        run_id: str,
        keys: list[str] | None = None,
        max_points: int = MAX_POINTS,
        after_ms: int = 0,
        owner: int | None = None,
    ) -> tuple[dict[str, list[list[float]]], dict[str, str]]:
        """``key -> [[step, value], ...]`` of a run, each series averaged into at most
        ``max_points`` step buckets (points after ``after_ms`` only), and each key's axis:
        ``step``, or ``time`` where all of its points share one step (a loop that logged no
        step: MLflow's 0), whose series is then :meth:`metrics`' ``[[time s, value], ...]``."""
        with self._store(owner) as db:
            if db is None:
                return {}, {}
            out: dict[str, list[list[float]]] = {}
            axis: dict[str, str] = {}
            for key, s0, s1, n in _spans(db, "step", run_id, keys, after_ms):
                if s0 == s1 and n > 1:
                    out[key] = _by_time(db, run_id, [key], max_points, after_ms).get(key, [])
                    axis[key] = "time"
                    continue
                rows = _buckets(db, "step", run_id, key, after_ms, s0, s1, max_points)
                out[key], axis[key] = [[s, v] for s, v in rows], "step"
            return out, axis


def attempt_span(a: Attempt) -> dict[str, Any]:
    """An attempt on the timeline: where (GPUs) and when, and what it held."""
    p = a.placement
    return {
        "job_id": a.job_id,
        "n": a.n,
        "state": a.state,
        "started": a.started,
        "ended": a.ended,
        "gpus": list(p.gpus),
        "gpu_mem_bytes": p.gpu_mem,
        "cause": a.cause,
        "peak_gpu_mem_bytes": a.peak_gpu_mem,
        "peak_mem_bytes": a.peak_mem,
    }


def share_row(share: Share, **producer: Any) -> dict[str, Any]:
    """A share group as the page lists it: its data, and its producer now (``producer``:
    ``producer_job``, ``outside_pid``, ``producer_pid``, ``cpus``, ``started``, ``error``,
    ``jobs``)."""
    spec = share.spec
    return {
        "name": share.name,
        "source": spec.source,
        "ref": spec.ref,
        "batch_size": spec.batch_size,
        **producer,
    }


def _by_time(
    db: sqlite3.Connection, run_id: str, keys: list[str] | None, max_points: int, after_ms: int
) -> dict[str, list[list[float]]]:
    """:meth:`Reader.metrics` of one store."""
    out: dict[str, list[list[float]]] = {}
    for key, t0, t1, _ in _spans(db, "timestamp", run_id, keys, after_ms):
        rows = _buckets(db, "timestamp", run_id, key, after_ms, t0, t1, max_points)
        out[key] = [[round(t / 1000.0, 3), v] for t, v in rows]
    return out


def _spans(
    db: sqlite3.Connection, column: str, run_id: str, keys: list[str] | None, after_ms: int
) -> list[tuple[str, float, float, int]]:
    """``(key, lowest, highest, points)`` of ``column`` (``timestamp`` or ``step``) for each
    of a run's series (``keys`` only, where given), its points after ``after_ms``."""
    where, args = "run_uuid = ? AND timestamp > ? AND is_nan = 0", [run_id, after_ms]
    if keys:
        where += f" AND key IN ({', '.join('?' for _ in keys)})"
        args += keys
    sql = f"SELECT key, min({column}), max({column}), count(*) FROM metrics WHERE {where} GROUP BY key"
    sql += " LIMIT ?"
    return db.execute(sql, [*args, MAX_KEYS]).fetchall()


def _buckets(
    db: sqlite3.Connection, column: str, run_id: str, key: str, after_ms: int, lo: float, hi: float, most: int
) -> list[tuple[float, float]]:
    """One series averaged into at most ``most`` buckets (1 to ``MAX_POINTS``) of ``column``
    from ``lo`` to ``hi``."""
    most = max(1, min(int(most), MAX_POINTS))
    width = max(1, -(-(hi - lo + 1) // most))
    return db.execute(
        f"SELECT avg({column}), avg(value) FROM metrics WHERE run_uuid = ? AND key = ? "
        f"AND timestamp > ? AND is_nan = 0 GROUP BY ({column} - ?) / ? ORDER BY 1",
        (run_id, key, after_ms, lo, width),
    ).fetchall()


def logged_by_the_job(keys: Iterable[str]) -> list[str]:
    """The keys a job logged itself (loss, accuracy), as the sweep report picks them: none of
    the hardware series and summaries that tandem.watch logs (``system/``, ``summary/``)."""
    from tandem.place import own_metrics  # the rule's one place (imported late: numpy)

    return own_metrics(keys)


def run_of(job: dict[str, Any], attempt: int | None) -> str | None:
    """The MLflow run of a job's attempt ``attempt`` (None: its latest run), as
    :meth:`Reader.job` gives the job; :class:`NotFound` where it has no such attempt."""
    if attempt is None:
        return job["mlflow_run_id"]
    chosen = next((a for a in job["attempts"] if a["n"] == attempt), None)
    if chosen is None:
        raise NotFound(f"job {job['id']} has no attempt {attempt}")
    return chosen["mlflow_run_id"]


def energy_of(latest: dict[str, float]) -> dict[str, float]:
    """A run's energy in joules, measured kept apart from estimated, as watch sums it for
    the run's summary, from its latest metrics (the sweep report's own reading of it)."""
    from tandem.place import energy_by_kind

    return {f"{kind}_joules": joules for kind, joules in energy_by_kind(latest).items()}
