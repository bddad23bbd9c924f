"""The daemon's requests, one handler each (pueue's design): ``submit``, ``submit_sweep``, ``cancel``,
``status``, ``stop``, ``define-share``, ``remove-shares``, a supervisor's ``not-started``, a
loader's ``auto-share``, and a system manager's users' reads (``read-jobs``, ``read-log``). Each
is a function of its request record (:mod:`tandem.place.protocol`), of what it may read and
write (:class:`Parts`: the state, the running attempts, ...; not the daemon) and of who sent
it (:class:`~tandem.place.model.Peer`, the socket's: a user acts on their own jobs and shares
only, root and the admin group on all), and returns the reply record and what it changed
(:class:`Changed`), which the daemon acts on (a scheduling pass, a stop). A refusal says what
to change (``refused``: the client's exit 2).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tandem import _ipc
from tandem.place import clock, pruning, sweep
from tandem.place import protocol as p
from tandem.place.admission import Admission
from tandem.place.attempts import Attempts
from tandem.place.config import DaemonConfig
from tandem.place.diskwait import DiskWait
from tandem.place.fairshare import Users
from tandem.place.identity import StateMoved
from tandem.place.model import (
    FINAL_STATES,
    RUNNING,
    STATES,
    WAITING_STATES,
    Capacity,
    JobSpec,
    Peer,
    format_size,
)
from tandem.place.producers import Producers, group_jobs, is_producer
from tandem.place.resources import Resources
from tandem.place.run.launchers.launch import Launcher
from tandem.place.run.supervisor.files import disk_trouble
from tandem.place.scheduler import Waiting, fits_a_node
from tandem.place.state import Job, State
from tandem.units import format_cores

if TYPE_CHECKING:
    from tandem.place.run.metrics.tracking import Tracker

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Parts:
    """What a handler may read and write: the daemon's parts, made once with it."""

    state: State
    capacity: Capacity
    config: DaemonConfig
    attempts: Attempts
    admission: Admission
    producers: Producers
    disk: DiskWait
    launcher: Launcher
    policy: str  # its name
    started: float  # when the daemon started
    tracker: Tracker | None
    users: Callable[[float, bool], Users]  # a system manager's users now (tandem.place.fairshare)


@dataclass(frozen=True, slots=True)
class Changed:
    """What a request changed, for the daemon to act on."""

    queued: bool = False  # jobs were queued: a scheduling pass at once
    queue: bool = False  # jobs left the queue, or what they wait on changed: a pass is due
    shares: bool = False  # a share was defined or removed: a pass is due
    stop: bool = False  # the daemon is asked to stop


NOTHING = Changed()
Handled = tuple[p.Reply, Changed]


def peer_of(conn: Any, admin_gid: int | None) -> Peer:
    """Who is connected on ``conn`` (:func:`tandem._ipc.peer_credentials`), and whether they
    may act on any job: root, the daemon's own user, a member of ``admin_gid``."""
    pid, uid, gid, groups = _ipc.peer_credentials(conn)
    admin = uid in (0, os.getuid()) or (admin_gid is not None and (gid == admin_gid or admin_gid in groups))
    return Peer(uid, gid, pid, groups, admin)


def failure(exc: Exception, op: object, state_dir: Path) -> p.Failure:
    """The reply to a request (``op``) that raised ``exc``: refused (a request this daemon
    cannot read), the state's file gone, the disk full (free space, try again), or the error."""
    if isinstance(exc, p.ProtocolError):
        return p.Failure(f"refused: {exc}", refused=True)
    if isinstance(exc, StateMoved):
        return p.Failure(str(exc))
    if disk_trouble(exc):
        log.warning("request %r: the state's disk would not take it: %s", op, exc)
        return p.Failure(
            f"the disk of {state_dir} would not take it ({exc}): free space, try again", disk=True
        )
    log.error("request %r failed", op, exc_info=exc)
    return p.Failure(f"{type(exc).__name__}: {exc}")


