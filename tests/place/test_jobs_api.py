"""tandem.jobs: the job manager from Python, with job handles that feel like futures."""

from __future__ import annotations

import sys

import pytest

import tandem.jobs
from tests.timing import scaled


def square(x: int, offset: int = 0) -> int:
    return x * x + offset


def fails(message: str) -> None:
    raise ValueError(message)


@pytest.fixture
def api(module_cli, monkeypatch):
    """The module's tests share one daemon (the first submit starts it): each reads only its
    own jobs, and ends those it leaves running."""
    monkeypatch.setenv("TANDEM_STATE_DIR", module_cli.env["TANDEM_STATE_DIR"])
    monkeypatch.setenv("TANDEM_RUNTIME_DIR", module_cli.env["TANDEM_RUNTIME_DIR"])
    return module_cli


def test_submit_wait_logs_and_params(api):
    job = tandem.jobs.submit(
        [sys.executable, "-c", "print('hello from the job')"], cpus=0.5, group="g", params={"lr": 0.1}
    )
    assert job.wait(timeout=scaled(60)) == "succeeded"
    assert "hello from the job" in job.logs()
    assert job.record.params == {"lr": 0.1} and job.record.group == "g"
    assert api.job(job.id)["params"] == {"lr": 0.1}


def test_call_returns_the_value_or_raises_with_the_jobs_traceback(api):
    ok = tandem.jobs.call(square, 7, offset=1, cpus=0.5)
    bad = tandem.jobs.call(fails, "no good", cpus=0.5)
    assert ok.result(timeout=scaled(60)) == 50
    with pytest.raises(tandem.jobs.JobFailed, match="no good") as caught:
        bad.result(timeout=scaled(60))
    assert "in fails" in str(caught.value)  # the job's traceback
    assert isinstance(caught.value.__cause__, ValueError)
    assert bad.state == "failed"
    with pytest.raises(TypeError, match="runs a command"):
        tandem.jobs.submit([sys.executable, "-c", "pass"], cpus=0.5).result()


def test_cancel_and_after(api):
    sleeper = tandem.jobs.submit([sys.executable, "-c", "import time; time.sleep(600)"], cpus=0.5)
    waiting = tandem.jobs.submit([sys.executable, "-c", "pass"], cpus=0.5, after=[sleeper])
    assert waiting.state == "queued"
    assert sleeper.cancel()
    assert sleeper.wait(timeout=scaled(60)) == "cancelled"
    assert waiting.wait(timeout=scaled(60)) in ("cancelled", "failed")
    late = tandem.jobs.submit([sys.executable, "-c", "import time; time.sleep(600)"], cpus=0.5)
    with pytest.raises(TimeoutError):
        late.wait(timeout=0.5)
    assert late.cancel()  # not left holding its half core for the module's next tests


def test_bad_options_are_clear_errors(api):
    with pytest.raises(TypeError, match="unknown job option"):
        tandem.jobs.submit(["true"], colour="red")
    with pytest.raises(ValueError, match="empty"):
        tandem.jobs.submit([])


def test_metrics_are_the_jobs_mlflow_run(api):
    pytest.importorskip("mlflow")
    code = "import mlflow; mlflow.log_metric('val_loss', 0.25)"
    job = tandem.jobs.submit([sys.executable, "-c", code], cpus=0.5)
    assert job.wait(timeout=scaled(120)) == "succeeded", job.logs()
    assert job.metrics()["val_loss"] == 0.25
