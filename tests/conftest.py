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


def pytest_unconfigure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller: once its workers are gone
        leftovers.end_session()


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """One worker per core this process may use, at most 4: the tests start daemons, jobs and
    producers of their own, so more workers than that only contend for the same cores."""
    return max(1, min(4, len(os.sched_getaffinity(0))))


@pytest.fixture(autouse=True)
def runtime_dir(monkeypatch):
    # Short path: Unix socket paths are limited to 107 bytes.
    path = tempfile.mkdtemp(prefix="tdm-")
    monkeypatch.setenv("TANDEM_RUNTIME_DIR", path)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def dev_shm_before():
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
