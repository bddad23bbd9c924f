"""One scheduling pass: which waiting jobs start now, and where.

:func:`plan` is pure: it takes the waiting jobs (:class:`Waiting`), the host and GPUs as
they are now (:class:`~tandem.place.policies.HostSlot`, ``GpuSlot``), a policy and its
limits, and returns placements. The daemon calls it every tick with measured state; the
simulator calls it with modelled state. Rules every policy keeps, here and nowhere else:

- RAM and GPU memory reservations never exceed capacity, and a job's memory must also fit
  what is measured free (once the jobs already there have settled).
- Cores are elastic: a job fits where its cores are unreserved, or (its cores learnt,
  :attr:`Waiting.elastic`) where the host's measured use leaves room for it
  (:attr:`~tandem.place.policies.HostSlot.cpus_busy`), or where it joins its share group,
  whose producer runs, under :func:`share_bound`. Cores given as a number stay a hard
  reservation. A share's producer is a job of its own (:mod:`tandem.place.producers`),
  reserved before its group's jobs start.
- A GPU whose newest job has unknown memory that is still growing (``probing``) takes no
  one; nor does a GPU or host running a job that must run alone.
- At most ``max_per_gpu`` jobs per GPU.
- A job of unknown GPU memory (``gpu_mem`` None) is a probe: it goes to the GPU with the
  most free memory, whatever the policy, and that GPU takes no one else until it settles.
- Retries escalate (:attr:`Waiting.escalation`): 1 = the GPU with most free memory,
  2 = alone on a GPU (or alone on the host for a CPU-only job).

Queue order: higher priority first, then submission order. A job that cannot be placed
is passed over (backfill) unless the policy is strict FIFO or it has waited longer than
``starve_after_s``: then nothing behind it starts until it has (so a large job is not
starved by a stream of small ones).

Every job the pass does not start gets a reason (:attr:`Plan.reasons`), in words for
``tandem ls``: the resource that is short with its figures, the job that goes first, the
GPU that is settling, the measurement that holds it back.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import attrgetter

from tandem.place.fairshare import Users, fair_order
from tandem.place.model import format_size
from tandem.place.policies import GpuSlot, HostSlot, Limits, MostFreeMemory, Policy
from tandem.place.resources import Reservation, Resources
from tandem.units import format_cores


@dataclass(slots=True)  # not frozen: made for every waiting job each pass, and a frozen init is slow
class Waiting:
    """A job the scheduler may start: what it reserves (:attr:`need`, the pass's
    :class:`~tandem.place.resources.Reservation`) and how long it has waited (read, never
    changed, by the scheduler)."""

    id: int
    priority: int
    submitted: float
    need: Reservation
    escalation: int = 0  # 0 first try; 1 most-free GPU; 2 alone
    waiting_since: float | None = None  # since when it could start (queued, requeued, deps met)
    prefer_gpus: tuple[int, ...] = ()  # where its shared data is (a GPU-slab producer's GPU)
    startup_cpus: float | None = None  # what its program used at start before (measured)
    share: str | None = None  # its share group, whose producer runs
    share_jobs: int | None = None  # its share's jobs running now; None: not of a share group
    elastic: bool = False  # its cores are learnt (--cpus auto): it may start on measured room
    # Under Ray, the nodes it may go to, each with its share group's jobs running there (those
    # where its group's producers run; a share's next producer: those where none does); None: any.
    nodes: dict[str, int] | None = None
    owner: int | None = None  # its submitter (a system manager's user; fair share between them)

    @property
    def alone(self) -> bool:
        """A retry that runs alone (escalation 2)."""
        return self.escalation >= 2


@dataclass(frozen=True)
class Placement:
    """Where a job starts, with the reservation the pass decided for it (which its start
    and its attempt's record keep)."""

    job_id: int
    gpus: tuple[int, ...]  # GPU indices
    reservation: Reservation
    alone: bool
    probe: bool  # its GPU memory unknown: measured as it runs, its GPU taking no one else meanwhile
    node: str = ""  # the Ray node it goes to ("" on one server)
    cores_held: float | None = None  # of its cores, those its node's Ray holds for it (under Ray)


@dataclass
class NodeSlot:
    """One machine as a pass sees it: its host (cores, RAM) and its GPUs. On one server the
    only one (``node`` ""). Under Ray, ``cpus_held`` is what Ray holds of the node's cores for
    the attempts on it: Ray's CPUs are a hard reservation, tandem's cores are elastic (a
    share group's jobs, a job on measured room), so an attempt asks Ray for the part of its
    cores that Ray has unreserved, never more: Ray never queues what tandem started."""

    node: str
    host: HostSlot
    gpus: list[GpuSlot]
    name: str = ""  # what reasons call it
    cpus_held: float | None = None


@dataclass
class Plan:
    """One pass's outcome: the jobs to start, in order, and why each other job waits."""

    placements: list[Placement] = field(default_factory=list)
    reasons: dict[int, str] = field(default_factory=dict)
    short: list[int] = field(default_factory=list)  # the jobs no node had room for (not held behind one)


_MOST_FREE = MostFreeMemory()


def order(queue: Sequence[Waiting]) -> list[Waiting]:
    """Highest priority first, then first submitted (two stable sorts on plain attributes:
    a queue of 10,000 is sorted every pass)."""
    by_time = sorted(queue, key=attrgetter("submitted", "id"))
    return sorted(by_time, key=attrgetter("priority"), reverse=True)  # reverse keeps the order of ties


def plan(
    queue: Sequence[Waiting],
    host: HostSlot,
    gpus: Sequence[GpuSlot],
    policy: Policy,
    limits: Limits,
    now: float,
) -> Plan:
    """The jobs to start now on one server, in order, and the reasons the others wait.
    ``host`` and ``gpus`` are not changed."""
    return plan_nodes(queue, [NodeSlot("", host, list(gpus))], policy, limits, now)


def plan_nodes(
    queue: Sequence[Waiting],
    nodes: Sequence[NodeSlot],
    policy: Policy,
    limits: Limits,
    now: float,
    users: Users | None = None,
) -> Plan:
    """The jobs to start now, in order, each on one node where it fits, and the reasons the
    others wait. ``nodes`` are not changed. ``users``: a system manager's users, their use
    (the order between them: fair share) and limits (:mod:`tandem.place.fairshare`)."""
    copy = dataclasses.replace
    slots = [NodeSlot(n.node, copy(n.host), [copy(g) for g in n.gpus], n.name, n.cpus_held) for n in nodes]
    out = Plan()
    blocker: str | None = None
    # A job that needs what one before it needed, where that one could not start, cannot
    # either (a pass only ever fills the nodes further): a sweep of 10,000 alike jobs is
    # looked at once, not 10,000 times.
    refused: dict[tuple[object, ...], str] = {}
    # Per share, per node: its jobs placed this pass.
    placed: dict[str, dict[str, int]] = {}
    ordered = order(queue)
    if users is not None:
        ordered = fair_order(
            ordered, attrgetter("owner"), lambda w: users.weight(w.need.resources), users.standing()
        )
    for job in ordered:
        if blocker is not None:
            out.reasons[job.id] = blocker
            continue
        if users is not None and (over := users.over(job.owner, job.need.resources)):
            out.reasons[job.id] = over  # its user's other jobs hold their limit: the others' go on
            continue
        job = _this_pass(job, placed)
        need = _need_key(job)
        placement = refused.get(need) or _place_on_nodes(job, slots, policy, limits)
        if isinstance(placement, Placement):
            slot = next(n for n in slots if n.node == placement.node)
            _reserve(job, placement, slot.host, slot.gpus)
            if slot.cpus_held is not None:  # Ray's part of its cores: what Ray has unreserved
                unheld = max(0.0, slot.host.total.cores - slot.cpus_held)
                held = math.floor(min(job.need.resources.cores, unheld) * 1e4) / 1e4
                slot.cpus_held += held
                placement = dataclasses.replace(placement, cores_held=held)
            if job.share is not None:
                on = placed.setdefault(job.share, {})
                on[placement.node] = on.get(placement.node, 0) + 1
            out.placements.append(placement)
            if users is not None:
                users.add(job.owner, job.need.resources)
            continue
        out.reasons[job.id] = refused[need] = placement
        out.short.append(job.id)
        since = job.submitted if job.waiting_since is None else job.waiting_since
        if not policy.backfill:
            blocker = f"priority: job {job.id} first (policy {policy.name}: first in, first out)"
        elif now - since >= limits.starve_after_s:
            blocker = (
                f"priority: job {job.id} first (it has waited {now - since:.0f} s, over "
                f"--starve-after {limits.starve_after_s:g}: nothing starts past it)"
            )
    return out


def _place_on_nodes(job: Waiting, nodes: list[NodeSlot], policy: Policy, limits: Limits) -> Placement | str:
    """Where ``job`` goes: the node with the most unreserved cores that takes it (a sweep
    spreads over the cluster), or why none can now. A job of a share group goes only where
    one of its group's producers runs (its batches are in that node's memory), counted
    with its group's jobs there."""
    if len(nodes) == 1 and job.nodes is None:  # one server (or one node left)
        placement = _place(job, nodes[0].host, nodes[0].gpus, policy, limits)
        return (
            dataclasses.replace(placement, node=nodes[0].node)
            if isinstance(placement, Placement)
            else placement
        )
    candidates = [n for n in nodes if job.nodes is None or n.node in job.nodes]
    if not candidates:
        if job.share is None:
            return "node: no live node may take it"
        gone = ", ".join(n[:12] for n in job.nodes or ())
        return f"node: its share's producer's node ({gone}) has gone"
    candidates.sort(key=lambda n: n.host.reserved.cores - n.host.total.cores)  # stable: ties keep their order
    why = []
    for n in candidates:
        here = job
        if job.nodes is not None and job.share_jobs is not None:  # its group as it is on this node
            here = dataclasses.replace(job, share_jobs=job.nodes[n.node])
        placement = _place(here, n.host, n.gpus, policy, limits)
        if isinstance(placement, Placement):
            return dataclasses.replace(placement, node=n.node)
        why.append(f"{n.name or n.node[:12]}: {placement}" if len(nodes) > 1 else placement)
    return "; ".join(why)


def _this_pass(job: Waiting, placed: dict[str, dict[str, int]]) -> Waiting:
    """``job`` as this pass sees it: the jobs of its share group placed this pass counted
    beside those running (on each node, under Ray)."""
    if job.share is None or job.share_jobs is None:
        return job
    mine = placed.get(job.share)
    if not mine:
        return job
    nodes = None if job.nodes is None else {k: v + mine.get(k, 0) for k, v in job.nodes.items()}
    return dataclasses.replace(job, share_jobs=job.share_jobs + sum(mine.values()), nodes=nodes)


def fits_at_all(
    job: Waiting, host: HostSlot, gpus: Sequence[GpuSlot], limits: Limits | None = None
) -> str | None:
    """Why ``job`` can never run on this machine (its needs exceed the capacity), or None."""
    need, producer = job.need.resources, _producer_words(job)
    usable = int(host.total.ram * (1 - (limits or Limits()).host_mem_headroom))
    if need.cores > host.total.cores + 1e-9:
        return f"asks for {format_cores(need.cores)} cores{producer}; the manager has {host.total.cores:g}"
    if need.ram > usable:
        return (
            f"asks for {format_size(need.ram)} of RAM{producer}; the manager hands out at most "
            f"{format_size(usable)}"
        )
    if need.gpus > len(gpus):
        return f"asks for {need.gpus} GPU(s); the manager has {len(gpus)}"
    if not need.gpus and need.gpu_mem:  # else it would run on the CPU, its GPU memory unheeded
        where = "the manager has no GPU" if not gpus else "it asks for no GPU (--gpus 0)"
        return f"asks for {format_size(need.gpu_mem)} of GPU memory; {where}"
    if need.gpus and not job.need.gpu_probe:
        biggest = sorted((g.mem_total for g in gpus), reverse=True)[need.gpus - 1]
        if need.gpu_mem > biggest:
            return f"asks for {format_size(need.gpu_mem)} per GPU; the largest GPU has {format_size(biggest)}"
    return None


def fits_a_node(job: Waiting, nodes: Sequence[NodeSlot], limits: Limits | None = None) -> str | None:
    """Why ``job`` can never run on any of ``nodes`` (it exceeds each one's capacity), or
    None. With several nodes, the reason given is the largest node's."""
    why = [fits_at_all(job, n.host, n.gpus, limits) for n in nodes]
    if not why or any(w is None for w in why):
        return None
    if len(nodes) == 1:
        return why[0]
    largest = max(range(len(nodes)), key=lambda i: (nodes[i].host.total.cores, nodes[i].host.total.ram))
    return f"{why[largest]} on its largest node, {nodes[largest].name or nodes[largest].node[:12]}"


def _need_key(job: Waiting) -> tuple[object, ...]:
    """What decides where ``job`` may go (all of it but who it is and how long it waited)."""
    return (
        job.need.resources,
        job.need.gpu_probe,
        job.need.with_share,
        job.escalation,
        job.prefer_gpus,
        job.startup_cpus,
        job.share_jobs,
        job.elastic,
        None if job.nodes is None else tuple(sorted(job.nodes.items())),
    )


def _producer_words(job: Waiting) -> str:
    return " with its share's producer" if job.need.with_share else ""


def _ram_short(job: Waiting, host: HostSlot, limits: Limits) -> str | None:
    """Whether the host's RAM (a strict reservation) is short for ``job``, with the figures."""
    ram = Resources(ram=job.need.resources.ram)
    free = Resources(ram=max(0, host.total.ram - host.reserved.ram))
    short = ram.short_of(free, Resources(ram=host.total.ram), suffix=_producer_words(job))
    if short:
        return str(short[0])
    if host.mem_available is not None:
        headroom = int(limits.host_mem_headroom * host.total.ram)
        if ram.ram + headroom > host.mem_available:
            return (
                f"RAM: needs {format_size(ram.ram)}{_producer_words(job)} plus {format_size(headroom)} "
                "kept free; "
                f"{format_size(host.mem_available)} measured available"
            )
    return None


def _cores_short(job: Waiting, host: HostSlot) -> str | None:
    """Whether the host's unreserved cores are short for ``job``, with the figures."""
    cores = Resources(cores=job.need.resources.cores)
    free = Resources(cores=max(0.0, host.total.cores - host.reserved.cores))
    short = cores.short_of(free, Resources(cores=host.total.cores), suffix=_producer_words(job))
    return str(short[0]) if short else None


def share_bound(host: HostSlot) -> float:
    """How many jobs of one share group run together whatever their cores: four a core.
    Their loading is the producer's; each late joiner makes it serve its epochs again, so
    running them together costs less than running them in turn, and the kernel's CPU weights
    share the cores among them (RAM stays strict). Measured on 2 cores: with two a core, an
    8-trial sweep ran in three waves and its producer decoded 16.5 epochs for the trials' 3
    (69 of the sweep's 134 CPU-s)."""
    return 4 * host.total.cores


def _room_anyway(job: Waiting, host: HostSlot, policy: Policy) -> str | None:
    """Cores are elastic: why ``job`` may start where reservations (or the policy's load gate)
    say no, or None. A job of a share group whose producer runs or starts, while its group
    is under :func:`share_bound`; a job of learnt cores where the host's measured use (its
    jobs that are starting counted at their figure) leaves room for it. RAM is never elastic."""
    if not policy.collocate:
        return None
    if job.share_jobs is not None and job.share_jobs < share_bound(host):
        return "share"
    need = max(job.need.resources.cores, job.startup_cpus or 0.0)
    if job.elastic and host.cpus_busy is not None and host.cpus_busy + need <= host.total.cores + 1e-9:
        return "measured"
    return None


def _measured_words(job: Waiting, host: HostSlot) -> str:
    if not job.elastic or host.cpus_busy is None:
        return ""
    free = max(0.0, host.total.cores - host.cpus_busy)
    return f"; {free:.2f} of {host.total.cores:g} cores measured idle"


def _place(
    job: Waiting, host: HostSlot, gpus: list[GpuSlot], policy: Policy, limits: Limits
) -> Placement | str:
    """Where ``job`` goes, or why it cannot start now."""
    need, alone = job.need.resources, job.alone
    short = _ram_short(job, host, limits)  # RAM is strict
    if short is not None:
        return short
    short = _cores_short(job, host)  # cores are elastic (_room_anyway)
    if short is not None and _room_anyway(job, host, policy) is None:
        return short + _measured_words(job, host)
    if host.alone:
        return "host: a job that must run alone (after running out of host memory) is running"
    if need.gpus == 0:
        if alone and host.all_jobs > 0:
            return f"alone: this retry runs alone on the host; {host.all_jobs} job(s) still run"
        blocked = None if alone else policy.host_blocks(host, need, limits)
        if blocked and _room_anyway(job, host, policy) is None:
            return blocked + _measured_words(job, host)
        return Placement(job.id, (), job.need, alone, probe=False)
    admissible, refused = [], []
    for g in gpus:
        why = _gpu_blocks(g, job, policy, limits)
        if why is None:
            admissible.append(g)
        else:
            refused.append(why)
    if len(admissible) < need.gpus:
        need_more = f"needs {need.gpus} GPUs, {len(admissible)} can take it: " if need.gpus > 1 else ""
        return (
            need_more
            + "; ".join(refused[:3])
            + (f"; and {len(refused) - 3} more" if len(refused) > 3 else "")
        )
    ranker = _MOST_FREE if job.need.gpu_probe or job.escalation >= 1 else policy
    ranked = ranker.rank(admissible, need)
    if job.prefer_gpus:  # the GPU its batches are on, if admissible; the policy's order otherwise
        ranked = sorted(ranked, key=lambda g: g.index not in job.prefer_gpus)
    chosen = ranked[: need.gpus]
    probe = job.need.gpu_probe and not all(g.unmeasured for g in chosen)
    return Placement(job.id, tuple(sorted(g.index for g in chosen)), job.need, alone, probe)


def _gpu_blocks(gpu: GpuSlot, job: Waiting, policy: Policy, limits: Limits) -> str | None:
    """Why ``gpu`` cannot take the job now, or None."""
    i, need, alone, unknown = gpu.index, job.need.resources, job.alone, job.need.gpu_probe
    if gpu.alone:
        return f"GPU {i}: a job that must run alone is on it"
    if gpu.unmeasured and unknown:  # nothing to wait for: no reading will come
        if gpu.jobs >= limits.max_per_gpu:
            return f"GPU {i}: {gpu.jobs} jobs, the most per GPU (--max-per-gpu {limits.max_per_gpu})"
        return f"GPU {i}: {gpu.jobs} job(s) on it; this retry runs alone" if gpu.jobs and alone else None
    if gpu.probing:
        who = f"job {gpu.probing_job}'s" if gpu.probing_job is not None else "a new job's"
        return f"GPU {i} settling: {who} memory still growing"
    if gpu.jobs >= limits.max_per_gpu:
        return f"GPU {i}: {gpu.jobs} jobs, the most per GPU (--max-per-gpu {limits.max_per_gpu})"
    if gpu.jobs > 0 and alone:
        return f"GPU {i}: {gpu.jobs} job(s) on it; this retry runs alone"
    if gpu.jobs > 0 and unknown and gpu.fresh:
        return f"GPU {i} settling: its new jobs' memory not yet measured (this job's is unknown: --gpu-mem)"
    measured = gpu.free_measured()
    if not unknown:
        gpu_mem = Resources(gpu_mem=need.gpu_mem)
        total = Resources(gpu_mem=gpu.mem_total)
        short = gpu_mem.short_of(Resources(gpu_mem=gpu.mem_total - gpu.mem_reserved), total, where=f"GPU {i}")
        if short:
            return str(short[0])
        # Measured free memory counts only once the jobs on the GPU have settled (jobs
        # allocate for tens of seconds after they start; reading it earlier causes OOMs).
        if measured is not None and not gpu.fresh and need.gpu_mem > measured:
            return f"GPU {i} memory: needs {format_size(need.gpu_mem)}, {format_size(measured)} measured free"
    elif gpu.free_reserved() <= 0 or (measured is not None and measured <= 0):
        return f"GPU {i} memory: none free for a job of unknown size"
    return policy.gpu_blocks(gpu, need, limits)


def _reserve(job: Waiting, p: Placement, host: HostSlot, gpus: list[GpuSlot]) -> None:
    need = job.need.resources
    host.reserved += Resources(cores=need.cores, ram=need.ram)
    if host.cpus_busy is not None:  # counted at its figure for the rest of the pass
        host.cpus_busy += max(need.cores, job.startup_cpus or 0.0)
    if host.mem_available is not None:
        host.mem_available -= need.ram
    host.all_jobs += 1
    if not p.gpus:
        host.jobs += 1
        host.alone = host.alone or p.alone
        if (
            job.startup_cpus is not None and job.startup_cpus > need.cores
        ):  # its start-up, for the rest of the pass
            over, who = host.cpus_over
            host.cpus_over = (over + job.startup_cpus - need.cores, who if who is not None else job.id)
            host.cpus_starting += job.startup_cpus - need.cores
        return
    for g in gpus:
        if g.index in p.gpus:
            g.jobs += 1
            g.fresh = True
            g.alone = g.alone or p.alone
            if p.probe:
                g.probing = True
                g.probing_job = job.id
            else:
                g.mem_reserved += need.gpu_mem
            declared = g.compute_declared
            g.compute_declared = None if declared is None or not need.gpu_share else declared + need.gpu_share
