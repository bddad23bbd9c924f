"""Every job attempt as an MLflow run, live: one helper process writes them all.

Each job's supervisor tracks it with watch's own :class:`~tandem.watch.Run` (the samplers
and summary of ``tandem run``: process tree, host, the job's GPUs, energy, share) into a
spool file (:class:`~tandem.watch.stores.spool.SpoolStore`), which imports nothing. One
helper per state directory (``python -m tandem.place.run.metrics.tracking_helper``, started with the
daemon, at nice 10 once its store is open) opens a run when an attempt starts and forwards
its spool through watch's :class:`~tandem.watch.stores.MlflowStore` (a SQLite store written
straight into its tables, any other through MLflow, imported once)
every ``POLL_S`` seconds: a metric sampled now is in MLflow within about 12 s (a supervisor
appends to its spool every 10 s, ``FLUSH_S`` in :mod:`~tandem.place.run.supervisor.shim`), while the
job runs. When the attempt ends, the
daemon's record (status, how it ended, the manager's own figures) closes the run, with the
job's output (capped: its newest part) as an artifact.

The queue is files in ``<state dir>/track/``, so nothing is lost if the daemon or the
helper dies: ``<job>-<n>.start.json`` (from the daemon; kept while the run is open),
``<job>-<n>.end.json`` (from the daemon), ``<job>-<n>.open.json`` (the helper's progress:
run id and spool offset, so that a new helper resumes the same run) and
``done/<job>-<n>.json`` (run id or error, for the daemon).

The run exists before its job starts: the helper looks for new attempts every
``START_POLL_S`` and writes each run's id into the attempt's directory
(:class:`~tandem.place.run.supervisor.files.RunRef`, ``mlflow.json``), where the supervisor waits for
it and tells the job (``MLFLOW_TRACKING_URI``, ``MLFLOW_RUN_ID``), so that MLflow in the job
writes to the same run. Where no run can be made, the file says why, and the job starts
without them.

The store: the daemon's ``--store URI``, else ``$MLFLOW_TRACKING_URI``, else an embedded
SQLite store in the state directory (:func:`manager_store` says which, for ``tandem report``).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import os
import shutil
import site
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tandem._safepath import module_command
from tandem.place.model import PRODUCER_ROLE, param_value
from tandem.place.run.metrics import tracking_ends as ends
from tandem.place.run.metrics.as_user import (
    AS_ROOT,
    Owner,
    acting_as,
    copy_over,
    hand_over,
    touch_theirs,
)
from tandem.place.run.metrics.tracking_ends import STOPPED
from tandem.place.run.supervisor.files import (
    DaemonFile,
    RunEnd,
    RunMade,
    RunOpen,
    RunRef,
    RunStart,
    disk_trouble,
    load,
    open_plain,
    queued,
    queued_keys,
    read_record,
    save,
    write_record,
)
from tandem.watch.stores.base import absolute_uri

log = logging.getLogger(__name__)

RETRY_AFTER_S = 30.0
POLL_S = 2.0  # between forwards of the open runs' spools
START_POLL_S = 0.2  # between looks for new attempts (each waits for its run to start)
START_WEIGHT = 8.0  # the helper's CPU weight while it makes runs (their jobs wait on them)
# Its weight while it only forwards samples: a tenth of a job's. Where the kernel groups
# processes by session (autogroup), nice 10 counts only against the daemon in its group, so
# the helper took a job's full share (5 CPU-s of a 2-core sweep's first 8 s, measured).
FORWARD_WEIGHT = 0.1
MAX_TAG = 8000  # characters of an MLflow tag's value


def queue_dir(state_dir: Path) -> Path:
    return state_dir / "track"


def _put(state_dir: Path, key: str, record: RunStart | RunEnd) -> None:
    q = queue_dir(state_dir)
    (q / "done").mkdir(parents=True, exist_ok=True)
    write_record(queued(q, key, type(record)), record)


def run_key(job_id: int, attempt: int) -> str:
    return f"{job_id}-{attempt}"


def attempt_tags(job: Any, n: int, where: str, mps: bool, selection: str | None) -> dict[str, Any]:
    """The MLflow tags of a job's attempt ``n`` (``job``: a stored job) run on ``where``;
    ``selection``: the data selection its share serves (``tandem select show ID``), which
    its jobs train on and its producer, which only serves it, does not."""
    producer = job.role == PRODUCER_ROLE
    tags = {
        "tandem.job_id": job.id,
        "tandem.attempt": n,
        "group": job.group or "",
        "tandem.share": job.share or "",
        "tandem.placement": where,
        "tandem.mps": mps,
        "tandem.command": " ".join(job.command)[:5000],
    } | ({"tandem.role": "producer"} if producer else {})
    if selection and not producer:
        tags["tandem.selection"] = selection
    return tags


def daemon_tracker(state_dir: Path, store: str | None) -> Tracker:
    """The daemon's tracker of its jobs' runs: into ``store``, else ``MLFLOW_TRACKING_URI``,
    else the state directory's own ``mlflow.db`` (made 0600 before SQLite makes it with the
    umask); its helper warmed at once, so that the first job does not wait for MLflow."""
    from tandem.dirs import mlflow_store_uri, private_file

    if not (store or os.environ.get("MLFLOW_TRACKING_URI")):
        private_file(state_dir / "mlflow.db")
    tracker = Tracker(state_dir, store or mlflow_store_uri(state_dir))
    if tracker.why_not:
        log.warning("jobs are not tracked in MLflow: %s", tracker.why_not)
    else:
        tracker.warm()
    return tracker


class Tracker:
    """The daemon's side: keep the helper running while runs are open, collect run ids.

    A system manager's user's (``owner``; :mod:`tandem.place.run.metrics.users`): their store
    and queue in their own folder (``state_dir``), their helper run as them; root's reads and
    writes there made as them (:func:`~tandem.place.run.metrics.as_user.acting_as`), and each
    attempt's spool and log handed to them in ``handed`` (root's folder beside it), as their
    helper cannot read the attempt's folder, nor tell its supervisor the run (:meth:`relay`)."""

    def __init__(
        self,
        state_dir: Path,
        uri: str,
        experiment: str = "tandem",
        owner: Owner | None = None,
        handed: Path | None = None,
    ) -> None:
        self.state_dir = state_dir
        self.uri = absolute_uri(uri)  # as the helper (same working directory) and every job see it
        self.experiment = experiment
        self.owner, self.handed = owner, handed
        self._dirs: dict[str, Path] = {}  # a user's open runs' attempt folders, by key (root's record)
        self._next_sweep = 0.0
        self.proc: subprocess.Popen | None = None
        self._next_start = 0.0
        self._running = False
        self._warm = False  # start the helper at the next poke, with no job waiting
        self.why_not = (
            ""
            if importlib.util.find_spec("mlflow")
            else "mlflow is not installed (pip install 'tandem[watch]')"
        )

    def started(
        self,
        key: str,
        name: str,
        tags: dict[str, Any],
        spool: Path,
        started: float,
        job_id: int | None = None,
        attempt: int | None = None,
        params: dict[str, Any] | None = None,
    ) -> None:
        """The daemon: an attempt (or a share's producer: no job) started, its spool ``spool``
        (in its folder); its run is opened (with the job's sweep point, ``params``, as the run's
        MLflow params)."""
        record = RunStart(
            name=name,
            spool=str(spool),
            started=started,
            job_id=job_id,
            attempt=attempt,
            tags={k: str(v) for k, v in tags.items()},
            params={k: param_value(v) for k, v in (params or {}).items()},
        )
        if self.owner is not None and self.handed is not None:
            hand_over(spool, self.handed / f"{key}.jsonl", self.owner)
            self._dirs[key] = spool.parent
        with acting_as(self.owner):
            _put(self.state_dir, key, record)

    def ended(
        self,
        key: str,
        status: str,
        tags: dict[str, Any],
        summary: dict[str, float | None],
        log_file: Path,
        ended: float | None = None,
    ) -> None:
        """The daemon: the attempt ended (at ``ended``, seconds since the epoch), its output in
        ``log_file``; its run is closed with that end once its spool is forwarded. A user's
        folder that refuses it (as they changed it) leaves their run open, saying so; a disk
        that refuses it raises (the attempt's end is written again)."""
        record = RunEnd(
            status=status,
            tags={k: str(v) for k, v in tags.items()},
            log_file=str(log_file),
            summary={k: v for k, v in summary.items() if v is not None},
            ended=ended,
        )
        try:
            if self.owner is not None and self.handed is not None:
                self._hand_end(key, log_file)
            with acting_as(self.owner):
                _put(self.state_dir, key, record)
        except OSError as exc:
            if self.owner is None or disk_trouble(exc):
                raise
            log.warning(
                "user %d: run %s not closed: their MLflow folder refused it: %s", self.owner[0], key, exc
            )

    def _hand_end(self, key: str, log_file: Path) -> None:
        """A user's attempt's log and artifacts (its summary, which the spool names) as they are
        now, theirs, in a folder of root's (their helper lists it, adds nothing to it)."""
        assert self.owner is not None and self.handed is not None
        folder = self.handed / f"{key}.artifacts"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(mode=0o700)
        for path in [log_file, *sorted((log_file.parent / "artifacts").glob("*"))]:
            copy_over(path, folder / path.name, self.owner)
        os.chmod(folder, 0o755)

    def relay(self, adir: Path | None, made: RunMade) -> None:
        """A user's helper's answer for the attempt of folder ``adir`` (None: not running
        here): its supervisor told the run (or why there is none) as their helper, who may
        not write there, could not; once the run is closed, what was handed to them for it goes."""
        if self.owner is None:
            return
        if adir is not None and load(adir, RunRef) is None and (made.run_id or made.error):
            ref = RunRef(self.uri, made.run_id or "", self.experiment, made.error)
            tell_job(adir / "metrics.jsonl", ref)
        if made.final and self.handed is not None and made.job_id is not None and made.attempt is not None:
            key = run_key(made.job_id, made.attempt)  # ints (take_results): a name of root's making
            self._dirs.pop(key, None)
            (self.handed / f"{key}.jsonl").unlink(missing_ok=True)
            # Theirs now (rmtree follows no link in it).
            shutil.rmtree(self.handed / f"{key}.artifacts", ignore_errors=True)

    def poke(self) -> None:
        if self.why_not:
            return
        if self.handed is not None and time.monotonic() >= self._next_sweep:
            self._next_sweep = time.monotonic() + SWEEP_EVERY_S
            _sweep(self.handed)
        with acting_as(self.owner):
            self._poke()

    def _poke(self) -> None:
        q = queue_dir(self.state_dir)
        if not self._running:  # a daemon serves again: its helper idles before it ends
            (q / STOPPED).unlink(missing_ok=True)
            self._running = True
        # One listing, every pass: a start or an end queued for the helper.
        tails = tuple(cls.NAME.partition("{key}")[2] for cls in (RunStart, RunEnd))
        pending = q.is_dir() and any(p.name.endswith(tails) for p in q.iterdir())
        if self.proc is not None and self.proc.poll() is not None:
            if self.proc.returncode != 0:  # it failed (an unreachable store?): wait before the next try
                self._next_start = time.monotonic() + RETRY_AFTER_S
                log.warning(
                    "the MLflow helper exited %s; see %s",
                    self.proc.returncode,
                    self.state_dir / "tracking.log",
                )
                self._no_run_yet(f"the MLflow helper failed (exit {self.proc.returncode}; see tracking.log)")
            self.proc = None
        if self.proc is None and ends.helper_serves(self.state_dir):
            return  # a helper from before (the last daemon's) serves the queue until it ends
        if (pending or self._warm) and self.proc is None and time.monotonic() >= self._next_start:
            self._warm = False
            appended = os.O_WRONLY | os.O_APPEND | os.O_CREAT
            uid = None if self.owner is None else self.owner[0]
            log_fd = open_plain(self.state_dir / "tracking.log", appended, uid)
            with os.fdopen(log_fd, "ab") as out:
                python, env = _helper_python(self.owner is not None)
                argv = module_command(
                    "tandem.place.run.metrics.tracking_helper", str(self.state_dir), self.uri, python=python
                )
                argv.append(self.experiment)
                as_them: dict[str, Any] = {}
                if self.owner is not None and self.handed is not None:
                    argv.append(str(self.handed))  # their runs' spools and logs: it tells no job
                    uid, gid = self.owner
                    as_them = dict(
                        user=uid, group=gid, extra_groups=[], umask=0o077, cwd=self.state_dir,
                        env={**env, "HOME": str(self.state_dir)},
                    )  # fmt: skip
                try:
                    self.proc = subprocess.Popen(
                        argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, **as_them
                    )
                except OSError as exc:  # it cannot start: its jobs start without their runs, then again
                    self._next_start = time.monotonic() + RETRY_AFTER_S
                    log.warning("the MLflow helper of %s cannot start: %s", self.state_dir, exc)
                    out.write(f"the MLflow helper cannot start: {exc}\n".encode())
                    self._no_run_yet(f"the MLflow helper cannot start: {exc}")

    def warm(self) -> None:
        """Start the helper now, before any job: the first job's run then does not wait for
        a new store's tables, or MLflow's import where the store needs MLflow (seconds). It ends after
        :func:`~tandem.place.run.metrics.tracking_ends.idle_exit_s` if no job comes."""
        (queue_dir(self.state_dir) / "done").mkdir(parents=True, exist_ok=True)
        self._warm = True
        self.poke()

    def _no_run_yet(self, why: str) -> None:
        """The attempts waiting for a run the failed helper did not make: their jobs start
        now, without one (it is made, later, when a helper runs again). (Called as the owner:
        each attempt's folder is root's, told as root.)"""
        q = queue_dir(self.state_dir)
        waiting = []
        for key in queued_keys(q, RunStart):
            start = read_record(queued(q, key, RunStart), RunStart)
            if start is None or queued(q, key, RunOpen).exists():
                continue
            if self.owner is None:
                waiting.append(Path(start.spool))
            elif key in self._dirs:  # a user's queue names no folder of root's: its own record does
                waiting.append(self._dirs[key] / "metrics.jsonl")
        with acting_as(None if self.owner is None else AS_ROOT):
            for spool in waiting:
                tell_job(spool, RunRef(error=why))

    def stop(self) -> None:
        """The daemon stops: its helper ends once it has written every open run (those of
        jobs still running stay open, and it goes on writing them). A file, not a signal: a
        helper just started may not yet handle one."""
        with acting_as(self.owner):
            q = queue_dir(self.state_dir)
            if q.is_dir():
                touch_theirs(q / STOPPED, self.owner)

    def take_results(self) -> list[RunMade]:
        """Take the helper's answers (each run it made: job, attempt, run id), oldest first:
        a queue's take, so each is removed as it is handed over (the daemon, their one
        consumer, records them in the state)."""
        q = queue_dir(self.state_dir)
        out: list[RunMade] = []
        with acting_as(self.owner):
            for key in queued_keys(q, RunMade)[:MAX_TAKEN]:
                path = queued(q, key, RunMade)
                made = read_record(path, RunMade)
                if self.owner is not None:  # a user's helper's, theirs to write: taken as they are
                    made = _checked(made)
                    path.unlink(missing_ok=True)
                if made is not None:
                    out.append(made)
                    path.unlink(missing_ok=True)
        return out


