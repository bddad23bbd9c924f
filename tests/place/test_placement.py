"""An attempt's placement is a typed record (:class:`~tandem.place.records.AttemptPlacement`):
a state file whose attempts the previous tandem wrote (the same schema, placements as loose
JSON objects) opens and reads typed, and what ``--json`` shows of it is what it was."""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import FrozenInstanceError, replace
from pathlib import Path

import pytest

from tandem.place.model import JobSpec
from tandem.place.records import Attempt, AttemptPlacement
from tandem.place.reserve import AUTO_CPUS
from tandem.place.resources import GIVEN, LEARNT, PROBE, Reservation, Resources
from tandem.place.schema import SCHEMA_VERSION
from tandem.place.state import State
from tandem.place.views import job_json, ls_row

# As the previous tandem wrote them: a GPU attempt under MPS that settled, on a Ray node; a
# CPU attempt of before cores were learnt (no cpus, no mem); keys it never had are absent.
OLD_GPU = {
    "gpus": [1],
    "uuids": ["GPU-b"],
    "gpu_mem": 3 << 30,
    "alone": False,
    "probe": True,
    "device": "cuda:1",
    "mps": True,
    "backend": "ray",
    "cpus": 1.5,
    "cpus_from": "measured, this run",
    "mem": 2 << 30,
    "mem_from": "measured, this run",
    "node": "node-2",
    "settled": True,
}
OLD_CPU = {"gpus": [], "uuids": [], "gpu_mem": None, "alone": True, "probe": False, "device": "cpu"}


def _state_with_old_placements(tmp_path: Path) -> tuple[int, int]:
    state = State(tmp_path)
    ids = []
    for placement in (OLD_GPU, OLD_CPU):
        job_id, _ = state.add_job(JobSpec(["true"], "/", cpus=AUTO_CPUS), 0, time.time())
        state.start(Attempt(job_id, 1, "running", AttemptPlacement(), time.time()), None, "attempt 1")
        ids.append(job_id)
        state.db.execute(
            "UPDATE attempts SET placement = ? WHERE job_id = ?", (json.dumps(placement), job_id)
        )
    state.db.commit()
    state.close()
    return ids[0], ids[1]


def test_placements_the_previous_tandem_wrote_read_typed(tmp_path: Path) -> None:
    gpu_job, cpu_job = _state_with_old_placements(tmp_path)
    db = sqlite3.connect(tmp_path / "place.db")
    assert db.execute("SELECT v FROM meta WHERE k = 'schema'").fetchone() == (str(SCHEMA_VERSION),)
    db.close()
    state = State(tmp_path)
    job = state.job(gpu_job)
    assert job is not None
    gpu = job.attempts[0].placement
    assert gpu == AttemptPlacement(
        device="cuda:1",
        gpus=(1,),
        uuids=("GPU-b",),
        mps=True,
        alone=False,
        probe=True,
        reservation=Reservation(
            Resources(cores=1.5, ram=2 << 30, gpus=1, gpu_mem=3 << 30),
            cores_from=LEARNT,
            ram_from=LEARNT,
            gpu_mem_from=GIVEN,  # settled
            cores_why="measured, this run",
            ram_why="measured, this run",
        ),
        settled=True,
        backend="ray",
        node="node-2",
    )
    assert gpu.gpu_mem == 3 << 30
    shown = job_json(job)
    # The --json object as the previous tandem showed it, key for key (the dashboard reads it).
    assert shown["placement"] == {
        "device": "cuda:1",
        "gpus": [1],
        "gpu_uuids": ["GPU-b"],
        "gpu_mem_bytes": 3 << 30,
        "mps": True,
        "alone": False,
        "probe": True,
        "cpus": 1.5,
        "cpus_from": "measured, this run",
        "node": None,  # the previous tandem kept the Ray node's id only, not its name
    }
    assert shown["attempts"][0]["placement"] == shown["placement"]
    assert shown["reservation"] == {
        "cpus": 1.5,
        "from": "measured, this run",
        "mem_bytes": 2 << 30,
        "mem_from": "measured, this run",
    }
    assert ls_row(job)[4] == "cuda:1 mps"
    old_cpu = state.job(cpu_job)
    assert old_cpu is not None
    cpu = old_cpu.attempts[0].placement
    assert (cpu.device, cpu.gpus, cpu.alone, cpu.reservation, cpu.settled) == ("cpu", (), True, None, False)
    assert job_json(old_cpu)["reservation"] == {
        "cpus": None,
        "from": "auto: learnt when it starts",
        "mem_bytes": None,
        "mem_from": "auto: learnt when it starts",
    }


