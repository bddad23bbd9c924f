"""A job's parameters exactly as given: ``--grid``/``--param`` values are the text typed, in
the command, the name and the job's MLflow run; a job that logs its own hyper-parameters
under the same names (``mlflow.log_params``, Lightning's ``MLFlowLogger``) succeeds, its own
values kept in MLflow and tandem's beside them as tags. A real daemon, real supervisors,
the real MLflow store and Lightning's logger; and the checks a request goes through, fast."""

from __future__ import annotations

import importlib.util
import json
import sys
import time

import pytest

from tandem.jobs import _params, _spec
from tandem.place.model import MAX_ARG, MAX_COMMAND, JobSpec
from tests.place.conftest import Cli
from tests.timing import scaled

GRID = ["1.0", "1.0000000000000001", "1e3", "true"]

# Logs its own hyper-parameters under the sweep's name ``x``, as training code does: the
# fluent API with its own str() of the number, or Lightning's logger (``True`` for ``true``).
SELF_LOGGING = """\
import os, sys
import mlflow
raw = sys.argv[1]
if raw == "true":
    from lightning.pytorch.loggers import MLFlowLogger

    logger = MLFlowLogger(run_id=os.environ["MLFLOW_RUN_ID"], tracking_uri=os.environ["MLFLOW_TRACKING_URI"])
    logger.log_hyperparams({"x": True, "pretrained": True})
else:
    mlflow.log_params({"x": float(raw)})
    mlflow.log_params({"x": float(raw)})  # again, the same value: MLflow takes it
print("logged", raw)
"""


def _closed_run(client, cli: Cli, job_id: int):  # type: ignore[no-untyped-def]
    """Job ``job_id``'s run once the manager's helper has closed it (params are written as it
    closes; the job's row names its run once the helper has said so, after the job ended)."""
    deadline = time.monotonic() + scaled(90)
    while (run_id := cli.job(job_id)["mlflow_run_id"]) is None:
        assert time.monotonic() < deadline, f"job {job_id}'s run is not named"
        time.sleep(0.1)
    while True:
        run = client.get_run(run_id)
        if run.info.status != "RUNNING" and "tandem.mlflow_written" in run.data.tags:
            return run
        assert time.monotonic() < deadline, f"run {run_id} still {run.info.status}"
        time.sleep(0.3)


def _sweep(cli: Cli, group: str, *command: str, named: bool = True) -> list[dict]:
    grid = ["--grid", f"x={','.join(GRID)}", *(["--name", f"{group}-{{x}}"] if named else [])]
    out = cli("submit", "--cpus", "0.5", "--group", group, *grid, "--json", "--", *command)
    ids = json.loads(out.stdout)["ids"]
    assert len(ids) == 4, "four strings, four points (1.0 and 1.0000000000000001 are two)"
    assert cli("wait", *map(str, ids), timeout=300).returncode == 0, cli("ls").stdout
    jobs = [cli.job(i) for i in ids]
    # An ended job names its MLflow run at once (its end and its run in one write).
    assert all(j["mlflow_run_id"] for j in jobs), [(j["id"], j["mlflow_run_id"]) for j in jobs]
    return jobs