def _refused(error: str) -> p.Failure:
    return p.Failure(f"refused: {error}", refused=True)


def stop(_request: p.Stop, _d: Parts, peer: Peer) -> Handled:
    if not peer.admin:
        return _refused("only root (or the manager's admin group) may stop this manager"), NOTHING
    return p.Stopping(), Changed(stop=True)


def submit(request: p.Submit, d: Parts, peer: Peer) -> Handled:
    checked = _checked(d, request.job, peer)
    if isinstance(checked, p.Failure):
        return checked, NOTHING
    spec, gpus = checked
    job_id, new = d.state.add_job(spec, gpus, clock.now(), owner=peer)
    return p.Submitted(job_id, new), Changed(queued=True)


def submit_sweep(request: p.SubmitSweep, d: Parts, peer: Peer) -> Handled:
    if not request.points:
        return _refused("the sweep has no point"), NOTHING
    template = request.job
    if not template.group:  # from its token where it has one: a retried sweep is told the same group
        name = hashlib.sha1(template.token.encode()).hexdigest() if template.token else uuid.uuid4().hex
        template = dataclasses.replace(template, group=f"sweep-{name[:8]}")
    try:
        specs = [sweep.job_of(template, pt, i, request.fill_env) for i, pt in enumerate(request.points)]
    except sweep.SweepError as exc:
        return _refused(str(exc)), NOTHING
    checked = _checked(d, specs[0], peer)  # one request, one reservation: the first stands for all
    if isinstance(checked, p.Failure):
        return checked, NOTHING
    first, gpus = checked
    after = first.after  # with the share's selection job, where it has one
    specs = [dataclasses.replace(s, after=after) for s in specs]
    for spec in specs[1:]:  # the first was checked with its reservation
        problem = spec.problem() or d.launcher.missing(spec.command, spec.cwd, spec.env)
        if problem:
            return _refused(problem), NOTHING
    # Its points are alike: what one is measured to use, the others reserve (tandem.place.reserve).
    made = d.state.add_jobs(specs, gpus, clock.now(), alike=sweep.alike_key(template), owner=peer)
    return p.SweepSubmitted([job_id for job_id, _ in made], template.group or ""), Changed(queued=True)


def submit_many(request: p.SubmitMany, d: Parts, peer: Peer) -> Handled:
    checked = []
    for i, spec in enumerate(request.jobs):
        one = _checked(d, spec, peer)
        if isinstance(one, p.Failure):
            if len(request.jobs) == 1:
                return one, NOTHING
            return dataclasses.replace(one, error=f"job {i + 1} of {len(request.jobs)}: {one.error}"), NOTHING
        checked.append(one)
    made = d.state.add_jobs([s for s, _ in checked], [g for _, g in checked], clock.now(), owner=peer)
    return p.SweepSubmitted([job_id for job_id, _ in made]), Changed(queued=True)


