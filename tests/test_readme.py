"""The README's first example as printed: its ``train.py`` (read from README.md) started three
times at once without the job manager, as the README says it may be. All three train and
log their metrics with MLflow's defaults (``./mlflow.db``, which none of them finds made):
tandem's MLflow plugin makes the new store once, under a lock, where MLflow alone would run
its migrations in all three at once (``table _alembic_tmp_tags already exists``)."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.timing import scaled

README = Path(__file__).resolve().parents[1] / "README.md"
LRS = ("0.1", "0.03", "0.01")


def readme_train_py() -> str:
    """The README's ``train.py``, as printed."""
    found = re.search(r"```python\n(# train\.py\n.*?)```", README.read_text(), re.S)
    assert found, "README.md has no ```python block starting with # train.py"
    return found.group(1)


def _end_what_it_started(runtime: str) -> None:
    """Its drop-in loaders' producer lingers a minute after its last reader: ended here."""
    left = []
    for proc in psutil.process_iter():
        try:
            if proc.pid != os.getpid() and proc.environ().get("TANDEM_RUNTIME_DIR") == runtime:
                proc.kill()
                left.append(proc)
        except psutil.Error:
            continue
    psutil.wait_procs(left, timeout=10)


def test_the_readmes_train_py_started_three_times_at_once_trains_and_logs_all_three(
    tmp_path: Path, runtime_dir: str
) -> None:
    pytest.importorskip("mlflow")
    from importlib.metadata import entry_points

    plugins = {e.name: e.value for e in entry_points(group="mlflow.tracking_store")}
    assert "tandem" in plugins.get("sqlite", ""), "tandem's MLflow plugin is not installed: pip install -e ."
    (tmp_path / "train.py").write_text(readme_train_py())
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}  # MLflow's defaults
    started = [
        subprocess.Popen(
            [sys.executable, "train.py", lr],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for lr in LRS
    ]
    try:
        outputs = [p.communicate(timeout=scaled(120))[0] for p in started]
    finally:
        for p in started:
            if p.poll() is None:
                p.kill()
                p.wait()
        _end_what_it_started(runtime_dir)
    for p, out in zip(started, outputs):
        assert p.returncode == 0 and "epoch 2: loss" in out, out[-3000:]
    from mlflow.tracking import MlflowClient

    db = tmp_path / "mlflow.db"
    assert stat.S_IMODE(db.stat().st_mode) == 0o600  # made by tandem: its user's alone
    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len(runs) == 3, [r.info.run_name for r in runs]
    for run in runs:
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "loss")]
        assert sorted(steps) == [0, 1, 2], (run.info.run_name, steps)
