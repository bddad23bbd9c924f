"""NaN and infinities never break a page or ``--json``: a ``--param x=NaN`` is the text
``NaN``; a NaN a job logged as a metric, or a NaN param a state file of before kept as a
number, is sent as strict JSON (null, or the value's text) by the dashboard's API, its event
stream and ``tandem ls/show --json``. A real daemon, job, MLflow store and dashboard."""

from __future__ import annotations

import json
import sqlite3
import sys

from tests.web.conftest import Dashboard, state_file, wait_for
from tests.web.test_api import _call, _events


def _strict(text: str | bytes) -> object:
    def refuse(constant: str) -> object:
        raise AssertionError(f"{constant} in JSON")

    return json.loads(text, parse_constant=refuse)


LOGS_NAN = "import mlflow; mlflow.log_metric('loss', float('nan')); mlflow.log_metric('gain', float('inf'))"


def test_nan_params_and_metrics_leave_ls_json_and_the_dashboard_valid(dashboard: Dashboard) -> None:
    d = dashboard
    job = d.cli.submit(
        "--group", "nan", "--param", "x=NaN", "--param", "y=-Infinity", "--", sys.executable, "-c", LOGS_NAN
    )
    old = d.cli.submit("--group", "nan", "--param", "x=1", "--", "true")
    assert d.cli("wait", str(job), str(old), timeout=120).returncode == 0
    # A state file written before params were kept as text held NaN as a number.
    with sqlite3.connect(state_file(d.cli)) as db:
        db.execute("UPDATE jobs SET params = ? WHERE id = ?", ('{"x": NaN, "z": [Infinity]}', old))

    listed = {j["id"]: j for j in _strict(d.cli("ls", "--all", "--json").stdout)}  # type: ignore[union-attr]
    assert listed[job]["params"] == {"x": "NaN", "y": "-Infinity"}
    assert listed[old]["params"] == {"x": "NaN", "z": [None]}
    assert _strict(d.cli("show", str(old), "--json").stdout)["params"]["x"] == "NaN"  # type: ignore[index]
    assert "x=NaN" in d.cli("show", str(job)).stdout

    wait_for(lambda: "loss" in _strict(_call(d, f"/api/jobs/{job}/metrics")[2])["keys"], 60, "the NaN metric")
    for path in (
        "/api/jobs",
        f"/api/jobs/{job}",
        f"/api/jobs/{old}",
        f"/api/jobs/{job}/metrics",
        "/api/groups/nan",
        "/api/timeline",
    ):
        status, _, body = _call(d, path)
        assert status == 200, (path, body)
        _strict(body)
    report = _strict(_call(d, "/api/groups/nan")[2])["report"]  # type: ignore[index]
    (row,) = [r for r in report["jobs"] if r["id"] == job]
    assert "loss" not in row["metrics"], row  # NaN: no value (MLflow's table says 0), never a 500
    page = _strict(_call(d, "/api/jobs?state=succeeded")[2])
    assert {j["id"]: j["params"] for j in page["jobs"]}[old] == {"x": "NaN", "z": [None]}  # type: ignore[index]
    # The event stream's data lines are strict JSON too.
    text = _events(d, "/api/events?since=0", None, f'"id": {old}')
    for line in text.splitlines():
        if line.startswith("data: "):
            _strict(line[6:])
