"""How jobs are shown: the ``--json`` objects (field names fixed by the interface) and the
rows of ``tandem ls``."""

from __future__ import annotations

import functools
import json
import math
from dataclasses import fields
from typing import Any

from tandem.place import clock
from tandem.place.fields import meta
from tandem.place.model import PRODUCER_ROLE, RUNNING, WAITING_STATES, format_size, param_value
from tandem.place.records import Attempt, Job
from tandem.place.reserve import AUTO_CPUS


def _placement(attempt: Attempt | None) -> dict[str, Any] | None:
    """An attempt's placement as ``--json`` shows it (its shown fields; lists, not tuples)."""
    if attempt is None:
        return None
    shown = record_json(attempt.placement)
    # its reservation's figures under the names the dashboard and earlier tandems read
    flat = attempt.placement.flat_figures()
    shown |= {"gpu_mem_bytes": flat["gpu_mem"], "cpus": flat["cpus"], "cpus_from": flat["cpus_from"]}
    return {k: list(v) if isinstance(v, tuple) else v for k, v in shown.items()}


def _reservation(job: Job, last: Attempt | None) -> dict[str, Any]:
    """The cores and RAM a job reserves and where each comes from: given (--cpus N, --mem
    SIZE), or for auto what its attempt was given (learnt for its job key, a probe, its
    measurement; RAM: its key's peak, raised to its own as it grows)."""
    recorded = last is not None and last.placement.reservation is not None
    flat = last.placement.flat_figures() if last is not None else {}
    if job.mem:
        mem: dict[str, Any] = {"mem_bytes": job.mem, "mem_from": "given"}
    elif recorded:  # as its attempt started, or raised to its measurement since
        mem = {"mem_bytes": flat["mem"] or None, "mem_from": flat["mem_from"]}
    else:
        mem = {"mem_bytes": None, "mem_from": "auto: learnt when it starts"}
    if job.cpus != AUTO_CPUS:
        return {"cpus": job.cpus, "from": "given", **mem}
    if not recorded:
        return {"cpus": None, "from": "auto: learnt when it starts", **mem}
    return {"cpus": flat["cpus"], "from": flat["cpus_from"], **mem}


def attempt_json(a: Attempt) -> dict[str, Any]:
    return {
        "n": a.n,
        "state": a.state,
        "exit_code": a.exit_code,
        "signal": a.signal,
        "cause": a.cause,
        "cause_line": a.cause_line,
        "placement": _placement(a),
        "started": a.started,
        "ended": a.ended,
        "peak_mem_bytes": a.peak_mem,
        "peak_gpu_mem_bytes": a.peak_gpu_mem,
        "cpu_seconds": a.cpu_seconds,
        "mlflow_run_id": a.mlflow_run_id,
    }


def run_seconds(job: Job, now: float | None = None) -> float | None:
    if not job.attempts:
        return None
    now = clock.now() if now is None else now
    return sum((a.ended or now) - a.started for a in job.attempts if a.state != "lost")


def wait_seconds(job: Job, now: float) -> float:
    """How long it waited before it started (still waits: until ``now``)."""
    until = job.started or (now if job.state in WAITING_STATES else job.ended or now)
    return max(0.0, until - job.submitted)


def waiting_reason(job: Job) -> str | None:
    """Why a waiting job waits: the daemon's last word on it, else that no pass has seen it."""
    if job.state not in WAITING_STATES:
        return None
    return job.reason or "not yet looked at by the daemon (a running daemon looks within a second)"


@functools.cache
def _shown(cls: type) -> list[tuple[str, str | None, str]]:
    """``(field, the object it goes under or None, its key)`` of ``cls``'s shown fields."""
    return [
        (f.name, meta(f, "under"), meta(f, "json_key") or f.name) for f in fields(cls) if meta(f, "shown")
    ]


def record_json(record: Any) -> dict[str, Any]:
    """A record's shown fields, by their ``--json`` keys (:func:`tandem.place.fields.column`)."""
    out: dict[str, Any] = {}
    for name, under, key in _shown(type(record)):  # type: ignore[arg-type]  # mypy: a class is not Hashable
        into = out.setdefault(under, {}) if under else out
        into[key] = getattr(record, name)
    return out


