"""The job manager's daemon: the loop and the requests.

One daemon per state directory (a file lock says which), started by ``tandem daemon start``
or by the first ``tandem submit`` (``python -m tandem.place.daemon STATE_DIR``), with the
configuration kept in the state directory (:class:`~tandem.place.config.DaemonConfig`).
Each tick (1 s, or at once when a request or a job's result arrives) it:

1. answers requests on its socket (:mod:`tandem.place.protocol`), one handler per request;
   a connection is read only when its packet is there, so an idle client blocks no one;
2. measures the host and GPUs each second (:class:`~tandem.place.devices.Monitor`);
3. follows the running attempts (:mod:`tandem.place.attempts`): usage, settling, endings
   and out-of-memory retries;
4. plans (:func:`tandem.place.scheduler.plan`) from what :mod:`tandem.place.admission`
   sees, starts what it placed, and stores why every other job waits;
5. tends the share groups' producers, jobs of their own (:mod:`tandem.place.producers`):
   stopped after their group's last job, and one that died fails its group.

Jobs do not depend on the daemon: each runs under a supervisor in its own session, and a
restarted daemon re-adopts the attempts it finds running and goes on with the queue.
It opens the state only once it holds the directory's lock, and stops, saying so, when
``place.db`` is no longer the file it writes (:mod:`tandem.place.identity`).
"""

from __future__ import annotations

import logging
import os
import selectors
import signal
import sys
import time
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from tandem import _ipc
from tandem.dirs import system_users_dir
from tandem.place import clock, fairshare, protocol
from tandem.place.admission import Admission
from tandem.place.attempts import Attempts
from tandem.place.clock import current as current_clock
from tandem.place.clock import use as use_clock
from tandem.place.config import DaemonConfig
from tandem.place.devices import Monitor, Nvml, detect_capacity
from tandem.place.diskwait import DiskWait
from tandem.place.fairshare import Users
from tandem.place.identity import StateMoved, keep_records, moved
from tandem.place.model import DAEMON_PEER, Capacity, Peer, format_size
from tandem.place.paths import RAY_TROUBLE, StateError, private_dir
from tandem.place.policies import make_policy
from tandem.place.producers import Producers
from tandem.place.pruning import EVERY_S as PRUNE_EVERY_S
from tandem.place.pruning import Pruner
from tandem.place.queue import WaitingJobs
from tandem.place.requests import HANDLERS, Parts, failure, peer_of
from tandem.place.resources import Resources
from tandem.place.run.launchers.launch import Launcher, LocalLauncher, RayLauncher
from tandem.place.run.metrics.users import Trackers
from tandem.place.run.services import ray_head
from tandem.place.run.supervisor import weights
from tandem.place.run.supervisor.files import DaemonFile, disk_trouble
from tandem.place.run.supervisor.proctrack import create_time, reap_children
from tandem.place.scheduler import Placement, plan_nodes
from tandem.place.starting import jobs_per_node, start_job
from tandem.place.state import Job, State

log = logging.getLogger(__name__)

# Between ticks when nothing happens (a request, a job's result and a pass due end the wait at
# once): how often attempts are followed (usage.json: once a second) and measurements read.
TICK_S = 1.0
SAMPLE_S = 1.0
# A scheduling pass runs when something changed (a submit, a cancel, a job that started or
# ended, a producer that died), at most every PLAN_MIN_S (a storm of submits costs one pass
# per interval, not one per submit), and every PLAN_EVERY_S anyway (measurements move).
PLAN_MIN_S = 0.2
PLAN_EVERY_S = 2.0
# A pass with nothing changed (for measurements alone) costs time in proportion to the queue
# (each waiting job is looked at, to say why it waits): with a long queue such passes come
# less often, so that they take at most this share of a core. A change still gets its pass
# at once. With 10,000 queued, about one pass every 10 s instead of 2.
IDLE_PASS_SHARE = 0.005
USE_EVERY_S = 10.0  # a system manager reads its users' decayed use again this often
STOP_WAIT_S = 15.0  # at its stop: the longest wait for the attempts it told to stop
IDLE_CONNECTION_S = 2.0  # a client that connected and sent nothing is dropped after this
# Connections one user may hold open at once (not yet answered): a flood of them from one user
# (a system manager's) is closed unread beyond this, so that it holds no one else's descriptors.
CONNECTIONS_PER_USER = 32
SLOW_TICK_S = 5.0  # a pass that blocks requests longer than this is logged


