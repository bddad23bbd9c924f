"""The per-job supervisor: ``python -m tandem.place.run.supervisor.shim ATTEMPT_DIR``.

The daemon starts one supervisor per attempt in a session of its own, so it does not share
the daemon's fate: if the daemon dies (SIGKILL included) the job keeps running and the
supervisor still records how it ended; a restarted daemon finds it by pid and start time
and reads its files (:mod:`tandem.place.run.supervisor.files`, the one definition of them).

What it does for its job:

- **tracks it as ``tandem run`` does**: watch's :class:`~tandem.watch.Run` with the same
  samplers (process tree, host, the job's GPUs through NVML, energy measured or estimated,
  tandem share), into a spool file that the job manager's MLflow helper forwards while the
  job runs (no MLflow import in here); and ``usage.json`` for the daemon, each sample. The
  job starts once the helper has made its MLflow run (``mlflow.json``, at most
  ``RUN_WAIT_S``) and is told it (``MLFLOW_TRACKING_URI``, ``MLFLOW_RUN_ID``), so that
  MLflow in the job writes to that one run;
- **keeps its output**, capped: the job writes into a pipe, read here into ``output.log``,
  which rotates to ``output.log.1`` at half of ``log_max``; a disk that refuses it loses
  output, never the job;
- **owns every process of it** (:mod:`tandem.place.run.supervisor.proctrack`: a cgroup of its own where
  one can be made, and a marker every descendant inherits): a cancel (SIGTERM here) or the
  end of the main process stops all of them, those that left the session too;
- **outlives a full disk**: what cannot be written is said once and written when it can;
  the result is written as soon as the disk takes it. A disk that refuses its first write
  (before the job starts) puts the job back in the queue: the daemon is told over its socket.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from tandem.place.model import mlflow_status
from tandem.place.run.supervisor import failures, proctrack, warm, weights
from tandem.place.run.supervisor.cgroups import OomWatch
from tandem.place.run.supervisor.fence import start_fence
from tandem.place.run.supervisor.files import (
    ORPHAN_GRACE_S,
    ORPHAN_PARENT,
    ORPHAN_SIGNAL,
    AttemptSpec,
    Result,
    RunRef,
    ShimInfo,
    Started,
    Usage,
    disk_trouble,
    load,
    save,
)
from tandem.place.run.supervisor.logpump import LogPump
from tandem.place.run.supervisor.proctrack import (
    JobProcesses,
    create_time,
    host_id,
    join,
    leave,
    make_cgroup,
    wait_exit,
)
from tandem.place.run.supervisor.telling import tell_not_started, wake_daemon
from tandem.watch.stores.base import absolute_uri, run_env, with_run_env

RESULT_RETRY_S = 3600.0  # how long a result waits for a disk that refuses it
EXIT_NOT_STARTED = 75  # EX_TEMPFAIL: the disk refused the first write; the job was put back, not run
EXIT_ORPHANED = 76  # its Ray actor's process died: the job stopped, no result written
RUN_WAIT_S = 60.0  # how long a job waits for its MLflow run to be made (then starts without its id)
# The run's points go to the spool every FLUSH_S, and the MLflow helper writes each batch in
# one transaction: MLflow's SQL store costs about 5 ms a write and 0.06 ms a point, so every
# 2 s made the helper's writes the largest part of the manager's own CPU on a sweep.
FLUSH_S = 10.0


class Shim:
    def __init__(self, attempt_dir: Path) -> None:
        self.dir = attempt_dir
        spec = load(attempt_dir, AttemptSpec)
        if spec is None:
            raise SystemExit(f"tandem shim: no readable {AttemptSpec.FILE} in {attempt_dir}")
        self.spec = spec
        # Its attempt's own folder, held open: everything it writes goes there, wherever the
        # folder is moved (a lost database's are set aside while their jobs run), never into
        # a folder made at its path since.
        from tandem.place.run.supervisor.files import hold

        self.path, self.dir = attempt_dir, hold(attempt_dir)
        self.cancelled = False
        self.orphaned = False  # its Ray actor died: stop, and write no result (the attempt is lost)
        self.terms = 0  # SIGTERMs received (one more while its result waits for the disk: give up)
        self.notes: list[str] = []
        self.peak_mem = 0

    def note(self, text: str) -> None:
        """Say once what could not be done (a full disk): in the shim's log and the result."""
        self.notes.append(text)
        _say(text)

    def _on_term(self, _signum: int, _frame: Any) -> None:
        self.cancelled = True
        self.terms += 1

    def _on_orphaned(self, _signum: int, _frame: Any) -> None:
        self.orphaned = True  # not a cancel: a job that ended by itself keeps its result

    def run(self) -> int:
        me = os.getpid()
        signal.signal(ORPHAN_SIGNAL, self._on_orphaned)
        parent = os.environ.pop(ORPHAN_PARENT, "")  # under a Ray actor: stop when it dies
        if parent.isdigit() and not proctrack.signal_on_parent_death(ORPHAN_SIGNAL, int(parent)):
            self.orphaned = True  # it died already
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, self._on_term)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a closed terminal is not a cancel
        try:  # the first write, before the job starts: a full disk puts the job back, never fails it
            info = ShimInfo(me, create_time(me), host_id())
            save(self.dir, info)
        except OSError as exc:
            if not disk_trouble(exc):
                raise
            return self._not_started(f"its supervisor's first write failed ({exc.strerror})")
        fence = start_fence(self.dir)  # under Ray: stops it where cut off from the cluster and the disk
        spec = self.spec
        run_ids = self._run_env() if spec.mlflow_env else {}
        if self.orphaned:
            return EXIT_ORPHANED
        if self.cancelled:  # while it waited for its run: it never starts
            return self._write_result(failures.classify(-signal.SIGTERM, "", cancelled=True), time.time())
        oom = OomWatch()  # the counters of the cgroup it shares with its job, before either moves
        cgroup = make_cgroup(f"tandem-{os.getuid()}-{spec.job_id}-{spec.attempt}-{me}")
        if cgroup is not None and not join(cgroup):
            cgroup = None
        if cgroup is not None:
            oom.add_job_cgroup(cgroup)
        # its CPU weight (a producer's is raised by the daemon as its jobs come and go)
        weighted = weights.enter(f"{os.getuid()}-{spec.job_id}-{spec.attempt}-{me}", 1.0, cgroup)
        procs = JobProcesses(f"{spec.job_id}.{spec.attempt}.{secrets.token_hex(6)}", cgroup)
        where = str(cgroup) if cgroup else None
        self._try_save(replace(info, marker=procs.marker, cgroup=where))
        started = time.time()
        log_path = self.dir / "output.log"
        read_fd, write_fd = os.pipe()
        env = with_run_env({**_node_env(spec), **procs.env()}, run_ids)
        # a Python job whose interpreter would import what this one has: forked, warm (warm.py)
        plan = warm.plan(spec.command, env, spec.cwd, bool(_as_submitter(spec)), in_cgroup=cgroup is not None)
        proc: subprocess.Popen[bytes] | warm.ForkedJob
        try:
            if plan is not None:
                proc = warm.start(plan, env, spec.cwd, write_fd)
            else:
                proc = subprocess.Popen(
                    spec.command,
                    cwd=spec.cwd,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=write_fd,
                    stderr=write_fd,
                    start_new_session=True,
                    **_as_submitter(spec),
                )
        except OSError as exc:
            os.close(read_fd)
            os.close(write_fd)
            if cgroup is not None:
                leave(cgroup)
            procs.close()
            if weighted is not None:
                weighted.close()
            code = 127 if isinstance(exc, (FileNotFoundError, NotADirectoryError)) else 126
            return self._finish(code, f"{spec.command[0]}: {exc.strerror}", started)
        os.close(write_fd)
        pump = LogPump(read_fd, log_path, spec.log_max, self.note)
        pump.start()
        self._try_save(
            Started(
                proc.pid,
                create_time(proc.pid),
                proc.pid,
                started,
                procs.marker,
                where,
            )
        )
        run = self._track(proc.pid)
        wait_exit(proc, lambda: self.cancelled or self.orphaned)  # asleep until it ends or a signal comes
        orphaned = self.orphaned and proc.poll() is None  # its actor died while the job ran
        if cgroup is not None:
            leave(cgroup)  # before any kill of the cgroup
        if self.cancelled or orphaned:  # every process of the job; the main one is reaped below
            procs.stop(ORPHAN_GRACE_S if orphaned else spec.grace_s, first=proc.pid)
        returncode = proc.wait()
        rusage = _child_cpu()
        if procs.pids():  # what the job left running, in its session or outside it
            procs.stop(min(spec.grace_s, 5.0))
        pump.join(10.0)
        oom_kills, oom_where = oom.kills() or (0, None)  # before its own cgroup (and count) goes
        procs.close()
        if weighted is not None:
            weighted.close()
        kernel = failures.kernel_oom_killed(proc.pid) if returncode == -signal.SIGKILL else None
        ending = failures.classify(
            returncode,
            failures.read_tail(log_path),
            cancelled=self.cancelled,
            oom_kills=oom_kills,
            kernel_oom=kernel is not None,
            oom_where=oom_where,
        )
        cpu_seconds = None
        if run is not None:
            status = mlflow_status(ending.state)
            run.stop(status, final_cpu=rusage)
            cpu_seconds = run.tree.cpu_seconds if run.tree is not None else None
        if pump.dropped:
            self.note(f"{pump.dropped} bytes of output were lost: the disk refused them")
        if orphaned:  # the daemon takes the attempt for lost with its node, and runs it again
            _say(f"{fence and fence.why or 'its Ray actor died (it lost the cluster)'}: the job was stopped")
            return EXIT_ORPHANED
        return self._write_result(ending, started, self.peak_mem or None, cpu_seconds, kernel)

    def _not_started(self, why: str) -> int:
        """The job was not started: the daemon is told, and puts it back in the queue."""
        _say(f"the job was not started: {why}; the daemon puts it back in the queue")
        if self.spec.socket:
            tell_not_started(self.spec.socket, self.spec.job_id, self.spec.attempt, why, RESULT_RETRY_S)
        return EXIT_NOT_STARTED

    def _run_env(self) -> dict[str, str]:
        """The job's MLflow run, once the manager's MLflow helper has made it (``mlflow.json``),
        as the job's environment gives it (:func:`~tandem.watch.stores.base.run_env`); empty,
        with a note, where there is none or it did not come in ``RUN_WAIT_S``."""
        deadline = time.monotonic() + RUN_WAIT_S
        while (ref := load(self.dir, RunRef)) is None:
            if self.cancelled or self.orphaned:
                return {}
            if time.monotonic() > deadline:
                self.note(f"no MLflow run made within {RUN_WAIT_S:g} s: started without MLFLOW_RUN_ID")
                return {}
            time.sleep(0.05)
        if ref.error or not ref.run_id:
            self.note(f"started without MLFLOW_RUN_ID: its MLflow run could not be made ({ref.error})")
            return {}
        ids = run_env(ref.uri, ref.run_id, ref.experiment)
        own = self.spec.env.get("MLFLOW_TRACKING_URI")
        if own and absolute_uri(own) != ids["MLFLOW_TRACKING_URI"]:
            self.note(f"MLFLOW_TRACKING_URI {own} replaced by the job manager's store, where its run is")
        return ids

    def _track(self, pid: int) -> Any:
        """watch's Run over the job, into the spool; None if it cannot start (the job runs on)."""
        from tandem.watch.stores.spool import SpoolStore
        from tandem.watch.tracker import Run, default_samplers

        spec = self.spec
        # By its path: the spool names its artifacts' files for the MLflow helper, another process.
        store = SpoolStore(self.path / "metrics.jsonl", warn=self.note)
        tags = {"tandem.job_id": str(spec.job_id), "tandem.attempt": str(spec.attempt)} if spec.job_id else {}
        tree = _TreeOf()
        samplers = [_UsageWriter(self, tree), *default_samplers(tree, spec.env)]  # type: ignore[arg-type]
        try:
            run = Run(
                pid=pid,
                name=spec.name or Path(spec.command[0]).name,
                tags=tags,
                interval=spec.interval_s,
                store=store,
                env=spec.env,
                quiet=True,
                flush_s=FLUSH_S,
                cpu_since_start=True,
                writer="thread",
                samplers=samplers,
            )
            tree.run = run
            return run.start()
        except Exception as exc:  # tracking never stops the job
            self.note(f"the job is not tracked: {type(exc).__name__}: {exc}")
            return None

    def _try_save(self, record: Any) -> None:
        try:
            save(self.dir, record)
        except OSError as exc:
            self.note(f"cannot write {record.FILE} ({exc.strerror})")

    def _finish(self, code: int, message: str, started: float) -> int:
        try:
            with open(self.dir / "output.log", "ab") as log:
                log.write(f"tandem: {message}\n".encode())
        except OSError:
            pass
        return self._write_result(failures.classify(code, message), started)

    def _write_result(
        self,
        ending: failures.Ending,
        started: float,
        peak_mem: int | None = None,
        cpu_seconds: float | None = None,
        kernel_line: str | None = None,
    ) -> int:
        """Write how the job ended, waiting for a disk that refuses it (the job has ended;
        only its record waits), then wake the daemon."""
        result = Result(
            ending.kind,
            ending.state,
            ending.exit_code,
            ending.signal,
            ending.cause,
            ending.line or kernel_line,
            started,
            time.time(),
            peak_mem,
            cpu_seconds,
            self.notes,
        )
        deadline = time.monotonic() + RESULT_RETRY_S
        terms = self.terms  # a SIGTERM from now on: stop waiting for the disk
        said = False
        while True:
            try:
                save(self.dir, result)
                break
            except OSError as exc:
                if not disk_trouble(exc):  # its folder removed, say: no wait makes it writable
                    why = "its attempt folder was removed" if _removed(self.dir) else exc.strerror
                    _say(f"could not write the result ({why}): the job ended {ending.state} ({ending.cause})")
                    return 1
                if not said:
                    said = True
                    _say(f"cannot write the result yet ({exc.strerror}); retrying")
                if time.monotonic() > deadline or self.terms > terms:
                    _say(
                        f"could not write the result ({exc.strerror}): the job ended {ending.state} "
                        f"({ending.cause}); the daemon will count this attempt as lost"
                    )
                    return 1
                time.sleep(0.2)
        wake_daemon(self.spec.socket)
        return 0


