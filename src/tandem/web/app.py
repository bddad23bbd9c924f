"""The dashboard's web application: the page, its JSON API and its live stream.

=========================================  =====================================================
``GET /``                                  the page (``#/``, ``#/job/ID``, ``#/group/NAME``)
``GET /api/jobs?state=&before=&limit=``    a page of jobs, newest first (``tandem ls --json``'s fields)
``GET /api/jobs/ID``                       one job (``tandem show --json``'s fields, with its events)
``GET /api/jobs/ID/log?offset=``           its output from a byte offset
``GET /api/jobs/ID/metrics?key=&points=``  its run's metrics, at most 2,000 points a series
``POST /api/jobs/ID/cancel``               cancel it (through the daemon)
``POST /api/login``                        a tab's session token for a one-time code (see ``access``)
``GET /api/queue``                         the waiting jobs, each with its reason
``GET /api/gpus``                          the daemon's capacity and use (GPUs, host), or why none
``GET /api/timeline?window=``              the attempts of the last ``window`` s, where and when
``GET /api/shares``                        the share groups: producer, jobs, live statistics
``GET /api/groups/NAME``                   a sweep: its jobs and its report (``tandem report group:NAME``'s)
``GET /api/events``                        server-sent events (:mod:`tandem.web.live`)
=========================================  =====================================================

A job's metrics: ``key`` (repeated; none: every key), ``points``, ``after`` (ms: later points
only), ``attempt`` (that attempt's run; default the latest), ``by`` (``time``; ``step``: each
series ``[[step, value], ...]``, unless its ``axis`` says ``time``: all its points at one
step). ``logged_keys``: the keys the job logged itself (loss, accuracy), for the job page.

Every route is behind :class:`tandem.web.access.Access`. A job's environment is never sent.
"""

from __future__ import annotations

import dataclasses
import sqlite3
import time
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.middleware.gzip import GZipMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse
from starlette.responses import JSONResponse as _JSONResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from tandem.place import STATES, DaemonError, StateError, json_safe, user_name
from tandem.web.access import LOOPBACK_HOSTS, Access, Sessions
from tandem.web.data import MAX_ID, NotFound, Reader, energy_of, logged_by_the_job, run_of
from tandem.web.live import MAX_STREAMS, Streams, events
from tandem.web.remote import RemoteReader

STATIC = Path(__file__).parent / "static"


class JSONResponse(_JSONResponse):
    """Starlette's, with each NaN or infinity (a job's metric, a measure) as null: its own
    refuses them (allow_nan=False), and a 500 would take the page down."""

    def render(self, content: Any) -> bytes:
        try:  # the usual case, at no cost: no NaN anywhere
            return super().render(content)
        except ValueError:
            return super().render(json_safe(content))