MAX_TAKEN = 1000  # a user's helper's answers taken in one pass at most
# What was handed to a user for a run their helper never closed goes after a week (their
# helper could not start, say), looked for hourly: it does not pile up in root's folder.
KEEP_HANDED_S, SWEEP_EVERY_S = 7 * 86400.0, 3600.0


def _sweep(handed: Path) -> None:
    """What ``handed`` (root's folder of a user's) holds from over :data:`KEEP_HANDED_S` ago."""
    now = time.time()
    for entry in handed.iterdir():
        try:
            if now - entry.lstat().st_mtime < KEEP_HANDED_S:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
        except OSError:
            continue


def _checked(made: RunMade | None) -> RunMade | None:
    """A user's helper's answer as the daemon may use it: a job and attempt by number, a run
    id and an error as short text; None where it is not one."""
    if made is None:
        return None
    numbers = (made.job_id, made.attempt)
    if not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in numbers):
        return None
    texts = (made.run_id, made.error)
    if not all(t is None or isinstance(t, str) for t in texts) or not isinstance(made.final, bool):
        return None
    run_id = made.run_id if made.run_id and made.run_id.isalnum() and len(made.run_id) <= 64 else None
    return dataclasses.replace(made, run_id=run_id, error=made.error[:500] if made.error else None)


