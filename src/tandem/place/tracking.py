"""Every job attempt as an MLflow run, written by one helper process for all jobs.

Importing MLflow costs seconds of CPU: paid once per ``tandem run``, it visibly slows small
jobs on a small machine. So jobs import nothing: each job's shim samples its process tree
into ``metrics.jsonl`` in the attempt's directory, and when the attempt ends the daemon
drops a request file in ``<state dir>/track/``. One helper (``python -m
tandem.place.tracking``, at nice 10, in the daemon's session so that the kernel's
autogroup does not undo the nice) imports MLflow once, turns each request into a run
(tags: job id, attempt, group, share, placement, command, how it ended; the samples as
system metrics with their real times; a summary; ``output.log`` as an artifact), writes
``track/done/<job>-<attempt>.json`` with the run id, and exits after a minute with
nothing to do. Requests are files, so none is lost if the daemon or the helper dies: the
next helper takes them up.

The store: ``--store URI`` on the daemon, else ``$MLFLOW_TRACKING_URI``, else an embedded
SQLite store in the state directory (``tandem ui --store sqlite:///<state dir>/mlflow.db``).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tandem.place.shim import read_json, write_json

log = logging.getLogger(__name__)

IDLE_EXIT_S = 60.0
RETRY_AFTER_S = 60.0
POLL_S = 0.5


def default_store(state_dir: Path) -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{state_dir / 'mlflow.db'}"


def queue_dir(state_dir: Path) -> Path:
    return state_dir / "track"


def enqueue(state_dir: Path, request: dict[str, Any]) -> None:
    q = queue_dir(state_dir)
    (q / "done").mkdir(parents=True, exist_ok=True)
    write_json(q / f"{request['job_id']}-{request['attempt']}.json", request)


class Tracker:
    """The daemon's side: start the helper when requests wait, collect the run ids."""

    def __init__(self, state_dir: Path, uri: str, experiment: str = "tandem") -> None:
        self.state_dir = state_dir
        self.uri = uri
        self.experiment = experiment
        self.proc: subprocess.Popen | None = None
        self._next_start = 0.0
        self.why_not = (
            ""
            if importlib.util.find_spec("mlflow")
            else "mlflow is not installed (pip install 'tandem[watch]')"
        )

    def poke(self) -> None:
        if self.why_not:
            return
        q = queue_dir(self.state_dir)
        pending = q.is_dir() and any(p.suffix == ".json" for p in q.iterdir())
        if self.proc is not None and self.proc.poll() is not None:
            if self.proc.returncode != 0:  # it failed (an unreachable store?): wait before the next try
                self._next_start = time.monotonic() + RETRY_AFTER_S
                log.warning(
                    "the MLflow helper exited %s; see %s",
                    self.proc.returncode,
                    self.state_dir / "tracking.log",
                )
            self.proc = None
        if pending and self.proc is None and time.monotonic() >= self._next_start:
            with open(self.state_dir / "tracking.log", "ab") as out:
                self.proc = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "tandem.place.tracking",
                        str(self.state_dir),
                        self.uri,
                        self.experiment,
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )

    def results(self) -> list[dict[str, Any]]:
        done = queue_dir(self.state_dir) / "done"
        out = []
        if not done.is_dir():
            return out
        for path in sorted(done.glob("*.json")):
            data = read_json(path)
            if data is not None:
                out.append(data)
                path.unlink(missing_ok=True)
        return out


def _samples(path: Path) -> list[Any]:
    from tandem.watch.point import Point

    points = []
    try:
        with open(path) as f:
            for step, line in enumerate(f):
                try:
                    sample = json.loads(line)
                except ValueError:
                    continue  # a line cut short when the shim was killed
                ms = int(sample["t"] * 1000)
                points += [Point(k, float(v), ms, step) for k, v in sample["m"].items() if v is not None]
    except OSError:
        pass
    return points


def record(client: Any, experiment_id: str, request: dict[str, Any]) -> str:
    """One attempt as one MLflow run; its id."""
    from mlflow.entities import Metric, RunTag

    run = client.create_run(
        experiment_id,
        start_time=int(request["started"] * 1000),
        run_name=request["name"],
        tags={k: str(v) for k, v in request["tags"].items()},
    )
    run_id = run.info.run_id
    points = _samples(Path(request["metrics_file"]))
    end_ms = int(request["ended"] * 1000)
    points_summary = [
        Metric(f"summary/{k}", float(v), end_ms, 0) for k, v in request["summary"].items() if v is not None
    ]
    metrics = [Metric(p.key, p.value, p.timestamp_ms, p.step) for p in points] + points_summary
    for i in range(0, len(metrics), 1000):
        client.log_batch(run_id, metrics=metrics[i : i + 1000])
    client.log_batch(run_id, tags=[RunTag("tandem.mlflow_written", str(time.time()))])
    log_file = Path(request["log_file"])
    if log_file.is_file():
        client.log_artifact(run_id, str(log_file))
    client.set_terminated(run_id, status=request["status"], end_time=end_ms)
    return run_id


def main(argv: list[str]) -> int:
    state_dir, uri, experiment = Path(argv[0]), argv[1], argv[2]
    try:
        os.nice(10)
    except OSError:
        pass
    logging.basicConfig(level=logging.INFO, format="%(asctime)s tracking: %(message)s")
    from filelock import FileLock, Timeout

    lock = FileLock(str(queue_dir(state_dir) / "helper.lock"))
    try:
        lock.acquire(timeout=0)  # one helper per state directory (an old one may still be idling)
    except Timeout:
        return 0
    from tandem.watch.stores.mlflow_store import MlflowStore

    client, experiment_id = MlflowStore(uri, experiment).prepare()
    q = queue_dir(state_dir)
    idle_since = time.monotonic()
    while time.monotonic() - idle_since < IDLE_EXIT_S:
        requests = sorted(q.glob("*.json"))
        for path in requests:
            request = read_json(path)
            if request is None:
                continue
            try:
                run_id = record(client, experiment_id, request)
            except Exception as exc:  # one bad record must not block the others
                logging.exception(
                    "job %s attempt %s: not recorded", request.get("job_id"), request.get("attempt")
                )
                run_id, error = None, f"{type(exc).__name__}: {exc}"
            else:
                error = None
            write_json(
                q / "done" / path.name,
                {
                    "job_id": request["job_id"],
                    "attempt": request["attempt"],
                    "run_id": run_id,
                    "error": error,
                    "uri": uri,
                },
            )
            path.unlink(missing_ok=True)
        if requests:
            idle_since = time.monotonic()
        time.sleep(POLL_S)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