@functools.cache  # a listing names each owner of thousands of jobs
def user_name(uid: int | None) -> str:
    """A job owner's login name (its uid where the host has none; ``-``: no owner kept)."""
    import pwd

    if uid is None:
        return "-"
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def job_json(job: Job, now: float | None = None) -> dict[str, Any]:
    """A job as ``--json`` prints it: its shown fields (declared with the record) and what is
    worked out from them. Times are seconds since the epoch."""
    now = clock.now() if now is None else now
    last = job.attempts[-1] if job.attempts else None
    shown = record_json(job)
    # A NaN or infinity a job was given (a state file of before params were kept as text): its
    # text, as MLflow has it; JSON has no such number.
    shown["params"] = {k: _finite_or_text(v) for k, v in (job.params or {}).items()}
    if job.cpus == AUTO_CPUS:
        shown["request"]["cpus"] = "auto"
    return {
        **shown,
        "reservation": _reservation(job, last),
        "reason": waiting_reason(job),
        "starting": starting(job),
        "attempts": [attempt_json(a) for a in job.attempts],
        "placement": _placement(last),
        "wait_s": wait_seconds(job, now),
        "run_s": run_seconds(job, now),
        "user": None if job.owner is None else user_name(job.owner),  # its owner's login name
    }


def _finite_or_text(value: Any) -> Any:
    return param_value(value) if isinstance(value, float) and not math.isfinite(value) else value


def json_safe(value: Any) -> Any:
    """``value`` with each NaN or infinity (a metric, a measure) as null: JSON has no such
    number, and a page or a ``--json`` reader would fail on Python's ``NaN``."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def strict_json(value: Any, **options: Any) -> str:
    """``value`` as strict JSON (:func:`json_safe`): what every ``--json`` prints."""
    try:  # the usual case, at no cost: no NaN anywhere
        return json.dumps(value, allow_nan=False, **options)
    except ValueError:
        return json.dumps(json_safe(value), allow_nan=False, **options)


def strict_json_lines(items: list[Any]) -> str:
    """A list as strict JSON, one item a line: what ``ls --json`` prints. Python's JSON
    encoder is its C one only without ``indent``: ten thousand jobs indented took 2 s."""
    if not items:
        return "[]"
    return "[\n" + ",\n".join(f"  {strict_json(item)}" for item in items) + "\n]"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def starting(job: Job) -> bool:
    """Running, but its supervisor has not shown itself yet: on a Ray cluster, Ray is
    placing its actor or the node is starting a worker for it (its run has not begun)."""
    last = job.attempts[-1] if job.attempts else None
    return job.state == RUNNING and last is not None and last.shim_pid is None and last.ended is None


def ls_row(job: Job, now: float | None = None) -> list[str]:
    """The row of ``tandem ls`` (what ``--json`` says, worked out for only these columns:
    ``ls`` prints thousands)."""
    now = clock.now() if now is None else now
    placement = job.attempts[-1].placement if job.attempts else None
    where = placement.where if placement is not None else "-"
    if placement is not None and placement.mps:
        where += " mps"
    cause = "" if job.state in ("running", "succeeded") else (job.cause or "")
    if job.state in WAITING_STATES:
        cause = waiting_reason(job) or ""
    if job.state == "failed" and job.cause_line and job.cause_line not in cause:
        cause = f"{cause}: {job.cause_line}"  # what it said last: why, most often
    if job.state == "retrying" and job.attempts:
        cause = f"{job.attempts[-1].cause} (retry {len(job.attempts)}/{job.retries}); {cause}"
    return [
        str(job.id),
        (job.name or "-") + (" [producer]" if job.role == PRODUCER_ROLE else ""),
        "starting" if starting(job) else job.state,
        job.group or job.share or "-",
        where,
        str(len(job.attempts)),
        _duration(wait_seconds(job, now)),
        _duration(run_seconds(job, now)),
        format_size(job.peak_mem),
        format_size(job.peak_gpu_mem),
        cause,
    ]


LS_COLUMNS = ["id", "name", "state", "group", "where", "tries", "wait", "run", "mem", "gpu mem", "cause"]
