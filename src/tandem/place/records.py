"""The job manager's stored records: a job (its request and what happened to it), each of
its attempts (with where it was placed: :class:`AttemptPlacement`), and a defined share with
its running producer.

Each field is declared here once (with :func:`tandem.place.fields.column` where its storage
or display is not the default); the SQL tables (:mod:`tandem.place.schema`) and the
``--json`` objects (:mod:`tandem.place.views`) are derived from these declarations. How to add
a field: CONTRIBUTING.md, "Adding a field to a stored record".
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from tandem.place.fields import column
from tandem.place.model import JOB_ROLE, QUEUED, JobSpec
from tandem.place.resources import GIVEN, LEARNT, PROBE, Reservation, Resources
from tandem.share.spec import ShareSpec


@dataclass(frozen=True, slots=True)
class AttemptPlacement:
    """Where an attempt runs and what it reserves, as its attempt's record keeps it (one
    JSON object in the attempt's ``placement`` column, under these names; ``--json`` shows
    the fields declared shown, under their ``json_key``). Changed only by replacing it:
    the daemon writes the whole record each time a figure is learnt."""

    device: str = "cpu"  # "cpu" or "cuda:0,1"
    gpus: tuple[int, ...] = ()
    uuids: tuple[str, ...] = column((), json_key="gpu_uuids")
    mps: bool = False  # through an MPS server
    alone: bool = False  # its GPUs (or the host's cores) not shared
    probe: bool = False  # its GPU memory measured as it runs
    # What it reserves: the pass's decision as it started, then as it is measured (cores of
    # --cpus auto, RAM of --mem auto, a probe's GPU memory once settled). ``--json`` shows
    # its figures under the names of before (tandem.place.views).
    reservation: Reservation | None = column(None, shown=False)
    settled: bool = column(False, shown=False)  # a probe's GPU memory stopped growing
    backend: str | None = column(None, shown=False)  # "ray" where a Ray node runs it
    node: str | None = column(None, shown=False)  # that node's Ray id
    node_name: str | None = column(None, json_key="node")  # that node's host name
    ray_cpus: float | None = column(None, shown=False)  # of its cores, those Ray holds there

    @property
    def gpu_mem(self) -> int | None:
        """GPU memory reserved per GPU now (its reservation's); None: no GPU, or a probe's
        not settled yet."""
        r = self.reservation
        return None if r is None or not self.gpus else r.gpu_mem

    def flat_figures(self) -> dict[str, Any]:
        """Its reservation's figures under the flat names earlier tandems wrote and read, and
        ``--json`` and ``producers.status`` show: ``cpus`` (rounded), ``cpus_from``, ``mem``,
        ``mem_from``, ``gpu_mem``; each None without a reservation."""
        r = self.reservation
        if r is None:
            return dict.fromkeys(("cpus", "cpus_from", "mem", "mem_from", "gpu_mem"))
        return {
            "cpus": round(r.resources.cores, 3),
            "cpus_from": r.cores_why,
            "mem": r.resources.ram,
            "mem_from": r.ram_why,
            "gpu_mem": self.gpu_mem,
        }

    @property
    def where(self) -> str:
        """Where it runs, in words: ``cuda:0``, ``cpu``; on a Ray cluster ``node/cuda:0``."""
        return f"{self.node_name}/{self.device}" if self.node_name else self.device

    def to_json(self) -> str:
        """Its figures by name, those it has not (None) left out; its reservation as one object
        and, for a tandem of before it (which reads the same state file), also under the flat
        names that one read."""
        values = ((f.name, getattr(self, f.name)) for f in dataclasses.fields(self))
        out = {k: v for k, v in values if v is not None}
        r = out.pop("reservation", None)
        if r is not None:
            out |= self.flat_figures() | {"reservation": r.to_dict()}
        return json.dumps({k: v for k, v in out.items() if v is not None})

    @classmethod
    def from_json(cls, text: str) -> AttemptPlacement:
        """The record a column holds; one written by an earlier tandem (a dict that lacks
        the newer names: their defaults; ``None`` where there is none) reads the same."""
        values = json.loads(text) if text else {}
        known = {k: v for k, v in values.items() if k in _PLACEMENT_FIELDS and v is not None}
        if "reservation" in known:
            known["reservation"] = Reservation.from_dict(known["reservation"])
        elif "cpus" in values or "mem" in values:  # flat figures, as earlier tandems wrote them
            known["reservation"] = _flat_reservation(values)
        if "gpus" in known:
            known["gpus"] = tuple(int(g) for g in known["gpus"])
        if "uuids" in known:
            known["uuids"] = tuple(str(u) for u in known["uuids"])
        for name in ("mps", "alone", "probe", "settled"):
            if name in known:
                known[name] = bool(known[name])
        return cls(**known)


_PLACEMENT_FIELDS = frozenset(f.name for f in dataclasses.fields(AttemptPlacement))


def _flat_reservation(values: dict[str, Any]) -> Reservation:
    """The reservation of a placement written with flat figures (``cpus``, ``cpus_from``,
    ``mem``, ``mem_from``, ``gpu_mem``): the kinds worked out from their words."""
    cores_why, ram_why = values.get("cpus_from") or GIVEN, values.get("mem_from") or GIVEN
    gpu_mem, unsettled = values.get("gpu_mem"), values.get("probe") and not values.get("settled")
    return Reservation(
        Resources(
            cores=float(values.get("cpus") or 0.0),
            ram=int(values.get("mem") or 0),
            gpus=len(values.get("gpus") or ()),
            gpu_mem=int(gpu_mem or 0),
        ),
        cores_from=GIVEN if cores_why == GIVEN else PROBE if cores_why == PROBE else LEARNT,
        ram_from=GIVEN if ram_why == GIVEN else LEARNT if values.get("mem") else PROBE,
        gpu_mem_from=PROBE if unsettled or (values.get("gpus") and gpu_mem is None) else GIVEN,
        cores_why=cores_why,
        ram_why=ram_why,
    )


@dataclass
class Attempt:
    job_id: int
    n: int
    state: str
    placement: AttemptPlacement = column(encode=AttemptPlacement.to_json, decode=AttemptPlacement.from_json)
    # Given, as the placement is; through column() because mypy takes a field of column() as
    # one with a default (it is not), and a plain field after it as an error.
    started: float = column()
    ended: float | None = None
    exit_code: int | None = None
    signal: str | None = None
    cause: str | None = None
    cause_line: str | None = None
    shim_pid: int | None = None
    shim_ctime: float | None = None
    pid: int | None = None
    pid_ctime: float | None = None
    peak_mem: int | None = None
    peak_gpu_mem: int | None = None
    cpu_seconds: float | None = None
    mlflow_run_id: str | None = None
    # Its folder's name in jobs/<job id>/ ("<n>.<random>": no attempt of another database,
    # lost or not, has it); None for one made before the names were unique ("<n>").
    folder: str | None = column(None, shown=False)


@dataclass
class Job(JobSpec):
    """A job as stored: its request (:class:`~tandem.place.model.JobSpec`, ``gpus`` resolved)
    and what happened to it. Its ``state`` changes only through :class:`tandem.place.state.State`'s
    transitions (:data:`tandem.place.state.TRANSITIONS`)."""

    id: int = column(0, sql="INTEGER PRIMARY KEY AUTOINCREMENT", queued=True)
    job_key: str = column("", queued=True, shown=False)
    # What its reservations are learnt under (tandem.place.reserve): a sweep's point has its
    # template's key (its --name, else command, before {KEY} is filled), so its points are alike.
    learn_key: str = column("", queued=True, shown=False)
    state: str = column(QUEUED, queued=True)
    # What it is: a job ("job": submitted) or a share group's producer ("producer": made by
    # the daemon, never by tandem submit).
    role: str = column(JOB_ROLE, queued=True)
    submitted: float = column(0.0, queued=True)
    cause: str | None = None
    cause_line: str | None = None
    exit_code: int | None = None
    signal: str | None = None
    started: float | None = column(None, queued=True)
    ended: float | None = None
    cancel_requested: bool = column(False, queued=True, shown=False)
    # Its --prune rule stopped it (tandem.place.pruning): why, and at which rung (its report count).
    pruned: str | None = None
    pruned_rung: int | None = None
    queued_at: float | None = column(None, queued=True, shown=False)  # when it last became able to start
    escalation: int = column(0, queued=True, shown=False)
    peak_mem: int | None = column(None, json_key="peak_mem_bytes")
    peak_gpu_mem: int | None = column(None, json_key="peak_gpu_mem_bytes")
    energy_joules: float | None = None
    mlflow_run_id: str | None = None
    reason: str | None = column(
        None, shown=False
    )  # why it waits, as the daemon's last pass saw it (shown: views)
    updated: float | None = None  # when its row last changed (what a live view asks for)
    # Who submitted it, as the kernel said (the socket's peer: never what a client says): it
    # runs as that user under a system manager (tandem.place.fairshare weighs users by it).
    # None: made before owners were kept (the daemon's own user's).
    owner: int | None = column(None, queued=True)
    owner_gid: int | None = column(None, shown=False)
    owner_groups: list[int] = column(default_factory=list, shown=False)
    attempts: list[Attempt] = column(default_factory=list, stored=False, shown=False)

    @property
    def learning_key(self) -> str:
        """The key its cores, RAM and GPU memory are learnt under (its own where none was set)."""
        return self.learn_key or self.job_key


@dataclass
class Share:
    """A dataset defined with ``tandem share define`` (its :class:`ShareSpec`) and the data
    selection it serves (``selection``: an id of ``tandem.select``'s store, given at define or
    written by the daemon when the share's selection job succeeds). Its producer is a job row
    of its own (role ``producer``, :mod:`tandem.place.producers`)."""

    name: str = column(sql="TEXT PRIMARY KEY")
    spec: ShareSpec = column(encode=ShareSpec.to_json, decode=ShareSpec.from_json)
    defined: float = 0.0
    selection: str | None = None
    owner: int | None = None  # who defined it (the socket's peer); None: before owners were kept
