"""Where each job's MLflow run is written: the daemon's own store, or, under a system manager
(``tandem daemon start --system``), its user's.

A system manager's users' runs are theirs to read and write: each user has a folder of their
own (``tandem.dirs.system_users_dir()/<uid>/mlflow``, 0700) with an MLflow store
(``mlflow.db``, its artifacts beside it) written by a helper run as them
(:class:`~tandem.place.run.metrics.tracking.Tracker` with an owner), so that their job, told
its run (``MLFLOW_TRACKING_URI``, ``MLFLOW_RUN_ID``), logs into it as well, and ``tandem
report`` and ``mlflow ui`` read it as them. Root's jobs, and a user's own daemon's, are in the
daemon's store, as before.
"""

from __future__ import annotations

import logging
import pwd
from pathlib import Path

from tandem.place.run.metrics.as_user import Owner, user_folders
from tandem.place.run.metrics.tracking import Tracker, manager_store, queue_dir

log = logging.getLogger(__name__)


def user_store(users: Path, uid: int) -> Path:
    """The MLflow store (a SQLite file) of a system manager's user ``uid``."""
    return users / str(uid) / "mlflow" / "mlflow.db"


def system_user_store(uid: int) -> str:
    """The URI of the MLflow store of the host's system manager's user ``uid`` (where their
    jobs' runs are, for ``tandem report`` and ``mlflow ui``): root's are the manager's own
    (:meth:`Trackers.of`)."""
    from tandem.dirs import system_paths, system_users_dir

    if uid == 0:
        return manager_store(system_paths()[0])
    return f"sqlite:///{user_store(system_users_dir(), uid)}"


class Trackers:
    """The daemon's trackers: its own (``own``), and a system manager's one per user
    (``users``: :func:`tandem.dirs.system_users_dir`; None: a user's own daemon)."""

    def __init__(self, own: Tracker, users: Path | None = None) -> None:
        self.own, self.users = own, users
        self._of: dict[int, Tracker] = {}
        if users is not None and users.is_dir():  # a helper's work left by the last daemon: done now
            for folder in users.iterdir():
                if folder.name.isdigit() and queue_dir(folder / "mlflow").is_dir():
                    self.of(int(folder.name))

    def of(self, owner: int | None, gid: int | None = None) -> Tracker:
        """The tracker of a job submitted by ``owner`` (of group ``gid``)."""
        if self.users is None or owner is None or owner == 0:
            return self.own
        tracker = self._of.get(owner)
        if tracker is None:
            tracker = self._of[owner] = self._user(owner, gid)
        return tracker

    def _user(self, uid: int, gid: int | None) -> Tracker:
        assert self.users is not None
        if gid is None:
            try:
                gid = pwd.getpwuid(uid).pw_gid
            except KeyError:
                gid = uid
        owner: Owner = (uid, gid)
        store = user_store(self.users, uid)
        try:
            theirs, handed = user_folders(self.users, owner)
        except OSError as exc:
            tracker = Tracker(store.parent, f"sqlite:///{store}", self.own.experiment, owner)
            tracker.why_not = f"user {uid}'s MLflow folder cannot be used: {exc}"
            log.warning("%s", tracker.why_not)
            return tracker
        return Tracker(theirs, f"sqlite:///{store}", self.own.experiment, owner, handed)

    def all(self) -> list[Tracker]:
        return [self.own, *self._of.values()]
