"""The daemon's requests, one handler each (pueue's design): ``submit``, ``submit_sweep``, ``cancel``,
``status``, ``stop``, ``define-share``, ``remove-shares``, and a supervisor's ``not-started``. Each
takes the daemon and its request record (:mod:`tandem.place.protocol`) and returns the reply
record; a refusal says what to change (``refused``: the client's exit 2).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tandem.place import protocol as p
from tandem.place import sweep
from tandem.place.model import FINAL_STATES, RUNNING, STATES, JobSpec, format_size
from tandem.place.scheduler import Waiting, fits_at_all

if TYPE_CHECKING:
    from tandem.place.daemon import Daemon

log = logging.getLogger(__name__)


def _refused(error: str) -> p.Failure:
    return p.Failure(f"refused: {error}", refused=True)


def stop(d: Daemon, _request: p.Stop) -> p.Stopping:
    d.stop_requested = True
    return p.Stopping()


def submit(d: Daemon, request: p.Submit) -> p.Submitted | p.Failure:
    checked = _checked(d, request.job)
    if isinstance(checked, p.Failure):
        return checked
    spec, gpus = checked
    job_id, new = d.state.add_job(spec, gpus, time.time())
    d.wake = d.dirty = True
    return p.Submitted(job_id, new)


def submit_sweep(d: Daemon, request: p.SubmitSweep) -> p.SweepSubmitted | p.Failure:
    if not request.points:
        return _refused("the sweep has no point")
    template = request.job
    if not template.group:  # from its token where it has one: a retried sweep is told the same group
        name = hashlib.sha1(template.token.encode()).hexdigest() if template.token else uuid.uuid4().hex
        template = dataclasses.replace(template, group=f"sweep-{name[:8]}")
    try:
        specs = [sweep.job_of(template, pt, i, request.fill_env) for i, pt in enumerate(request.points)]
    except sweep.SweepError as exc:
        return _refused(str(exc))
    checked = _checked(d, specs[0])  # one request, one reservation: the first stands for all
    if isinstance(checked, p.Failure):
        return checked
    first, gpus = checked
    after = first.after  # with the share's selection job, where it has one
    specs = [dataclasses.replace(s, after=after) for s in specs]
    for spec in specs:
        problem = spec.problem()
        if problem:
            return _refused(problem)
    # Its points are alike: what one is measured to use, the others reserve (tandem.place.reserve).
    made = d.state.add_jobs(specs, gpus, time.time(), alike=sweep.alike_key(template))
    d.wake = d.dirty = True
    return p.SweepSubmitted([job_id for job_id, _ in made], template.group or "")


def _checked(d: Daemon, spec: JobSpec) -> tuple[JobSpec, int] | p.Failure:
    """The job as it will be queued, and its GPUs; or why it is refused."""
    problem = spec.problem()
    if problem:
        return _refused(problem)
    gpus = spec.gpus if spec.gpus is not None else (1 if d.capacity.gpus else 0)
    cpus, mem = float(spec.cpus), int(spec.mem)
    share = d.state.share(spec.share) if spec.share else None
    if spec.share and share is None:
        return _refused(
            f"--share {spec.share}: no such shared dataset; define it first: "
            f"tandem share define {spec.share} --dataset MODULE:FUNCTION"
        )
    fix = "ask for less, or start the daemon with more"
    if share is not None:
        p_cpus, p_mem = d.producers.reservation(share)
        cpus, mem = cpus + p_cpus, mem + p_mem
        fix = (
            f"its share's producer reserves {p_cpus:g} cores and {format_size(p_mem or None)} RAM: "
            f"ask for less, redefine the share with less (tandem share define {share.name} ... "
            "--cpus N), or start the daemon with more"
        )
    waiting = Waiting(0, 0, 0.0, cpus, mem, gpus, spec.gpu_mem, with_producer=share is not None)
    why = fits_at_all(waiting, d.admission.host_slot(()), d.admission.gpu_slots(()), d.limits)
    if why:
        return _refused(f"the job {why}; {fix}")
    if share is not None and share.spec.select_job is not None and share.spec.select_job not in spec.after:
        # The group's selection is made once, by its own job: every job of the group waits for it.
        spec = dataclasses.replace(spec, after=[*spec.after, share.spec.select_job])
    for dep in spec.after:
        if d.state.job(int(dep), attempts=False) is None:
            return _refused(f"--after {dep}: no such job")
    return spec, gpus


def cancel(d: Daemon, request: p.Cancel) -> p.Cancelled:
    cancelled, unknown, ended, waiting = [], [], [], []
    ids = [int(i) for i in request.ids]
    listed = {}  # a group's or every job, read once, without their environments
    if request.group is not None or request.everything:
        live = tuple(s for s in STATES if s not in FINAL_STATES)
        listed = {j.id: j for j in d.state.jobs(live, group=None if request.everything else request.group)}
        ids += list(listed)
    for job_id in ids:
        job = listed.get(job_id) or d.state.job(job_id, attempts=False)
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
    d.state.cancel_waiting(waiting, "cancelled", "while waiting", time.time())
    cancelled += waiting
    d.dirty = True
    return p.Cancelled(sorted(cancelled), unknown, ended)


def status(d: Daemon, _request: p.Status) -> p.DaemonStatus:
    active = d.attempts.active.values()
    host = d.admission.host_slot(active)
    gpus = [p.GpuCapacity(g.index, g.uuid, g.mem_total) for g in d.capacity.gpus]
    used_gpus = [
        p.GpuUse(g.index, g.jobs, g.mem_reserved, g.mem_used, g.activity_mean, g.probing)
        for g in d.admission.gpu_slots(active)
    ]
    return p.DaemonStatus(
        pid=os.getpid(),
        policy=d.policy.name,
        state_dir=str(d.state.dir),
        started=d.started,
        limits=dict(d.limits.__dict__),
        mps=d.config.mps,
        backend=d.config.backend,
        tracking=None if d.tracker is None else (d.tracker.why_not or d.tracker.uri),
        capacity=p.CapacityReport(d.capacity.cpus, d.capacity.mem, gpus),
        used=p.Use(
            cpus=host.cpus_reserved,
            mem_bytes=host.mem_reserved,
            cpu_busy_mean=host.cpu_mean,
            mem_available_bytes=host.mem_available,
            jobs=len(d.attempts.active),
            gpus=used_gpus,
        ),
        jobs=d.state.counts(),
    )


def define_share(d: Daemon, request: p.DefineShare) -> p.ShareDefined | p.Failure:
    job = request.select_job
    if job is not None:
        problem = job.problem()
        if problem:
            return _refused(f"its selection job: {problem}")
    # As submit resolves it: a selection job that trains a proxy gets a GPU where there is one.
    gpus = 0 if job is None else (job.gpus if job.gpus is not None else (1 if d.capacity.gpus else 0))
    job_id = d.state.define_share(request.spec, job, gpus)
    d.wake = d.dirty = True
    return p.ShareDefined(request.spec.name, job_id)


def remove_shares(d: Daemon, request: p.RemoveShares) -> p.SharesRemoved:
    removed, unknown, in_use = [], [], {}
    for name in request.names:
        if d.state.share(name) is None:
            unknown.append(name)
        elif users := d.state.remove_share(name):  # the check and the delete: one transaction
            in_use[name] = users
        else:
            removed.append(name)
    d.dirty = True
    return p.SharesRemoved(removed, unknown, in_use)


def not_started(d: Daemon, request: p.NotStarted) -> p.PutBack:
    """A supervisor that could not start its job (the disk refused its first write): the job
    back in the queue, or ended if it was cancelled meanwhile, and no start until the disk takes
    writes. Recorded before the answer: a supervisor that gets none (this write failed too, or
    the daemon restarted) asks again, and stays alive until then, so it is never taken as lost."""
    why = request.why or "its supervisor could not start it"
    d.disk.hold(why)
    a = d.attempts.active.get(request.job_id)
    if a is None or a.n != request.attempt:
        return p.PutBack("")  # not this daemon's to follow, or already dealt with
    job = d.state.job(request.job_id, attempts=False)
    now = time.time()
    if job is not None and job.state == RUNNING:
        if job.cancel_requested:
            d.state.cancel(job.id, "cancelled", "before its attempt started", now, attempt=a.n)
        else:
            d.state.requeue(job.id, a.n, f"not started: {why}", now)
    del d.attempts.active[request.job_id]
    d.launcher.forget(a)
    d.dirty = True
    if d.attempts.tracked:  # its MLflow run, opened as it started, is closed: it will have no other end
        from tandem.place.run import tracking

        try:
            tags = {"tandem.state": "requeued", "tandem.cause": f"not started: {why}"}
            tracking.run_ended(
                d.state.dir, tracking.run_key(a.job.id, a.n), "KILLED", tags, {}, a.dir / "output.log"
            )
        except OSError as exc:  # the disk again: the run stays open, the job is queued all the same
            log.warning("job %d attempt %d: its MLflow run not closed: %s", a.job.id, a.n, exc)
    job = d.state.job(request.job_id, attempts=False)
    return p.PutBack(job.state if job is not None else "")


HANDLERS: dict[type, Callable[[Daemon, Any], p.Reply]] = {
    p.Submit: submit,
    p.SubmitSweep: submit_sweep,
    p.Cancel: cancel,
    p.Status: status,
    p.Stop: stop,
    p.DefineShare: define_share,
    p.RemoveShares: remove_shares,
    p.NotStarted: not_started,
}
