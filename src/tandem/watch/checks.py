"""Checks of what a user gives ``tandem run`` and ``track()``: the sampling interval, tags and
metric names.

Standard library only, so that the command line rejects a bad ``--interval`` or ``--tag``
at once, before the tracker's imports (psutil, rich, torch through ``tandem.share``) take
seconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

MIN_INTERVAL_S = 0.1
MAX_INTERVAL_S = 3600.0
_KEY_OK = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./ ")


def check_interval(interval: float) -> float:
    if not MIN_INTERVAL_S <= interval <= MAX_INTERVAL_S:
        raise ValueError(
            f"interval must be between {MIN_INTERVAL_S} and {MAX_INTERVAL_S:.0f} seconds, got {interval}"
        )
    return float(interval)


def valid_key(k: str) -> bool:
    """A name MLflow takes as a tag key or metric name (and a file store too)."""
    return bool(k) and set(k) <= _KEY_OK


def check_tags(tags: Mapping[str, Any]) -> dict[str, str]:
    out = {}
    for k, v in tags.items():
        if not valid_key(k):
            raise ValueError(f"tag key {k!r} is not valid: use letters, digits, '_', '-', '.', '/' or spaces")
        out[k] = str(v)
    return out