def test_a_placement_this_tandem_writes_is_what_the_previous_one_read(tmp_path: Path) -> None:
    """The column keeps the names and JSON types the previous tandem read with ``.get``: a
    state file goes back and forth between the two (same schema)."""
    state = State(tmp_path)
    job_id, _ = state.add_job(JobSpec(["true"], "/"), 0, time.time())
    need = Reservation(Resources(cores=0.5, gpus=1, gpu_mem=1 << 30), cores_why="given", ram_why="given")
    placed = AttemptPlacement(device="cuda:0", gpus=(0,), uuids=("GPU-a",), reservation=need)
    state.start(Attempt(job_id, 1, "running", placed, time.time()), None, "attempt 1")
    state.update_attempt(job_id, 1, placement=replace(placed, settled=True, node="n1"))
    (text,) = state.db.execute("SELECT placement FROM attempts WHERE job_id = ?", (job_id,)).fetchone()
    assert json.loads(text) == {
        "device": "cuda:0",
        "gpus": [0],
        "uuids": ["GPU-a"],
        "gpu_mem": 1 << 30,
        "mps": False,
        "alone": False,
        "probe": False,
        "cpus": 0.5,
        "cpus_from": "given",
        "mem": 0,
        "mem_from": "given",
        "settled": True,
        "node": "n1",
        "reservation": need.to_dict(),
    }, "names and JSON types as before, the reservation beside them; a figure it has not is left out"
    job = state.job(job_id)
    assert job is not None and job.attempts[0].placement == replace(placed, settled=True, node="n1")


def test_a_placement_is_changed_only_by_replacing_it() -> None:
    placed = AttemptPlacement()
    with pytest.raises(FrozenInstanceError):
        placed.gpus = (2,)  # type: ignore[misc]
    assert AttemptPlacement.from_json(placed.to_json()) == placed
    # A name an earlier or later tandem wrote that this one does not know is not an error.
    assert AttemptPlacement.from_json('{"device": "cpu", "gone": 1}') == placed


def test_a_probe_that_settles_is_written_whole_and_a_new_daemon_adopts_it_typed(tmp_path: Path) -> None:
    """The GPU path without a GPU: a probe on GPU 0 that has used none for long settles; its
    record keeps every other figure, and an adopting daemon reads back what it reserved."""
    from tandem.place.active import Active
    from tandem.place.attempts import Attempts
    from tandem.place.config import DaemonConfig
    from tandem.place.devices import Monitor
    from tandem.place.model import Capacity, GpuInfo
    from tandem.place.run.launchers.launch import LocalLauncher

    capacity = Capacity(Resources(2.0, 1 << 30), (GpuInfo(0, "GPU-a", 8 << 30),))
    config = DaemonConfig(track=False)
    state = State(tmp_path)

    def attempts() -> Attempts:
        return Attempts(state, capacity, config, Monitor(capacity, 5.0, None), LocalLauncher(), None, "")

    job_id, _ = state.add_job(JobSpec(["true"], "/", cpus=AUTO_CPUS, gpus=1), 1, time.time())
    probe = Reservation(Resources(0.5, 1 << 20, 1), PROBE, LEARNT, PROBE, cores_why=PROBE, ram_why="measured")
    placed = AttemptPlacement(device="cuda:0", gpus=(0,), uuids=("GPU-a",), probe=True, reservation=probe)
    long_ago = time.time() - 3600
    record = Attempt(job_id, 1, "running", placed, long_ago, folder="1.x")
    state.start(record, None, "attempt 1")
    job = state.job(job_id)
    assert job is not None
    follower = attempts()
    a = Active(job, 1, placed, state.attempt_dir(record), long_ago, last_growth=long_ago)
    assert a.gpu_probing and a.reservation.gpu_mem is None
    follower._measure(a, time.time())
    settled = replace(placed, reservation=probe.measured(gpu_mem=0, why=""), settled=True)
    assert a.reservation.gpu_mem == 0 and a.placed == settled and not a.gpu_probing
    stored = state.job(job_id)
    assert stored is not None and stored.attempts[0].placement == settled
    adopter = attempts()
    adopter.follow_all = lambda _now: None  # type: ignore[method-assign]  # no supervisor to follow here
    adopter.adopt()
    adopted = adopter.active[job_id]
    assert adopted.placed == settled and adopted.uuids == ("GPU-a",) and adopted.placed.probe
    assert not adopted.gpu_probing and adopted.reservation.gpu_mem == 0, "settled: not a probe again"
    assert adopted.reservation.resources.ram == 1 << 20


