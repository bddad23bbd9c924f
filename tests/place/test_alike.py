"""Jobs of a sweep are alike: its points share one learning key (its template's), the first
is measured and the others start at its figure, and what was learnt survives a restart of
the daemon (kept in the state, not its memory; a share sweep's restart under a real daemon
is test_elastic's README sweep)."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

from tandem.place.model import JobSpec
from tandem.place.state import State
from tests.place.test_daemon import FAST

LRS = ("0.1", "0.03", "0.01", "0.003")


def test_a_sweeps_points_share_its_templates_key_and_plain_jobs_keep_their_own(tmp_path: Path) -> None:
    from tandem.place import sweep

    template = JobSpec(["python", "train.py", "--lr", "{lr}"], "/", name="r18-lr{lr}", group="g")
    points = [sweep.job_of(template, {"lr": lr}, i) for i, lr in enumerate(LRS)]
    assert len({p.job_key for p in points}) == 4  # each point's own text differs...
    state = State(tmp_path)
    made = state.add_jobs(points, 0, 1.0, alike=sweep.alike_key(template))
    plain, _ = state.add_job(JobSpec(["python", "train.py", "--lr", "0.1"], "/"), 0, 2.0)
    jobs = {j.id: j for j in state.jobs()}
    assert {jobs[i].learning_key for i, _ in made} == {"name:r18-lr{lr}"}  # ...its key does not
    assert jobs[plain].learning_key == jobs[plain].job_key == "cmd:python train.py --lr 0.1"
    unnamed = JobSpec(["python", "train.py", "--lr", "{lr}"], "/")
    assert sweep.alike_key(unnamed) == "cmd:python train.py --lr {lr}"


def test_what_was_learnt_is_kept_in_the_state_and_a_running_figure_is_lent() -> None:
    """Learned writes each run through to the state before it counts; a new Learned made
    from the state (a restarted daemon) reserves the same. A job alike to a running one that
    was measured starts at its figure; one alike to a running probe is a probe (it waits)."""
    import tempfile

    from tandem.place.active import Active
    from tandem.place.records import AttemptPlacement, Job
    from tandem.place.reserve import AUTO_CPUS, Learned, Measuring, probing_keys, running_figures

    with tempfile.TemporaryDirectory() as d:
        state = State(Path(d))
        learned = Learned(state.learnt_cores(), state.record_cores)
        point = Job(["python", "t.py"], "/", cpus=AUTO_CPUS, id=7, learn_key="name:r{lr}")
        other = Job(["python", "t.py"], "/", cpus=AUTO_CPUS, id=8, learn_key="name:r{lr}")
        first = Measuring(point, learned)
        assert first.probe
        active = [Active(point, 1, AttemptPlacement(), Path(d), 0.0, cpu=first)]
        assert probing_keys(active) == {"name:r{lr}": 7}
        assert Measuring(other, learned, running_figures(active)).probe  # nothing measured yet
        for c in (0.1, 0.1):  # past its start-up: measured
            first.sample(c)
        assert not first.probe and probing_keys(active) == {}
        lent = Measuring(other, learned, running_figures(active))
        assert (lent.cores, lent.probe) == (first.cores, False)
        assert lent.source == "measured, job key r{lr}, job 7 running"
        learned.seen("name:r{lr}", 0.1)
        state.close()
        again = Learned(State(Path(d)).learnt_cores())  # what a restarted daemon reads
        assert again.runs("name:r{lr}") == [0.1]
        cores, source, probe = again.reserve(other)
        assert (round(cores, 3), source, probe) == (0.17, "measured, job key r{lr}, 1 run", False)


def test_a_state_file_of_schema_5_gains_learning_keys_and_cores(tmp_path: Path) -> None:
    from tandem.place.schema import SCHEMA_VERSION

    state = State(tmp_path)
    state.add_job(JobSpec(["true"], "/", name="a"), 0, 1.0)
    state.record_peak("name:a", 100 << 20, None, 5.0)
    state.close()
    db = sqlite3.connect(tmp_path / "place.db")  # back to schema 5
    db.execute("ALTER TABLE jobs DROP COLUMN learn_key")
    db.execute("ALTER TABLE peaks DROP COLUMN cpu_runs")
    db.execute("UPDATE meta SET v = '5' WHERE k = 'schema'")
    db.commit()
    db.close()
    state = State(tmp_path)
    assert state.setting("schema") == str(SCHEMA_VERSION)
    (job,) = state.jobs()
    assert job.learn_key == job.learning_key == "name:a"
    assert state.learnt_cores() == {}
    state.record_cores("name:a", [0.5])
    assert state.learnt_cores() == {"name:a": [0.5]}
    peak = state.peak("name:a")
    assert peak is not None and peak["peak_mem"] == 100 << 20  # kept beside the cores


def test_a_sweep_without_a_share_measures_one_point_and_the_others_start_at_its_figure(inproc) -> None:
    h = inproc("--cpus", "2", *FAST)
    h.cli("submit", "--name", "p-{lr}", "--grid", "lr=1,2,3", "--", sys.executable, "train.py", "{lr}")
    first, *others = sorted(h.jobs())
    h.run_until(lambda: h.state_of(first) == "running", within=30)
    alike = f"waits for job {first}'s measurement, a job alike (job key p-{{lr}}), then starts at it"
    h.run_until(lambda: all(alike in (h.jobs()[i].reason or "") for i in others), within=30)
    # Once the first is measured (a few samples past its start-up), the others start at it.
    h.run_until(lambda: all(h.state_of(i) == "running" for i in others), within=120)
    assert all(h.job(i)["reservation"]["from"].startswith("measured, job key p-{lr}") for i in others)
