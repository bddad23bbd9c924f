"""The dashboard's live stream: server-sent events (``GET /api/events``).

The server looks four times a second whether the state file changed (the size and time
of it and its write-ahead log: two ``stat`` calls) and, only then, reads the jobs whose
row changed since its last look. Events, each a JSON object:

============  =====================================================================
``jobs``      ``{"jobs": [...], "counts": {...}}``: jobs that changed (``ls --json``'s fields)
``status``    ``{"daemon": ..., "why_not": ...}``: the daemon's capacity and use, every 2 s
``log``       ``{"job", "attempt", "offset", "text"}``: new output of the job followed (``?job=ID``)
``metrics``   ``{"job", "run_id", "series": {key: [[t, v], ...]}, "logged_keys"}``: its new
              metric points, every second (``logged_keys``: the keys among them the job logged itself)
============  =====================================================================

Each event's id is the stream's cursor (``since``, log offset, last metric time), so a
browser that reconnects (``EventSource`` sends ``Last-Event-ID``) goes on where it was.
A page starts a stream with ``?since=`` set to the ``now`` of the snapshot it loaded.
"""

from __future__ import annotations

import asyncio
import json
import math
import sqlite3
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Protocol

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import StreamingResponse

from tandem.place import DaemonError, strict_json
from tandem.web.data import MAX_ID, logged_by_the_job

if TYPE_CHECKING:
    from tandem.web.data import Reader


class DaemonAsked(Protocol):
    """What a stream reads of the daemon (:class:`tandem.web.app.Daemon`, whose app imports
    this module: a protocol, so that no module circle forms)."""

    why_not: str

    def status(self) -> dict[str, Any] | None: ...


POLL_S = 0.25
STATUS_EVERY_S = 2.0
METRICS_EVERY_S = 1.0
KEEPALIVE_S = 15.0


def _cursor(request: Request) -> dict[str, float]:
    """Where the stream starts: the Last-Event-ID of a reconnect, else the query."""
    cursor = {"since": time.time(), "log": 0.0, "metrics": 0.0}
    for name in ("since", "log_offset", "metrics_after"):
        value = request.query_params.get(name)
        if value:
            try:
                number = float(value)
            except ValueError:
                continue
            if math.isfinite(number):  # since=NaN would match no change, ever
                cursor[{"log_offset": "log", "metrics_after": "metrics"}.get(name, name)] = number
    last = request.headers.get("last-event-id", "")
    try:
        given = {k: float(v) for k, v in json.loads(last).items() if k in cursor}
        cursor.update({k: v for k, v in given.items() if math.isfinite(v)})
    except (ValueError, TypeError, AttributeError):
        pass
    return cursor


def _offset(value: float) -> int:
    """A cursor's number as a byte offset or a time: whole, from 0 (a forged one is clamped)."""
    return int(value) if value == value and 0 <= value < 2**62 else 0


def _event(kind: str, data: Any, cursor: dict[str, float]) -> str:
    return f"id: {json.dumps(cursor, separators=(',', ':'))}\nevent: {kind}\ndata: {strict_json(data)}\n\n"


MAX_STREAMS = 32  # open event streams at most (one token: every client shares it)


class Streams:
    """The open event streams, oldest first: past ``limit`` the oldest is closed (a page
    left open somewhere reconnects; a flood of streams cannot take the machine's cores)."""

    def __init__(self, limit: int = MAX_STREAMS) -> None:
        self.limit = max(1, limit)
        self._open: list[asyncio.Event] = []

    def open(self) -> asyncio.Event:
        while len(self._open) >= self.limit:
            self._open.pop(0).set()  # the oldest ends at its next poll
        closing = asyncio.Event()
        self._open.append(closing)
        return closing

    def close(self, closing: asyncio.Event) -> None:
        if closing in self._open:
            self._open.remove(closing)


async def events(
    request: Request, reader: Reader, daemon: DaemonAsked, streams: Streams
) -> StreamingResponse:
    job_id = request.query_params.get("job")
    follow = int(job_id) if job_id and job_id.isdigit() and int(job_id) <= MAX_ID else None
    cursor = _cursor(request)

    async def stream() -> AsyncIterator[str]:
        closing = streams.open()
        try:
            async for chunk in _stream(closing):
                yield chunk
        finally:
            streams.close(closing)

    async def _stream(closing: asyncio.Event) -> AsyncIterator[str]:
        followed = follow
        version = None
        next_status = next_metrics = 0.0
        last_sent = time.monotonic()
        yield "retry: 1000\n\n"
        while not closing.is_set() and not await request.is_disconnected():
            now = time.monotonic()
            out: list[str] = []
            try:
                seen = await run_in_threadpool(reader.version)
                if seen != version:
                    looked = time.time()
                    changed = await run_in_threadpool(reader.changed, cursor["since"] - 0.5)
                    if changed:
                        # 0.5 s of overlap: a row written as we looked is sent again rather than lost.
                        counts = await run_in_threadpool(reader.counts)
                        cursor["since"] = looked
                        out.append(_event("jobs", {"jobs": changed, "counts": counts}, cursor))
                    version = seen  # read: a read that failed is made again at the next round
                log = None
                if followed is not None:
                    try:
                        log = await run_in_threadpool(reader.log, followed, _offset(cursor["log"]))
                    except LookupError:  # no such job: nothing to follow (the page says so)
                        followed = None
                if followed is not None and log is not None:
                    if log["text"] or log["offset"] < cursor["log"]:
                        cursor["log"] = log["offset"]
                        out.append(_event("log", log, cursor))
                    if now >= next_metrics:
                        next_metrics = now + METRICS_EVERY_S
                        update = await run_in_threadpool(
                            _new_points, reader, followed, _offset(cursor["metrics"])
                        )
                        if update:
                            cursor["metrics"] = update["after_ms"]
                            out.append(_event("metrics", update, cursor))
            except (DaemonError, sqlite3.Error):
                # The host's manager not answering now (the status event says why), or a run's
                # store unreadable for now: the next round asks again; the stream stays open.
                pass
            if now >= next_status:
                next_status = now + STATUS_EVERY_S
                status = await run_in_threadpool(daemon.status)
                out.append(_event("status", {"daemon": status, "why_not": daemon.why_not}, cursor))
            if out:
                last_sent = now
                yield "".join(out)
            elif now - last_sent > KEEPALIVE_S:
                last_sent = now
                yield ": keep-alive\n\n"
            await asyncio.sleep(POLL_S)

    headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    return StreamingResponse(stream(), media_type="text/event-stream", headers=headers)


def _new_points(reader: Any, job_id: int, after_ms: int) -> dict[str, Any] | None:
    """The followed job's metric points after ``after_ms``, or None if there are none."""
    job = reader.state.job(job_id, attempts=False)  # its run id only: not events, not its share
    run = job.mlflow_run_id if job is not None else None
    if not run:
        return None
    series = reader.metrics(run, None, 2000, after_ms, job.owner)  # job is there: its run id was read
    if not series:
        return None
    last = max(points[-1][0] for points in series.values() if points)
    logged = logged_by_the_job(series)  # the page charts these by step: it asks for them anew
    return {
        "job": job_id,
        "run_id": run,
        "series": series,
        "logged_keys": logged,
        "after_ms": int(last * 1000),
    }