def _checked(d: Parts, spec: JobSpec, peer: Peer) -> tuple[JobSpec, int] | p.Failure:
    """The job as it will be queued for ``peer``, and its GPUs; or why it is refused."""
    problem = spec.problem() or d.launcher.missing(spec.command, spec.cwd, spec.env)
    if problem is None and spec.prune is not None:
        tracked = d.tracker is not None and not d.tracker.why_not
        problem = pruning.why_not(d.tracker.uri if tracked and d.tracker is not None else None)
    if problem:
        return _refused(problem)
    gpus = spec.gpus if spec.gpus is not None else (1 if d.capacity.gpus else 0)
    # What it would reserve as it starts (tandem.place.decide, as each pass decides it).
    need = d.admission.decisions(()).reserve(Job(**{**spec.to_dict(), "gpus": gpus}))
    share = d.state.share(spec.share) if spec.share else None
    # A share's producer runs as its definer: its jobs are theirs alone (root's and an admin's
    # jobs too would read, and run, what another user defined).
    if share is not None and share.owner not in (None, peer.uid) and not share.spec.public:
        return _refused(
            f"--share {spec.share}: that shared dataset is another user's and not public; define one "
            "of your own (or ask them for `tandem share define --public`)"
        )
    if spec.share and share is None:
        return _refused(
            f"--share {spec.share}: no such shared dataset; define it first: "
            f"tandem share define {spec.share} --dataset MODULE:FUNCTION"
        )
    fix = "ask for less, or start the daemon with more"
    if share is not None:
        producer = d.producers.reservation(share)
        need = need.with_producer(producer)  # reserved with the job, which starts it
        fix = (
            f"its share's producer reserves {format_cores(producer.cores)} cores and "
            f"{format_size(producer.ram or None)} RAM: "
            f"ask for less, redefine the share with less (tandem share define {share.name} ... "
            "--cpus N), or start the daemon with more"
        )
    waiting = Waiting(0, 0, 0.0, need)
    why = fits_a_node(waiting, d.admission.node_slots(()), d.config.limits)  # one server: the host
    if why:
        return _refused(f"the job {why}; {fix}")
    if share is not None and share.spec.select_job is not None and share.spec.select_job not in spec.after:
        # The group's selection is made once, by its own job: every job of the group waits for it.
        spec = dataclasses.replace(spec, after=[*spec.after, share.spec.select_job])
    for dep in spec.after:
        after = d.state.job(int(dep), attempts=False)
        if after is None or not peer.may_act_on(after.owner):  # another's: as if there were none
            return _refused(f"--after {dep}: no such job of yours")
    return spec, gpus


def cancel(request: p.Cancel, d: Parts, peer: Peer) -> Handled:
    cancelled, unknown, ended, waiting = [], [], [], []
    ids = [int(i) for i in request.ids]
    listed: dict[int, Job] = {}  # every job named or meant, read once, without their environments
    if request.group is not None or request.everything:
        live = tuple(s for s in STATES if s not in FINAL_STATES)
        every = d.state.jobs(live, group=None if request.everything else request.group)
        listed = {j.id: j for j in every if peer.may_act_on(j.owner)}  # a user's --all: their own
        ids += list(listed)
    for job_id in ids:
        if job_id not in listed and (named := d.state.job(job_id, attempts=False)) is not None:
            listed[job_id] = named
    others = [i for i in ids if i in listed and not peer.may_act_on(listed[i].owner)]
    if others:
        return _refused(f"job {others[0]} is another user's: you may cancel only your own jobs"), NOTHING
    refused = None if request.everything else _feeds(d, ids, listed)
    if refused is not None:
        return _refused(refused), NOTHING
    for job_id in ids:
        job = listed.get(job_id)
        if job is None:
            unknown.append(job_id)
        elif job.state in FINAL_STATES:
            ended.append(job_id)
        elif job_id in d.attempts.active:
            d.state.update_job(job_id, cancel_requested=1)
            d.attempts.stop(job_id)
            cancelled.append(job_id)
        else:
            waiting.append(job_id)
    # The waiting ones in one transaction: a sweep's thousands in well under a second.
    d.state.cancel_waiting(waiting, "cancelled", "while waiting", clock.now())
    cancelled += waiting
    return p.Cancelled(sorted(cancelled), unknown, ended), Changed(queue=True)


def _feeds(d: Parts, ids: list[int], listed: dict[int, Job]) -> str | None:
    """Why the cancel of ``ids`` (``listed``: each of them there is, as read) is refused: one
    is a share group's producer whose group has jobs not ended that it leaves unfed (it stops
    by itself after their last), or None."""
    for job_id in ids:
        job = listed.get(job_id)
        if job is None or not is_producer(job) or job.state in FINAL_STATES:
            continue
        unfed = [j.id for j in group_jobs(d.state, job) if j.id not in ids]
        if unfed:
            named = ", ".join(map(str, unfed[:10])) + (
                f" and {len(unfed) - 10} more" if len(unfed) > 10 else ""
            )
            return (
                f"job {job_id} is the producer of share {job.share!r}: its group's jobs {named} still "
                f"read it; cancel them (or the group: tandem cancel --group {job.group}) and it stops "
                "after the last"
            )
    return None


