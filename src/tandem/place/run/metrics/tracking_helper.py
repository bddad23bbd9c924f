"""The MLflow helper process (``python -m tandem.place.run.metrics.tracking_helper``): it opens
the store once (a SQLite store's tables written directly, any other through MLflow, imported
once), opens a run for each attempt that starts (:class:`_OpenRun`) and forwards its spool
while it runs, then closes it with the daemon's record. The queue it serves, and the
daemon's side of it, are :mod:`tandem.place.run.metrics.tracking`'s."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path

from tandem.place.run.metrics import tracking_ends as ends
from tandem.place.run.metrics.tracking import (
    FORWARD_WEIGHT,
    MAX_TAG,
    POLL_S,
    START_POLL_S,
    START_WEIGHT,
    queue_dir,
    tell_job,
)
from tandem.place.run.supervisor import files, weights
from tandem.place.run.supervisor.files import RunEnd, RunMade, RunOpen, RunRef, RunStart

log = logging.getLogger(__name__)


class _OpenRun:
    """One attempt's MLflow run as the helper forwards it (``handed``: a system manager's
    user's helper, its spool and log handed to it there, its supervisor told by the daemon)."""

    def __init__(
        self, q: Path, key: str, start: RunStart, uri: str, experiment: str, handed: Path | None = None
    ) -> None:
        from tandem.watch.stores.mlflow_store import MlflowStore

        self.q, self.key, self.start, self.handed = q, key, start, handed
        self.spool = handed / f"{key}.jsonl" if handed is not None else Path(start.spool)
        self.store = MlflowStore(uri, experiment)
        progress = files.read_record(files.queued(q, key, RunOpen), RunOpen)
        if progress is not None and progress.run_id:
            self.store.resume(progress.run_id)
            self.offset = progress.offset
        else:
            self.store.open(start.name, start.tags, int(start.started * 1000))
            if start.params:  # seen while it runs; its MLflow params come when it ends
                self.store.set_tags({"tandem.params": json.dumps(start.params)[:MAX_TAG]})
            self.offset = 0
            self._done(final=False)  # the daemon learns the run id at once
        self._save()
        # The job waits for this to start (its supervisor tells it the run's id).
        if handed is None:
            tell_job(self.spool, RunRef(self.store.uri, self.store.run_id, experiment))

    def _save(self) -> None:
        files.write_record(files.queued(self.q, self.key, RunOpen), RunOpen(self.store.run_id, self.offset))

    def _done(self, final: bool) -> None:
        made = RunMade(self.start.job_id, self.start.attempt, final, run_id=self.store.run_id or None)
        files.write_record(files.queued(self.q, self.key, RunMade), made)

    def forward(self) -> None:
        """What the spool gained since the last call."""
        from tandem.watch.stores.spool import points_of, read_spool

        entries, offset = read_spool(self.spool, self.offset)
        points = []
        for entry in entries:
            points += points_of(entry)
            if "open" in entry:  # the supervisor's tags (host, pid, samplers' notes)
                self.store.set_tags(entry["open"].get("tags") or {})
            if "tags" in entry:
                self.store.set_tags(entry["tags"])
            # A user's helper may not read the attempt's folder: its artifacts are handed at its end.
            if "artifact" in entry and self.handed is None and Path(entry["artifact"]).is_file():
                self.store.log_artifact(Path(entry["artifact"]))
        if points:
            self.store.log(points)
        if offset != self.offset:
            self.offset = offset
            self._save()

    def finish(self, end: RunEnd) -> None:
        from tandem.watch.point import Point

        self.forward()
        self._log_params()
        ms = int(time.time() * 1000)
        self.store.log([Point(f"summary/{k}", float(v), ms, 0) for k, v in end.summary.items()])
        self.store.set_tags({**end.tags, "tandem.mlflow_written": str(time.time())})
        if self.handed is not None:  # a user's: its log and artifacts handed to them as it ended
            for artifact in sorted((self.handed / f"{self.key}.artifacts").glob("*")):
                self.store.log_artifact(artifact)
        elif (log_file := Path(end.log_file)).is_file():  # its newest part: rotated at half of --log-max
            self.store.log_artifact(log_file)
        # The run ends when its attempt did, not when the helper (low priority, behind on a
        # busy host) got to it: a report reads which jobs a producer's run overlapped.
        self.store.close(end.status, int(end.ended * 1000) if end.ended else None)
        if end.by_helper:  # no daemon said it: one may yet (tracking_ends)
            ends.closed_by_helper(self.q, self.key, self.store.run_id)
        self._done(final=True)
        _unqueue(self.q, self.key)

    def _log_params(self) -> None:
        """The job's params, written once it has ended, so last: a job that logs its own
        hyper-parameters under the same names (Lightning's logger, HF's Trainer,
        ``mlflow.log_params``) never meets a param tandem set (MLflow refuses to change one).
        Where the job logged another value, its own stays and tandem's is the tag
        ``tandem.param.NAME``. A failure here costs the params, never the run's closing."""
        params = self.start.params
        try:
            differ = self.store.log_params(params)
            self.store.set_tags({f"tandem.param.{k}": params[k][:MAX_TAG] for k in differ})
        except Exception:
            log.exception("job %s: its params are not in MLflow", self.key)


def _open_new(
    q: Path,
    runs: dict[str, _OpenRun],
    failed: set[str],
    uri: str,
    experiment: str,
    weighted: bool = False,
    handed: Path | None = None,
) -> None:
    """Open the run of each attempt that started since the last look (``weighted``: this
    process weighed :data:`START_WEIGHT` meanwhile, its jobs waiting, then back)."""
    seen = runs.keys() | failed
    new = [key for key in files.queued_keys(q, RunStart) if key not in seen]
    if new and weighted:
        weights.set_weight(os.getpid(), START_WEIGHT)
    try:
        for key in new:
            _open_one(q, key, runs, failed, uri, experiment, handed)
    finally:
        if new and weighted:
            weights.set_weight(os.getpid(), FORWARD_WEIGHT)


