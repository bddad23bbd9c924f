"""A share group's producer is a job row of its own (role ``producer``): made by the daemon
when a job of the share waits and no producer of it is queued or running, then reserved,
started, followed, retried and tracked in MLflow like any job (:mod:`tandem.place.attempts`,
its runs tagged ``tandem.role=producer`` and ``tandem.share``, which ``tandem report`` counts
with the group it fed). This module holds what is a producer's own:

- its row (:meth:`Producers.make`): ``producer <share>``, in the group of the job that asked
  for it (else the share's name), running ``tandem share serve-spec SPEC.json`` (the spec
  written as it starts, :meth:`Producers.prepare`: the selection it serves is the state's
  then, its loader workers sized to the daemon's cores, :meth:`ShareSpec.loader_workers`),
  reserving its definition's cores or what its earlier producers used
  (:func:`~tandem.place.reserve.producer_reservation`, learnt under
  :func:`~tandem.place.reserve.producer_key`);
- the group's side of it, once a pass (:meth:`Producers.tend`): it is stopped (its
  supervisor's SIGTERM, SIGKILL after a grace) once no job of its share has waited or run
  (an ``auto`` share's, a drop-in loader's: no job of its group either) for the daemon's
  ``producer_linger_s``, and
  that stop ends it as succeeded; one that ends by itself fails its group's running jobs
  with its own error (and the waiting ones, unless it is retried); it weighs as much as its
  group's running jobs (:mod:`tandem.place.run.supervisor.weights`); what a stopped one used is learnt.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import signal
import stat
import sys
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from tandem._safepath import module_command
from tandem.place import clock
from tandem.place.config import DaemonConfig
from tandem.place.model import FAILED, OOM, PRODUCER_ROLE, RUNNING, WAITING_STATES, Capacity, JobSpec
from tandem.place.outside import serving
from tandem.place.reads import StateReads
from tandem.place.reserve import Learned, producer_key, producer_reservation
from tandem.place.resources import Resources
from tandem.place.run.launchers.launch import signal_shim
from tandem.place.run.supervisor import weights
from tandem.place.run.supervisor.files import read_json, write_json
from tandem.place.state import Job, Share, State
from tandem.share.spec import THIS_PYTHON
from tandem.units import format_cores

if TYPE_CHECKING:
    from tandem.place.active import Active


# The spec a producer job serves, in its environment (Producers.prepare; tandem share serve-spec).
SPEC_ENV = "TANDEM_SHARE_SPEC"
# In a public share's folder of the state directory: its definer's environment and directory.
DEFINER_FILE = "definer.json"


class RunningAttempts(Protocol):
    """What producers need of the daemon's running attempts (:class:`tandem.place.attempts.
    Attempts`, which imports this module: a protocol, so that no module circle forms)."""

    active: dict[int, Active]

    def stop(self, job_id: int, cause: str | None = None, succeeded: str | None = None) -> None: ...


log = logging.getLogger(__name__)
LEARN_AFTER_S = 10.0  # a producer's run shorter than this teaches nothing of its use
STOPPED = "stopped: its group's last job ended"  # the cause of a producer the daemon stopped
# One retry (after running out of memory, on the GPU with most free memory), never the
# escalation that runs a job alone: a producer alone on the host would hold back its group.
PRODUCER_RETRIES = 1
# A share's jobs that find no room where its producers run for this long get another producer
# on another node (Ray): not for a moment's wait (a job about to end), as a producer costs its
# cores and its epochs' loading again. A GPU settling on a one-GPU node counts: its group's
# jobs would start there one a settling (30 s) while another node's GPUs idle.
SPREAD_AFTER_S = 5.0
FAILED_HOST_S = 300.0  # a host where a share's producer failed for good takes no other for this long


def is_producer(job: Job) -> bool:
    return job.role == PRODUCER_ROLE


def public_socket(share: Share, made: bool = False) -> Path:
    """Where public ``share``'s producer listens: ``<system shares dir>/<definer's uid>/``, a
    folder of the definer's (their producer makes its socket there) in one of root's that no
    user may change, so a socket there is the definer's or none. ``made``: the folders made
    (by the manager, root) where missing; one that is not what it should be is refused."""
    from tandem.dirs import system_shares_dir

    top = system_shares_dir()
    folder = top / str(share.owner)
    if made:
        top.mkdir(mode=0o755, exist_ok=True)
        top_st = os.lstat(top)
        if not stat.S_ISDIR(top_st.st_mode) or top_st.st_uid != os.getuid():
            raise RuntimeError(f"{top} is not a folder of the manager's: remove it and start the job again")
        try:
            folder.mkdir(mode=0o755)
            assert share.owner is not None
            os.chown(folder, share.owner, _primary_gid(share.owner))
        except FileExistsError:
            pass
        st = os.lstat(folder)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != share.owner:
            raise RuntimeError(
                f"{folder} is not user {share.owner}'s folder: remove it and start the job again"
            )
    return folder / f"{share.name}.sock"


def _primary_gid(uid: int) -> int:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_gid
    except KeyError:
        return uid


class Producers:
    def __init__(self, state: State, capacity: Capacity, config: DaemonConfig, learned: Learned) -> None:
        self.state, self.capacity, self.config = state, capacity, config
        self.learned = learned  # what producers used, kept in the state (reserve.py)
        self._stopping: dict[int, float] = {}  # producer job id -> when its supervisor is killed
        self._unneeded: dict[int, float] = {}  # producer job id -> since when no job needs it
        self._weights: dict[int, tuple[int, int]] = {}  # producer job id -> supervisor pid, weight
        self._followed: set[int] = set()  # the producers running at the last pass
        self._moved = False  # a row made or a producer started since the daemon last asked
        self._short: dict[str, float] = {}  # share -> since when its jobs find no room (spread)
        self._failed: dict[tuple[str, str], float] = {}  # (share, host) -> until when none goes there

    def moved(self) -> bool:
        """Whether a producer row was made or a producer started since the last call. The
        pass that did it could not move its group (the row was made after the queue was read;
        the jobs wait for a running producer): the daemon runs the next pass at once, not at
        its idle interval (seconds, with a long queue), which a sweep's first start waited."""
        moved, self._moved = self._moved, False
        return moved

    # --- its row --------------------------------------------------------------------------

    def reservation(self, share: Share) -> Resources:
        """The cores and RAM a new producer of ``share`` reserves."""
        return Resources(cores=self._cores(share)[0], ram=share.spec.mem)

    def _cores(self, share: Share) -> tuple[float, str]:
        """What a new producer of ``share`` reserves and why (tandem.place.reserve)."""
        defined = share.spec.producer_cpus(self.capacity.largest_cpus)
        return producer_reservation(defined, share.spec.cpus is not None, self.learned, share.name)

    def make(self, share: Share, asked: Job, why: str = "") -> int:
        """Queue a producer of ``share`` for the waiting job ``asked`` (whose environment,
        and so runtime directory, and working directory it runs in), ``why`` another; its id."""
        full = self.state.job(asked.id, attempts=False) or asked  # with its environment
        env, cwd, priority, group = full.env, full.cwd, full.priority, full.group or share.name
        if share.owner is not None and full.owner != share.owner:
            # Another user's job (a public share's guest): the producer runs as the definer, in
            # their environment and directory as defined, never the asker's (their PYTHONPATH
            # or LD_PRELOAD would be their code run as the definer), nor in their group.
            env, cwd = self._definer(share)
            priority, group = 0, share.name
        elif share.spec.public:  # the definer's own job: as defined too, whoever asks first
            env, cwd = self._definer(share)
        cpus, reason = self._cores(share)
        # A GPU slab's producer keeps its batches on a GPU of its own placement (cuda:0 to it).
        gpus = 1 if share.spec.slab_on_gpu and self.capacity.gpus else 0
        folder = self.state.dir / "shares" / share.name / uuid.uuid4().hex[:12]
        command = module_command(
            "tandem.cli", "share", "serve-spec", str(folder / "share.json"), python=_python(share)
        )
        spec = JobSpec(
            command=command,
            cwd=cwd if os.path.isdir(cwd) else "/",
            env=dict(env),
            name=f"producer {share.name}",
            cpus=cpus,
            mem=share.spec.mem,
            gpu_mem=0 if gpus else None,  # its slab is seen in the GPU's measured use, not reserved
            priority=priority,
            retries=PRODUCER_RETRIES,
            share=share.name,
            group=group,
        )
        # It runs as the share's definer (a system manager's user), whoever's job asked for it.
        owner = share.owner if share.owner is not None else full.owner
        job_id = self.state.add_producer(spec, gpus, clock.now(), producer_key(share.name), owner=owner)
        self._moved = True
        self.state.event(
            job_id,
            "producer",
            f"share {share.name!r}: for job {asked.id}{': ' + why if why else ''}, "
            f"reserving {format_cores(cpus)} cores ({reason})",
        )
        return job_id

    def keep_definer(self, name: str, where: tuple[dict[str, str], str] | None) -> None:
        """Keep public share ``name``'s definer's environment and directory (in the state
        directory: root's only); None: forget them (a share not public, or removed)."""
        path = self.state.dir / "shares" / name / DEFINER_FILE
        if where is None:
            path.unlink(missing_ok=True)
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, {"env": where[0], "cwd": where[1]})

    def _definer(self, share: Share) -> tuple[dict[str, str], str]:
        """Public ``share``'s producer's environment and directory: its definer's, as kept at
        define; else (kept by none: lost) a plain one of theirs, their home its directory."""
        kept = read_json(self.state.dir / "shares" / share.name / DEFINER_FILE)
        if isinstance(kept, dict) and isinstance(kept.get("env"), dict) and isinstance(kept.get("cwd"), str):
            return {str(k): str(v) for k, v in kept["env"].items()}, kept["cwd"]
        import pwd

        try:
            user = pwd.getpwuid(share.owner if share.owner is not None else os.getuid())
        except KeyError:
            return {"PATH": "/usr/local/bin:/usr/bin:/bin"}, "/"
        plain = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": user.pw_dir, "USER": user.pw_name}
        return {**plain, "LOGNAME": user.pw_name, "LANG": "C.UTF-8"}, user.pw_dir

    def prepare(self, job: Job) -> str:
        """Before producer ``job`` starts: the spec it serves, with the selection the state has
        now (given at define, or made by its selection job; one from before tandem kept it: its
        producer makes it, or finds it stored), as JSON: written where its command names it,
        and returned for its environment (``$TANDEM_SHARE_SPEC``, which ``serve-spec`` reads
        first: a system manager's producer runs as its definer, who may not read the manager's
        folders)."""
        share = self.state.share(job.share or "")
        if share is None:
            raise RuntimeError(f"shared dataset {job.share!r} is not defined (tandem share define)")
        spec = share.spec
        served = (
            dataclasses.replace(spec, selection=share.selection, select=None) if share.selection else spec
        )
        if spec.source != "loader":  # its loader workers: the manager's cores' worth (ShareSpec)
            served = dataclasses.replace(served, num_workers=spec.loader_workers(self.capacity.largest_cpus))
        # The jobs that will read it now, which start with it: it keeps its start for them.
        readers = self.state.jobs((*WAITING_STATES, RUNNING), shares=(share.name,))
        served = dataclasses.replace(served, readers=sum(not is_producer(j) for j in readers) or None)
        if spec.public:  # where every user's jobs reach it (defined under a system manager only)
            served = dataclasses.replace(served, listen=str(public_socket(share, made=True)))
        path = Path(job.command[job.command.index("serve-spec") + 1])  # as make() wrote it
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, dataclasses.asdict(served))
        self._moved = True
        return json.dumps(dataclasses.asdict(served))

    @staticmethod
    def rows(
        waiting: Iterable[Job], active: Iterable[Active]
    ) -> tuple[dict[str, list[int]], dict[str, list[Active]]]:
        """This pass's producers, by share: the queued ones' ids, and the running ones (under
        Ray, one a node at most: a share whose node was full has another on a second node)."""
        queued: dict[str, list[int]] = {}
        running: dict[str, list[Active]] = {}
        for j in waiting:
            if is_producer(j) and not j.cancel_requested:
                queued.setdefault(j.share or "", []).append(j.id)
        for a in active:
            if is_producer(a.job):
                running.setdefault(a.job.share or "", []).append(a)
        return queued, running

    def stopping(self, job_id: int) -> bool:
        """Whether producer ``job_id`` was told to stop (its group is done)."""
        return job_id in self._stopping

    def hosts(self, producers: Iterable[Active]) -> set[str]:
        """The host names of the nodes ``producers`` run on."""
        return {self.capacity.node_name(a.placed.node) for a in producers}

    def free_nodes(self, share: str, producers: Iterable[Active]) -> dict[str, int]:
        """The live Ray nodes where another producer of ``share``, whose running ``producers``
        these are, may start: those of another host than each of theirs (a producer is found
        by its share's name on its host: two on one host would collide) and than one where a
        producer of it failed lately, each with 0 jobs of its group; none on one server."""
        now = clock.now()
        taken = self.hosts(producers)
        taken |= {host for (name, host), until in self._failed.items() if name == share and until > now}
        return {n.id: 0 for n in self.capacity.nodes if n.alive and n.name not in taken}

    def spread(self, now: float, short: Iterable[int], waiting: list[Job], active: Iterable[Active]) -> None:
        """Another producer for a share whose jobs no node of its running producers has had
        room for (``short``: those this pass found none for) over :data:`SPREAD_AFTER_S`,
        where another node may take one
        (:meth:`free_nodes`) and none is queued: the next passes place it there (its row's
        nodes are those, :class:`~tandem.place.admission.Admission`), and the group's waiting
        jobs go to either. One at a time: a share grows by a node only after its jobs have
        found no room again that long. Not an ``auto`` share (a drop-in loader's: one server)."""
        if not self.capacity.nodes:
            return
        refused = set(short)
        jobs = [j for j in waiting if j.id in refused and j.share and not is_producer(j)]
        firsts = {j.share or "": j for j in reversed(jobs)}  # each share's first refused job
        self._short = {share: self._short.get(share, now) for share in firsts}
        queued, running = self.rows(waiting, active)
        for name, job in firsts.items():
            if now - self._short[name] < SPREAD_AFTER_S or queued.get(name):
                continue
            share = self.state.share(name)
            live = [a for a in running.get(name, []) if not self.stopping(a.job.id)]
            if share is None or share.spec.source == "auto" or not live:
                continue
            if not self.free_nodes(name, running[name]):
                continue
            on = ", ".join(sorted(self.hosts(live)))
            queued[name] = [self.make(share, job, f"its producers' nodes ({on}) have no room for it")]
            self._short[name] = now  # the next one only once its jobs find no room again

    # --- the group's side, once a pass ------------------------------------------------------

    def tend(
        self, now: float, waiting: list[Job], attempts: RunningAttempts, linger_s: float | None = None
    ) -> bool:
        """Stop the producers whose group is done (for ``linger_s``, else the daemon's
        producer linger), cancel the queued ones no job waits for, fail the groups whose
        producer ended by itself, learn what stopped ones used, weigh the running ones.
        Whether it changed a job (a pass is due)."""
        linger = self.config.producer_linger_s if linger_s is None else linger_s
        active = attempts.active
        readers = [a for a in active.values() if not is_producer(a.job)]
        jobs = [j for j in waiting if not is_producer(j)] + [a.job for a in readers]
        busy = {j.share for j in jobs if j.share}
        wanted = {j.share for j in waiting if j.share and not is_producer(j)}  # a job of it waits
        fed = {(a.job.share, node_of(a)) for a in readers if a.job.share}  # read on that node
        groups = {j.group for j in jobs if j.group is not None}
        defined = {s.name: s for s in self.state.shares()}  # read once a pass
        auto = {name for name, s in defined.items() if s.spec.source == "auto"}
        running = {a.job.id: a for a in active.values() if is_producer(a.job)}
        serving = {a.job.share for a in running.values()}

        def needed(producer: Job, node: str | None = None) -> bool:
            # An auto share (a drop-in loader's) is read by jobs that do not say so (the job
            # that asked for it, another loader of its jobs): it lives while its group does.
            if producer.share in auto and producer.group in groups:
                return True
            if node is not None:  # a running one: while jobs read it on its node, or wait
                return (producer.share, node) in fed or producer.share in wanted
            # a queued one: beside a running producer of its share, only while a job waits
            return producer.share in (wanted if producer.share in serving else busy)

        changed = False
        idle = [j.id for j in waiting if is_producer(j) and (not needed(j) or j.share not in defined)]
        if idle:  # its jobs were cancelled, failed or started elsewhere before it started
            self.state.cancel_waiting(idle, "cancelled", "no job of its share waits for it", now)
            changed = True
        for job_id, a in running.items():
            if job_id in self._stopping:
                if now >= self._stopping[job_id]:  # its supervisor did not end it within its grace
                    signal_shim(a, signal.SIGKILL)
            elif a.job.cancel_requested or needed(a.job, node_of(a)):
                self._unneeded.pop(job_id, None)
            elif now - self._unneeded.setdefault(job_id, now) >= linger:
                attempts.stop(job_id, succeeded=STOPPED)  # the supervisor's SIGTERM
                self._stopping[job_id] = now + 2 * self.config.grace_s + 5
                self.state.event(job_id, "producer", f"stopping producer of {a.job.share!r}: {STOPPED}")
        for job_id in self._followed - set(running):
            changed |= self._ended(job_id, now, running.values())
        self._followed = set(running)
        changed |= self._orphans(running.values(), readers, attempts, auto)
        self._weigh(running.values(), readers)
        return changed

    def _ended(self, job_id: int, now: float, running: Iterable[Active]) -> bool:
        """Producer ``job_id`` ended (or went back to the queue): learn what a stopped one used;
        one that failed for good fails its group's waiting jobs with its error (unless another
        producer of its share runs, on another node: they go there)."""
        self._stopping.pop(job_id, None)
        idle_since = self._unneeded.pop(job_id, None)
        self._weights.pop(job_id, None)
        job = self.state.job(job_id)
        if job is None or not job.attempts:
            return False
        last = job.attempts[-1]
        if job.state not in (FAILED, OOM):
            # Its rate while it fed jobs: the linger after its group's last job is left out.
            run_s = (idle_since or last.ended or now) - last.started
            if last.cause == STOPPED and last.cpu_seconds and run_s >= LEARN_AFTER_S:
                self.learned.seen(producer_key(job.share or ""), last.cpu_seconds / run_s)
            return False
        error = self.error(job)
        log.warning("%s", error)
        host = last.placement.node_name
        if host:  # under Ray: that host lacks what it needs (its data, its environment), for a while
            self._failed[(job.share or "", host)] = now + FAILED_HOST_S
        if any(a.job.share == job.share and a.job.id not in self._stopping for a in running):
            return False
        for waiting in self.state.jobs(tuple(WAITING_STATES), shares=(job.share or "",)):
            if not is_producer(waiting) and not waiting.cancel_requested:
                self.state.fail(waiting.id, error, now)
        return True

    def _orphans(
        self, running: Iterable[Active], readers: Iterable[Active], attempts: RunningAttempts, auto: set[str]
    ) -> bool:
        """The running jobs of a share whose producer is not running on their node (it ended by
        itself, or before this daemon adopted them): stopped, failed with its producer's error.
        Not those of an ``auto`` share: its readers wait for it, or fail with its error themselves."""
        fed = {(a.job.share, node_of(a)) for a in running}
        orphans = [  # a drop-in loader's reader waits for its producer, or fails with its error
            a
            for a in readers
            if a.job.share
            and (a.job.share, node_of(a)) not in fed
            and a.job.share not in auto
            and a.fail_cause is None
        ]
        for a in orphans:
            if a.job.cancel_requested:
                continue
            newest = self.newest(a.job.share or "")
            why = self.error(newest) if newest is not None else f"share {a.job.share!r} has no producer"
            attempts.stop(a.job.id, cause=why)
        return bool(orphans)

    def newest(self, share: str) -> Job | None:
        return newest(self.state, share)

    def error(self, producer: Job) -> str:
        return error(self.state, producer)

    def _weigh(self, running: Iterable[Active], readers: Iterable[Active]) -> None:
        """Each running producer weighs as much as its group's running jobs on its node, at
        least one; set again only when that changes (and kept only once written: a supervisor
        just started may not have entered its cgroup yet, and the next pass tries again)."""
        jobs: dict[tuple[str | None, str], int] = {}
        for a in readers:
            key = (a.job.share, node_of(a))
            jobs[key] = jobs.get(key, 0) + 1
        for a in running:
            if a.shim_pid is None or a.job.id in self._stopping:
                continue
            want = (a.shim_pid, max(1, jobs.get((a.job.share, node_of(a)), 0)))
            if self._weights.get(a.job.id) != want and weights.set_weight(*want):
                self._weights[a.job.id] = want

    @staticmethod
    def start_weights() -> None:
        """At the daemon's start: sweep the CPU cgroups a killed daemon's attempts left, and
        say once how jobs and producers are weighted (:mod:`tandem.place.run.supervisor.weights`)."""
        weights.sweep()
        weighted, how = weights.available()
        (log.info if weighted else log.warning)("CPU weights: %s", how)


def node_of(a: Active) -> str:
    """The Ray node an attempt runs on ("" on one server)."""
    return a.placed.node or ""


def _python(share: Share) -> str:
    """The interpreter a producer of ``share`` runs: the one that defined it (a drop-in's:
    its loader's), which imports its dataset and its dependencies, while it is still there;
    else the daemon's (a share defined before tandem recorded it)."""
    python = share.spec.python
    return python if python and os.access(python, os.X_OK) else sys.executable


def auto_share_command(state_dir: Path, system: bool = False) -> list[str]:
    """What a job's drop-in loader runs to have this daemon serve its data (``tandem share
    auto SPEC``, told to the job in ``$TANDEM_SHARE_STARTER``): share knows no job manager.
    ``system``: the host's system manager's job, which asks it through its socket (the state
    directory is root's)."""
    if system:  # run by the job's own interpreter: its user may not run the manager's
        return module_command("tandem.cli", "share", "auto", "--system", python=THIS_PYTHON)
    return module_command("tandem.cli", "share", "auto", "--state-dir", str(state_dir))


def newest(state: StateReads, share: str, live: bool = False) -> Job | None:
    """The newest producer row of ``share``, with its attempts (``live``: the newest running
    or waiting one first: under Ray a share may have had a second one, since cancelled)."""
    order = "id DESC"
    args: tuple[Any, ...] = (share, PRODUCER_ROLE)
    if live:
        states = (RUNNING, *sorted(WAITING_STATES))
        order = f"state IN ({', '.join('?' * len(states))}) DESC, id DESC"
        args += states
    rows = state.query(f"SELECT id FROM jobs WHERE share = ? AND role = ? ORDER BY {order} LIMIT 1", args)
    return state.job(rows[0][0]) if rows else None


def error(state: StateReads, producer: Job) -> str:
    """How producer ``producer`` ended, in words for its group's jobs, with its log."""
    said = f"the producer of share {producer.share!r} (job {producer.id}) ended ({ended(producer)})"
    if producer.attempts:
        said += f"; its log: {state.attempt_dir(producer.attempts[-1]) / 'output.log'}"
    return said


def ended(producer: Job) -> str:
    """How ``producer`` (its last attempt) ended: its cause and log line."""
    last = producer.attempts[-1] if producer.attempts else None
    cause = (last.cause if last else None) or producer.cause or producer.state
    line = (last.cause_line if last else None) or producer.cause_line
    return cause + (f": {line}" if line and line not in cause else "")


@dataclasses.dataclass(frozen=True)
class ProducerStatus:
    """A share's producer as ``tandem ls``, ``show`` and the dashboard show it."""

    job: int | None  # the newest producer job of the share (the newest live one if any)
    state: str | None
    pid: int | None  # its supervisor's, while it runs
    cpus: float | None  # its cores, while it runs
    started: float | None  # while it runs
    error: str | None  # how it ended, where it failed
    outside: int | None  # the pid of a producer outside the manager that serves it instead

    @property
    def live(self) -> bool:
        """Does a producer of the manager run, or wait to, for the share?"""
        return self.job is not None and self.state in (RUNNING, *WAITING_STATES)


def status(state: StateReads, share: str) -> ProducerStatus:
    """The newest producer of ``share`` (the newest running or waiting one where there is one)."""
    job = newest(state, share, live=True)
    last = job.attempts[-1] if job is not None and job.attempts else None
    running = job is not None and job.state == RUNNING and last is not None
    return ProducerStatus(
        job=job.id if job is not None else None,
        state=job.state if job is not None else None,
        pid=last.shim_pid if running and last is not None else None,
        cpus=last.placement.flat_figures()["cpus"] if running and last is not None else None,
        started=last.started if running and last is not None else None,
        error=ended(job) if job is not None and job.state in (FAILED, OOM) else None,
        outside=serving(share, job),
    )


def group_jobs(state: State, producer: Job) -> list[Job]:
    """The jobs of ``producer``'s share not yet ended (what a cancel of it would leave unfed)."""
    live = (*WAITING_STATES, RUNNING)
    return [j for j in state.jobs(live, shares=(producer.share or "",)) if not is_producer(j)]


def selections_made(state: State, job_id: int, adir: Path) -> dict[str, str | None]:
    """The selections a share's selection job made, by share: the id ``tandem select run``
    leaves in its directory (``selection.json``), None where it left none."""
    made: dict[str, str | None] = {}
    for share in state.shares():
        if share.spec.select_job != job_id:
            continue
        found = read_json(adir / "selection.json")
        sel_id = found.get("id") if found is not None else None
        made[share.name] = (
            sel_id if isinstance(sel_id, str) and re.fullmatch(r"[0-9a-f]{16}", sel_id) else None
        )
    return made
