"""tandem.jobs: the job manager from Python, with job handles that feel like futures."""

from __future__ import annotations

import sys

import pytest

import tandem.jobs
import tandem.place.client
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


def test_the_options_are_tandem_submits_with_its_defaults(api):
    """Every option of tandem submit, named and defaulted alike (JobSpec's fields): retries
    and gpu_share are the job's (a call's function never gets them), gpu_mem and cpus take
    "auto", and a job given neither reserves as tandem submit's default does (auto)."""
    from click.testing import CliRunner

    from tandem.cli.jobs import submit as submit_command

    flags = {p.name for p in submit_command.params if p.name}
    for option in ("retries", "gpu_share", "priority", "gpu_mem", "cpus", "mem", "share", "group", "name"):
        assert option in tandem.jobs.JOB_OPTIONS and option in flags, option
    auto = tandem.jobs.submit(
        [sys.executable, "-c", "pass"], gpu_mem="auto", mem="auto", retries=0, gpu_share=30
    )
    record = auto.refresh().record
    assert (record.cpus, record.mem, record.gpu_mem, record.retries, record.gpu_share) == (
        0.0,
        0,
        None,
        0,
        30,
    )
    given = tandem.jobs.submit([sys.executable, "-c", "pass"], cpus="0.5", mem="64M", gpus=0, gpu_mem=0)
    assert (given.record.cpus, given.record.mem, given.record.gpu_mem) == (0.5, 64 << 20, 0)
    with pytest.raises(tandem.place.client.DaemonRefused, match="1.0G of GPU memory; the manager has no GPU"):
        tandem.jobs.submit(["true"], gpu_mem="1G")  # read as a size, as --gpu-mem 1G is
    # The CLI's defaults are the API's: the same job from tandem submit is stored alike.
    out = CliRunner().invoke(submit_command, ["--", sys.executable, "-c", "pass"], catch_exceptions=False)
    from_cli = tandem.jobs.job(int(out.output.strip())).record
    plain = tandem.jobs.submit([sys.executable, "-c", "pass"])
    for name in ("cpus", "mem", "gpus", "gpu_mem", "gpu_share", "priority", "retries"):
        assert getattr(from_cli, name) == getattr(plain.record, name), name
    with pytest.raises(ValueError, match="or auto"):
        tandem.jobs.submit(["true"], gpu_mem="lots")
    kept = tandem.jobs.call(square, 3, retries=0, cpus=0.5)
    assert kept.result(timeout=scaled(60)) == 9 and kept.record.retries == 0
    for job in (auto, given, plain, tandem.jobs.job(from_cli.id)):
        job.wait(timeout=scaled(120))


def test_submit_many_is_one_request_all_or_none(api):
    from tandem.place.reads import StateReader

    def count() -> int:
        with StateReader() as reader:
            return sum(reader.counts().values())

    before = count()
    jobs = tandem.jobs.submit_many(
        [[sys.executable, "-c", f"print({i})"] for i in range(3)],
        params=[{"i": i} for i in range(3)],
        cpus=0.5,
    )
    assert [j.record.params for j in jobs] == [{"i": 0}, {"i": 1}, {"i": 2}]
    assert [j.wait(timeout=scaled(60)) for j in jobs] == ["succeeded"] * 3
    assert [j.logs().strip() for j in jobs] == ["0", "1", "2"]
    assert count() == before + 3
    # A job that can never fit refuses them all, naming it (the first here): none is queued.
    with pytest.raises(tandem.place.client.DaemonRefused, match="job 1 of 2: .*cores"):
        tandem.jobs.submit_many([["true"], ["true", "big"]], params=[{}, {}], cpus=1000)
    assert count() == before + 3
