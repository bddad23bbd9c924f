"""A sweep's points: ``--grid KEY=V1,V2`` / ``KEY=A..B`` (the cross product, in the order
given) or ``--params FILE.jsonl`` (one JSON object per line), and each point put into a job's
command, name and environment through ``{KEY}`` placeholders.

Pure functions, with errors that say what was wrong; the CLI and ``tandem.jobs`` use them.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
import string
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from tandem.place.model import JobSpec

MAX_POINTS = 100_000
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_RANGE = re.compile(r"(-?\d+)\.\.(-?\d+)\Z")


class SweepError(ValueError):
    """A grid, a params file or a placeholder that cannot work, with what to change."""


def _value(text: str) -> Any:
    """``0.1`` -> 0.1, ``3`` -> 3, ``true`` -> True, anything else the text itself."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_grid(items: Sequence[str]) -> dict[str, list[Any]]:
    """``["lr=0.1,0.01", "seed=0..2"]`` -> ``{"lr": [0.1, 0.01], "seed": [0, 1, 2]}``."""
    axes: dict[str, list[Any]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        key = key.strip()
        if not sep or not _KEY.match(key):
            raise SweepError(
                f"--grid {item!r}: expected KEY=V1,V2,... or KEY=A..B (KEY a name: letters, digits, _)"
            )
        if key in axes:
            raise SweepError(f"--grid: {key!r} is given twice")
        span = _RANGE.match(values.strip())
        if span:
            a, b = int(span.group(1)), int(span.group(2))
            if b < a:
                raise SweepError(
                    f"--grid {item!r}: the range {a}..{b} is empty (A..B counts up, both included)"
                )
            axes[key] = list(range(a, b + 1))
        else:
            parts = [v.strip() for v in values.split(",")]
            if not values.strip() or any(not p for p in parts):
                raise SweepError(f"--grid {item!r}: an empty value; give KEY=V1,V2,...")
            axes[key] = [_value(p) for p in parts]
    return axes


def grid_points(axes: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """The cross product of the axes, the first varying slowest."""
    count = 1
    for values in axes.values():
        count *= len(values)
    if count > MAX_POINTS:
        raise SweepError(f"the grid has {count:,} points; at most {MAX_POINTS:,} in one request")
    keys = list(axes)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(axes[k] for k in keys))]


def read_params(path: str | Path) -> list[dict[str, Any]]:
    """One point per non-empty line of a JSON-lines file, each a JSON object."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise SweepError(f"--params {path}: {exc.strerror or exc}") from None
    points = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            point = json.loads(line)
        except ValueError as exc:
            raise SweepError(f"--params {path}, line {n}: not JSON ({exc})") from None
        if not isinstance(point, dict) or not all(isinstance(k, str) and _KEY.match(k) for k in point):
            raise SweepError(
                f'--params {path}, line {n}: expected an object of names to values, like {{"lr": 0.1}}'
            )
        points.append(point)
    if not points:
        raise SweepError(f"--params {path}: no point in it (one JSON object per line)")
    if len(points) > MAX_POINTS:
        raise SweepError(f"--params {path}: {len(points):,} points; at most {MAX_POINTS:,} in one request")
    return points


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def fill(template: str, point: dict[str, Any], where: str) -> str:
    """``template`` with each ``{KEY}`` replaced by the point's value (``{{`` for a brace)."""
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as exc:
        raise SweepError(f"{where} {template!r}: {exc} (write {{{{ for a literal brace)") from None
    missing = [f for f in fields if f not in point]
    if missing:
        known = ", ".join(sorted(point)) or "none"
        raise SweepError(f"{where} {template!r}: no parameter {missing[0]!r} (the sweep's are: {known})")
    return template.format_map({k: _text(v) for k, v in point.items()})


def fill_all(templates: Iterable[str], point: dict[str, Any], where: str) -> list[str]:
    return [fill(t, point, where) for t in templates]


def unused(
    command: Sequence[str], name: str | None, env: dict[str, str], points: list[dict[str, Any]]
) -> list[str]:
    """Parameters no placeholder names: probably a mistake (the jobs would all be alike)."""
    text = " ".join([*command, name or "", *env.values()])
    keys = {k for p in points for k in p}
    return sorted(k for k in keys if "{" + k + "}" not in text)


def job_of(template: JobSpec, point: dict[str, Any], index: int, fill_env: Sequence[str] = ()) -> JobSpec:
    """The job of one point: ``{KEY}`` filled in its command, name and the variables
    ``fill_env`` names (those given with ``--env``: the rest of the environment is left as
    it is), its ``params`` the point, its token the sweep's with the point's index."""
    env = dict(template.env)
    for key in fill_env:
        if key in env:
            env[key] = fill(env[key], point, f"--env {key}")
    return dataclasses.replace(
        template,
        command=fill_all(template.command, point, "the command's"),
        name=fill(template.name, point, "--name") if template.name else None,
        env=env,
        params={**template.params, **point},
        token=f"{template.token}:{index}" if template.token else None,
    )
