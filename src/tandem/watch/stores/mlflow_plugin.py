"""MLflow's own SQLite tracking store, made safely where several processes open a new one at
once: an MLflow plugin (entry point ``sqlite`` of ``mlflow.tracking_store``).

MLflow makes a new SQLite store's tables on first use, in each process that finds the file
without them: copies of one training script started together (the README's first example,
with MLflow's default ``./mlflow.db``) all run MLflow's migrations on one file at once, and
all but one fail (``table _alembic_tmp_tags already exists``), or both add the default
experiment. With tandem installed, MLflow builds a ``sqlite:///`` store through
:func:`sqlite_store`: under the store's init lock (``FILE.lock``, the one ``tandem run``
takes), a new file is made as tandem makes one (0600, the ``mlruns`` folder beside it 0700,
MLflow's tables copied from a template) and MLflow's store is built by MLflow's own builder,
its default experiment made then. An existing store is opened as MLflow opens it, after the
same lock (once per process and store). Where the lock cannot be taken (a folder this user
may not write), MLflow builds its store as it would without tandem.

Importing this module costs no MLflow import: MLflow loads it while it imports itself.
"""

from __future__ import annotations

import contextlib
from typing import Any

from tandem.watch.stores.mlflow_store import _create, _sqlite_init_lock, sqlite_path


def _mlflows_builder() -> Any:
    """The builder MLflow registers for SQL stores itself (this module's stands in for it)."""
    from mlflow.tracking._tracking_service import utils

    return utils._get_sqlalchemy_store


def sqlite_store(store_uri: str, artifact_uri: str | None = None, **_: Any) -> Any:
    """MLflow's tracking store for ``store_uri`` (a ``sqlite:`` URI), made under its lock
    where the file is new (see the module's doc)."""
    build = _mlflows_builder()
    if sqlite_path(store_uri) is None or "?" in store_uri:  # in memory, or with options: MLflow's
        return build(store_uri, artifact_uri)
    held = contextlib.ExitStack()
    try:
        held.enter_context(_sqlite_init_lock(store_uri))
    except OSError:  # a folder this user may not write, a lock held too long: as MLflow does
        return build(store_uri, artifact_uri)
    with held:
        with contextlib.suppress(OSError):  # not made here: MLflow makes it, as without tandem
            _create(store_uri)
        return build(store_uri, artifact_uri)