class _TreeOf:
    """The run's process tree, for the samplers that read it (the run makes it when it
    starts, after the samplers are made)."""

    run: Any = None

    @property
    def tree(self) -> Any:
        return self.run.tree if self.run is not None else None

    @property
    def pids(self) -> frozenset[int]:
        return self.tree.pids if self.tree is not None else frozenset()

    @property
    def cpu_seconds(self) -> float:
        return self.tree.cpu_seconds if self.tree is not None else 0.0


class _UsageWriter:
    """A sampler that samples nothing: after the process tree's sample it writes
    ``usage.json`` for the daemon (pids, memory, CPU)."""

    name = "usage"

    def __init__(self, shim: Shim, tree: _TreeOf) -> None:
        self.shim, self.of = shim, tree

    def available(self) -> tuple[bool, str]:
        return True, ""

    def tags(self) -> dict[str, str]:
        return {}

    def sample(self) -> dict[str, float]:
        tree = self.of.tree
        if tree is None:
            return {}
        mem = int(tree.last.get("system/process_tree/pss_bytes", 0))
        self.shim.peak_mem = max(self.shim.peak_mem, mem)
        usage = Usage(
            time.time(),
            sorted(tree.pids),
            mem,
            self.shim.peak_mem,
            tree.cpu_seconds,
            tree.last.get("system/process_tree/cpu_percent"),
        )
        try:
            save(self.shim.dir, usage)
        except OSError:
            pass  # the next sample tries again; the spool says the disk is full
        return {}

    def close(self) -> None:
        pass