class Daemon:
    """The daemon's status, asked at most once a second (None: no daemon answers)."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self._at = 0.0
        self._status: dict[str, Any] | None = None
        self.why_not = ""

    def status(self) -> dict[str, Any] | None:
        from tandem.place import protocol, request

        if time.monotonic() - self._at >= 1.0:
            self._at = time.monotonic()
            try:
                self._status, self.why_not = (
                    dataclasses.asdict(request(self.state_dir, protocol.Status(), 1.0)),
                    "",
                )
            except DaemonError as exc:
                self._status, self.why_not = None, str(exc)
            for user in (self._status or {}).get("users") or []:  # a system manager's, by name
                user["name"] = user_name(user["uid"])
        return self._status

    def cancel(self, job_id: int) -> dict[str, Any]:
        from tandem.place import protocol, request

        return dataclasses.asdict(request(self.state_dir, protocol.Cancel([job_id]), 5.0))


def _int(request: Request, name: str, default: int | None = None) -> int | None:
    value = request.query_params.get(name)
    if value is None or value == "":
        return default
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r}: not a whole number") from None
    if not -MAX_ID <= number <= MAX_ID:
        raise ValueError(f"{name}={value!r}: out of range")
    return number


def _job_id(request: Request) -> int:
    """The job id of the path, :class:`NotFound` if no job can have it."""
    job_id = request.path_params["id"]
    if not 0 < job_id <= MAX_ID:
        raise NotFound(f"no job {job_id}")
    return job_id


def _bad(why: str, status: int = 400) -> JSONResponse:
    return JSONResponse({"error": why}, status)


async def _unreadable(_request: Request, exc: Exception) -> JSONResponse:
    """The state lost, replaced under its daemon, or unreadable: said as the CLI says it.
    Under a system manager, the same for its socket: the manager stopped, busy past the
    read's time limit, or lost mid-read; and for a run's store that could not be read (locked,
    not a database, or its read stopped at its time limit): the page says so and asks again,
    never a bare 500."""
    return _bad(str(exc), 503)


def build(
    state_dir: Path,
    mlflow_db: Path | None,
    sessions: Sessions | str,
    hosts: frozenset[str] | None = None,
    max_streams: int = MAX_STREAMS,
    port: int = 80,
    remote: Path | None = None,
) -> Any:
    """The ASGI application for ``state_dir`` (``sessions``: who is logged in, or one fixed
    session token, for a script's or a test's own server; ``hosts``: the Host names to
    accept; ``max_streams``: open event streams at most, the oldest closed first; ``port``:
    the server's, which a Host header must name: 80, http's default, may go unnamed;
    ``remote``: the socket of the host's system manager, whose state is read through it)."""
    if isinstance(sessions, str):
        sessions = Sessions.of_token(sessions)

    streams = Streams(max_streams)
    reader = Reader(state_dir, mlflow_db) if remote is None else RemoteReader(remote, mlflow_db)
    daemon = Daemon(state_dir)

    def index(request: Request) -> FileResponse:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-store"})

    def jobs(request: Request) -> JSONResponse:
        states = tuple(s for s in request.query_params.get("state", "").split(",") if s)
        unknown = set(states) - set(STATES)
        if unknown:
            return _bad(f"unknown state {sorted(unknown)}; one of {', '.join(STATES)}")
        try:
            before, limit = _int(request, "before"), _int(request, "limit", 100)
        except ValueError as exc:
            return _bad(str(exc))
        group = request.query_params.get("group") or None
        return JSONResponse(reader.jobs(states or None, before, limit or 100, group))

    def job(request: Request) -> JSONResponse:
        try:
            return JSONResponse(reader.job(_job_id(request)))
        except NotFound as exc:
            return _bad(str(exc), 404)

    def log(request: Request) -> JSONResponse:
        try:
            offset = _int(request, "offset", 0) or 0
            return JSONResponse(reader.log(_job_id(request), offset, _int(request, "attempt")))
        except NotFound as exc:
            return _bad(str(exc), 404)
        except ValueError as exc:
            return _bad(str(exc))

    def metrics(request: Request) -> JSONResponse:
        try:
            data = reader.job(_job_id(request))
            points = _int(request, "points", 2000) or 2000
            after = _int(request, "after", 0) or 0
            attempt = _int(request, "attempt")
            by = request.query_params.get("by") or "time"
            if by not in ("time", "step"):
                raise ValueError(f"by={by!r}: time or step")
            run = run_of(data, attempt)
        except NotFound as exc:
            return _bad(str(exc), 404)
        except ValueError as exc:
            return _bad(str(exc))
        keys = request.query_params.getlist("key")
        answer: dict[str, Any] = {"job": data["id"], "attempt": attempt, "run_id": run}
        if not run:
            return JSONResponse(
                {**answer, "keys": [], "logged_keys": [], "series": {}, "axis": {}, "energy": {}}
            )
        owner = data.get("owner")  # whose store the run is in (a system manager's user's own)
        if by == "step":
            series, axis = reader.steps(run, keys or None, points, after, owner)
        else:
            series = reader.metrics(run, keys or None, points, after, owner)
            axis = dict.fromkeys(series, "time")
        every = reader.metric_keys(run, owner)
        return JSONResponse(
            {
                **answer,
                "keys": every,
                "logged_keys": logged_by_the_job(every),
                "series": series,
                "axis": axis,
                "energy": energy_of(reader.latest(run, owner)),
            }
        )

    def cancel(request: Request) -> JSONResponse:
        from tandem.place import DaemonNotRunning

        try:
            return JSONResponse(daemon.cancel(_job_id(request)))
        except NotFound as exc:
            return _bad(str(exc), 404)
        except DaemonNotRunning as exc:
            return _bad(f"{exc}: start it (tandem daemon start) to cancel a job", 503)
        except DaemonError as exc:
            return _bad(str(exc), 502)

    def queue(request: Request) -> JSONResponse:
        return JSONResponse(reader.waiting())

    def gpus(request: Request) -> JSONResponse:
        status = daemon.status()
        return JSONResponse({"daemon": status, "why_not": daemon.why_not, "counts": reader.counts()})

    def timeline(request: Request) -> JSONResponse:
        try:
            window = _int(request, "window", 3600) or 3600
        except ValueError as exc:
            return _bad(str(exc))
        return JSONResponse({"now": time.time(), "attempts": reader.timeline(window)})

    def shares(request: Request) -> JSONResponse:
        from tandem.share.stats import query_all

        live: dict[str, Any] = {}
        for s in query_all(timeout=0.5):
            entry = dataclasses.asdict(s) if dataclasses.is_dataclass(s) else dict(s)
            live[entry["name"]] = entry
        out = reader.shares()
        for share in out:
            share["live"] = live.get(share["name"])
        return JSONResponse({"shares": out})

    def group(request: Request) -> JSONResponse:
        """A sweep: its jobs as listed, and its report as ``tandem report group:NAME`` gives it
        (one computation: :func:`tandem.place.sweep_report.group_report`)."""
        from tandem.place import group_report

        name = request.path_params["name"]
        page = reader.jobs(group=name, limit=1000)
        # A system manager's: its jobs read through the manager, their metrics from the
        # store of the user who serves the page (reader.mlflow_db).
        sweep = group_report(reader.state, name, reader.mlflow_db)
        return JSONResponse(
            {
                "group": name,
                "jobs": page["jobs"],
                "report": sweep,
                "selections": reader.selections_of(page["jobs"]),
            }
        )

    async def live(request: Request) -> Any:
        return await events(request, reader, daemon, streams)

    routes = [
        Route("/", index),
        Route("/api/jobs", jobs),
        Route("/api/jobs/{id:int}", job),
        Route("/api/jobs/{id:int}/log", log),
        Route("/api/jobs/{id:int}/metrics", metrics),
        Route("/api/jobs/{id:int}/cancel", cancel, methods=["POST"]),
        Route("/api/queue", queue),
        Route("/api/gpus", gpus),
        Route("/api/timeline", timeline),
        Route("/api/shares", shares),
        Route("/api/groups/{name:path}", group),  # a group's name may hold any character, "/" too
        Route("/api/events", live),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    unreadable = {StateError: _unreadable, DaemonError: _unreadable, sqlite3.Error: _unreadable}
    app = Starlette(routes=routes, exception_handlers=unreadable)
    packed = GZipMiddleware(app, minimum_size=1024)

    async def compressed(scope: Any, receive: Any, send: Any) -> None:
        # JSON and the page compress ~10x; the event stream is sent as it comes, unbuffered.
        live = scope["type"] == "http" and scope["path"] == "/api/events"
        await (app if live else packed)(scope, receive, send)

    return Access(compressed, sessions, port, hosts if hosts is not None else LOOPBACK_HOSTS)