def status(_request: p.Status, d: Parts, peer: Peer) -> Handled:
    active = d.attempts.active.values()
    host = d.admission.host_slot(active)
    gpus = [p.GpuCapacity(g.index, g.uuid, g.mem_total) for g in d.capacity.gpus]
    used_gpus = [
        p.GpuUse(g.index, g.jobs, g.mem_reserved, g.mem_used, g.activity_mean, g.probing)
        for g in d.admission.gpu_slots(active)
    ]
    nodes = _nodes(d)
    free = _measured_free(host.total, host.cpu_mean, host.mem_available)
    if nodes:  # a Ray cluster: its measured nodes' sums (the daemon's own host is not its capacity)
        measured = [n.measured_free for n in nodes if n.alive and n.measured_free is not None]
        free = sum(measured, Resources()) if measured else None
    reply = p.DaemonStatus(
        pid=os.getpid(),
        policy=d.policy,
        state_dir=str(d.state.dir),
        started=d.started,
        limits=dict(d.config.limits.__dict__),
        mps=d.config.mps,
        backend=d.config.backend,
        tracking=None if d.tracker is None else (d.tracker.why_not or d.tracker.uri),
        capacity=p.CapacityReport(d.capacity.total, gpus),
        used=p.Use(reserved=host.reserved, measured_free=free, jobs=len(d.attempts.active), gpus=used_gpus),
        jobs=d.state.counts(),
        nodes=nodes,
        system=d.config.system,
        users=_users(d) if d.config.system else [],
    )
    return reply, NOTHING


def _users(d: Parts) -> list[p.UserUse]:
    """A system manager's users as fair share sees them (the least use first)."""
    users = d.users(clock.now(), True)
    waiting: dict[int, int] = {}
    for job in d.state.jobs(tuple(WAITING_STATES)):
        if job.owner is not None:
            waiting[job.owner] = waiting.get(job.owner, 0) + 1
    standing = users.standing()
    out = []
    for uid in sorted(standing.keys() | waiting.keys(), key=lambda u: (standing.get(u, 0.0), u)):
        jobs, cores, gpu_mem = users.running.get(uid, [0, 0.0, 0])
        out.append(
            p.UserUse(
                uid, int(jobs), waiting.get(uid, 0), cores, int(gpu_mem), round(users.use.get(uid, 0.0), 1)
            )
        )
    return out


def _measured_free(total: Resources, busy: float | None, ram_free: int | None) -> Resources | None:
    """The cores not busy (``busy``: the measured mean fraction) and the RAM free of a host
    or node; None until both were measured."""
    if busy is None or ram_free is None:
        return None
    return Resources(total.cores * (1 - busy), ram_free)


def _nodes(d: Parts) -> list[p.NodeUse]:
    """Each node of a Ray cluster, those gone too, with the attempts on it."""
    slots = {n.node: n for n in d.admission.node_slots(d.attempts.active.values()) if n.node}
    out = []
    for node in d.capacity.nodes:
        slot = slots.get(node.id)
        host = slot.host if slot is not None else None
        out.append(
            p.NodeUse(
                node.id,
                node.name,
                node.alive,
                node.total,
                host.reserved if host else Resources(),
                slot.cpus_held or 0.0 if slot else 0.0,
                host.all_jobs if host else 0,
                [g.index for g in d.capacity.gpus if g.node == node.id],
                # as its agent measured it (None: no agent has answered)
                None if host is None else _measured_free(node.total, host.cpu_mean, host.mem_available),
            )
        )
    return out


