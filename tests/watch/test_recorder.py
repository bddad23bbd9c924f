"""The recorder's fall-back when the MLflow store breaks in the middle of a run (a real store)."""

from __future__ import annotations

import time

from tandem.watch._recording.recorder import Recorder
from tandem.watch.point import Point
from tandem.watch.stores import MlflowStore
from tandem.watch.stores.csv_file import read_points


def test_store_broken_mid_run_keeps_the_rest_in_a_local_file(tmp_path):
    db = tmp_path / "mlflow.db"
    warnings: list[str] = []
    rec = Recorder(MlflowStore(f"sqlite:///{db}", experiment="e"), "mid", {"group": "x"},
                   fallback_dir=tmp_path / "fallback", flush_s=0.2, warn=warnings.append)  # fmt: skip
    assert rec.wait_open(60) and not rec.fell_back
    now = int(time.time() * 1000)
    rec.log([Point("system/a", 1.0, now, 0)])
    from mlflow.tracking import MlflowClient

    deadline = time.monotonic() + 30
    while not MlflowClient(f"sqlite:///{db}").get_metric_history(rec.run_id, "system/a"):
        assert time.monotonic() < deadline, "the first point never reached MLflow"
        time.sleep(0.1)
    db.write_bytes(b"this is not a database any more" * 1000)  # the store breaks
    rec.log([Point("system/a", 2.0, now + 1000, 1), Point("system/b", 3.0, now + 1000, 1)])
    assert rec.close("FINISHED", timeout=60)
    assert rec.fell_back, warnings
    assert len(warnings) == 1 and "from now on are kept in" in warnings[0], warnings
    (run_dir,) = (tmp_path / "fallback").iterdir()
    points = read_points(run_dir / "metrics.csv")
    assert [(p.key, p.value) for p in points] == [("system/a", 2.0), ("system/b", 3.0)], "nothing lost"
    assert '"status": "FINISHED"' in (run_dir / "run.json").read_text()
