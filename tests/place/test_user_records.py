"""What a system manager (root) reads of its users' own folders (their MLflow queues and
stores): never through a link, never waiting on a pipe, never a record made to be none (a
nesting bomb), and their helper's answers only as numbers and short text."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path

import pytest

from tandem.place.pruning import read_reports
from tandem.place.run.metrics.tracking import _checked
from tandem.place.run.supervisor.files import RunMade, open_plain, read_json


def test_a_record_is_read_from_a_plain_file_only(tmp_path: Path) -> None:
    (tmp_path / "ok.json").write_text(json.dumps({"a": 1}))
    assert read_json(tmp_path / "ok.json") == {"a": 1}
    os.mkfifo(tmp_path / "pipe.json")  # an open of it for reading would wait for a writer
    assert read_json(tmp_path / "pipe.json") is None
    (tmp_path / "secret").write_text(json.dumps({"a": "root's"}))
    (tmp_path / "link.json").symlink_to(tmp_path / "secret")
    assert read_json(tmp_path / "link.json") is None
    (tmp_path / "bomb.json").write_text("[" * 100_000)
    assert read_json(tmp_path / "bomb.json") is None
    with pytest.raises(OSError, match="not a plain file"):
        open_plain(tmp_path / "pipe.json", os.O_RDONLY)
    with pytest.raises(OSError):
        open_plain(tmp_path / "link.json", os.O_RDONLY)


@pytest.mark.parametrize(
    "made",
    [
        RunMade(3, "1.artifacts/../../../x", True, run_id="abc"),  # type: ignore[arg-type]
        RunMade(True, 1, True, run_id="abc"),
        RunMade(3, 1, "yes", run_id="abc"),  # type: ignore[arg-type]
        RunMade(3, 1, True, run_id=["a"]),  # type: ignore[arg-type]
        RunMade(-3, 1, True, run_id="abc"),
    ],
)
def test_a_users_helper_answer_that_is_not_numbers_and_text_is_none(made: RunMade) -> None:
    assert _checked(made) is None


def test_a_users_helper_answer_keeps_a_run_id_and_a_short_error() -> None:
    made = _checked(RunMade(3, 1, False, run_id="0123abcd", error="x" * 10_000))
    assert made is not None and made.run_id == "0123abcd" and made.error == "x" * 500
    odd = _checked(RunMade(3, 1, False, run_id="../../etc"))
    assert odd is not None and odd.run_id is None


@pytest.mark.skipif(os.getuid() != 0, reason="reading as a user is a system manager's (root's)")
def test_a_users_store_made_a_pipe_or_made_to_run_forever_is_given_up(tmp_path: Path) -> None:
    db = tmp_path / "mlflow.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE metrics (run_uuid, key, step, value, timestamp)")
        conn.execute("INSERT INTO metrics VALUES ('r1', 'loss', 1, 0.5, 10), ('r1', 'loss', 'x', NULL, 11)")
    me = (os.getuid(), os.getgid())
    assert read_reports(db, "loss", {"r1": 7}, owner=me)[7][0].value == 0.5  # the odd row left out
    with sqlite3.connect(db) as conn:
        conn.execute("DROP TABLE metrics")
        conn.execute(
            "CREATE VIEW metrics AS WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) "
            "SELECT 'r1' AS run_uuid, 'loss' AS key, n AS step, 1.0 AS value, 1 AS timestamp "
            "FROM r WHERE n < 0"
        )
    with pytest.raises(sqlite3.OperationalError, match="interrupted"):
        read_reports(db, "loss", {"r1": 7}, owner=me)
    db.unlink()
    os.mkfifo(db)
    with pytest.raises(OSError, match="not a plain file"):
        read_reports(db, "loss", {"r1": 7}, owner=me)


@pytest.mark.skipif(os.getuid() != 0, reason="reading as a user is a system manager's (root's)")
def test_a_store_swapped_after_its_check_is_read_as_checked(tmp_path: Path, monkeypatch) -> None:
    """SQLite opens a file by its name again (and resolves ``/proc/self/fd/N`` to the name the
    file has then): a user who swaps their store after root's check, here for a link named as
    their unlinked file would then be named, still has root read the file checked."""
    from tandem.place.run.metrics import as_user

    folder = tmp_path / "users" / "1"
    (folder / "mlflow").mkdir(parents=True)
    folder.chmod(0o711)
    db, other = folder / "mlflow" / "mlflow.db", tmp_path / "root-only.db"
    for path, value in ((db, 0.5), (other, 9.0)):
        with sqlite3.connect(path) as conn:
            conn.execute("CREATE TABLE metrics (run_uuid, key, step, value, timestamp)")
            conn.execute("INSERT INTO metrics VALUES ('r1', 'loss', 1, ?, 10)", (value,))
    connect = sqlite3.connect

    def swapped_first(*args, **kwargs):  # the user's swap, between the check and SQLite's open
        db.unlink()
        Path(f"{db} (deleted)").symlink_to(other)
        return connect(*args, **kwargs)

    monkeypatch.setattr(as_user.sqlite3, "connect", swapped_first)
    me = (os.getuid(), os.getgid())
    assert read_reports(db, "loss", {"r1": 7}, owner=me)[7][0].value == 0.5
    assert not list(folder.glob(".read-*")), "root's name for it goes with the read"


def test_what_was_handed_to_a_user_and_never_taken_goes_after_a_week(tmp_path: Path) -> None:
    from tandem.place.run.metrics.tracking import KEEP_HANDED_S, _sweep

    old, new = tmp_path / "3-1.jsonl", tmp_path / "4-1.jsonl"
    folder = tmp_path / "3-1.artifacts"
    folder.mkdir()
    (folder / "output.log").write_text("x")
    for path in (old, new):
        path.write_text("{}\n")
    week_ago = time.time() - KEEP_HANDED_S - 60
    for path in (old, folder):
        os.utime(path, (week_ago, week_ago))
    _sweep(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["4-1.jsonl"]


def test_a_users_job_folder_of_any_shape_is_removed_as_them_and_nothing_of_roots_with_it(
    tmp_path: Path,
) -> None:
    """What a user's job leaves in its folder (``$TANDEM_JOB_DIR`` under a system manager)
    goes as its attempt ends, whatever its shape (a tree thousands of folders deep: Python's
    own rmtree recursion would fail) and whatever it links to (root's file stays)."""
    import shutil
    import tempfile

    from tandem.place.run.metrics.as_user import job_folder, remove_theirs
    from tests.other_user import local_user
    from tests.timing import until

    base = Path(tempfile.mkdtemp(prefix="tandem-users-"))  # theirs to pass through, as /var/lib is
    base.chmod(0o711)
    try:
        users = base / "users"
        roots = tmp_path / "roots.txt"
        roots.write_text("root's")
        with local_user() as user:
            owner = (user.uid, user.gid)
            folder = job_folder(users, owner, "7-1")
            assert folder.stat().st_uid == user.uid and oct(folder.stat().st_mode & 0o777) == "0o700"
            deep = "/".join(["d"] * 3000)
            made = user.run(
                ["sh", "-c", f"mkdir -p {deep} && ln -s {roots} link && ln -s {tmp_path} dirlink"], cwd=folder
            )
            assert made.returncode == 0, made.stderr
            remove_theirs(folder, owner)
            until(lambda: not folder.exists(), 60, lambda: f"{folder} still there")
            assert roots.read_text() == "root's" and (users / str(user.uid) / "jobs").is_dir()
            # The same key again (a lost database's attempt): a new, empty folder of theirs.
            again = job_folder(users, owner, "7-1")
            assert list(again.iterdir()) == []
    finally:
        shutil.rmtree(base, ignore_errors=True)
