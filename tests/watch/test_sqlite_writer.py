"""A run written straight into a SQLite store's tables (``SqliteTables``, no MLflow import)
reads back through MLflow's own client as the same run written through MLflow: its info,
tags, params, latest metrics and histories (a duplicate, a NaN, an infinity, a later step
logged first), artifacts and end; MLflow's client goes on writing it; a store at a schema
this writer was not checked against, or whose experiment keeps artifacts elsewhere, is
written through MLflow; bad names and deleted runs are refused as MLflow refuses them."""

from __future__ import annotations

import math
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mlflow")

from tandem.watch.point import Point  # noqa: E402
from tandem.watch.stores import sqlite_writer  # noqa: E402
from tandem.watch.stores.mlflow_store import MlflowStore  # noqa: E402

T = 1_700_000_000_000


def write(store: MlflowStore, artifact: Path) -> None:
    """The writes tandem makes of a run, in the order the MLflow helper makes them."""
    store.open("job-3", {"tandem.job_id": "3", "group": "g", "mlflow.user": "ann"}, T)
    store.set_tags({"tandem.params": '{"lr": "0.1"}'})
    store.log([Point("cpu_percent", 50.0, T + 1000, 0), Point("loss", 2.0, T + 1000, 1)])
    store.log(
        [Point("loss", 1.0, T + 3000, 3), Point("loss", 1.5, T + 2000, 2), Point("loss", 1.0, T + 3000, 3)]
    )
    store.log([Point("nan", float("nan"), T + 1000, 0), Point("inf", float("inf"), T + 1000, 0)])
    store.set_tags({"long": "x" * 9000, "mlflow.runName": "job-3b"})
    store.log_artifact(artifact)
    assert store.log_params({"lr": "0.1", "epochs": "2"}) == {}
    assert store.log_params({"lr": "0.2", "seed": "1"}) == {"lr": "0.1"}  # a param is never changed
    store.close("FINISHED", T + 9000)