def test_a_running_job_whose_supervisor_has_not_shown_itself_is_starting(tmp_path: Path) -> None:
    """On a Ray cluster an attempt is recorded as it is handed to Ray; until its supervisor
    writes who it is, Ray is still placing it (or its node starting a worker): ``ls`` and
    ``show`` say ``starting``, ``--json`` keeps its state and says ``starting`` beside it."""
    state = State(tmp_path)
    job_id, _ = state.add_job(JobSpec(["true"], "/"), 0, time.time())
    state.start(
        Attempt(job_id, 1, "running", AttemptPlacement(node_name="worker"), time.time()), None, "attempt 1"
    )
    job = state.job(job_id)
    assert job is not None and job.state == "running"
    assert ls_row(job)[2] == "starting"
    assert job_json(job)["state"] == "running" and job_json(job)["starting"] is True
    state.update_attempt(job_id, 1, shim_pid=4242, shim_ctime=1.0)  # its supervisor wrote
    job = state.job(job_id)
    assert job is not None and ls_row(job)[2] == "running" and job_json(job)["starting"] is False
    state.close()


def test_a_restarted_daemon_adopts_a_cpus_auto_job_at_its_recorded_reservation(tmp_path: Path) -> None:
    """A job of --cpus auto measured at 0.9 cores in its run (its key learnt nothing yet: no
    run of it ended) is taken up by the next daemon at 0.9, as measured, not probed again;
    its RAM as recorded too."""
    from tandem.place.attempts import Attempts
    from tandem.place.config import DaemonConfig
    from tandem.place.devices import Monitor
    from tandem.place.model import Capacity
    from tandem.place.run.launchers.launch import LocalLauncher

    capacity = Capacity(Resources(2.0, 4 << 30), ())
    state = State(tmp_path)
    job_id, _ = state.add_job(JobSpec(["python", "train.py"], "/", cpus=AUTO_CPUS), 0, time.time())
    measured = Reservation(
        Resources(cores=0.9, ram=300 << 20),
        cores_from=LEARNT,
        ram_from=LEARNT,
        cores_why="measured, this run",
        ram_why="measured, this run",
    )
    record = Attempt(job_id, 1, "running", AttemptPlacement(reservation=measured), time.time(), folder="1.x")
    state.start(record, None, "attempt 1")
    adopter = Attempts(
        state, capacity, DaemonConfig(track=False), Monitor(capacity, 5.0, None), LocalLauncher(), None, ""
    )
    assert adopter.startup.learned.runs(state.job(job_id).learning_key) == [], "nothing learnt for its key"  # type: ignore[union-attr]
    adopter.follow_all = lambda _now: None  # type: ignore[method-assign]  # no supervisor to follow here
    adopter.adopt()
    adopted = adopter.active[job_id]
    assert adopted.reservation == measured
    assert adopted.cpu is not None and not adopted.cpu.probe and adopted.cpu.cores == 0.9
    assert adopted.cpu.source == "measured, this run" and not adopted.probing
    assert not any(a.probing for a in adopter.active.values()), "it is no probe"
