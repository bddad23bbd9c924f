"""Shared fixtures: every test gets its own private runtime directory for producers."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest


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
