"""A new SQLite MLflow store starts as a copy of MLflow's own tables, made once."""

from __future__ import annotations

import os
import sqlite3
import tempfile
from pathlib import Path

import pytest

from tandem.watch.stores import _sqlite_seed
from tandem.watch.stores.mlflow_store import MlflowStore


def _schema(db: Path) -> dict[str, object]:
    """Each table's columns and each index (MLflow's own migrations, run twice, do not write
    the same SQL text: its CHECK constraints come in another order)."""
    with sqlite3.connect(db) as c:
        names = [n for (n,) in c.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        tables = {n: sorted(c.execute(f'PRAGMA table_info("{n}")').fetchall()) for n in names}
        found = c.execute("SELECT name, tbl_name FROM sqlite_master WHERE type = 'index'")
        indexes = sorted(found.fetchall())
        version = c.execute("SELECT version_num FROM alembic_version").fetchall()
    return {"tables": tables, "indexes": indexes, "version": version}


def test_a_seeded_store_is_mlflows_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    own = tmp_path / "own" / "mlflow.db"
    monkeypatch.setattr(_sqlite_seed, "seed", lambda db: False)  # MLflow's migrations
    MlflowStore(f"sqlite:///{own}", "e").prepare()
    monkeypatch.undo()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    seeded = []
    for name in ("a", "b"):  # the first makes the template, the second copies it
        store = MlflowStore(f"sqlite:///{tmp_path / name / 'mlflow.db'}", "e")
        store.open("run", {"k": "v"})
        assert store.run_id
        seeded.append(tmp_path / name / "mlflow.db")
    (template,) = (tmp_path / "tmp" / f"tandem-{os.getuid()}").glob("mlflow-tables-*.db")
    assert os.stat(template.parent).st_mode & 0o777 == 0o700
    for db in seeded:
        assert _schema(db) == _schema(own)
        with sqlite3.connect(db) as c:  # MLflow's default experiment, where this store is
            (loc,) = c.execute("SELECT artifact_location FROM experiments WHERE experiment_id = 0").fetchone()
            assert c.execute("SELECT COUNT(*) FROM runs").fetchone() == (1,)
        assert loc  # made by MLflow as it opened the copy, not carried from the template


def test_no_template_where_the_directory_is_open_to_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    (tmp_path / f"tandem-{os.getuid()}").mkdir(mode=0o777)
    os.chmod(tmp_path / f"tandem-{os.getuid()}", 0o777)
    db = tmp_path / "s" / "mlflow.db"
    db.parent.mkdir()
    assert _sqlite_seed.seed(db) is False and not db.exists()
    store = MlflowStore(f"sqlite:///{db}", "e")  # MLflow makes its tables itself
    store.open("run", {})
    assert store.run_id and list((tmp_path / f"tandem-{os.getuid()}").iterdir()) == []


def test_the_empty_0600_file_the_job_manager_makes_first_is_seeded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The daemon makes its mlflow.db empty and 0600 before its MLflow helper opens it; that
    # file had kept the seed from ever applying under the manager (MLflow's migrations ran).
    from tandem.dirs import private_file

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    MlflowStore(f"sqlite:///{tmp_path / 'first' / 'mlflow.db'}", "e").prepare()  # the template
    (tmp_path / "s").mkdir()
    db = private_file(tmp_path / "s" / "mlflow.db")
    assert db.stat().st_size == 0
    migrations = []
    monkeypatch.setattr("mlflow.store.db.utils._initialize_tables", lambda *a: migrations.append(a))
    store = MlflowStore(f"sqlite:///{db}", "e")
    store.open("run", {})
    assert store.run_id and not migrations, "a copy of the template, not MLflow's migrations"
    assert os.stat(db).st_mode & 0o777 == 0o600
    assert _sqlite_seed.seed(db) is False, "a store with tables is never replaced"
