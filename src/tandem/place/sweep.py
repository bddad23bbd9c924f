"""A sweep's points: ``--grid KEY=V1,V2`` / ``KEY=A..B`` (the cross product, in the order
given) or ``--params FILE.jsonl`` (one JSON object per line), and each point put into a job's
command, name and environment through ``{KEY}`` placeholders.

A point's values are text, exactly as given (``1e3`` stays ``1e3``, ``true`` stays ``true``,
a JSON line's ``1.50`` stays ``1.50``): the same string goes into the command, the name and
the job's MLflow params, and two strings that differ are two points. Everything is checked
before anything is expanded (a range's size is counted, not listed).

Pure functions, with errors that say what was wrong; the CLI and ``tandem.jobs`` use them.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import math
import re
import string
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from tandem.place.model import JobSpec, job_key, param_value

MAX_POINTS = 100_000
MAX_LINE = 1 << 20  # bytes of one --params line: a point, not a data set
MAX_FILE = 64 << 20  # bytes of a --params file: a request's limit (protocol.MAX_BODY)
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_RANGE = re.compile(r"(-?\d{1,18})\.\.(-?\d{1,18})\Z")
# What is meant as a range but is none of ours: 0.1..0.5, 1..1e3, 1.., ..5, a..z, 99... (not a
# path: ../data is a value).
_LIKE_RANGE = re.compile(r"([-+\w.]*?)\.\.([-+\w.]*)\Z")
_WHOLE = re.compile(r"-?\d{1,18}\Z")


class SweepError(ValueError):
    """A grid, a params file or a placeholder that cannot work, with what to change."""


def _span(item: str, key: str, text: str) -> range | None:
    """``A..B`` (integers, both included) as a range, not listed; None if ``text`` is a value;
    :class:`SweepError` if it is meant as a range and is none (an end missing, or not a whole
    number), rather than one job of that text."""
    span = _RANGE.match(text)
    if span is None:
        like = _LIKE_RANGE.match(text)
        if like is None:
            return None
        ends = {"start": like.group(1), "end": like.group(2)}
        missing = [which for which, end in ends.items() if not end]
        wrong = [repr(end) for end in ends.values() if end and not _WHOLE.match(end)]
        what = (
            f"has no {' and no '.join(missing)}"
            if missing
            else f"counts whole numbers of up to 18 digits, not {' and '.join(wrong)}"
        )
        raise SweepError(
            f"--grid {item!r}: the range {text} {what}; write A..B with whole numbers, both "
            f"included (e.g. {key}=1..10), or list the values: {key}=0.1,0.2,0.3"
        )
    a, b = int(span.group(1)), int(span.group(2))
    if b < a:
        raise SweepError(f"--grid {item!r}: the range {a}..{b} is empty (A..B counts up, both included)")
    return range(a, b + 1)


def _padded(first: str) -> int:
    """The width of a range's zero-padded start (``007..120`` -> 3), else 0: ``seed=000..099``
    names ``000``, ``001``, ... as written."""
    return len(first) if len(first) > 1 and first.startswith("0") else 0


def parse_grid(items: Sequence[str]) -> dict[str, Sequence[str]]:
    """``["lr=0.1,1e-2", "seed=0..2"]`` -> ``{"lr": ["0.1", "1e-2"], "seed": ["0", "1", "2"]}``
    (a range is a lazy sequence: ``a=0..100000000`` is counted, never listed here)."""
    axes: dict[str, Sequence[str]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        key = key.strip()
        if not sep or not _KEY.match(key):
            raise SweepError(
                f"--grid {item!r}: expected KEY=V1,V2,... or KEY=A..B (KEY a name: letters, digits, _)"
            )
        if key in axes:
            raise SweepError(f"--grid: {key!r} is given twice")
        span = _span(item, key, values.strip())
        if span is not None:
            width = _padded(values.strip().partition("..")[0])
            axes[key] = _Range(span, width)
            continue
        listed = values.strip()
        if listed[:1] in ("[", "(") or listed[-1:] in ("]", ")"):
            # A Python or JSON list (lr=[0.1,0.01]) would give the points "[0.1" and "0.01]".
            raise SweepError(
                f"--grid {item!r}: values are listed bare, comma-separated: {key}={listed.strip('[]()')}"
            )
        if ";" in listed:  # lr=0.1;0.01: one value with a ';' in it, surely not what was meant
            raise SweepError(
                f"--grid {item!r}: values are separated by commas, not ';': {key}={listed.replace(';', ',')}"
            )
        parts = [v.strip() for v in values.split(",")]
        if not values.strip() or any(not p for p in parts):
            raise SweepError(f"--grid {item!r}: an empty value; give KEY=V1,V2,...")
        if any(_LIKE_RANGE.match(p) for p in parts):
            raise SweepError(f"--grid {item!r}: a range A..B stands alone (KEY=A..B), not in a list")
        twice = next((p for i, p in enumerate(parts) if p in parts[:i]), None)
        if twice is not None:
            raise SweepError(f"--grid {item!r}: {twice!r} is given twice (each value is one point)")
        axes[key] = parts
    return axes


@dataclasses.dataclass(frozen=True)
class _Range(Sequence[str]):
    """``A..B``'s values as text, made when read (its length is known without them)."""

    span: range
    width: int = 0

    def __len__(self) -> int:
        return len(self.span)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return f"{self.span[i]:0{self.width}d}" if self.width else str(self.span[i])