def read(uri: str, run_id: str) -> dict[str, Any]:
    """What MLflow's client reads of the run, ids and the store's paths left out."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    run = client.get_run(run_id)
    info = {
        k: v
        for k, v in dict(run.info).items()
        if k not in ("run_id", "run_uuid", "artifact_uri", "experiment_id")
    }
    history = {
        k: [(m.timestamp, m.step, m.value) for m in client.get_metric_history(run_id, k)]
        for k in run.data.metrics
    }
    found = client.search_runs([run.info.experiment_id], "params.epochs = '2' and tags.group = 'g'")
    return {
        "info": info,
        "experiment": client.get_experiment(run.info.experiment_id).name,
        "artifact_uri": run.info.artifact_uri.replace(run_id, "ID").replace(
            Path(uri[10:]).parent.as_uri(), "STORE"
        ),
        "tags": run.data.tags,
        "params": run.data.params,
        "metrics": {k: "nan" if math.isnan(v) else v for k, v in run.data.metrics.items()},
        "history": {k: [(t, s, "nan" if math.isnan(v) else v) for t, s, v in h] for k, h in history.items()},
        "artifacts": [(f.path, f.file_size) for f in client.list_artifacts(run_id)],
        "searched": [r.info.run_id == run_id for r in found],
    }


def test_a_run_written_to_the_tables_reads_back_as_mlflow_writes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    artifact = tmp_path / "output.log"
    artifact.write_text("the command's output\n")
    direct = MlflowStore(f"sqlite:///{tmp_path / 'a' / 'mlflow.db'}")
    write(direct, artifact)
    assert direct._tables is not None and direct._client is None  # written without MLflow
    with monkeypatch.context() as m:
        m.setattr(sqlite_writer, "KNOWN_SCHEMAS", frozenset())  # a schema it does not know: MLflow
        through_mlflow = MlflowStore(f"sqlite:///{tmp_path / 'b' / 'mlflow.db'}")
        write(through_mlflow, artifact)
        assert through_mlflow._client is not None and through_mlflow._tables is None
    ours, theirs = read(direct.uri, direct.run_id), read(through_mlflow.uri, through_mlflow.run_id)
    assert ours == theirs
    # What the comparison rests on, spelled out:
    assert ours["info"]["run_name"] == "job-3b" and ours["info"]["user_id"] == "ann"
    assert ours["info"]["status"] == "FINISHED" and ours["info"]["end_time"] == T + 9000
    assert ours["metrics"] == {"cpu_percent": 50.0, "loss": 1.0, "nan": "nan", "inf": 1.7976931348623157e308}
    assert ours["history"]["loss"] == [(T + 1000, 1, 2.0), (T + 2000, 2, 1.5), (T + 3000, 3, 1.0)]
    assert len(ours["tags"]["long"]) == 8000 and ours["params"] == {"lr": "0.1", "epochs": "2", "seed": "1"}
    assert ours["artifacts"] == [("output.log", 21)] and ours["searched"] == [True]
    assert ours["artifact_uri"] == "STORE/mlruns/tandem/ID/artifacts"


def test_mlflow_goes_on_writing_a_run_made_in_the_tables(tmp_path: Path) -> None:
    """The job's own MLflow (Lightning's logger, ``mlflow.log_metric``) writes the same run."""
    from mlflow.tracking import MlflowClient

    store = MlflowStore(f"sqlite:///{tmp_path / 'mlflow.db'}")
    store.open("job", {}, T)
    store.log([Point("loss", 2.0, T + 1000, 5)])
    client = MlflowClient(store.uri)
    client.log_metric(store.run_id, "loss", 1.0, step=6, timestamp=T + 2000)
    client.log_param(store.run_id, "lr", "0.5")
    assert client.get_experiment("0").name == "Default"  # MLflow adds its own on opening
    resumed = MlflowStore(store.uri)
    resumed.resume(store.run_id)
    assert resumed.log_params({"lr": "0.1"}) == {"lr": "0.5"}
    resumed.log([Point("loss", 3.0, T + 500, 4)])  # an older step: not the latest value
    resumed.close("KILLED")
    run = client.get_run(store.run_id)
    assert run.data.metrics == {"loss": 1.0} and run.data.params == {"lr": "0.5"}
    assert run.info.status == "KILLED" and run.info.end_time is not None


def test_refused_as_mlflow_refuses(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    store = MlflowStore(f"sqlite:///{tmp_path / 'mlflow.db'}")
    store.open("job", {}, T)
    with pytest.raises(ValueError, match="invalid metric name '../x'"):
        store.log([Point("../x", 1.0, T, 0)])
    with pytest.raises(ValueError, match="invalid tag name 'a\\$b'"):
        store.set_tags({"a$b": "1"})
    with pytest.raises(ValueError, match="longer than MLflow's 6000"):
        store.log_params({"p": "x" * 6001})
    MlflowClient(store.uri).delete_run(store.run_id)
    with pytest.raises(ValueError, match="is deleted"):
        store.set_tags({"a": "1"})
    with pytest.raises(LookupError, match="no run 0123"):
        MlflowStore(store.uri).resume("0123")


def test_a_store_it_was_not_checked_against_goes_through_mlflow(tmp_path: Path) -> None:
    """A schema revision not in ``KNOWN_SCHEMAS`` (a store of another MLflow version), and an
    experiment that keeps its artifacts anywhere but a local folder."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    first = MlflowStore(uri)
    first.open("job", {}, T)
    db = sqlite3.connect(tmp_path / "mlflow.db")
    db.execute("UPDATE experiments SET artifact_location = 's3://bucket/x' WHERE name = 'tandem'")
    db.commit()
    assert MlflowStore(uri)._prepare_tables() is None
    db.execute(
        "UPDATE experiments SET artifact_location = ? WHERE name = 'tandem'", ((tmp_path / "art").as_uri(),)
    )
    db.commit()
    assert MlflowStore(uri)._prepare_tables() is not None
    db.execute("UPDATE alembic_version SET version_num = 'ffffffffffff'")
    db.commit()
    assert MlflowStore(uri)._prepare_tables() is None
    assert sqlite_writer.SqliteTables.open(tmp_path / "none.db") is None  # no store at all


def test_a_run_is_written_without_importing_mlflow(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from tandem.watch.point import Point\n"
        "from tandem.watch.stores.mlflow_store import MlflowStore\n"
        f"s = MlflowStore({uri!r})\n"
        "s.open('job', {'k': 'v'}, 1)\n"
        "s.log([Point('loss', 1.0, 2, 0)])\n"
        "s.close('FINISHED')\n"
        "assert 'mlflow' not in sys.modules and 'sqlalchemy' not in sys.modules, 'MLflow imported'\n"
    )
    MlflowStore(uri).prepare()  # the template of MLflow's tables made
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
