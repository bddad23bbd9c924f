"""Jobs of a sweep are alike: its points share one learning key (its template's), they start
side by side (none waits for another's measurement), a job alike to a measured one starts
at its figure, a script's learnt figures carry to its other commands, and what was learnt
survives a restart of the daemon (kept in the state, not its memory)."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

from tandem.place.model import JobSpec
from tandem.place.state import State
from tests.place.inproc import Step
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
    was measured starts at its figure; one alike to a running probe is a probe itself."""
    import tempfile

    from tandem.place.active import Active
    from tandem.place.records import AttemptPlacement, Job
    from tandem.place.reserve import AUTO_CPUS, Learned, Measuring, running_figures

    with tempfile.TemporaryDirectory() as d:
        state = State(Path(d))
        learned = Learned(state.learnt_cores(), state.record_cores)
        point = Job(["python", "t.py"], "/", cpus=AUTO_CPUS, id=7, learn_key="name:r{lr}")
        other = Job(["python", "t.py"], "/", cpus=AUTO_CPUS, id=8, learn_key="name:r{lr}")
        first = Measuring(point, learned)
        assert first.probe
        active = [Active(point, 1, AttemptPlacement(), Path(d), 0.0, cpu=first)]
        assert Measuring(other, learned, running_figures(active)).probe  # nothing measured yet
        for c in (0.1, 0.1):  # past its start-up: measured
            first.sample(c)
        assert not first.probe
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


def test_a_scripts_learnt_cores_carry_to_its_other_commands() -> None:
    """``python train.py --lr 0.1`` and ``--lr 0.01`` submitted apart (or each point with a
    --name of its own) are keys of their own; what one was measured at is what the other
    reserves until it has runs of its own. A command that does not say which code runs
    (``python -c``, a shell) carries nothing."""
    from tandem.place.records import Job
    from tandem.place.reserve import AUTO_CPUS, Learned, script_key

    assert script_key(["/usr/bin/python3", "train.py", "--lr", "1"]) == "script:python3 train.py"
    assert script_key(["python", "-m", "pkg.train", "--lr", "1"]) == "script:python -m pkg.train"
    assert script_key(["python", "-c", "print(1)"]) is None
    assert script_key(["bash", "-c", "python train.py"]) is None
    assert script_key(["./train.sh", "1"]) == "script:train.sh"
    learned = Learned()

    def job(command: list[str], key: str) -> Job:
        return Job(command, "/", cpus=AUTO_CPUS, job_key=key)

    first = job(["python", "train.py", "--lr", "0.1"], "cmd:python train.py --lr 0.1")
    named = job(["python", "train.py", "--lr", "0.01"], "name:lr-0.01")
    other = job(["python", "eval.py"], "cmd:python eval.py")
    inline = job(["python", "-c", "pass"], "cmd:python -c pass")
    assert learned.reserve(named)[2]  # nothing learnt: a probe
    learned.seen_job(first, 0.9)
    cores, source, probe = learned.reserve(named)
    assert (cores, source, probe) == (1.0, "measured, script python train.py, 1 run", False)
    assert learned.reserve(other)[2] and learned.reserve(inline)[2]  # other code: probes
    learned.seen_job(named, 0.3)  # its own key's runs come first once it has them
    assert learned.reserve(named)[1].startswith("measured, job key lr-0.01")


def test_a_sweep_without_a_share_starts_its_points_side_by_side(inproc) -> None:
    """No point waits for another's measurement: on 2 idle cores two start in the first pass
    (each counted at a core while it starts), the third as their start-up ends; a point
    submitted after they ended starts at what was learnt, no probe."""
    h = inproc("--cpus", "2", *FAST)
    h.launcher.default = Step(run_s=30.0, cores=0.3, burst_s=3.0, burst_cores=1.0)
    h.cli("submit", "--name", "p-{lr}", "--grid", "lr=1,2,3", "--", sys.executable, "train.py", "{lr}")
    ids = sorted(h.jobs())
    h.run_until(lambda: all(h.state_of(i) == "running" for i in ids), within=20)
    assert not any("measurement" in (j.reason or "") for j in h.jobs().values())
    h.run_until(lambda: h.ended(*ids), within=120)
    again = h.cli("submit", "--name", "p-{lr}", "--grid", "lr=4", "--", sys.executable, "train.py", "{lr}")
    (late,) = [i for i in h.jobs() if i not in ids]
    h.run_until(lambda: h.state_of(late) == "running", within=5)
    shown = h.job(late)
    assert shown["reservation"]["from"].startswith("measured, job key p-{lr}"), (again, shown)
    assert shown["placement"]["probe"] is False, shown