def grid_points(axes: dict[str, Sequence[str]]) -> list[dict[str, str]]:
    """The cross product of the axes, the first varying slowest; its size is checked first."""
    count = math.prod(len(values) for values in axes.values())
    if count > MAX_POINTS:
        sizes = " x ".join(f"{len(v):,}" for v in axes.values())
        raise SweepError(
            f"the grid has {count:,} points ({sizes}); at most {MAX_POINTS:,} in one request: "
            "split it, or use fewer values"
        )
    keys = list(axes)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(axes[k] for k in keys))]


class _Duplicate(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise _Duplicate(key)
        seen[key] = value
    return seen


_DECODER = json.JSONDecoder(object_pairs_hook=_no_duplicates)
_WS = re.compile(r"[ \t\n\r]*")


def _point(line: str) -> dict[str, str] | None:
    """A JSON object's members, each value as its text in the line (a string's decoded text:
    ``{"lr": 1.50, "opt": "adam"}`` -> ``{"lr": "1.50", "opt": "adam"}``); None if the line
    is JSON but not an object. Raises ValueError, RecursionError or _Duplicate."""
    if not isinstance(_DECODER.decode(line), dict):  # the whole line checked first
        return None
    point: dict[str, str] = {}
    i = _past_ws(line, line.index("{") + 1)
    while line[i] == '"':
        key, i = json.decoder.scanstring(line, i + 1)  # type: ignore[attr-defined]
        i = _past_ws(line, _past_ws(line, i) + 1)  # past the ':'
        value, end = _DECODER.raw_decode(line, i)
        point[key] = value if isinstance(value, str) else line[i:end]
        i = _past_ws(line, end)
        i = _past_ws(line, i + 1) if line[i] == "," else i
    return point


def _past_ws(line: str, i: int) -> int:
    """The index of the first character at or after ``i`` that is not JSON whitespace."""
    match = _WS.match(line, i)
    assert match is not None  # the pattern matches the empty string too
    return match.end()


def _lines(path: str | Path, max_bytes: int) -> Iterator[tuple[int, str]]:
    """``(number, text)`` of each line, each checked to be at most ``MAX_LINE`` bytes of
    UTF-8 and all at most ``max_bytes``, as read (a huge file is not read to be refused)."""
    where = f"--params {path}"
    try:
        f = open(path, "rb")  # noqa: SIM115 (closed below: a generator, open while read)
    except OSError as exc:
        raise SweepError(f"{where}: {exc.strerror or exc}") from None
    read = 0
    with f:
        for n, raw in enumerate(iter(lambda: f.readline(MAX_LINE + 1), b""), 1):
            read += len(raw)
            if len(raw) > MAX_LINE:
                raise SweepError(f"{where}, line {n}: over {MAX_LINE >> 20} MiB; one point a line")
            if read > max_bytes:
                raise SweepError(f"{where}: over {max_bytes >> 20} MiB; split the sweep into requests")
            try:
                yield n, raw.decode("utf-8").removeprefix("\ufeff" if n == 1 else "")
            except UnicodeDecodeError as exc:
                why = f"not UTF-8 (byte {exc.start + 1}); save it as UTF-8"
                raise SweepError(f"{where}, line {n}: {why}") from None


def _line_point(line: str) -> dict[str, str]:
    """One line's point, or a SweepError saying what is wrong with it (without where)."""
    try:
        point = _point(line)
    except _Duplicate as exc:
        raise SweepError(f"the key {exc.args[0]!r} is given twice") from None
    except RecursionError:
        raise SweepError("nested too deep to be a parameter") from None
    except ValueError as exc:
        raise SweepError(f"not JSON ({exc})") from None
    if point is None or not all(_KEY.match(k) for k in point):
        raise SweepError('expected an object of names (letters, digits, _) to values, like {"lr": 0.1}')
    return point


def read_params(path: str | Path, max_bytes: int = MAX_FILE) -> list[dict[str, str]]:
    """One point per non-empty line of a JSON-lines file, each a JSON object of names to
    values; each value's text as the file gives it. A line over ``MAX_LINE`` bytes, a file
    over ``max_bytes`` (a request's limit), bad UTF-8, deep nesting, a key given twice or a
    point given twice is an error naming the line."""
    where = f"--params {path}"
    points: list[dict[str, str]] = []
    first_line: dict[frozenset[tuple[str, str]], int] = {}
    for n, line in _lines(path, max_bytes):
        if not line.strip():
            continue
        try:
            point = _line_point(line)
        except SweepError as exc:
            raise SweepError(f"{where}, line {n}: {exc}") from None
        same = first_line.setdefault(frozenset(point.items()), n)
        if same != n:
            raise SweepError(f"{where}, line {n}: the same point as line {same} (each point runs once)")
        points.append(point)
        if len(points) > MAX_POINTS:
            raise SweepError(f"{where}: over {MAX_POINTS:,} points; at most {MAX_POINTS:,} a request")
    if not points:
        raise SweepError(f"{where}: no point in it (one JSON object per line)")
    return points


@functools.lru_cache(maxsize=256)  # a sweep fills the same few templates for every point
def _pieces(template: str, where: str) -> tuple[tuple[str, str | None], ...]:
    """``template``'s literal text and placeholder names, in order; a placeholder is ``{KEY}``
    alone: a format spec (``{lr:.3f}``) or conversion (``{lr!r}``) is refused, since the value
    goes in as given."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise SweepError(f"{where} {template!r}: {exc} (write {{{{ for a literal brace)") from None
    pieces: list[tuple[str, str | None]] = []
    for literal, field, spec, conversion in parsed:
        pieces.append((literal, field))
        if field is None:
            continue
        if spec or conversion:
            shown = (
                "{" + field + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
            )
            raise SweepError(
                f"{where} {template!r}: {shown}: a placeholder takes no format; the value goes in as "
                f"given: write {{{field}}} (and the values as wanted, e.g. seed=000..099 for 000, 001, ...)"
            )
        if not _KEY.match(field):
            raise SweepError(
                f"{where} {template!r}: {{{field}}} is not a parameter's name "
                "(write {{ and }} for literal braces)"
            )
    return tuple(pieces)


def fill(template: str, point: dict[str, Any], where: str) -> str:
    """``template`` with each ``{KEY}`` replaced by the point's value (``{{`` for a brace)."""
    if "{" not in template and "}" not in template:
        return template
    out = []
    for literal, field in _pieces(template, where):
        out.append(literal)
        if field is None:
            continue
        if field not in point:
            known = ", ".join(sorted(point)) or "none"
            raise SweepError(f"{where} {template!r}: no parameter {field!r} (the sweep's are: {known})")
        out.append(param_value(point[field]))
    return "".join(out)


def fill_all(templates: Iterable[str], point: dict[str, Any], where: str) -> list[str]:
    return [fill(t, point, where) for t in templates]


def unused(
    command: Sequence[str], name: str | None, env: dict[str, str], points: list[dict[str, Any]]
) -> list[str]:
    """Parameters no placeholder names: probably a mistake (the jobs would all be alike)."""
    text = " ".join([*command, name or "", *env.values()])
    keys = {k for p in points for k in p}
    return sorted(k for k in keys if "{" + k + "}" not in text)


def alike_key(template: JobSpec) -> str:
    """The learning key of a sweep's points: its template's ``--name``, else its command, as
    given (``{KEY}`` not filled), so each point reserves what the others were measured at."""
    return job_key(template.name, template.command)


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
