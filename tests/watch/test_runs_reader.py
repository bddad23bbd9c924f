"""The store's tables read directly (``SqliteRuns``, no MLflow import) give what MLflow's own
client gives (``MlflowRuns``), on a store MLflow wrote: runs of two experiments, tags, a
NaN, a metric logged at several steps, a deleted run and a run of a deleted experiment; a
SQLite file that is no MLflow store is left to MLflow; a report loads without importing
MLflow."""

from __future__ import annotations

import math
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mlflow")

from tandem.watch.stores.runs_reader import MlflowRuns, NotAStore, SqliteRuns, StoredRun, open_reader  # noqa: E402

WRITE = """
import sys, mlflow
from mlflow.tracking import MlflowClient
uri = sys.argv[1]
mlflow.set_tracking_uri(uri)
c = MlflowClient(uri)
other = c.create_experiment("other")
gone = c.create_experiment("gone")
def run(exp, name, tags, metrics, end="FINISHED"):
    r = c.create_run(exp, run_name=name, tags=tags)
    for key, values in metrics.items():
        for step, v in enumerate(values):
            c.log_metric(r.info.run_id, key, v, step=step, timestamp=1000 * (step + 1))
    if end:
        c.set_terminated(r.info.run_id, end)
    return r.info.run_id
run("0", "a", {"group": "g", "tandem.job_id": "1"}, {"loss": [3.0, 2.0, 1.0], "summary/cpu_s": [4.5]})
run(other, "b", {"group": "g", "tandem.job_id": "2"}, {"loss": [2.5, float("nan")]}, end="KILLED")
run("0", "p", {"tandem.role": "producer", "tandem.share": "ds"}, {"samples": [64.0]}, end=None)
run("0", "b", {"group": "h"}, {"loss": [9.0]})
c.delete_run(run("0", "x", {"group": "g"}, {"loss": [0.0]}))
run(gone, "y", {"group": "g"}, {"loss": [0.0]})
c.delete_experiment(gone)
"""


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    db = tmp_path_factory.mktemp("store") / "mlflow.db"
    uri = f"sqlite:///{db}"
    done = subprocess.run([sys.executable, "-c", WRITE, uri], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return uri


def same(a: StoredRun, b: StoredRun) -> bool:
    nan = [k for k, v in a.metrics.items() if math.isnan(v)]
    assert nan == [k for k, v in b.metrics.items() if math.isnan(v)]
    strip = lambda r: {**r.__dict__, "metrics": {k: v for k, v in r.metrics.items() if k not in nan}}  # noqa: E731
    return strip(a) == strip(b)


def test_the_tables_read_as_mlflow_reads_them(store: str) -> None:
    direct, client = open_reader(store), MlflowRuns(store)
    assert isinstance(direct, SqliteRuns)
    for reader in (direct, client):
        assert [r.name for r in reader.tagged({"group": "g"})] == ["a", "b"], (
            "no deleted run, none of a deleted experiment"
        )
        assert [r.name for r in reader.recent(10)] == ["b", "p", "b", "a"]
    pairs = [
        (direct.tagged({"group": "g"}), client.tagged({"group": "g"})),
        (
            direct.tagged({"tandem.role": "producer", "tandem.share": "ds"}),
            client.tagged({"tandem.role": "producer", "tandem.share": "ds"}),
        ),
        (direct.recent(2), client.recent(2)),
        ([direct.named("b")], [client.named("b")]),
    ]
    for mine, theirs in pairs:
        assert len(mine) == len(theirs) and all(m and t and same(m, t) for m, t in zip(mine, theirs))
    a, b = direct.tagged({"group": "g"})
    assert a.status == "FINISHED" and b.status == "KILLED" and a.end_ms is not None
    assert a.metrics == {"loss": 1.0, "summary/cpu_s": 4.5} and math.isnan(b.metrics["loss"])
    assert direct.named("b").tags.get("group") == "h", "the newest of that name"
    (producer,) = direct.tagged({"tandem.role": "producer", "tandem.share": "ds"})
    assert producer.status == "RUNNING" and producer.end_ms is None
    assert (
        direct.history(a.run_id, "loss")
        == client.history(a.run_id, "loss")
        == [(1000, 3.0), (2000, 2.0), (3000, 1.0)]
    )
    assert direct.get(a.run_id) is not None and same(direct.get(a.run_id), client.get(a.run_id))
    assert direct.get("0" * 32) is None and client.get("0" * 32) is None
    assert direct.tagged({"group": "nothing"}) == [] and direct.named("nothing") is None


def test_a_sqlite_file_that_is_no_mlflow_store_goes_to_mlflow(tmp_path: Path) -> None:
    db = tmp_path / "other.db"
    sqlite3.connect(db).execute("CREATE TABLE runs (x)").connection.commit()
    with pytest.raises(NotAStore, match="no MLflow table"):
        SqliteRuns(db)
    with pytest.raises(Exception, match="no such column"):  # MLflow's own reading, and its error
        open_reader(f"sqlite:///{db}")


def test_a_groups_runs_load_without_importing_mlflow(store: str) -> None:
    code = (
        "import sys\n"
        "from tandem.watch.report import load_runs\n"
        f"runs = load_runs(['group:g'], {store!r})\n"
        "assert [r.name for r in runs] == ['a', 'b'], runs\n"
        "assert runs[0].series['loss'] == [(1000, 3.0), (2000, 2.0), (3000, 1.0)]\n"
        "assert runs[0].summary == {'cpu_s': 4.5}\n"
        "assert 'mlflow' not in sys.modules, 'MLflow imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
