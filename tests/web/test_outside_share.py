"""The dashboard's share view of a share served by a producer outside the job manager (a
hand-started run's, :mod:`tandem.place.outside`): it names that producer, never the producer
job that ended as not needed. The state is written through ``State``, as the daemon does;
the process serving is this one (alive, its start time known)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from tandem.place import outside
from tandem.place.model import JobSpec
from tandem.place.records import Attempt, AttemptPlacement
from tandem.place.resources import Reservation, Resources
from tandem.place.state import State
from tandem.share.spec import ShareSpec
from tandem.web.data import Reader


def test_a_share_served_outside_the_manager_names_that_producer(tmp_path: Path) -> None:
    state = State(tmp_path)
    state.define_share(ShareSpec("toy", "dataset", "m:f", batch_size=4))
    spec = tmp_path / "shares" / "toy" / "abc" / "share.json"
    spec.parent.mkdir(parents=True)
    command = ["python", "-m", "tandem.cli", "share", "serve-spec", str(spec)]
    now = time.time()
    job = state.add_producer(JobSpec(command, "/", name="producer toy", share="toy"), 0, now, "toy")
    state.start(
        Attempt(
            job,
            1,
            "running",
            AttemptPlacement(reservation=Reservation(Resources(cores=1.0))),
            started=now,
            shim_pid=1,
        ),
        None,
        "",
    )
    cause = outside.report(spec, "toy", os.getpid())  # what the producer job says, finding it served
    ended = {"state": "succeeded", "ended": now, "cause": cause}
    state.finish(job, 1, "succeeded", ended, {"cause": cause}, "")

    (shown,) = Reader(tmp_path, None).shares()
    assert shown["outside_pid"] == os.getpid(), shown
    assert shown["producer_job"] is None and shown["producer_pid"] is None, shown
    state.close()