def define_share(request: p.DefineShare, d: Parts, peer: Peer) -> Handled:
    spec = dataclasses.replace(request.spec, listen=None)  # where it listens: the manager's to say
    if spec.public and not d.config.system:
        return _refused(
            f"share {spec.name!r}: --public lets other users' jobs read it, under the host's system "
            "manager (tandem daemon start --system); your own daemon's jobs are all yours: leave it out"
        ), NOTHING
    known = d.state.share(spec.name)
    if known is not None and known.owner not in (None, peer.uid):
        return _refused(f"share {spec.name!r} is another user's: choose another name"), NOTHING
    job = request.select_job
    if job is not None:
        problem = job.problem()
        if problem:
            return _refused(f"its selection job: {problem}"), NOTHING
    # As submit resolves it: a selection job that trains a proxy gets a GPU where there is one.
    gpus = 0 if job is None else (job.gpus if job.gpus is not None else (1 if d.capacity.gpus else 0))
    job_id = d.state.define_share(spec, job, gpus, owner=peer)
    # A public share's: where and how its producer runs, whoever's job starts it (Producers.make).
    d.producers.keep_definer(spec.name, (request.env or {}, request.cwd or "/") if spec.public else None)
    # Its selection job, where it has one, is queued: a pass at once, as after a submit.
    return p.ShareDefined(spec.name, job_id), Changed(queued=True, shares=True)


def auto_share(request: p.AutoShare, d: Parts, peer: Peer) -> Handled:
    """A running job's drop-in loader asks for its data to be shared: the share defined (the
    loader's fingerprint names it), its producer queued unless one is queued or runs, the job
    reading it (of no group: in the share's, the producer's, :meth:`Producers.make`), and the
    waiting jobs of its sweep (its group, alike by job key; of no group, the same command
    submitted again) bound to it: they start together once it runs, as a ``--share`` group
    does. The producer lives while a job of the asker's group waits or runs
    (:meth:`Producers.tend`): a job's second loader, of other data, reads its own auto share
    without saying so."""
    job = d.state.job(request.job_id, attempts=False)
    if job is None or job.state != RUNNING or is_producer(job) or not peer.may_act_on(job.owner):
        return _refused(f"job {request.job_id} is not a running job of yours on this daemon"), NOTHING
    spec = request.spec
    share = d.state.share(spec.name)
    if share is not None and not peer.may_act_on(share.owner):
        return _refused(
            f"another user's job reads the same data as auto share {spec.name!r}, and a share serves "
            "one user's jobs: submit with --share NAME of a share of yours"
        ), NOTHING
    if share is None or share.spec != spec:
        d.state.define_share(spec, owner=peer)
        share = d.state.share(spec.name)
    assert share is not None  # defined just now, by the state's one writer
    # Its sweep: the waiting jobs alike (by job key) in its group, read before it joins one.
    waiting = d.state.jobs(tuple(WAITING_STATES))
    alike = [j.id for j in waiting if j.group == job.group and j.learning_key == job.learning_key]
    share_of, group_of = job.share or spec.name, job.group or spec.name
    if (share_of, group_of) != (job.share, job.group):
        d.state.update_job(job.id, share=share_of, group=group_of)
        job = dataclasses.replace(job, share=share_of, group=group_of)
        followed = d.attempts.active.get(job.id)
        if followed is not None:  # what the passes see of it (its producers live while it runs)
            followed.job = dataclasses.replace(followed.job, share=share_of, group=group_of)
    queued, running = d.producers.rows(waiting, d.attempts.active.values())
    # A drop-in loader's job runs on the daemon's host (under Ray it is told no starter).
    rows = (
        [a.job.id for a in running.get(spec.name, [])]
        or queued.get(spec.name)
        or [d.producers.make(share, job)]
    )
    producer = rows[0]
    bound = d.state.bind_share(alike, spec.name, job.group or spec.name) if alike else []
    d.state.event(job.id, "share", f"its loader reads auto share {spec.name!r} (producer: job {producer})")
    return p.AutoShared(spec.name, producer, bound), Changed(queued=True, shares=True)


