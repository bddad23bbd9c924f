"""A job row's role: every submitted job is of role "job" (``ls --json``, ``show``), a state
file of schema 6 (no roles) opens with its jobs as jobs, and ``tandem ls`` marks a producer's
row."""

from __future__ import annotations

import dataclasses
import sqlite3
from pathlib import Path

from tandem.place.model import JOB_ROLE, PRODUCER_ROLE, JobSpec
from tandem.place.state import State
from tandem.place.views import job_json, ls_row


def test_a_state_file_of_schema_6_opens_with_its_jobs_of_role_job(tmp_path: Path) -> None:
    from tandem.place.schema import SCHEMA_VERSION
    from tandem.share.spec import ShareSpec

    state = State(tmp_path)
    state.add_job(JobSpec(["true"], "/", name="a"), 0, 1.0)
    state.define_share(ShareSpec("toy", "dataset", "m:f", batch_size=4))
    state.close()
    db = sqlite3.connect(tmp_path / "place.db")  # back to schema 6: no roles, producers in shares
    db.execute("ALTER TABLE jobs DROP COLUMN role")
    for column in ("pid INTEGER", "ctime REAL", "started REAL", "cpus REAL", "error TEXT"):
        db.execute(f"ALTER TABLE shares ADD COLUMN {column}")
    db.execute("UPDATE shares SET pid = 4242, error = 'old'")
    db.execute("UPDATE meta SET v = '6' WHERE k = 'schema'")
    db.commit()
    db.close()
    state = State(tmp_path)
    assert state.setting("schema") == str(SCHEMA_VERSION) == "9"
    (job,) = state.jobs()
    assert job.role == JOB_ROLE
    assert job_json(job)["role"] == "job"
    (job,) = state.jobs(states=("queued",))  # the scheduler's read has it too
    assert job.role == JOB_ROLE
    # The share's producer columns went (its producer is a job row now); the share is kept.
    (share,) = state.shares()
    assert share.name == "toy" and share.spec.batch_size == 4
    assert "pid" not in {r[1] for r in state.query("PRAGMA table_info(shares)")}


def test_a_producer_row_is_marked_in_ls_and_no_submit_makes_one(tmp_path: Path) -> None:
    # A submit sends a JobSpec: the role is the stored Job's only, so no request can set it.
    assert "role" not in {f.name for f in dataclasses.fields(JobSpec)}
    state = State(tmp_path)
    job_id, _ = state.add_job(JobSpec(["true"], "/", name="toy"), 0, 1.0)
    job = state.job(job_id)
    assert job is not None and "[producer]" not in ls_row(job)[1]
    job.role = PRODUCER_ROLE
    assert ls_row(job)[1] == "toy [producer]"
    assert job_json(job)["role"] == "producer"
