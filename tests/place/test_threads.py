"""A job's compute threads: its share of the host's cores, unless it says otherwise."""

from __future__ import annotations

from tandem.place.threads import THREAD_VARS, thread_count, thread_env

PRINT_THREADS = (
    'import os; print("threads", os.environ.get("OMP_NUM_THREADS"), os.environ.get("MKL_NUM_THREADS"))'
)


def test_the_count_is_the_reservation_given_else_a_fair_share_of_the_host() -> None:
    assert thread_count(2.5, 16, 8) == 3  # --cpus given: what it reserved, rounded up
    assert thread_count(0.5, 16, 1) == 1
    assert thread_count(None, 16, 1) == 16  # auto, alone: every core
    assert thread_count(None, 2, 8) == 1  # auto, a sweep's eight points on two cores
    assert thread_count(None, 2, 3) == 1
    assert thread_count(None, 8, 3) == 2
    assert thread_count(0.0, 4, 2) == 2  # 0 is how auto is stored


def test_the_jobs_own_setting_wins() -> None:
    assert thread_env({"MKL_NUM_THREADS": "7"}, None, 2, 1) == {}
    assert thread_env({"PATH": "/bin"}, None, 2, 2) == dict.fromkeys(THREAD_VARS, "1")


def test_a_job_of_the_daemon_gets_its_share_and_keeps_its_own(cli) -> None:
    for var in THREAD_VARS:
        cli.env.pop(var, None)
    cli("daemon", "start", "--cpus", "2", "--no-track")  # no MLflow: threads are the point
    given = cli.submit("--cpus", "1.5", "--", "python", "-c", PRINT_THREADS)
    auto = cli.submit("--", "python", "-c", PRINT_THREADS)
    cli.env["OMP_NUM_THREADS"] = "5"
    own = cli.submit("--", "python", "-c", PRINT_THREADS)
    assert cli("wait", str(given), str(auto), str(own)).returncode == 0
    assert "threads 2 2" in cli("logs", str(given)).stdout
    # auto: 2 cores among the jobs running once it starts (itself, perhaps the other)
    assert any(f"threads {n} {n}" in cli("logs", str(auto)).stdout for n in (1, 2))
    assert "threads 5 None" in cli("logs", str(own)).stdout


def test_a_job_on_a_share_counts_its_producer(inproc, tmp_path, monkeypatch) -> None:
    """On 2 cores, the first job of a share submitted alone gets 1 thread, not 2: its producer
    decodes beside it (measured: the one given 2 threads used 10.7 CPU-s, the others 6.9)."""
    import sys

    from tandem.place.run.supervisor.files import AttemptSpec, load

    for var in THREAD_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "thr_data.py").write_text("def train_set():\n    return list(range(8))\n")
    h = inproc("--cpus", "2", "--settle", "0.3", "--window", "2", "--grace", "1")
    h.cli("share", "define", "thr", "--dataset", "thr_data:train_set", "--batch-size", "4")
    alone = h.submit("--", "true")
    h.wait_state(alone, {"running", "done"})
    h.cli("cancel", str(alone))
    h.wait_state(alone, {"cancelled", "done"})
    on_share = h.submit("--share", "thr", "--", "true")
    h.wait_state(on_share, {"running"})

    def threads(job_id: int) -> str:
        (run,) = [r for (j, _), r in h.launcher.runs.items() if j == job_id]
        spec = load(run.dir, AttemptSpec)
        assert spec is not None
        return spec.env["OMP_NUM_THREADS"]

    assert threads(alone) == "2"  # alone, no share: both cores
    assert threads(on_share) == "1"  # alone but for its producer


def test_under_ray_a_job_s_threads_count_the_jobs_on_its_node_not_the_cluster_s() -> None:
    from types import SimpleNamespace

    from tandem.place.starting import jobs_per_node
    from tandem.place.threads import thread_count
    from tests.place.needs import placed

    running = [SimpleNamespace(placed=SimpleNamespace(node=n)) for n in ("id-head", "id-head", "id-worker")]
    new = [placed(9, node="id-worker")]
    on = jobs_per_node(running, new)  # type: ignore[arg-type]
    assert on == {"id-head": 2, "id-worker": 2}
    assert thread_count(None, 8, on["id-worker"]) == 4  # its 8-core node's half, not 8 // 4
    assert jobs_per_node([SimpleNamespace(placed=SimpleNamespace(node=None))], []) == {"": 1}  # type: ignore[list-item]