class DaemonRunning(Exception):
    """Another daemon holds this state directory."""


class Daemon:
    def __init__(
        self,
        state: State,
        capacity: Capacity,
        config: DaemonConfig,
        nvml: Nvml | None = None,
        *,
        clock: clock.Clock | None = None,
        launcher: Launcher | None = None,
    ) -> None:
        """``clock``: what the daemon reads the time from (default: the system's);
        ``launcher``: what starts and follows a local daemon's attempts (default: a
        supervisor process each). Tests give their own (``tests/place/inproc.py``)."""
        if clock is not None:
            use_clock(clock)
        self.state, self.config, self.nvml = state, config, nvml
        self.limits = config.limits
        self.policy = make_policy(config.policy)
        backend = None
        if config.backend == "ray":
            from tandem.place.run.launchers.ray_backend import RayBackend

            # Without an address: this machine's head of the daemon's own, which outlives it.
            if not config.address:  # its own head lets in only this user's processes
                os.environ.update(ray_head.auth_env(state.dir))
            address = (
                config.address or ray_head.ensure(state.dir, capacity.total.cores, capacity.gpus).address
            )
            backend = RayBackend(address)
            capacity = backend.cluster()
            nvml = None  # GPUs are Ray's now: each measured by its node's agent
        self.capacity = capacity
        trouble = state.dir / RAY_TROUBLE
        self.launcher: Launcher = launcher if launcher is not None else LocalLauncher()
        if backend is not None:
            self.launcher = RayLauncher(backend, trouble, config.address, self.limits.window_s)
            self.launcher.samples()  # the nodes' agents made before serving: Ray's first costs seconds
        else:  # what a Ray daemon of this directory said is no longer true, and its own head ends
            trouble.unlink(missing_ok=True)  # (a switch is refused while any of its jobs runs)
            ray_head.stop(state.dir)
        self.monitor = Monitor(capacity, self.limits.window_s, nvml)
        self.socket_path = Path(config.socket) if config.socket else protocol.socket_path(state.dir)
        self.moved: str | None = None  # what happened to the state's file, once it is not ours
        self.started = current_clock().time()
        self.stop_requested = False
        self.wake = False
        self.dirty = True  # something changed since the last scheduling pass
        self.queue = WaitingJobs(state)
        self.disk = DiskWait(state.dir)  # starts held while the disk refuses writes
        self._pass_cpu_s = 0.0  # the last scheduling pass's CPU time
        self._last_plan = 0.0
        self._next_sample = 0.0
        self._next_tick = 0.0
        self.tracker = None
        self.trackers: Trackers | None = None  # its own, and a system manager's users'
        if config.track:
            from tandem.place.run.metrics.tracking import daemon_tracker

            self.tracker = daemon_tracker(state.dir, config.store)
            if not self.tracker.why_not:
                self.trackers = Trackers(self.tracker, system_users_dir() if config.system else None)
        tracked = self.tracker is not None and not self.tracker.why_not
        self.attempts = Attempts(
            state, capacity, config, self.monitor, self.launcher, self.trackers, str(self.socket_path)
        )
        self.producers = Producers(state, capacity, config, self.attempts.startup.learned)
        # Jobs this host's supervisors start run under CPU weights where its cgroups allow
        # (a fake launcher's do not): what they use beyond their declaration is shared out.
        weighted = isinstance(self.launcher, LocalLauncher) and weights.available()[0]
        self.admission = Admission(
            state, capacity, self.limits, self.monitor, self.producers, self.attempts.startup, weighted
        )
        self.pruner = Pruner(
            state,
            self.tracker.uri if tracked and self.tracker is not None else None,
            self.trackers if config.system else None,  # each user's trials in their own store
        )
        self.mps = None
        if config.mps:
            from tandem.place.run.services.mps import MpsManager

            self.mps = MpsManager(_ipc.runtime_dir())
        # A system manager's users (fair share, limits): the host they share, their use as last read.
        self._host = Resources(capacity.total.cores, gpu_mem=sum(g.mem_total for g in capacity.gpus))
        self._use: tuple[float, dict[int, float]] | None = None
        self._use_of: frozenset[int] = frozenset()  # the attempts running when it was read
        parts = (self.attempts, self.admission, self.producers, self.disk, self.launcher)  # what handlers use
        self.parts = Parts(
            state, capacity, config, *parts, self.policy.name, self.started, self.tracker, self._users
        )

    # --- life cycle -----------------------------------------------------------------------

    def serve(self) -> None:
        """Serve until stopped (the caller holds the directory's lock: :func:`run_daemon`)."""
        sel = selectors.DefaultSelector()
        try:
            listener = self._listen(sel)
            self._install_signals()
            self.attempts.adopt()
            self.producers.start_weights()
            log.info("serving %s with policy %s", self.state.dir, self.policy.name)
            while not self.stop_requested:
                wait = 0 if self.wake else PLAN_MIN_S if self.dirty else TICK_S
                if self.pruner.watching:  # a pruned sweep's fast trials: its reports read more often
                    wait = min(wait, PRUNE_EVERY_S)
                ready = sel.select(timeout=wait)
                if self._state_moved():
                    break
                for key, _ in ready:
                    if key.fileobj is listener:
                        self._accept(sel, listener)
                    else:
                        self._answer(sel, key.fileobj)
                if self.moved is not None:  # seen while answering: no tick writes on
                    break
                self._drop_idle(sel, listener)
                if not (ready or self.wake or self.dirty) and clock.monotonic() < self._next_tick:
                    self.dirty |= bool(self.pruner.prune(self.attempts))  # between ticks: the pruner alone
                    continue
                self.wake = False
                self._next_tick = clock.monotonic() + TICK_S
                began = clock.monotonic()
                try:
                    self.tick()
                except Exception:  # one bad tick (a full disk, a vanished file) must not end the daemon
                    log.exception("tick failed; going on")
                    clock.sleep(TICK_S)
                took = clock.monotonic() - began
                if took >= SLOW_TICK_S:  # no request was answered meanwhile: the log says why they waited
                    load = os.getloadavg()[0]
                    log.warning("a pass took %.1f s; requests waited for it (load %.1f)", took, load)
                listener = self._check_socket(sel, listener)
        finally:
            for key in list(sel.get_map().values()):
                key.fileobj.close()  # type: ignore[union-attr]
            sel.close()
            self.socket_path.unlink(missing_ok=True)
            if self.stop_requested and self.moved is None:
                self._before_stop()
            if self.mps is not None:  # servers with clients stay: the next daemon adopts their jobs
                self.mps.release_idle({u for a in self.attempts.active.values() for u in a.uuids})
            if self.nvml is not None:
                self.nvml.close()
            self.launcher.shutdown()
            if self.config.backend == "ray" and not self.config.address and not self.attempts.active:
                ray_head.stop(self.state.dir)  # no attempt runs under the daemon's own head
            for tracker in self.trackers.all() if self.trackers is not None else []:
                try:
                    tracker.poke()  # what is left to write is written (a helper started if none runs)
                    tracker.stop()  # and then it ends
                except Exception:
                    if tracker.owner is None:
                        raise
                    log.exception("user %d's MLflow helper not told to stop", tracker.owner[0])

    def _before_stop(self) -> None:
        """As it stops: idle producers (lingering for a next job) are stopped, which no daemon
        would stop later, and the attempts it told to stop are waited for a while (their ends
        recorded, not left "running"); running jobs and their producers are adopted later."""
        try:
            self.attempts.follow_all(now := clock.now())  # the ends not yet read (the last job's)
            self.producers.tend(now, self.queue.read(), self.attempts, linger_s=0.0)
            deadline = clock.monotonic() + min(STOP_WAIT_S, 2 * self.config.grace_s + 2)
            while self.attempts.told_to_stop() and clock.monotonic() < deadline:
                clock.sleep(0.1)
                self.attempts.follow_all(clock.now())
        except Exception:  # a full disk: the next daemon reads their ends, stops the others
            log.exception("stopping idle producers or reading stopped jobs' ends failed")

    def _listen(self, sel: selectors.BaseSelector) -> Any:
        self.socket_path.unlink(missing_ok=True)  # a dead daemon's; the lock says it is dead
        listener = _ipc.listen(self.socket_path)
        if self.config.system:  # every user of the host may connect: who they are comes from the kernel
            os.chmod(self.socket_path, 0o666)
        self._socket_ino = os.stat(self.socket_path).st_ino
        sel.register(listener, selectors.EVENT_READ)
        # Where clients find us: a shell with another runtime directory (cron has no
        # XDG_RUNTIME_DIR) reads the socket's path here instead of computing another.
        # And which MLflow store its jobs' runs are in: `tandem report` reads them there.
        store = self.tracker.uri if self.tracker is not None and not self.tracker.why_not else None
        DaemonFile(
            pid=os.getpid(),
            ctime=create_time(os.getpid()),
            started=self.started,
            socket=str(self.socket_path),
            store=store,
            db_id=self.state.id,
            db_file=self.state.file,
        ).save(self.state.dir)
        return listener

    def _state_moved(self) -> bool:
        """Is ``place.db`` no longer the file we write (removed, or replaced)? Then our
        records are kept beside it, it is said, and we stop."""
        how = moved(self.state.path, self.state.file)
        if how is not None:
            self.moved = keep_records(self.state.db, self.state.path, how)
            log.error("%s", self.moved)
            self.stop_requested = True
        return how is not None

    def _check_socket(self, sel: selectors.BaseSelector, listener: Any) -> Any:
        """Listen again if our socket file was removed or replaced (logind removes the
        runtime directory at the user's last logout): otherwise no client could reach us."""
        try:
            if os.stat(self.socket_path).st_ino == self._socket_ino:
                return listener
        except OSError:
            pass
        sel.unregister(listener)
        listener.close()
        log.warning("socket %s had gone; listening again", self.socket_path)
        return self._listen(sel)

    def _install_signals(self) -> None:
        def stop(_signum: int, _frame: Any) -> None:
            self.stop_requested = True

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    # --- requests -------------------------------------------------------------------------

    def _accept(self, sel: selectors.BaseSelector, listener: Any) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except BlockingIOError:
                return
            try:  # who connected, as the kernel says: each request is theirs
                peer = peer_of(conn, self.config.admin_gid)
            except OSError:
                conn.close()
                continue
            held = sum(1 for k in sel.get_map().values() if k.data is not None and k.data[1].uid == peer.uid)
            if not peer.admin and held >= CONNECTIONS_PER_USER:
                conn.close()  # this user's flood: the others' requests go on being answered
                continue
            sel.register(conn, selectors.EVENT_READ, data=(clock.monotonic(), peer))

    def _drop_idle(self, sel: selectors.BaseSelector, listener: Any) -> None:
        now = clock.monotonic()
        for key in list(sel.get_map().values()):
            if key.fileobj is not listener and now - key.data[0] > IDLE_CONNECTION_S:
                sel.unregister(key.fileobj)
                key.fileobj.close()  # type: ignore[union-attr]

    def _answer(self, sel: selectors.BaseSelector, conn: Any) -> None:
        peer: Peer = sel.get_key(conn).data[1]
        sel.unregister(conn)
        with conn:
            try:
                data, fds = _ipc.recv_packet(conn, timeout=0)
                request = protocol.unpack(data, fds)
            except (EOFError, TimeoutError, ValueError, OSError):
                return
            try:
                if self.moved is not None or self._state_moved():  # nothing written into no file
                    raise StateMoved(self.moved)
                reply = self.handle(protocol.read_request(request), peer)
            except Exception as exc:  # a bad request must not take the daemon down
                reply = failure(exc, request.get("op"), self.state.dir)
            if reply is None:
                return
            try:  # a large reply (a sweep's ids) in a memory file: no reply is too large to send
                data, body = protocol.pack(protocol.to_wire(reply))
            except ValueError as exc:
                data, body = protocol.encode(protocol.to_wire(protocol.Failure(str(exc)))), ()
            try:
                _ipc.send_packet(conn, data, body, timeout=2.0)
            except (OSError, TimeoutError, ValueError):
                pass
            finally:
                _ipc.close_fds(list(body))

    def handle(self, request: protocol.Request, peer: Peer = DAEMON_PEER) -> protocol.Reply | None:
        """The reply to ``request`` from ``peer`` (None: a wake, which has none); what it
        changed sets our flags."""
        if isinstance(request, protocol.Wake):
            self.wake = True
            return None
        reply, changed = HANDLERS[type(request)](request, self.parts, peer)
        self.stop_requested |= changed.stop
        self.dirty |= changed.queued or changed.queue or changed.shares
        self.wake |= changed.queued
        return reply

    # --- the tick ---------------------------------------------------------------------------

    def tick(self) -> None:
        now = clock.now()
        if clock.monotonic() >= self._next_sample:
            self._next_sample = clock.monotonic() + SAMPLE_S
            self.monitor.sample()
            for node, sample in self.launcher.samples().items():  # a Ray cluster's nodes
                self.monitor.take(node, sample)
        before = set(self.attempts.active)
        self.attempts.follow_all(now)
        self.dirty |= bool(self.pruner.prune(self.attempts))  # trials their sweep stops early
        reap_children()
        if self.mps is not None:
            self.mps.release_idle({u for a in self.attempts.active.values() for u in a.uuids})
        self.dirty |= set(self.attempts.active) != before
        since = clock.monotonic() - self._last_plan
        every = max(PLAN_EVERY_S, self._pass_cpu_s / IDLE_PASS_SHARE)
        if (self.dirty and since >= PLAN_MIN_S) or since >= every:
            self.dirty = False
            self._last_plan = clock.monotonic()
            # The waiting jobs (what a pass needs of them) and their dependencies, read once.
            self.launcher.refresh(self.capacity)  # a Ray cluster's live nodes, as they are now
            self.attempts.reconcile(now)
            waiting = self.queue.read()
            started = time.process_time()
            deps = self.admission.dependencies(waiting)
            waiting = self.admission.resolve(waiting, deps)
            launched = self._schedule(now, waiting, deps)
            self.dirty |= self.producers.tend(now, waiting, self.attempts)
            self.dirty |= self.producers.moved()
            if not launched:  # what a pass that only looks costs (a start costs more, once)
                self._pass_cpu_s = time.process_time() - started
        for tracker in self.trackers.all() if self.trackers is not None else []:
            try:
                tracker.poke()
                answers = tracker.take_results()
            except Exception as exc:
                if tracker.owner is None:
                    raise
                # A user's folder as they changed it fails them alone, never the manager's pass.
                log.warning("user %d's MLflow folder: %s", tracker.owner[0], exc)
                continue
            for done in answers:
                if done.job_id is None or done.attempt is None:
                    continue  # a share's producer: its run is found by its tags
                if tracker.owner is not None:  # a user's helper's answer: for a job of theirs only
                    job = self.state.job(done.job_id, attempts=False)
                    if job is None or job.owner != tracker.owner[0]:
                        log.warning(
                            "user %d's MLflow helper answered for job %d, not theirs",
                            tracker.owner[0],
                            done.job_id,
                        )
                        continue
                    a = self.attempts.active.get(done.job_id)
                    tracker.relay(a.dir if a is not None and a.n == done.attempt else None, done)
                if done.run_id:
                    self.state.update_attempt(done.job_id, done.attempt, mlflow_run_id=done.run_id)
                    self.state.update_job(done.job_id, mlflow_run_id=done.run_id)
                elif done.error:
                    self.state.event(done.job_id, "tracking", f"not recorded in MLflow: {done.error}")

    def _schedule(self, now: float, waiting: list[Job], deps: Any) -> bool:
        """One pass over the waiting jobs: start what fits, say why the others wait. Whether
        it started any."""
        reasons: dict[int, str] = {}
        launched = False
        short: list[int] = []  # the jobs no node had room for
        active = self.attempts.active
        queue = self.admission.waiting(waiting, deps, active, reasons)
        held = self.disk.reason() if queue else None
        if queue and not held and self.launcher.trouble:  # an actor made now could block the daemon
            held = "the Ray cluster does not answer: no job starts until it does"
        if held:  # a start would meet the full disk (or a cluster that does not answer) again
            reasons.update(dict.fromkeys((w.id for w in queue), held))
            queue = []
        if queue:
            nodes = self.admission.node_slots(active.values())
            users = self._users(now) if self.config.system else None
            outcome = plan_nodes(queue, nodes, self.policy, self.limits, now, users)
            reasons.update(outcome.reasons)
            short = outcome.short
            on_node = jobs_per_node(active.values(), outcome.placements)  # once this pass's run
            for placement in outcome.placements:
                if self.disk.why is not None:  # the disk stopped a start of this pass: the rest wait
                    break
                job = self.state.job(placement.job_id)  # with its environment: it starts now
                if job is None or job.cancel_requested:
                    continue
                launched = True
                try:
                    self._launch(job, placement, on_node[placement.node])
                except Exception as exc:
                    if disk_trouble(exc):  # the disk's failure, not the job's: it waits and is tried again
                        log.warning("could not start job %d: %s; it waits for the disk", job.id, exc)
                        self.attempts.put_back(job.id, f"could not start: {exc}; tried again", clock.now())
                        self.disk.hold(str(exc))
                        continue
                    log.exception("could not start job %d", job.id)
                    attempt = len(job.attempts) + 1  # recorded, or not yet: ended either way
                    self.state.fail(job.id, f"could not start: {exc}", clock.now(), attempt=attempt)
        self.producers.spread(now, short, waiting, active.values())  # a share whose nodes are full
        self.admission.write_reasons(reasons)
        return launched

    def _users(self, now: float, fresh: bool = False) -> Users:
        """The system manager's users as a pass sees them (:mod:`tandem.place.fairshare`):
        their decayed use, read again when a job started or ended, every :data:`USE_EVERY_S`
        and where ``fresh`` (a status), and their running jobs."""
        running_now = frozenset(self.attempts.active)
        stale = self._use is None or now - self._use[0] >= USE_EVERY_S or running_now != self._use_of
        if fresh or stale:
            self._use_of = running_now  # a job that ended since: its use counts at once
            attempts = self.state.attempts_since(now - 5 * fairshare.HALF_LIFE_S, limit=20_000)
            owners = self.state.owners({a.job_id for a in attempts})
            held = [
                fairshare.Held(
                    owner,
                    fairshare.host_share(a.placement.reservation.resources, self._host),
                    a.started,
                    a.ended,
                )
                for a in attempts
                if (owner := owners.get(a.job_id)) is not None and a.placement.reservation is not None
            ]
            self._use = (now, fairshare.decayed_use(held, now))
        assert self._use is not None
        users = Users(self._use[1], {}, self.config.user_limits, self._host)
        for a in self.attempts.active.values():  # what each user's running jobs hold now
            if a.placed.reservation is not None:
                users.add(a.job.owner, a.placed.reservation.resources)
        return users

    def _launch(self, job: Job, p: Placement, on_host: int) -> None:
        """Start ``job`` where ``p`` says; ``on_host``: the jobs on its node once this pass's run."""
        start_job(
            job,
            p,
            on_host,
            capacity=self.capacity,
            config=self.config,
            state_dir=self.state.dir,
            producers=self.producers,
            attempts=self.attempts,
            mps=self.mps,
        )


