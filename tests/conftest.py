"""Shared fixtures: every test gets its own private runtime directory for producers; how many
workers ``-n auto`` (pyproject's addopts) starts; what the session started ends with it,
interrupted too (tests/leftovers.py)."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from tests import leftovers


def pytest_configure(config: pytest.Config) -> None:
    leftovers.start_session(controller=not hasattr(config, "workerinput"))
    config.addinivalue_line(
        "markers", "tracked: its daemon tracks its jobs in MLflow (tests/place/conftest.py: on_cluster)"
    )
    config.addinivalue_line(
        "markers",
        "warm: its daemon starts Python jobs warm, as a user's does (tests/place/conftest.py: cli)",
    )


def pytest_unconfigure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller: once its workers are gone
        leftovers.end_session()


# Files that run longest (minutes: a Ray cluster of separate nodes, sweeps of real jobs) are
# handed out first: with ``--dist loadfile`` a file runs on one worker, so one started last
# would run alone at the end while the other workers idle.
LONGEST_FIRST = (
    "tests/place/test_ray_nodes.py",
    "tests/place/test_ray_nodes_lost.py",
    "tests/place/test_elastic.py",
    "tests/place/test_ray.py",
    "tests/place/test_auto_share.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::", 1)[0]
        return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: within a file, and among the rest, the collected order


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """One worker more than the cores this process may use, at most 5: many tests wait on
    processes of their own (a Ray cluster's nodes keep a core about a third busy), so a third
    worker on two cores took the place tests from 620 to 442 s; more than that only contend
    for the same cores (the tests start daemons, jobs and producers of their own)."""
    return max(1, min(5, len(os.sched_getaffinity(0)) + 1))


@pytest.fixture(autouse=True)
def runtime_dir(monkeypatch):
    # Short path: Unix socket paths are limited to 107 bytes.
    path = tempfile.mkdtemp(prefix="tdm-")
    monkeypatch.setenv("TANDEM_RUNTIME_DIR", path)
    # No test reaches a system manager the host may run (/run/tandem): one that wants one sets its own.
    monkeypatch.setenv("TANDEM_SYSTEM_DIR", os.path.join(path, "no-system-manager"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def dev_shm_before():
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
