"""The job manager's wire protocol: typed requests and replies over the daemon's socket.

One ``SOCK_SEQPACKET`` Unix socket per state directory, in tandem's private runtime
directory (:mod:`tandem._ipc`): ``place/<hash of the state directory>.sock``. A client
connects, sends one request packet, reads one reply packet, closes. Reads (``ls``,
``show``, ``logs``, ``wait``) go to the state file, not here, except under the host's system
manager (``tandem daemon start --system``: its socket ``/run/tandem/daemon.sock``, its file
root's), where they are :class:`ReadJobs` and :class:`ReadLog`. Each request is the socket
peer's, as the kernel says (``SO_PEERCRED``: :class:`tandem.place.model.Peer`), never a
field of the request.

Every message is one record below, named once: the client builds a request record, the
daemon reads it back with :func:`read_request` and answers with a reply record, which the
client reads with :func:`read_reply`. On the wire a record is a JSON object of its fields,
with ``op`` on a request and ``ok`` on a reply; a reply that is not ``ok`` is a
:class:`Failure` (``refused``: the request was understood and refused, the client's exit 2).

==============  ===========================  ==============================================
request         fields                       reply
==============  ===========================  ==============================================
:class:`Submit` ``job``: a :class:`JobSpec`  :class:`Submitted`: ``id``, ``new``
:class:`SubmitSweep` ``job``, ``points``     :class:`SweepSubmitted`: ``ids``, ``group``
:class:`SubmitMany` ``jobs``                 :class:`SweepSubmitted`: ``ids`` (all or none)
:class:`Cancel` ``ids``, ``group``, ``everything``  :class:`Cancelled`: ``cancelled``, ``unknown``, ``ended``
:class:`Status` -                            :class:`DaemonStatus`: pid, policy, capacity, use, ...
:class:`Stop`   -                            :class:`Stopping` (the daemon exits; jobs go on)
:class:`Wake`   -                            none (a supervisor's result is ready: look now)
:class:`DefineShare` ``spec``, ``select_job``  :class:`ShareDefined`: ``name``, ``select_job``
:class:`RemoveShares` ``names``              :class:`SharesRemoved`: ``removed``, ``unknown``, ``in_use``
:class:`NotStarted` ``job_id``, ``attempt``, ``why``  :class:`PutBack`: ``state`` (the job's now)
:class:`ReadJobs` ``states``, ``last``, ``job_id``  :class:`JobRows`: ``jobs`` (others' redacted), ``events``
:class:`ReadLog` ``job_id``                  :class:`LogParts`: each attempt's output (its owner's only)
==============  ===========================  ==============================================

A supervisor that could not start its job (the state's disk refused its first write) sends
:class:`NotStarted`: the daemon puts the job back in the queue (or ends it, if it was
cancelled meanwhile) and no job starts until the disk takes writes again. The socket needs no
disk: the supervisor sends it again until the daemon has recorded it.

Share definitions are written by the daemon alone (the state's one writer): ``tandem share
define`` and ``share rm`` send :class:`DefineShare` and :class:`RemoveShares`.

A message over the packet limit travels in an anonymous memory file whose descriptor the
packet carries (:func:`pack`, :func:`unpack`), both ways: a request (a job with a large
environment, a sweep's points) and a reply (a sweep's or a ``cancel --all``'s ids, any
number of them). It takes no disk, so a reply is never lost to its size or to a full disk.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar, Union

from tandem.place.model import JobSpec
from tandem.place.packets import (  # noqa: F401 (re-exported)
    MAX_BODY,
    decode,
    encode,
    exchange,
    pack,
    socket_path,
    unpack,
)
from tandem.place.resources import Resources
from tandem.share.spec import ShareSpec

T = TypeVar("T")


# --- requests -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Submit:
    """Queue ``job`` (``job.token`` makes a retried submit return the job it made)."""

    OP: ClassVar[str] = "submit"
    job: JobSpec


@dataclass(frozen=True)
class SubmitSweep:
    """Queue one job per point of a sweep, in one transaction: ``job`` with each point's
    values put into its ``{KEY}`` placeholders (:mod:`tandem.place.sweep`), its ``params``
    the point, its token ``job.token:i``."""

    OP: ClassVar[str] = "submit_sweep"
    job: JobSpec
    points: list[dict[str, Any]] = field(default_factory=list)
    fill_env: list[str] = field(default_factory=list)  # the variables given with --env


@dataclass(frozen=True)
class SubmitMany:
    """Queue these jobs in one transaction, all of them or none (``tandem.jobs.submit_many``):
    each is checked as a :class:`Submit` is; one refused refuses the request, naming it."""

    OP: ClassVar[str] = "submit_many"
    jobs: list[JobSpec] = field(default_factory=list)


@dataclass(frozen=True)
class Cancel:
    """Cancel these jobs: a waiting one ends at once, a running one is stopped. ``group``:
    every waiting or running job of the group; ``everything``: every one."""

    OP: ClassVar[str] = "cancel"
    ids: list[int] = field(default_factory=list)
    group: str | None = None
    everything: bool = False


@dataclass(frozen=True)
class Status:
    OP: ClassVar[str] = "status"


@dataclass(frozen=True)
class Stop:
    OP: ClassVar[str] = "stop"


@dataclass(frozen=True)
class Wake:
    OP: ClassVar[str] = "wake"


@dataclass(frozen=True)
class DefineShare:
    """Define (or redefine) the share ``spec``. ``select_job``: the job that makes its data
    selection once, queued with the definition (its id kept in it; the group's jobs wait for it)."""

    OP: ClassVar[str] = "define-share"
    spec: ShareSpec
    select_job: JobSpec | None = None
    # A public share's: the definer's environment and directory, its producer's whoever's job
    # starts it (another user's job's would run their code as the definer).
    env: dict[str, str] | None = None
    cwd: str | None = None


@dataclass(frozen=True)
class RemoveShares:
    """Remove these share definitions, each unless a job not yet ended reads it."""

    OP: ClassVar[str] = "remove-shares"
    names: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class NotStarted:
    """From a supervisor: attempt ``attempt`` of job ``job_id`` never started its job (``why``:
    the disk refused its first write); put the job back in the queue."""

    OP: ClassVar[str] = "not-started"
    job_id: int
    attempt: int
    why: str = ""


@dataclass(frozen=True)
class AutoShare:
    """From a running job's drop-in loader (:class:`tandem.share.DataLoader`, through
    ``tandem share auto``): serve ``spec`` (source ``auto``: what the loader would send its
    workers) to it and its sweep, from a producer job of the daemon's."""

    OP: ClassVar[str] = "auto-share"
    job_id: int
    spec: ShareSpec


@dataclass(frozen=True)
class ReadJobs:
    """Read the state through the daemon (a system manager's users may not read its file):
    the jobs in ``states`` (all: empty), the newest ``last`` before ``before``; or the job
    ``job_id`` with its attempts and events. Another user's jobs come without their command,
    working directory, parameters, names or log lines; another user's job asked by id is refused."""

    OP: ClassVar[str] = "read-jobs"
    states: list[str] = field(default_factory=list)
    last: int | None = None
    before: int | None = None
    job_id: int | None = None
    group: str | None = None  # of this group only, and the asker's own jobs of it
    changed_since: float | None = None  # only those whose row changed since (a live view's update)
    counts: bool = False  # and how many jobs are in each state (the host's, every user's)
    shares: list[str] | None = None  # only those reading these shares, the asker's own of them
    # and, under ``private``, the last succeeded job of each of these job keys that read no
    # share (the asker's own): what a sweep's report compares sharing against
    private_of: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ReadLog:
    """A job of the asker's own: each attempt's output since ``seen`` (``[n, inode, end]``
    of each attempt shown so far: ``tandem logs -f`` asks again for what came since)."""

    OP: ClassVar[str] = "read-log"
    job_id: int = 0
    seen: list[list[int]] = field(default_factory=list)


Request = Union[
    Submit,
    SubmitSweep,
    SubmitMany,
    Cancel,
    Status,
    Stop,
    Wake,
    DefineShare,
    RemoveShares,
    NotStarted,
    AutoShare,
    ReadJobs,
    ReadLog,
]

REQUESTS: dict[str, type] = {
    cls.OP: cls
    for cls in (
        Submit,
        SubmitSweep,
        SubmitMany,
        Cancel,
        Status,
        Stop,
        Wake,
        DefineShare,
        RemoveShares,
        NotStarted,
        AutoShare,
        ReadJobs,
        ReadLog,
    )
}
OPS = tuple(REQUESTS)


# --- replies --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Failure:
    """The daemon did not do it: ``error`` says why; ``refused`` if it understood the
    request and will not (a job that can never fit), else it failed (a bad request)."""

    error: str
    refused: bool = False
    disk: bool = False  # the state's disk would not take the write (full, failing): try again later


@dataclass(frozen=True)
class Submitted:
    id: int
    new: bool = True  # False: the token's earlier submit made this job


@dataclass(frozen=True)
class SweepSubmitted:
    ids: list[int] = field(default_factory=list)
    group: str = ""


@dataclass(frozen=True)
class Cancelled:
    cancelled: list[int] = field(default_factory=list)
    unknown: list[int] = field(default_factory=list)
    ended: list[int] = field(default_factory=list)  # had ended already: nothing to cancel


@dataclass(frozen=True)
class Stopping:
    pass


@dataclass(frozen=True)
class GpuCapacity:
    index: int
    uuid: str
    mem_bytes: int


@dataclass(frozen=True)
class CapacityReport:
    """What the daemon hands out: its cores and RAM (``total``) and each GPU."""

    total: Resources
    gpus: list[GpuCapacity] = field(default_factory=list)


@dataclass(frozen=True)
class GpuUse:
    index: int
    jobs: int
    mem_reserved_bytes: int
    mem_used_bytes: int | None
    activity_mean: float | None
    probing: bool


@dataclass(frozen=True)
class Use:
    """What running attempts reserve of the capacity, and what was measured free now:
    cores not busy (mean over the host window) and RAM free for new work (on a Ray cluster,
    its measured nodes' sums; None: not measured yet)."""

    reserved: Resources
    measured_free: Resources | None
    jobs: int
    gpus: list[GpuUse] = field(default_factory=list)


@dataclass(frozen=True)
class NodeUse:
    """One node of a Ray cluster: alive or gone, what it has, and what tandem's attempts
    reserve on it (``cpus_held``: of those cores, what Ray holds for them)."""

    id: str
    name: str
    alive: bool
    total: Resources  # its cores and RAM
    reserved: Resources
    cpus_held: float
    jobs: int
    gpus: list[int] = field(default_factory=list)  # its GPUs' indices
    # As its agent measured it: cores not busy, RAM free for new work (None: not measured).
    measured_free: Resources | None = None


@dataclass(frozen=True)
class UserUse:
    """One user of a system manager: their jobs running and waiting, what the running ones
    reserve, and their decayed use (host-seconds). A status lists users in fair-share order,
    which also counts what their running jobs hold now (:meth:`tandem.place.fairshare.Users.standing`)."""

    uid: int
    running: int
    waiting: int
    cores: float
    gpu_mem: int
    use: float


@dataclass(frozen=True)
class DaemonStatus:
    pid: int
    policy: str
    state_dir: str
    started: float
    limits: dict[str, Any]
    mps: bool
    backend: str
    tracking: str | None  # the MLflow store, or why there is none
    capacity: CapacityReport
    used: Use
    jobs: dict[str, int]  # jobs by state
    nodes: list[NodeUse] = field(default_factory=list)  # a Ray cluster's (none on one server)
    system: bool = False  # the host's system manager (every user's)
    users: list[UserUse] = field(default_factory=list)  # a system manager's users, by fair share


@dataclass(frozen=True)
class ShareDefined:
    name: str
    select_job: int | None = None  # the job that makes its selection, if it has one


@dataclass(frozen=True)
class AutoShared:
    name: str
    producer: int  # its producer's job (queued, or running)
    bound: list[int] = field(default_factory=list)  # the sweep's waiting jobs that now read it too


@dataclass(frozen=True)
class SharesRemoved:
    removed: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    in_use: dict[str, list[int]] = field(default_factory=dict)  # name: the jobs not yet ended that read it


@dataclass(frozen=True)
class PutBack:
    state: str = ""  # the job's state now (queued, retrying, cancelled); "": no such attempt runs


@dataclass(frozen=True)
class JobRows:
    """Jobs as their rows hold them (:func:`tandem.place.schema.row_values`), each with its
    attempts' rows under ``attempts``; ``events`` of the one job asked by id; ``shares``: the
    asker's share rows; ``older``: a job older than the first is there (paging); ``counts``:
    the jobs in each state, where asked; ``private``: the jobs of :attr:`ReadJobs.private_of`."""

    jobs: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    shares: list[dict[str, Any]] = field(default_factory=list)
    older: bool = False
    counts: dict[str, int] = field(default_factory=dict)  # where asked: jobs in each state
    private: list[dict[str, Any]] = field(default_factory=list)  # where asked (private_of)


@dataclass(frozen=True)
class LogParts:
    """A job's output: for each attempt (in order), ``n``, ``inode``, ``offset``, ``data``
    and ``older`` (the part rotated away; null where the asker saw the attempt already), the
    bytes base64 (:class:`~tandem.place.reads.LogPart`)."""

    attempts: list[dict[str, Any]] = field(default_factory=list)


Reply = Union[
    Failure,
    Submitted,
    SweepSubmitted,
    Cancelled,
    Stopping,
    DaemonStatus,
    ShareDefined,
    AutoShared,
    SharesRemoved,
    PutBack,
    JobRows,
    LogParts,
]
REPLIES: dict[str, type] = {
    "submit": Submitted,
    "submit_sweep": SweepSubmitted,
    "submit_many": SweepSubmitted,
    "cancel": Cancelled,
    "status": DaemonStatus,
    "stop": Stopping,
    "define-share": ShareDefined,
    "remove-shares": SharesRemoved,
    "not-started": PutBack,
    "auto-share": AutoShared,
    "read-jobs": JobRows,
    "read-log": LogParts,
}


class ProtocolError(ValueError):
    """A message that is not one of this protocol's records."""


# --- records <-> JSON objects ---------------------------------------------------------------


def to_wire(message: Request | Reply) -> dict[str, Any]:
    """The JSON object of a request (with ``op``) or a reply (with ``ok``)."""
    data = dataclasses.asdict(message)  # a Submit's JobSpec too: its fields, as JobSpec.to_dict
    if isinstance(message, tuple(REQUESTS.values())):
        return {"op": message.OP, **data}  # type: ignore[union-attr]
    return {"ok": not isinstance(message, Failure), **data}


def read_request(data: dict[str, Any]) -> Request:
    """The request record of a JSON object (:class:`ProtocolError` if it is none)."""
    op = data.get("op")
    cls = REQUESTS.get(op) if isinstance(op, str) else None
    if cls is None:
        raise ProtocolError(f"unknown request {op!r}; this daemon knows {', '.join(OPS)}")
    fields = {k: v for k, v in data.items() if k != "op"}
    if cls in (Submit, SubmitSweep):
        if not isinstance(fields.get("job"), dict):
            raise ProtocolError("not a job: a submit carries a job object")
        try:
            job = JobSpec.from_dict(fields["job"])
        except (TypeError, ValueError) as exc:
            raise ProtocolError(f"not a job: {exc}") from None
        if cls is Submit:
            return Submit(job)
        points = fields.get("points")
        if not isinstance(points, list) or not all(isinstance(p, dict) for p in points):
            raise ProtocolError("not a sweep: its points are a list of objects")
        fill_env = fields.get("fill_env") or []
        if not isinstance(fill_env, list) or not all(isinstance(k, str) for k in fill_env):
            raise ProtocolError("not a sweep: fill_env is a list of names")
        return SubmitSweep(job, points, fill_env)
    if cls is SubmitMany:
        jobs = fields.get("jobs")
        if not isinstance(jobs, list) or not jobs or not all(isinstance(j, dict) for j in jobs):
            raise ProtocolError("not a submit of many: its jobs are a list of job objects")
        try:
            return SubmitMany([JobSpec.from_dict(j) for j in jobs])
        except (TypeError, ValueError) as exc:
            raise ProtocolError(f"not a job: {exc}") from None
    if cls is AutoShare:
        try:
            spec = ShareSpec.from_json(json.dumps(fields.get("spec")))
        except (TypeError, ValueError, AttributeError) as exc:
            raise ProtocolError(f"not a share definition: {exc}") from None
        if spec.source != "auto":
            raise ProtocolError("an auto-share request carries a share of source auto")
        job_id = fields.get("job_id")
        if not isinstance(job_id, int) or isinstance(job_id, bool):
            raise ProtocolError("an auto-share request names its job by its id (a number)")
        return AutoShare(job_id, spec)
    if cls is DefineShare:
        select_job = fields.get("select_job")
        env, cwd = fields.get("env"), fields.get("cwd")
        if env is not None and not (
            isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
        ):
            raise ProtocolError("not a share definition: its env is an object of strings")
        if cwd is not None and not isinstance(cwd, str):
            raise ProtocolError("not a share definition: its cwd is a path")
        try:
            spec = ShareSpec.from_json(json.dumps(fields.get("spec")))
            maker = None if select_job is None else JobSpec.from_dict(select_job)
            return DefineShare(spec, maker, env, cwd)
        except (TypeError, ValueError, AttributeError) as exc:
            raise ProtocolError(f"not a share definition: {exc}") from None
    return _build(cls, fields)


def read_reply(op: str, data: dict[str, Any]) -> Reply:
    """The reply record to request ``op`` of a JSON object."""
    if not data.get("ok"):
        error = str(data.get("error") or "the daemon refused the request")
        return Failure(error, bool(data.get("refused")), bool(data.get("disk")))
    return _build(REPLIES[op], {k: v for k, v in data.items() if k != "ok"})


def _build(cls: type[T], data: Any) -> T:
    """``cls`` from a JSON object: nested records and lists of them built too; fields this
    version does not know are left out (a newer daemon may say more)."""
    if not isinstance(data, dict):
        raise ProtocolError(f"{cls.__name__}: not an object")
    hints = typing.get_type_hints(cls)
    values = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name in data:
            values[f.name] = _value(hints[f.name], data[f.name])
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:  # missing fields; a figure that is not one
        raise ProtocolError(f"{cls.__name__}: {exc}") from None


def _value(hint: Any, value: Any) -> Any:
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _build(hint, value)
    origin = typing.get_origin(hint)
    if origin is list and isinstance(value, list):
        (item,) = typing.get_args(hint)
        return [_value(item, v) for v in value]
    if origin in (Union, types.UnionType):
        records = [a for a in typing.get_args(hint) if isinstance(a, type) and dataclasses.is_dataclass(a)]
        if records and isinstance(value, dict):
            return _build(records[0], value)
    return value