def run_daemon(state_dir: Path, config: DaemonConfig) -> None:
    """Serve ``state_dir`` with ``config`` in this process until stopped (ValueError: a
    configuration this machine cannot give; :class:`StateMoved`: its database was removed or
    replaced under it)."""
    lock = FileLock(str(private_dir(state_dir) / "daemon.lock"), mode=0o600)
    try:  # before the state is opened: only the daemon that holds it makes or moves anything
        lock.acquire(timeout=0)
    except Timeout:
        raise DaemonRunning(f"a daemon already serves {state_dir}") from None
    try:
        nvml = Nvml() if config.gpus != "none" else None
        capacity = detect_capacity(config.cap, config.gpus, nvml)
        print(
            f"tandem daemon {os.getpid()}: {capacity.total.cores:g} cores, "
            f"{format_size(capacity.total.ram)} RAM, "
            f"{len(capacity.gpus)} GPU(s), policy {config.policy}, state {state_dir}",
            file=sys.stderr,
            flush=True,
        )
        daemon = Daemon(State(state_dir), capacity, config, nvml)
        daemon.serve()
    finally:
        lock.release()
    if daemon.moved is not None:
        raise StateMoved(daemon.moved)


def main(argv: list[str]) -> int:
    """``python -m tandem.place.daemon STATE_DIR``: the daemon, with the kept configuration."""
    if len(argv) != 1:
        print("usage: python -m tandem.place.daemon STATE_DIR", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    state_dir = Path(argv[0])
    try:
        run_daemon(state_dir, DaemonConfig.load(state_dir))
    except (ValueError, DaemonRunning, RuntimeError, ConnectionError, StateError) as exc:
        print(f"tandem daemon: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
