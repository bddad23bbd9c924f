"""The running attempts as the daemon follows them: start, follow, finish, adopt.

- **start**: the attempt is recorded before its supervisor starts (so no attempt runs
  twice), its spec written (:class:`~tandem.place.run.supervisor.files.AttemptSpec`), its MLflow run opened
  (:mod:`tandem.place.run.metrics.tracking`; the supervisor starts the job once the run exists, and
  tells it the run's id), and the launcher starts the supervisor;
- **follow** (each tick): the supervisor's ``usage.json`` (memory, pids), the job's GPU
  memory from NVML, when a probe has settled, and how it ended (``result.json``, or a
  supervisor that died without one);
- **finish**: the job's state written first, then the attempt leaves the active set (a
  write that fails, a full disk say, is tried again next tick: a job never stays
  ``running`` after it ended); an out-of-memory ending is retried (:mod:`tandem.place.retry`);
- **adopt**: after a restart, the attempts a previous daemon left running.
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from pathlib import Path

from tandem.place import clock, model, outside
from tandem.place.active import STARTUP_SAMPLES, Active, AttemptEnd, Startup, energy_of
from tandem.place.config import DaemonConfig
from tandem.place.devices import Monitor
from tandem.place.identity import attempt_folder
from tandem.place.model import CANCELLED, FAILED, RUNNING, SUCCEEDED, Capacity, GpuInfo, format_size
from tandem.place.producers import STOPPED, selections_made
from tandem.place.records import AttemptPlacement
from tandem.place.reserve import PROBE_CORES, SYSTEM_PROBE_CORES, Learned, Measuring
from tandem.place.resources import Reservation
from tandem.place.retry import retry
from tandem.place.run.launchers.launch import Launch, Launcher, stop_orphaned_job
from tandem.place.run.metrics import tracking
from tandem.place.run.metrics.as_user import Owner, acting_as, job_folder, job_folder_path, remove_theirs
from tandem.place.run.metrics.tracking import Tracker
from tandem.place.run.metrics.users import Trackers
from tandem.place.run.supervisor.files import (
    AttemptSpec,
    Result,
    RunRef,
    ShimInfo,
    Usage,
    disk_trouble,
    load,
    save,
)
from tandem.place.run.supervisor.proctrack import host_id, supervisor_runs
from tandem.place.scheduler import Placement
from tandem.place.state import Attempt, Job, State

log = logging.getLogger(__name__)

LOST_AFTER_S = 10.0  # an attempt whose supervisor never showed itself within this is abandoned
# A supervisor whose usage changed within this is alive, wherever Ray says its node is (it
# samples each second): an attempt on a node Ray lost runs again only once it is silent.
SILENT_S = 15.0


class Attempts:
    def __init__(
        self,
        state: State,
        capacity: Capacity,
        config: DaemonConfig,
        monitor: Monitor,
        launcher: Launcher,
        trackers: Trackers | None,
        socket: str,
    ) -> None:
        self.state, self.capacity, self.config = state, capacity, config
        self.monitor, self.launcher, self.trackers, self.socket = monitor, launcher, trackers, socket
        self.active: dict[int, Active] = {}
        self.host = host_id()
        probe = SYSTEM_PROBE_CORES if config.system else PROBE_CORES
        self.startup = Startup(Learned(state.learnt_cores(), state.record_cores, probe))

    def _left_dir(self, job: Job, adir: Path, made: bool = False) -> Path:
        """Where an attempt of ``job`` (in ``adir``) may leave us files: ``adir``, or under a
        system manager a folder of its user's (:func:`job_folder`; ``made``: new)."""
        if not self.config.system or job.owner in (None, 0):
            return adir
        from tandem.dirs import system_users_dir

        users, key = system_users_dir(), f"{job.id}-{adir.name}"
        return job_folder(users, _owner(job), key) if made else job_folder_path(users, _owner(job)[0], key)

    def _read_left(self, job: Job, adir: Path, read: bool) -> dict[str, str | None]:
        """As an attempt ends: the selections a share's selection job left (``read``: it
        succeeded; its user's folder read as them), and that folder gone."""
        left = self._left_dir(job, adir)
        if left == adir:
            return selections_made(self.state, job.id, adir) if read else {}
        owner = _owner(job)
        try:
            with acting_as(owner):
                return selections_made(self.state, job.id, left) if read else {}
        finally:
            remove_theirs(left, owner)

    def tracker(self, job: Job) -> Tracker | None:
        """Where ``job``'s runs are written (its user's store under a system manager), or None:
        they are not."""
        if self.trackers is None:
            return None
        tracker = self.trackers.of(job.owner, job.owner_gid)
        return None if tracker.why_not else tracker

    # --- start ------------------------------------------------------------------------------

    def start(
        self,
        job: Job,
        p: Placement,
        chosen: tuple[GpuInfo, ...],
        env: dict[str, str],
        mps: bool = False,
        backend: str | None = None,
        node_env: tuple[str, ...] = (),
    ) -> None:
        n = len(job.attempts) + 1
        # A folder of its own: no attempt before or after a lost database has this name.
        record = Attempt(job.id, n, RUNNING, AttemptPlacement(), 0.0, folder=attempt_folder(n))
        adir = self.state.attempt_dir(record)
        adir.mkdir(parents=True)
        # Its attempt's own directory (what it may leave us); a system manager's user's job, a
        # folder of theirs beside their runs (the attempt's is root's).
        left = self._left_dir(job, adir, made=True)
        env = {**env, "TANDEM_JOB_DIR": str(left)}
        uuids = tuple(g.uuid for g in chosen)
        # What it reserves is the pass's decision (tandem.place.decide.reserve), kept as it is.
        cpu = Measuring(job, self.startup.learned, start=p.reservation)
        by_index = sorted(chosen, key=lambda g: g.index)
        placement = AttemptPlacement(
            # its GPUs as its node numbers them (one server: the daemon's numbering, the same)
            device=",".join(f"cuda:{g.index if g.local is None else g.local}" for g in by_index) or "cpu",
            gpus=tuple(p.gpus),
            uuids=uuids,
            mps=mps,
            alone=p.alone,
            probe=p.probe,
            reservation=p.reservation,
            backend=backend,
            node=p.node or None,
            node_name=self.capacity.node_name(p.node) if p.node else None,
            ray_cpus=p.cores_held,
        )
        name, producer = model.run_name(job.name, job.command, job.params), job.role == model.PRODUCER_ROLE
        # A system manager (root) runs each job as its submitter; a user's daemon as itself.
        as_owner = os.geteuid() == 0 and job.owner not in (None, 0)
        tracker = self.tracker(job)
        save(
            adir,
            AttemptSpec(
                job.command,
                job.cwd,
                env,
                job_id=job.id,
                attempt=n,
                name=name,
                grace_s=self.config.grace_s,
                interval_s=self.config.interval_s,
                log_max=self.config.log_max,
                socket=self.socket,
                track=tracker is not None,
                # a job is told its run's id (one run per job; under a system manager, in its user's store)
                mlflow_env=tracker is not None and not producer,
                db_id=self.state.id,
                node_env=node_env,
                user=job.owner if as_owner else None,
                group=_owner(job)[1] if as_owner else None,
                groups=tuple(job.owner_groups) if as_owner else (),
            ),
        )
        record.placement, record.started = placement, (started := clock.now())
        self.state.start(record, job.started, f"attempt {n} on {placement.where}")
        a = Active(job, n, placement, adir, started, cpu=cpu)
        a.energy_start = {u: e for u in uuids if (e := self.monitor.energy_mj(u)) is not None}
        if tracker is not None:
            share = self.state.share(job.share) if job.share else None
            tags = tracking.attempt_tags(job, n, placement.where, mps, share.selection if share else None)
            key = tracking.run_key(job.id, n)
            try:
                tracker.started(key, name, tags, adir / "metrics.jsonl", started, job.id, n, job.params)
            except OSError as exc:
                if tracker.owner is None or disk_trouble(exc):
                    raise
                # Their folder, as they changed it, refused it: the job runs untracked, saying why.
                self.state.event(job.id, "tracking", f"not recorded in MLflow: {exc}")
                save(adir, RunRef(error=f"its user's MLflow folder refused it: {exc}"))
        a.lost_before = sum(at.state == "lost" for at in job.attempts)
        self.active[job.id] = a
        try:
            self.launcher.start(a, Launch(adir, job.cwd, p.reservation, chosen, p.node, p.cores_held))
        except BaseException:  # not started: not followed (the daemon fails the job)
            del self.active[job.id]
            self.launcher.forget(a)
            raise
        try:
            if a.shim_pid is not None:
                self.state.update_attempt(job.id, n, shim_pid=a.shim_pid, shim_ctime=a.shim_ctime)
        except Exception as exc:  # it runs: follow records its supervisor from its own files
            log.warning("job %d attempt %d started, not yet recorded in full: %s", job.id, n, exc)

    def put_back(self, job_id: int, why: str, now: float) -> None:
        """A start that the disk stopped: the job waits again (its attempt, if recorded, lost),
        to be tried once the disk takes writes; if even that cannot be written now,
        :meth:`reconcile` does it on a later pass."""
        try:
            job = self.state.job(job_id)
            if job is not None and job.state == RUNNING and job_id not in self.active:
                self.state.requeue(job_id, len(job.attempts) or None, why, now)
        except Exception as exc:
            log.warning("job %d: could not put it back in the queue yet: %s", job_id, exc)

    def reconcile(self, now: float) -> None:
        """A job the state says runs, which no attempt of this daemon follows (its start
        was cut short by a failed write): back to the queue, never ``running`` with no process."""
        for job in self.state.jobs((RUNNING,)):
            if job.id not in self.active:
                self.put_back(job.id, "its start did not complete (a write failed); tried again", now)

    # --- follow -----------------------------------------------------------------------------

    def follow_all(self, now: float) -> None:
        for a in list(self.active.values()):
            try:
                self.follow(a, now)
            except Exception:  # one attempt's trouble (a full disk) must not stop the others
                log.exception("following job %d attempt %d; trying again next tick", a.job.id, a.n)

    def follow(self, a: Active, now: float) -> None:
        if a.shim_pid is None:
            shim = load(a.dir, ShimInfo)
            if shim is not None:
                a.shim_pid, a.shim_ctime, a.remote = shim.pid, shim.ctime, shim.host != self.host
                self.state.update_attempt(a.job.id, a.n, shim_pid=a.shim_pid, shim_ctime=a.shim_ctime)
                if self._cancel_requested(a.job.id):  # cancelled before we knew whom to tell
                    self.launcher.cancel(a)
        self._measure(a, now)
        result = load(a.dir, Result)
        if result is not None:
            self.finish(a, result)
        elif (lost := self.launcher.lost(a)) is not None:  # its node is gone to Ray, no result written
            self._node_lost(a, lost, now)
        elif a.shim_pid is not None and not self.launcher.alive(a):
            result = load(a.dir, Result)  # it may have written it just before exiting
            if result is None:
                self._stop_orphan(a)
                cancelled = a.job.cancel_requested or self._cancel_requested(a.job.id)
                kind, state, cause = (
                    ("cancelled", CANCELLED, "cancelled")
                    if cancelled
                    else ("lost", FAILED, "lost: the job's supervisor died without a result")
                )
                result = Result(kind, state, None, None, cause, None, a.started, now)
            self.finish(a, result)
        # (pending first: a supervisor the fork server could not fork is started there, at once)
        elif a.shim_pid is None and not self.launcher.pending(a) and now - a.started > LOST_AFTER_S:
            if supervisor_runs(a.dir, a.started):
                return
            # The daemon died between recording the attempt and starting its supervisor: the
            # attempt never ran, so the job goes back to the queue (no attempt runs twice).
            if self._cancel_requested(a.job.id):
                self.state.cancel(a.job.id, "cancelled", "before its attempt started", now, attempt=a.n)
            else:
                self.state.requeue(a.job.id, a.n, "never started", now)
            del self.active[a.job.id]
            self.launcher.forget(a)  # its Ray actor, if one was made, ends (its hold freed)

    def _node_lost(self, a: Active, why: str, now: float) -> None:
        """Its node is gone to Ray. While its supervisor still writes, the node is cut off (a
        partition), not dead: its job runs on there, followed through the shared state
        directory to its end (run again now, it would run twice at once). Once silent, it is
        gone: not the job's failure, so it runs again elsewhere, its retries untouched (or
        ends cancelled, if that was asked)."""
        a.lost_seen = a.lost_seen or now  # it is cut off if it writes after this
        if now - max(a.heard, a.lost_seen) < SILENT_S:
            if a.heard > a.lost_seen and not a.cut_off_said:
                a.cut_off_said = True
                self.state.event(
                    a.job.id,
                    "cut off",
                    f"{why} to Ray, but its supervisor still writes (a partition?): followed to its "
                    f"end there; it runs again only if silent for {SILENT_S:.0f} s",
                )
            return
        if self._cancel_requested(a.job.id):
            self.state.cancel(a.job.id, "cancelled", why, now, attempt=a.n)
        else:
            self.state.requeue(a.job.id, a.n, f"lost with its node: {why}; it runs again", now)
        if (tracker := self.tracker(a.job)) is not None:
            tags = {"tandem.state": "lost", "tandem.cause": why}
            tracker.ended(tracking.run_key(a.job.id, a.n), "FAILED", tags, {}, a.dir / "output.log", now)
        del self.active[a.job.id]
        self.launcher.forget(a)

    def _measure(self, a: Active, now: float) -> None:
        usage = load(a.dir, Usage)
        if usage is not None and usage.t != a.usage_t:
            a.usage_t, a.heard = usage.t, now
            a.pids = tuple(usage.pids)
            a.cpus_used = None if usage.cpu_percent is None else usage.cpu_percent / 100.0
            a.samples += 1
            if a.samples <= STARTUP_SAMPLES and a.cpus_used is not None:
                self.startup.seen(a.job.command, a.cpus_used)
            elif a.cpus_used is not None and a.cpu is not None and a.cpu.sample(a.cpus_used):
                self._reserves(a, a.reservation.measured(cores=round(a.cpu.cores, 3), why=a.cpu.source))
            grown = usage.peak_mem > a.peak_mem * 1.02 + (1 << 20)
            a.peak_mem = max(a.peak_mem, usage.peak_mem)
            ram = a.ram_grown()  # --mem auto: its reservation follows its peak
            if ram is not None:
                self._reserves(a, ram)
            gpu_mem = max((self.monitor.job_gpu_mem(u, a.pids) for u in a.uuids), default=0)
            if gpu_mem > a.peak_gpu_mem * 1.02 + (1 << 20):
                grown = True
            a.peak_gpu_mem = max(a.peak_gpu_mem, gpu_mem)
            if grown:
                a.last_growth = now
        # A probe has settled once its GPU memory stopped growing; one that has not touched
        # the GPU yet (still loading data, say) is not settled at 0 unless that goes on long.
        limits = self.config.limits
        long_s = max(300.0, 10 * limits.settle_s)
        if (
            a.gpu_probing
            and a.settled(now, limits.settle_s)
            and (a.peak_gpu_mem > 0 or now - a.started > long_s)
        ):
            gpu_mem = int(a.peak_gpu_mem * (1 + limits.gpu_mem_margin))
            settled = a.reservation.measured(gpu_mem=gpu_mem, why="")
            a.placed = replace(a.placed, reservation=settled, settled=True)
            self.state.update_attempt(a.job.id, a.n, placement=a.placed, peak_gpu_mem=a.peak_gpu_mem)
            self.state.event(a.job.id, "settled", f"GPU memory {format_size(a.peak_gpu_mem)}")

    def _reserves(self, a: Active, reservation: Reservation) -> None:
        """What the attempt reserves, as learnt: its record written whole (the one the daemon
        holds, so that no write reads the stored one back)."""
        a.placed = replace(a.placed, reservation=reservation)
        self.state.update_attempt(a.job.id, a.n, placement=a.placed)

    def _stop_orphan(self, a: Active) -> None:
        """The supervisor died without a result (killed): stop the job it supervised, so that
        it does not run on unaccounted for, holding memory the scheduler has given away."""
        if stop_orphaned_job(a.dir, self.config.grace_s):
            self.state.event(a.job.id, "stopped", "its supervisor died; the job was stopped")

    def _stopped_before(self, a: Active, state: str) -> str | None:
        """A producer that a daemon before this one stopped (no one else cancels it unasked)."""
        producer = a.job.role == model.PRODUCER_ROLE and state == CANCELLED
        return STOPPED if producer and not self._cancel_requested(a.job.id) else None

    def told_to_stop(self) -> list[Active]:
        """The running attempts told to stop (a cancel, or an end or a failure the daemon
        decided) whose end is not recorded yet."""
        return [
            a
            for a in self.active.values()
            if a.stop_cause or a.fail_cause or self._cancel_requested(a.job.id)
        ]

    def _cancel_requested(self, job_id: int) -> bool:
        job = self.state.job(job_id, attempts=False)
        return bool(job and job.cancel_requested)

    # --- cancel, fail ------------------------------------------------------------------------

    def stop(self, job_id: int, cause: str | None = None, succeeded: str | None = None) -> None:
        """Stop a running attempt (a cancel; with ``cause``, a failure the daemon decided;
        with ``succeeded``, an end it decided: a producer whose group is done)."""
        a = self.active[job_id]
        a.fail_cause, a.stop_cause = cause or a.fail_cause, succeeded or a.stop_cause
        self.launcher.cancel(a)

    # --- finish -----------------------------------------------------------------------------

    def finish(self, a: Active, result: Result) -> None:
        """Record how the attempt ended (its job's transition, once), then what follows from
        it; a later write that fails (a full disk) is tried again next tick, alone."""
        if a.ending is None:
            a.ending = self._record_end(a, result)
        end = a.ending
        if a.cpu is not None and a.cpu.auto and end.state == SUCCEEDED:  # what its key reserves next
            run_s = end.ended - a.started
            totals = result.cpu_seconds / run_s if result.cpu_seconds and run_s > 1 else None
            used = a.cpu.measured() or totals
            if used is not None:
                self.startup.learned.seen_job(a.job, used)
        if end.peak_mem or end.peak_gpu_mem:
            self.state.record_peak(a.job.learning_key, end.peak_mem, end.peak_gpu_mem, end.ended - a.started)
        if (tracker := self.tracker(a.job)) is not None:
            status = model.mlflow_status(end.state)
            tags = {
                "tandem.state": "retrying" if end.retried else end.state,
                "tandem.cause": end.cause or "",
                "tandem.exit_code": result.exit_code,
            }
            if end.state == model.PRUNED:  # where its sweep stopped it, as the sweep report lists it
                tags |= {
                    "tandem.pruned": "true",
                    "tandem.pruned.rung": end.pruned_rung,
                    "tandem.pruned.reason": end.cause or "",
                }
            summary = {
                "run_s": end.ended - a.started,
                "wait_s": end.wait_s,
                "peak_mem_bytes": end.peak_mem,
                "peak_gpu_mem_bytes": end.peak_gpu_mem,
                "cpu_seconds": result.cpu_seconds,
                "gpu_energy_joules": end.energy,
            }
            key = tracking.run_key(a.job.id, a.n)
            tracker.ended(key, status, tags, summary, a.dir / "output.log", end.ended)
        # Only once everything is written: a write that failed leaves it here for the next tick.
        del self.active[a.job.id]
        self.launcher.forget(a)

    def _record_end(self, a: Active, result: Result) -> AttemptEnd:
        """The job's transition for the attempt's end: retried (escalated) or finished."""
        ended = result.ended or clock.now()
        peak_mem = max(a.peak_mem, result.peak_mem or 0) or None
        peak_gpu = a.peak_gpu_mem or None
        state, cause = result.state, result.cause
        job = self.state.job(a.job.id, attempts=False)
        assert job is not None
        if job.pruned is not None and state in (CANCELLED, FAILED):  # its --prune rule stopped it
            state, cause = model.PRUNED, job.pruned
        elif a.fail_cause is not None and state == CANCELLED:
            state, cause = FAILED, a.fail_cause
        elif (stop := a.stop_cause or self._stopped_before(a, state)) is not None and state != model.OOM:
            state, cause = SUCCEEDED, stop  # the daemon stopped it: however it took the stop
        cause = outside.cause(a.job, cause)  # a producer not needed: another process served its share
        ending = {
            "state": state,
            "ended": ended,
            "exit_code": result.exit_code,
            "signal": result.signal,
            "cause": cause,
            "cause_line": result.line,
            "peak_mem": peak_mem,
            "peak_gpu_mem": peak_gpu,
            "cpu_seconds": result.cpu_seconds,
        }
        # Its MLflow run, named with its end: the helper's word of it may come a tick after
        # the result, and a reader of the ended job would find no run.
        ref = load(a.dir, RunRef)
        run = {"mlflow_run_id": ref.run_id} if ref is not None and ref.run_id and not ref.error else {}
        ending |= run
        energy = energy_of(a, self.active.values(), self.monitor.energy_mj)
        common = {
            "exit_code": result.exit_code,
            "signal": result.signal,
            "cause": cause,
            "cause_line": result.line,
            "peak_mem": max(job.peak_mem or 0, peak_mem or 0) or None,
            "peak_gpu_mem": max(job.peak_gpu_mem or 0, peak_gpu or 0) or None,
            "energy_joules": (job.energy_joules or 0.0) + energy if energy is not None else job.energy_joules,
        }
        common |= run
        largest = max((g.mem_total for g in self.capacity.gpus), default=0) or None
        usable = int(self.capacity.largest_mem * (1 - self.config.limits.host_mem_headroom))
        again = None
        if not job.cancel_requested:
            limits = self.config.limits
            again = retry(
                result.kind,
                a.n - a.lost_before,  # attempts lost with their node or never started: not its tries
                job.retries,
                job.escalation,
                job.gpu_mem,
                job.mem,
                peak_gpu,
                peak_mem,
                limits.gpu_mem_margin,
                largest,
                usable,
            )
        if again is not None:
            changes = {"escalation": again.escalation, "gpu_mem": again.gpu_mem, "mem": again.mem}
            why = f"attempt {a.n} ended {cause}; retrying"
            self._read_left(job, a.dir, read=False)
            self.state.retry(job.id, a.n, ending, {**common, **changes}, why, result.notes)
        else:
            detail = "" if cause == state else cause or ""
            # A share's selection job: the selection it made, in the same transaction as its end.
            made = self._read_left(job, a.dir, read=state == SUCCEEDED)
            self.state.finish(
                job.id, a.n, state, ending, {**common, "ended": ended}, detail, result.notes, made
            )
        wait_s = (job.started or a.started) - job.submitted
        rung = job.pruned_rung if state == model.PRUNED else None
        return AttemptEnd(state, cause, again is not None, ended, peak_mem, peak_gpu, energy, wait_s, rung)

    # --- after a restart ----------------------------------------------------------------------

    def adopt(self) -> None:
        """Take up the attempts a previous daemon left running."""
        for job in self.state.jobs((RUNNING,), attempts=True):
            if not job.attempts:
                self.state.requeue(job.id, None, "running with no attempt recorded", clock.now())
                continue
            att = job.attempts[-1]
            a = Active.adopted(job, att, self.state.attempt_dir(att), self.startup.learned)
            shim = load(a.dir, ShimInfo)
            if shim is not None:
                a.remote = shim.host != self.host
                if a.shim_pid is None:
                    a.shim_pid, a.shim_ctime = shim.pid, shim.ctime
            a.lost_before = sum(at.state == "lost" for at in job.attempts)
            self.active[job.id] = a
            self.state.event(job.id, "adopted", f"attempt {att.n} (shim pid {a.shim_pid})")
        self.follow_all(clock.now())


def _owner(job: Job) -> Owner:
    """``(uid, gid)`` a system manager's user's job runs as (its primary group as submitted,
    else the group of its uid's number)."""
    assert job.owner is not None
    return job.owner, job.owner_gid if job.owner_gid is not None else job.owner
