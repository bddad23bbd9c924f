"""One MLflow run per ``tandem run``: the command is told its run (``MLFLOW_TRACKING_URI``,
``MLFLOW_RUN_ID``), and what it logs with MLflow itself (the fluent API, Lightning's
``MLFlowLogger``) lands in that same run, beside tandem's ``system/*`` metrics. Real
commands, a real MLflow SQLite store."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tandem.watch.stores.base import absolute_uri, run_env, with_run_env
from tests.watch.test_run import client_for, tandem

# Prints what it was told, logs a metric with no start_run, ends the run itself (FINISHED),
# then fails: the status tandem sets from the exit code is the one that stays.
FLUENT = """\
import json, os, sys
import mlflow
print("told", json.dumps({k: os.environ.get(k) for k in
      ("MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_EXPERIMENT_ID")}))
mlflow.log_metric("child/loss", 0.5, step=1)
mlflow.log_metric("child/loss", 0.25, step=2)
print("active", mlflow.active_run().info.run_id)
mlflow.end_run()
sys.exit(3)
"""

# Lightning's Trainer with the README's two-line glue, and a fluent metric after it.
LIGHTNING = """\
import os
import lightning as L
import mlflow
import torch
from lightning.pytorch.loggers import MLFlowLogger

print("told", os.environ["MLFLOW_RUN_ID"])


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, _i):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("lit/loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


data = torch.utils.data.TensorDataset(torch.randn(16, 2), torch.randn(16, 1))
logger = MLFlowLogger(run_id=os.environ["MLFLOW_RUN_ID"], tracking_uri=os.environ["MLFLOW_TRACKING_URI"])
trainer = L.Trainer(max_epochs=1, logger=logger, log_every_n_steps=1, accelerator="cpu",
                    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=4))
mlflow.log_metric("child/after_fit", 1.0)
print("lightning logged to", logger.run_id)
"""


def _told(stdout: str) -> dict[str, str | None]:
    line = next(line for line in stdout.splitlines() if line.startswith("told "))
    return json.loads(line.removeprefix("told "))


def _runs(store: Path) -> list:
    client = client_for(store)
    return client.search_runs([e.experiment_id for e in client.search_experiments()])


def test_the_commands_own_mlflow_logging_lands_in_tandems_run(tmp_path):
    (tmp_path / "child.py").write_text(FLUENT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    # The user's experiment is the run's; a stale experiment id of theirs must not contradict it.
    env.update(MLFLOW_EXPERIMENT_NAME="mine", MLFLOW_EXPERIMENT_ID="987654")
    env["MLFLOW_TRACKING_URI"] = "sqlite:///mlflow.db"  # relative: the command is told it absolute
    r = tandem(
        "run", "-q", "-n", "fluent", "-i", "0.2", "--", sys.executable, "child.py", cwd=tmp_path, env=env
    )
    assert r.returncode == 3, r.stderr
    store = tmp_path / "mlflow.db"
    (run,) = _runs(store)  # one run: the command made none of its own
    told = _told(r.stdout)
    assert told == {
        "MLFLOW_TRACKING_URI": f"sqlite:///{store}",
        "MLFLOW_RUN_ID": run.info.run_id,
        "MLFLOW_EXPERIMENT_NAME": "mine",
        "MLFLOW_EXPERIMENT_ID": None,
    }
    assert f"active {run.info.run_id}" in r.stdout, "mlflow.log_metric with no start_run resumed it"
    client = client_for(store)
    assert client.get_experiment(run.info.experiment_id).name == "mine"
    history = client.get_metric_history(run.info.run_id, "child/loss")
    assert sorted((m.step, m.value) for m in history) == [(1, 0.5), (2, 0.25)]
    assert "system/process_tree/cpu_percent" in run.data.metrics and "summary/cpu_seconds" in run.data.metrics
    # The command ended the run itself (FINISHED); tandem's status, from the exit code, is last.
    assert run.info.status == "FAILED" and run.data.tags["tandem.exit_code"] == "3"
    assert run.info.run_name == "fluent"


def test_lightning_mlflow_logger_with_the_run_id_logs_into_tandems_run(tmp_path):
    pytest.importorskip("lightning")
    (tmp_path / "train.py").write_text(LIGHTNING)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    r = tandem("run", "-q", "-n", "lit", "--", sys.executable, "train.py", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    (run,) = _runs(tmp_path / "mlflow.db")  # not a second run in experiment "lightning_logs"
    assert f"told {run.info.run_id}" in r.stdout and f"lightning logged to {run.info.run_id}" in r.stdout
    metrics = run.data.metrics
    assert "lit/loss" in metrics and "child/after_fit" in metrics, sorted(metrics)
    assert any(k.startswith("system/") for k in metrics) and "summary/duration_s" in metrics
    assert run.info.status == "FINISHED"
    assert not (tmp_path / "mlruns" / "0").exists(), "Lightning made no store of its own"


def test_no_run_id_is_given_where_the_run_is_not_in_mlflow(tmp_path):
    show = "import os; print('told', os.environ.get('MLFLOW_RUN_ID'), os.environ.get('MLFLOW_TRACKING_URI'))"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    r = tandem(
        "run", "-q", "--sink", "csv", "--out", "runs", "--", sys.executable, "-c", show, cwd=tmp_path, env=env
    )
    assert r.returncode == 0, r.stderr
    assert "told None None" in r.stdout, "a file-store run has no MLflow id to give"
    # MLflow cannot open its store (its folder is a file): the run falls back to a file, and
    # the command is given no id of a run that does not exist.
    (tmp_path / "blocked").write_text("")
    store = f"sqlite:///{tmp_path / 'blocked' / 'mlflow.db'}"
    r = tandem("run", "-q", "--store", store, "--", sys.executable, "-c", show, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    assert "told None None" in r.stdout and "tandem-runs" in r.stderr, r.stderr
    # Asked not to wait for the run: the command starts at once, told nothing; the run is made.
    r = tandem(
        "run",
        "-q",
        "--no-mlflow-env",
        "-n",
        "untold",
        "--",
        sys.executable,
        "-c",
        show,
        cwd=tmp_path,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert "told None None" in r.stdout
    (run,) = _runs(tmp_path / "mlflow.db")
    assert run.info.run_name == "untold" and run.info.status == "FINISHED"


def test_store_uris_are_made_absolute_and_the_env_replaces_the_experiment_id(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert absolute_uri("sqlite:///mlflow.db") == f"sqlite:///{tmp_path}/mlflow.db"
    assert absolute_uri("sqlite:////abs/x.db") == "sqlite:////abs/x.db"
    assert absolute_uri("file:./mlruns") == (tmp_path / "mlruns").as_uri()
    assert absolute_uri("mlruns") == str(tmp_path / "mlruns")
    for kept in ("http://127.0.0.1:5000", "databricks", "sqlite:///:memory:", "file:///abs/mlruns"):
        assert absolute_uri(kept) == kept
    ids = run_env("sqlite:///m.db", "abc", "exp")
    env = with_run_env({"MLFLOW_EXPERIMENT_ID": "7", "PATH": "/bin"}, ids)
    assert env == {"PATH": "/bin", **ids} and ids["MLFLOW_TRACKING_URI"] == f"sqlite:///{tmp_path}/m.db"
    assert with_run_env({"MLFLOW_EXPERIMENT_ID": "7"}, {}) == {"MLFLOW_EXPERIMENT_ID": "7"}
