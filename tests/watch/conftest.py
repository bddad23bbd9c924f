"""Fixtures for the watch tests: the share tests' process fixture, for the share sampler."""

from tests.share.conftest import procs  # noqa: F401