def _node_env(spec: AttemptSpec) -> dict[str, str]:
    """The job's environment: its submitter's, but for the variables that belong to the node
    it runs on (:attr:`AttemptSpec.node_env`), taken from this process's (or left unset)."""
    env = {k: v for k, v in spec.env.items() if k not in spec.node_env}
    return env | {k: os.environ[k] for k in spec.node_env if k in os.environ}


def _say(text: str) -> None:
    """A line in the supervisor's own log, if the disk takes it (a full one must not end us)."""
    try:
        print(f"tandem: {text}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def _removed(folder: Path) -> bool:
    """Was ``folder`` (held open: :func:`~tandem.place.run.supervisor.files.hold`) removed?"""
    try:
        return os.stat(folder).st_nlink == 0
    except OSError:
        return True


def _child_cpu() -> tuple[float, float] | None:
    """The reaped children's (user, system) CPU time: the kernel's exact total of the job."""
    try:
        import resource

        r = resource.getrusage(resource.RUSAGE_CHILDREN)
        return r.ru_utime, r.ru_stime
    except (ImportError, OSError):
        return None


def _as_submitter(spec: AttemptSpec) -> dict[str, Any]:
    """Popen's arguments that run the job as its submitter (a system manager's job: user,
    primary group, supplementary groups as the kernel gave them at submit); none for a
    job that runs as the supervisor does."""
    if spec.user is None:
        return {}
    return {"user": spec.user, "group": spec.group, "extra_groups": list(spec.groups)}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tandem.place.run.supervisor.shim ATTEMPT_DIR", file=sys.stderr)
        return 2
    from tandem.place.run.supervisor.files import moved_from

    shim = Shim(Path(argv[0]))
    code = shim.run()
    moved = moved_from(shim.dir, shim.path)
    if moved is not None:  # its files are its own still: said, so that no one looks for them there
        _say(
            f"its folder {shim.path} is now {moved}: its files (the result too) are there, not in {shim.path}"
        )
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