def remove_shares(request: p.RemoveShares, d: Parts, peer: Peer) -> Handled:
    removed, unknown, in_use = [], [], {}
    for name in request.names:
        share = d.state.share(name)
        if share is None or not peer.may_act_on(share.owner):  # another's: not this user's to remove
            unknown.append(name)
        elif users := d.state.remove_share(name):  # the check and the delete: one transaction
            in_use[name] = users
        else:
            removed.append(name)
            d.producers.keep_definer(name, None)
    return p.SharesRemoved(removed, unknown, in_use), Changed(shares=True)


def not_started(request: p.NotStarted, d: Parts, peer: Peer) -> Handled:
    """A supervisor that could not start its job (the disk refused its first write): the job
    back in the queue, or ended if it was cancelled meanwhile, and no start until the disk takes
    writes. Recorded before the answer: a supervisor that gets none (this write failed too, or
    the daemon restarted) asks again, and stays alive until then, so it is never taken as lost."""
    if not peer.admin:  # a supervisor runs as the manager's user
        return _refused("only the manager's supervisors say a job did not start"), NOTHING
    why = request.why or "its supervisor could not start it"
    d.disk.hold(why)
    a = d.attempts.active.get(request.job_id)
    if a is None or a.n != request.attempt:
        return p.PutBack(""), NOTHING  # not this daemon's to follow, or already dealt with
    job = d.state.job(request.job_id, attempts=False)
    now = clock.now()
    if job is not None and job.state == RUNNING:
        if job.cancel_requested:
            d.state.cancel(job.id, "cancelled", "before its attempt started", now, attempt=a.n)
        else:
            d.state.requeue(job.id, a.n, f"not started: {why}", now)
    del d.attempts.active[request.job_id]
    d.launcher.forget(a)
    tracker = d.attempts.tracker(a.job)
    if tracker is not None:  # its MLflow run, opened as it started, is closed: it will have no other end
        from tandem.place.run.metrics.tracking import run_key

        try:
            tags = {"tandem.state": "requeued", "tandem.cause": f"not started: {why}"}
            tracker.ended(run_key(a.job.id, a.n), "KILLED", tags, {}, a.dir / "output.log")
        except OSError as exc:  # the disk again: the run stays open, the job is queued all the same
            log.warning("job %d attempt %d: its MLflow run not closed: %s", a.job.id, a.n, exc)
    job = d.state.job(request.job_id, attempts=False)
    return p.PutBack(job.state if job is not None else ""), Changed(queue=True)


def read_jobs(request: p.ReadJobs, d: Parts, peer: Peer) -> Handled:
    """The state as ``peer`` may see it (a system manager's users may not read its file):
    their own jobs whole, others' without what they ran (:func:`_unseen`)."""
    for names in (request.shares or [], request.private_of):
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise p.ProtocolError("read-jobs: shares and private_of are lists of names")
    if request.job_id is not None:
        job = d.state.job(request.job_id)
        if job is None:
            return p.JobRows(), NOTHING
        if not peer.may_act_on(job.owner):
            return _refused(f"job {job.id} is another user's: you may read only your own jobs"), NOTHING
        events = [dict(e) for e in d.state.events(job.id)]
        return p.JobRows([_row(job)], events, _shares_of(d, peer)), NOTHING
    jobs = d.state.jobs(
        tuple(request.states) or None,
        attempts=True,
        last=request.last,
        before=request.before,
        group=request.group,
        shares=None if request.shares is None else tuple(request.shares),
        changed_since=request.changed_since,
    )
    if request.group is not None or request.shares is not None:
        # A group's or a share's name says nothing of whose (each user names their own): the
        # asker's of it, an admin's too, so that a sweep's report is never two users' sweeps.
        jobs = [j for j in jobs if _own(j.owner, peer)]
    older = bool(jobs) and request.last is not None and d.state.any_before(jobs[0].id)
    rows = [_row(j if peer.may_act_on(j.owner) else _unseen(j)) for j in jobs]
    counts = d.state.counts() if request.counts else {}
    private = d.state.private_runs(request.private_of, owner=peer.uid) if request.private_of else {}
    private_rows = [_row(j) for j in private.values()]
    return p.JobRows(rows, [], _shares_of(d, peer), older, counts, private_rows), NOTHING


