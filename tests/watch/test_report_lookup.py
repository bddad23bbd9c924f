"""``tandem report``'s run lookup: file-store runs need no MLflow, and a lookup never
creates a store (real commands; MLflow made unimportable where it must not be needed)."""

from __future__ import annotations

import os

from tests.watch.test_run import BUSY, python_c, tandem


def _without_mlflow(tmp_path) -> dict[str, str]:
    """An environment in which ``import mlflow`` fails, as where it is not installed."""
    shim = tmp_path / "no-mlflow"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text("import sys\nsys.modules['mlflow'] = None\n")
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(shim), os.environ.get("PYTHONPATH")])),
        "TANDEM_STATE_DIR": str(tmp_path / "no-manager"),  # not the user's: it may hold a store
    }


def test_file_store_runs_are_tracked_and_reported_without_mlflow(tmp_path):
    env = _without_mlflow(tmp_path)
    r = tandem("run", "--help", env=env)  # the shim works: a lookup by name fails below
    assert r.returncode == 0
    for name in ("f1", "f2"):
        args = ("--sink", "csv", "--out", "runs", "-q", "-n", name, *python_c(BUSY.format(s=0.3)))
        r = tandem("run", *args, cwd=tmp_path, env=env)
        assert r.returncode == 0, r.stderr
    (one, _) = sorted((tmp_path / "runs").iterdir())
    r = tandem("report", str(one), "-o", "one.png", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    assert "f1" in r.stdout and (tmp_path / "one.png").stat().st_size > 10_000
    r = tandem(
        "report", "runs", "-o", "all.png", cwd=tmp_path, env=env
    )  # the --out directory: every run in it
    assert r.returncode == 0, r.stderr
    assert "f1" in r.stdout and "f2" in r.stdout
    r = tandem("report", "f1", "-o", "x.png", cwd=tmp_path, env=env)
    assert r.returncode == 2 and "no MLflow store found" in r.stderr, r.stderr
    assert not (tmp_path / "mlflow.db").exists()
    (tmp_path / "there.db").touch()  # a store that exists, so the missing MLflow is what stops it
    store = f"sqlite:///{tmp_path}/there.db"
    r = tandem("report", "f1", "--store", store, "-o", "x.png", cwd=tmp_path, env=env)
    assert r.returncode == 2 and "needs MLflow (pip install mlflow)" in r.stderr, r.stderr


def test_a_lookup_in_a_directory_without_a_store_creates_none(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env["TANDEM_STATE_DIR"] = str(tmp_path.parent / f"{tmp_path.name}-no-manager")  # not the user's
    r = tandem("report", "resnet-lr0.1", "-o", "x.png", cwd=tmp_path, env=env)
    assert r.returncode == 2
    assert "no MLflow store found" in r.stderr and str(tmp_path / "mlflow.db") in r.stderr, r.stderr
    assert os.listdir(tmp_path) == [], "nothing created: no mlflow.db, no figure"
