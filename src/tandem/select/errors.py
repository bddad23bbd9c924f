"""The error of tandem.select: bad input or a stored selection that cannot be used, with
what was wrong and what to do."""

from __future__ import annotations


class SelectError(Exception):
    """A selection cannot be made or used; the message says why and what to do."""