def _own(owner: int | None, peer: Peer) -> bool:
    """Whether a job of ``owner`` is ``peer``'s own (one with none: the daemon's own user's)."""
    return (owner if owner is not None else os.getuid()) == peer.uid


def _row(job: Job) -> dict[str, Any]:
    """A job as its row holds it, with its attempts' rows."""
    from tandem.place.records import Attempt
    from tandem.place.schema import row_values

    return {**row_values(job), "attempts": [row_values(a) for a in job.attempts if isinstance(a, Attempt)]}


def _unseen(job: Job) -> Job:
    """Another user's job as a user sees it: its owner, state, times and resources; not what
    it runs, where, with what parameters, its names or its output's lines."""
    # Its causes and its pruning's words hold its lines and its metric's values; its run, where.
    attempts = [dataclasses.replace(a, cause=None, cause_line=None, mlflow_run_id=None) for a in job.attempts]
    return dataclasses.replace(
        job,
        cause=None,
        pruned=None,
        prune=None,
        metric=None,
        mlflow_run_id=None,
        command=[],
        cwd="",
        env={},
        name=None,
        params={},
        share=None,
        group=None,
        token=None,
        job_key="",
        learn_key="",
        cause_line=None,
        reason=None,
        attempts=attempts,
    )


def _shares_of(d: Parts, peer: Peer) -> list[dict[str, Any]]:
    from tandem.place.schema import row_values

    # Public ones too: the other users' jobs may read them (their definition is theirs to see).
    return [row_values(s) for s in d.state.shares() if peer.may_act_on(s.owner) or s.spec.public]


def read_log(request: p.ReadLog, d: Parts, peer: Peer) -> Handled:
    """A job's output since what the asker saw of it, for its owner only."""
    import base64

    job = d.state.job(request.job_id, attempts=False)
    if job is None:
        return _refused(f"no job {request.job_id}"), NOTHING
    if not peer.may_act_on(job.owner):
        return _refused(f"job {job.id} is another user's: you may read only your own jobs"), NOTHING
    try:
        seen = {int(n): (int(inode), int(end)) for n, inode, end in request.seen}
    except (TypeError, ValueError):
        return _refused("read-log: seen is a list of [attempt, inode, end]"), NOTHING

    def b64(data: bytes | None) -> str | None:
        return None if data is None else base64.b64encode(data).decode()

    parts = [
        {"n": part.n, "inode": part.inode, "offset": part.offset}
        | {"data": b64(part.data), "older": b64(part.older)}
        for part in d.state.log_parts(job.id, seen)
    ]
    return p.LogParts(parts), NOTHING


# Each request's handler: (the request, the daemon's parts, who sent it) -> (its reply, what it changed).
HANDLERS: dict[type, Callable[[Any, Parts, Peer], Handled]] = {
    p.Submit: submit,
    p.SubmitSweep: submit_sweep,
    p.SubmitMany: submit_many,
    p.Cancel: cancel,
    p.Status: status,
    p.Stop: stop,
    p.DefineShare: define_share,
    p.RemoveShares: remove_shares,
    p.NotStarted: not_started,
    p.AutoShare: auto_share,
    p.ReadJobs: read_jobs,
    p.ReadLog: read_log,
}