@pytest.mark.skipif(importlib.util.find_spec("lightning") is None, reason="needs Lightning")
def test_grid_values_are_the_text_typed_and_a_job_logging_its_own_params_succeeds(cli: Cli) -> None:
    from mlflow.tracking import MlflowClient

    cli("daemon", "start", "--cpus", "2", "--no-host-load", "--settle", "0.3", "--grace", "1")
    (cli.tmp / "job.py").write_text(SELF_LOGGING)
    plain = _sweep(cli, "plain", sys.executable, "-c", "import sys; print(sys.argv[1])", "{x}")
    logging = _sweep(cli, "own", sys.executable, "job.py", "{x}", named=False)
    client = MlflowClient(tracking_uri=cli.json("daemon", "status")["tracking"])

    for job, x in zip(plain, GRID):
        assert job["state"] == "succeeded" and job["params"] == {"x": x}
        assert job["command"][-1] == x and job["name"] == f"plain-{x}"
        assert cli("logs", str(job["id"])).stdout == x + "\n"
        run = _closed_run(client, cli, job["id"])
        assert run.data.params == {"x": x}, "the string typed, not 1000.0 or True"
        assert json.loads(run.data.tags["tandem.params"]) == {"x": x}
        assert "tandem.param.x" not in run.data.tags

    # The job's own values stay (MLflow never changes a param); tandem's, where they differ, are tags.
    own = {"1.0": "1.0", "1.0000000000000001": "1.0", "1e3": "1000.0", "true": "True"}
    for job, x in zip(logging, GRID):
        assert job["state"] == "succeeded", cli("logs", str(job["id"])).stdout
        assert job["params"] == {"x": x} and job["command"][-1] == x
        run = _closed_run(client, cli, job["id"])
        assert run.info.run_name == f"job.py x={x}"  # unnamed: its script and its sweep point
        assert run.data.params["x"] == own[x]
        if own[x] == x:
            assert "tandem.param.x" not in run.data.tags
        else:
            assert run.data.tags["tandem.param.x"] == x
    assert client.get_run(logging[3]["mlflow_run_id"]).data.params == {"x": "True", "pretrained": "True"}


def test_params_of_the_python_api_and_what_a_request_may_hold(tmp_path) -> None:
    np = pytest.importorskip("numpy")
    given = {"nan": float("nan"), "inf": float("-inf"), "n": np.int64(3), "lr": np.float32(0.5), "ok": True}
    assert _params(given) == {"nan": "NaN", "inf": "-Infinity", "n": 3, "lr": 0.5, "ok": True}
    spec = _spec(["true"], tmp_path, {"params": given})
    assert spec.params["nan"] == "NaN" and spec.problem() is None
    with pytest.raises(ValueError, match="params: values are text, numbers"):
        _spec(["true"], tmp_path, {"params": {"p": object()}})
    with pytest.raises(ValueError, match="params: names of up to 250"):
        _spec(["true"], tmp_path, {"params": {"a\nb": 1}})

    def problem(**fields) -> str:
        return JobSpec(**{"command": ["echo"], "cwd": "/", **fields}).problem() or ""

    assert "at most 128 KiB each" in problem(command=["echo", "x" * (MAX_ARG + 1)])
    assert "128 KiB" in problem(env={"BIG": "é" * (MAX_ARG // 2 + 1)})  # bytes, not characters
    many = [f"{'x' * 100_000}{i}" for i in range(MAX_COMMAND // 100_000 + 1)]
    assert f"at most {MAX_COMMAND >> 10} KiB in all" in problem(command=many)
    assert "NUL" in problem(command=["echo", "a\0b"])
    assert "at most 1024 KiB in all" in problem(params={"x": "y" * MAX_COMMAND})
    assert problem(command=["echo", "x" * 1000], env={"PATH": "/bin"}, params={"x": "1e3"}) == ""


def test_a_bad_grid_file_or_placeholder_is_a_clear_refusal_before_anything_runs(cli: Cli) -> None:
    """Exit 2 with what is wrong, never a traceback, and no daemon started to say it."""
    huge = cli.tmp / "huge.jsonl"
    huge.write_text(json.dumps({"a": "x" * (MAX_ARG + 10)}) + "\n")
    cases = [
        (["--grid", "a=0..100000000", "--", "echo", "{a}"], "100,000,001 points"),
        (["--grid", "a=1,2", "--", "echo", "{a:d}"], "takes no format"),
        (["--grid", "a=1,2", "--", "echo", "{a:{b}}"], "takes no format"),
        (["--grid", "a=1", "--name", "{a:>99999999}", "--", "echo"], "takes no format"),
        (["--grid", "a=1,1", "--", "echo", "{a}"], "given twice"),
        (["--params", str(huge), "--", "echo", "{a}"], "at most 128 KiB each"),
    ]
    for args, said in cases:
        run = cli("submit", *args, check=False, timeout=30)
        assert run.returncode == 2 and said in run.stderr, (args, run.stderr)
        assert "Traceback" not in run.stderr
    assert cli.daemon_pid() is None