def _helper_python(as_user: bool) -> tuple[str | None, dict[str, str]]:
    """The helper's interpreter (None: this one) and environment. A user's helper (run as
    them, as their current file-system identity is) gets only the daemon's way to its
    interpreter and packages, nothing else of root's (a token of its store, say); where this
    interpreter is not theirs to run (in root's home), the host's of the same version, with
    this one's packages on its path."""
    if not as_user:
        return None, dict(os.environ)
    keep = ("PATH", "PYTHONPATH", "LANG", "LC_ALL", "TZ", "TANDEM_TRACKING_IDLE_S", "TANDEM_TEST_SESSION")
    env = {k: v for k, v in os.environ.items() if k in keep}
    if os.access(sys.executable, os.X_OK, effective_ids=True):
        return None, env
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    python = shutil.which(version, path="/usr/local/bin:/usr/bin:/bin")
    if python is None:
        return None, env  # it fails to start, saying so in tracking.log
    import tandem

    ours = [*site.getsitepackages(), str(Path(tandem.__file__).resolve().parents[1])]
    env["PYTHONPATH"] = os.pathsep.join([*ours, *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))])
    return python, env


def tell_job(spool: Path, ref: RunRef) -> None:
    """Write ``ref`` into the attempt's directory (the spool's), where its supervisor waits
    for it; a disk that refuses it costs the job its run's id, not the run."""
    try:
        if spool.parent.is_dir():
            save(spool.parent, ref)
    except OSError as exc:
        log.warning("cannot write %s: %s", spool.parent / RunRef.FILE, exc)


def manager_store(state_dir: Path) -> str:
    """The MLflow store of the job manager of ``state_dir``: the one its daemon said it
    writes to (``daemon.json``), else the one its configuration and this environment give."""
    from tandem.dirs import mlflow_store_uri
    from tandem.place.config import DaemonConfig

    info = DaemonFile.read(state_dir)
    if info is not None and isinstance(info.store, str) and info.store:
        return info.store
    return absolute_uri(DaemonConfig.load(state_dir).store or mlflow_store_uri(state_dir))


def helper_pid(state_dir: Path) -> int | None:
    """The pid the MLflow helper of ``state_dir`` wrote when it started (it removes it as it
    ends), or None."""
    try:
        return int((queue_dir(state_dir) / "helper.pid").read_text())
    except (OSError, ValueError):
        return None
