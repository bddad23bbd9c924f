"""Reservations and waiting jobs for the scheduler's tests, from plain figures (what a job
given every figure reserves: ``--cpus``, ``--mem``, ``--gpus``, ``--gpu-mem``; GPU memory
``None``: unknown, a probe)."""

from __future__ import annotations

from typing import Any

from tandem.place.policies import HostSlot
from tandem.place.resources import GIVEN, PROBE, SHARE, Reservation, Resources
from tandem.place.scheduler import Placement, Waiting


def need(
    cpus: float = 1.0,
    mem: int = 0,
    gpus: int = 0,
    gpu_mem: int | None = None,
    gpu_share: int | None = None,
    with_producer: bool = False,
) -> Reservation:
    kind = f"{GIVEN}+{SHARE}" if with_producer else GIVEN
    return Reservation(
        Resources(cpus, mem, gpus, gpu_mem or 0, gpu_share or 0),
        cores_from=kind,
        ram_from=kind,
        gpu_mem_from=PROBE if gpu_mem is None and gpus else GIVEN,
    )


def waiting(
    i: int,
    priority: int = 0,
    submitted: float | None = None,
    *figures: Any,
    gpu_share: int | None = None,
    with_producer: bool = False,
    **kw: Any,
) -> Waiting:
    """A waiting job ``i`` (submitted at ``i`` unless said) of these figures (those of
    :func:`need`, by position or by name); ``kw``: the other fields of :class:`Waiting`."""
    named = {k: kw.pop(k) for k in ("cpus", "mem", "gpus", "gpu_mem") if k in kw}
    reservation = need(*figures, **named, gpu_share=gpu_share, with_producer=with_producer)
    return Waiting(i, priority, float(i) if submitted is None else submitted, reservation, **kw)


def placed(job_id: int, gpus: tuple[int, ...] = (), gpu_mem: int | None = None, **kw: Any) -> Placement:
    """A placement of job ``job_id`` on ``gpus`` (``kw``: alone, probe, node, cores_held)."""
    kw.setdefault("alone", False)
    kw.setdefault("probe", False)
    return Placement(job_id, gpus, need(1.0, 0, len(gpus), gpu_mem), **kw)


def host_slot(
    cpus_total: float, mem_total: int, cpus_reserved: float = 0.0, mem_reserved: int = 0, **kw: Any
) -> HostSlot:
    """A host of these cores and RAM, with so much of them reserved (``kw``: what is measured)."""
    return HostSlot(Resources(cpus_total, mem_total), Resources(cpus_reserved, mem_reserved), **kw)
