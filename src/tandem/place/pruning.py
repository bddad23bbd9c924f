"""The daemon's pruner: four times a second, the reports of its running ``--prune`` trials' groups
read from the MLflow store, and the trials :func:`tandem.place.prune.decide` names stopped.

A trial logs its metric to the run tandem made for it (``mlflow.log_metric("loss", v,
step=epoch)``: ``MLFLOW_RUN_ID`` is set in its environment), so its reports are rows of the
store's ``metrics`` table under that run. The manager's store is a SQLite file: it is read
here read-only, by SQL (a few rows a trial; no MLflow import in the daemon), and a pass
whose read meets a writer's lock waits for the next. A stopped trial's decision is written
to its job row first (``pruned``: why, ``pruned_rung``), then its attempt is stopped: it ends
``pruned`` (:meth:`tandem.place.attempts.Attempts.finish`), never retried, its run KILLED and
tagged ``tandem.pruned``. Its share group's producer sees a reader leave, as at a cancel.
"""

from __future__ import annotations

import logging
import sqlite3
from collections import defaultdict
from pathlib import Path
from urllib.parse import unquote

from tandem.place import clock
from tandem.place.attempts import Attempts
from tandem.place.model import RUNNING, prune_rule
from tandem.place.prune import Report, decide
from tandem.place.records import Job
from tandem.place.run.metrics.as_user import Owner, read_store
from tandem.place.run.metrics.users import Trackers
from tandem.place.state import State

log = logging.getLogger(__name__)

EVERY_S = 0.25  # between two reads of the store: a fast trial logs an epoch a second or less


def sqlite_path(uri: str | None) -> Path | None:
    """The file of a ``sqlite:///`` MLflow store URI, as SQLAlchemy reads it (``sqlite:///x.db``
    relative, ``sqlite:////abs/x.db`` absolute); None: not one."""
    if not uri or not uri.startswith("sqlite:///"):
        return None
    path = unquote(uri.removeprefix("sqlite:///").partition("?")[0])
    return Path(path) if path else None


def why_not(uri: str | None) -> str | None:
    """Why a daemon tracking to ``uri`` cannot prune (None: it can)."""
    if uri is None:
        return "--prune reads each trial's metric from its MLflow run, and this daemon makes none (no mlflow)"
    if sqlite_path(uri) is None:
        return (
            f"--prune reads each trial's metric from the manager's MLflow store, a SQLite file; this "
            f"daemon's is {uri}: start it with --store sqlite:///PATH (the default) to prune"
        )
    return None


READ_S = 1.0  # a read of a store that takes longer is given up (and tried at the next pass)


def read_reports(
    db: Path, metric: str, runs: dict[str, int], owner: Owner | None = None
) -> dict[int, list[Report]]:
    """Each trial's reports of ``metric``, by job id (``runs``: its run id's job). ``owner``:
    a system manager's user's store, theirs to change, read as
    :func:`~tandem.place.run.metrics.as_user.read_store` reads one."""
    if not runs or not db.exists():
        return {}
    marks = ",".join("?" * len(runs))
    query = f"SELECT run_uuid, step, value, timestamp FROM metrics WHERE key = ? AND run_uuid IN ({marks})"
    with read_store(db, owner, READ_S) as conn:
        rows = conn.execute(query, (metric, *runs)).fetchall()
    out: dict[int, list[Report]] = defaultdict(list)
    for run_id, step, value, at in rows:
        if run_id in runs and all(isinstance(v, (int, float)) for v in (step, value, at)):
            out[runs[run_id]].append(Report(int(step), float(value), int(at)))
    return out


class Pruner:
    """Stops the running trials their group's ``--prune`` rule says to (``EVERY_S`` apart)."""

    def __init__(self, state: State, store_uri: str | None, users: Trackers | None = None) -> None:
        """``store_uri``: the daemon's store; ``users``: a system manager's trackers, whose
        users' trials log their metric in their own stores (read as them: theirs to change)."""
        self.state = state
        self.db = sqlite_path(store_uri)
        self.users = users
        self._next = 0.0
        self._stopped: set[int] = set()  # told to stop by this daemon (its row says so too)
        self.watching = False  # running trials have a rule: the daemon wakes for the next read

    def prune(self, attempts: Attempts) -> list[int]:
        """Stop what the rules say to among the running attempts; the jobs stopped."""
        # A group is its user's: two users' sweeps of one name are two (a system manager's).
        groups = {
            (a.job.owner, a.job.group)
            for a in attempts.active.values()
            if a.job.prune is not None and a.job.group is not None and a.job.pruned is None
        }
        self.watching = self.db is not None and bool(groups)
        if self.db is None or not groups or clock.monotonic() < self._next:
            return []
        self._next = clock.monotonic() + EVERY_S
        stopped = []
        for owner, group in sorted((o or 0, g) for o, g in groups if g is not None):
            tracker = self.users.of(owner) if self.users is not None else None
            db = sqlite_path(tracker.uri) if tracker is not None else self.db
            if db is None:
                continue
            # The group's every trial with a run, ended or stopped too: each sets the bar for
            # those that reach a rung after it. Read now: a run id is recorded once made.
            members = [
                j for j in self.state.jobs(group=group) if j.prune is not None and (j.owner or 0) == owner
            ]
            for (method, metric), trials in _by_rule(members).items():
                rule = prune_rule(trials[0])
                assert rule is not None
                running = {
                    j.id
                    for j in trials
                    if j.state == RUNNING
                    and j.pruned is None
                    and j.id in attempts.active
                    and j.id not in self._stopped
                }
                if not running:
                    continue
                runs = {j.mlflow_run_id: j.id for j in trials if j.mlflow_run_id}
                try:
                    reports = read_reports(
                        db, rule.metric, runs, tracker.owner if tracker is not None else None
                    )
                except (sqlite3.Error, OSError) as exc:  # a writer holds it (or not MLflow's yet): next pass
                    log.debug(
                        "pruning %s by %s %s: the MLflow store not read: %s", group, method, metric, exc
                    )
                    continue
                for stop in decide(rule, reports, running):
                    why = stop.reason(rule)
                    self.state.update_job(stop.trial, pruned=why, pruned_rung=stop.rung, cancel_requested=1)
                    self.state.event(stop.trial, "stopping", why)  # its end, once stopped, says "pruned"
                    self._stopped.add(stop.trial)
                    attempts.stop(stop.trial)
                    stopped.append(stop.trial)
        return stopped


def _by_rule(jobs: list[Job]) -> dict[tuple[str, str], list[Job]]:
    """A group's trials by their rule (a group is one sweep: one rule, as a rule)."""
    out: dict[tuple[str, str], list[Job]] = defaultdict(list)
    for j in jobs:
        out[(j.prune or "", j.metric or "")].append(j)
    return out