def _unqueue(q: Path, key: str) -> None:
    """The run's records gone from the queue: it is closed, or will not be made."""
    for cls in (RunStart, RunEnd, RunOpen):
        files.queued(q, key, cls).unlink(missing_ok=True)


def _open_one(
    q: Path,
    key: str,
    runs: dict[str, _OpenRun],
    failed: set[str],
    uri: str,
    experiment: str,
    handed: Path | None = None,
) -> None:
    start = files.read_record(files.queued(q, key, RunStart), RunStart)
    if start is not None:
        try:
            runs[key] = _OpenRun(q, key, start, uri, experiment, handed)
        except Exception as exc:  # one bad run must not block the others
            logging.exception("job %s: no MLflow run", key)
            failed.add(key)
            error = f"{type(exc).__name__}: {exc}"
            made = RunMade(start.job_id, start.attempt, True, error=error)
            files.write_record(files.queued(q, key, RunMade), made)
            if handed is None:  # else the daemon tells its supervisor, from the answer
                tell_job(Path(start.spool), RunRef(uri, "", experiment, error))
            _unqueue(q, key)


def main(argv: list[str]) -> int:
    """``STATE_DIR URI EXPERIMENT [HANDED]``: HANDED, a system manager's user's helper (run as
    them: :mod:`tandem.place.run.metrics.users`), where their attempts' spools and logs are."""
    state_dir, uri, experiment = Path(argv[0]), argv[1], argv[2]
    handed = Path(argv[3]) if len(argv) > 3 else None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s tracking: %(message)s")
    from filelock import FileLock, Timeout

    q = queue_dir(state_dir)
    lock = FileLock(str(q / "helper.lock"), mode=0o600)
    try:
        lock.acquire(timeout=0)  # one helper per state directory (an old one may still be idling)
    except Timeout:
        return 0
    from tandem.watch.stores.mlflow_store import MlflowStore

    pid_file = q / "helper.pid"
    pid_file.write_text(str(os.getpid()))
    # Starting jobs wait for their runs: the store (MLflow's import where it needs MLflow), its
    # tables and the first runs go before what competes for the cores meanwhile (a new share's
    # producer, weighing as much as the jobs waiting here, pre-decoding; measured on 2 cores
    # with MLflow imported: the helper got ~0.6 of a core, its first runs came 6.3 s after it
    # started). What follows (forwarding samples
    # beside the running jobs) yields to them.
    first = weights.enter(f"helper-{os.getpid()}", START_WEIGHT)
    began, cpu = time.monotonic(), time.process_time()
    MlflowStore(uri, experiment).prepare()  # the tables and the experiment (MLflow's import), once
    prepared = time.monotonic()
    runs: dict[str, _OpenRun] = {}
    failed: set[str] = set()
    _open_new(q, runs, failed, uri, experiment, handed=handed)
    logging.info(
        "MLflow ready in %.1f s (%.1f CPU-s, weighted: %s), %d first run(s) in %.1f s",
        prepared - began,
        time.process_time() - cpu,
        first is not None,
        len(runs),
        time.monotonic() - prepared,
    )
    # Forwarding yields to the jobs: its cgroup weighs a tenth of a job's (back up while it
    # makes runs, _open_new); where it has none, nice 10.
    weighted = first is not None and weights.set_weight(os.getpid(), FORWARD_WEIGHT)
    if first is not None and not weighted:
        first.close()
    try:
        os.nice(10)
    except OSError:
        pass
    idle_since, last_forward, gone, parent = time.monotonic(), 0.0, False, os.getppid()
    looked = (-1, 0.0)  # the queue's mtime when last looked into, and when
    while True:
        # At once: a job waits for its run to start. Looked into only when a file came or went
        # (a stat, not a listing: this wakes 5 times a second), and every POLL_S anyway.
        mtime = os.stat(q).st_mtime_ns
        if mtime != looked[0] or time.monotonic() - looked[1] >= POLL_S:
            looked = (mtime, time.monotonic())
            _open_new(q, runs, failed, uri, experiment, weighted, handed)
        if time.monotonic() - last_forward >= POLL_S:
            last_forward = time.monotonic()
            gone = ends.daemon_gone(state_dir, q, parent)
            for key, run in list(runs.items()):
                end = files.read_record(files.queued(q, key, RunEnd), RunEnd)
                try:
                    if end is None and handed is None:  # its result where no daemon will say it ended
                        end = ends.end_without_daemon(run.spool, run.start, gone)
                    if end is not None:
                        run.finish(end)
                        del runs[key]
                    else:
                        run.forward()
                except Exception:
                    logging.exception("job %s: forwarding to MLflow failed; trying again", key)
            ends.late_ends(q, set(runs), uri, experiment)
        if gone and handed is not None:
            break  # it cannot read how their attempts ended: the next daemon's helper closes their runs
        if runs:
            idle_since = time.monotonic()
        # With no daemon (stopped or dead), it ends once no run is open, rather than after idling.
        elif gone or time.monotonic() - idle_since >= ends.idle_exit_s():
            break
        time.sleep(START_POLL_S)
    if weighted and first is not None:
        first.close()  # back to the daemon's cgroup; its own removed
    pid_file.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    # Everything is written (each write commits): skip the interpreter's teardown, which
    # after MLflow's import (a store other than SQLite) costs about 0.5 CPU-s.
    logging.shutdown()
    sys.stdout.flush()
    os._exit(code)
