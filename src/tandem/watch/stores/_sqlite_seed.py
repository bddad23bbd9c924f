"""A new SQLite MLflow store from a copy of an empty one, not from MLflow's migrations.

MLflow makes a new SQLite store's tables by running every schema migration since its first
version (alembic): about 3 s of CPU on this project's 2-core machine, more than the import
of MLflow itself. The job manager's jobs wait for their runs before they start, so a fresh
state directory (a first sweep, every test's daemon) paid it in each job's start. The tables
are the same for every store of one MLflow version, so they are made once into a template
(``<tmp>/tandem-<uid>/mlflow-tables-<version>.db``, a directory of this user's only) and a
new store's file starts as a copy of it. The template holds the tables and alembic's version
only: MLflow adds the default experiment (whose artifact location depends on the store's
path) when it opens the copy, as it does on its own tables. Anything unexpected (another
owner, a failed copy, MLflow's internals changed) falls back to MLflow's own way.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)


def _template_dir() -> Path | None:
    """This user's directory for templates, made 0700; None where it is another's or open."""
    d = Path(tempfile.gettempdir()) / f"tandem-{os.getuid()}"
    try:
        d.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(d)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return None
    return d


def _make_template(path: Path) -> None:
    """MLflow's tables (its migrations, as it runs them itself) into ``path``, atomically."""
    import sqlalchemy
    from mlflow.store.db.utils import _initialize_tables

    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tables-", suffix=".db")
    os.close(fd)
    try:
        engine = sqlalchemy.create_engine(f"sqlite:///{tmp}")
        try:
            _initialize_tables(engine)
        finally:
            engine.dispose()
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def fresh(db: Path) -> bool:
    """Whether the store file ``db`` has no tables yet: absent, or empty (the job manager
    makes it empty and 0600 before anything else opens it; SQLite reads an empty file as
    an empty database)."""
    try:
        return db.stat().st_size == 0
    except FileNotFoundError:
        return True


def seed(db: Path) -> bool:
    """Start the store file ``db``, which has no tables yet (:func:`fresh`), as a copy of
    the template of this MLflow version (made first if there is none), keeping the mode of
    an empty file that is there (0600 if none). The caller holds the store's init lock.
    Whether it did; False leaves ``db`` as it was and MLflow makes the tables."""
    if not fresh(db):
        return False
    try:
        from importlib.metadata import version

        d = _template_dir()
        if d is None:
            return False
        # MLflow's version from its metadata: no import of it (seconds) where the template is made
        template = d / f"mlflow-tables-{version('mlflow')}.db"
        if not template.is_file():
            _make_template(template)
        part = db.with_name(f".{db.name}.seeding")
        shutil.copyfile(template, part)
        try:
            mode = stat.S_IMODE(os.stat(db).st_mode)
        except FileNotFoundError:
            mode = 0o600
        os.chmod(part, mode)
        os.replace(part, db)
        return True
    except Exception as exc:  # MLflow's own way still works: only slower
        log.debug("MLflow store %s made without a template: %s", db, exc)
        with_part = db.with_name(f".{db.name}.seeding")
        with_part.unlink(missing_ok=True)
        return False
