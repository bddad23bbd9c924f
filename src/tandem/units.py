"""Sizes as people type and read them, one definition for every part of tandem: binary
units, as Slurm and Docker read them (``512M``, ``10G``, ``1.5GiB``, ``4096``)."""

from __future__ import annotations

import math
import re

KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40
MAX_BYTES = 1 << 62  # sizes beyond this are typos, not machines
_UNITS = {"": 1, "K": KiB, "M": MiB, "G": GiB, "T": TiB}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Bytes in ``512M``, ``10G``, ``1.5GiB``, ``4096``; ValueError naming the accepted forms
    otherwise (and for a size no machine has)."""
    m = _SIZE.match(str(text)) if len(str(text)) <= 40 else None
    if not m:
        raise ValueError(
            f"{str(text)[:40]!r} is not a size: use a number with an optional unit K, M, G or T (512M, 10G)"
        )
    value = float(m.group(1)) * _UNITS[m.group(2).upper()]
    if not math.isfinite(value) or value > MAX_BYTES:
        raise ValueError(f"{str(text)[:40]!r} is not a size any machine has")
    return int(math.ceil(value))


def format_size(n: int | float | None) -> str:
    """``1.5G``-style text for a byte count, to read (``-`` for None)."""
    if n is None:
        return "-"
    for unit in ("T", "G", "M", "K"):
        if abs(n) >= _UNITS[unit]:
            value = n / _UNITS[unit]
            return f"{value:.1f}{unit}" if value < 100 else f"{value:.0f}{unit}"
    return f"{int(n)}B"


def format_cores(cores: float) -> str:
    """A number of cores for people: two decimals under one core, one above, trailing zeros
    dropped (``0.01``, ``0.25``, ``1.5``, ``2``): a learnt reservation is a measurement
    (``0.00966509``), and no one schedules by its fifth digit."""
    return f"{round(cores, 2 if abs(cores) < 1 else 1):g}"


def exact_size(n: int) -> str:
    """Text that :func:`parse_size` reads back as exactly ``n``: whole units as such
    (``4K``, ``64G``), anything else in bytes."""
    for unit in ("T", "G", "M", "K"):
        if n and n % _UNITS[unit] == 0:
            return f"{n // _UNITS[unit]}{unit}"
    return str(n)
