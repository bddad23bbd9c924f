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
    cli("daemon", "start", "--cpus", "2")
    given = cli.submit("--cpus", "1.5", "--", "python", "-c", PRINT_THREADS)
    auto = cli.submit("--", "python", "-c", PRINT_THREADS)
    cli.env["OMP_NUM_THREADS"] = "5"
    own = cli.submit("--", "python", "-c", PRINT_THREADS)
    assert cli("wait", str(given), str(auto), str(own)).returncode == 0
    assert "threads 2 2" in cli("logs", str(given)).stdout
    # auto: 2 cores among the jobs running once it starts (itself, perhaps the other)
    assert any(f"threads {n} {n}" in cli("logs", str(auto)).stdout for n in (1, 2))
    assert "threads 5 None" in cli("logs", str(own)).stdout
