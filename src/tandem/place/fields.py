"""How a stored record's field is kept and shown, declared beside the field itself.

A record (:class:`~tandem.place.model.JobSpec`, :class:`~tandem.place.records.Job`,
``Attempt``, ``Share``) declares each field once, with :func:`column` where the defaults
below do not fit. Everything else is derived from that declaration: the SQL columns and the
check that a state file has them all (:mod:`tandem.place.schema`), the columns a listing or
a scheduling pass reads, and the ``--json`` objects of ``tandem ls``/``show`` and the
dashboard's API (:mod:`tandem.place.views`).

Defaults: a field is stored in a column of its own name, its SQL type from its annotation
(``str`` TEXT, ``int``/``bool`` INTEGER, ``float`` REAL, lists and dicts JSON text; NOT NULL
unless the annotation allows None), listed (read when jobs are listed), and shown in
``--json`` under its own name.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
from collections.abc import Callable
from typing import Any

_MISSING: Any = dataclasses.MISSING


def column(
    default: Any = _MISSING,
    *,
    default_factory: Any = _MISSING,
    sql: str | None = None,
    stored: bool = True,
    listed: bool = True,
    queued: bool = False,
    shown: bool = True,
    json_key: str | None = None,
    under: str | None = None,
    encode: Callable[[Any], Any] | None = None,
    decode: Callable[[Any], Any] | None = None,
) -> Any:
    """A record's field with how it is stored and shown.

    ``sql``: the column's declaration when its annotation does not say it (a key, a
    default). ``stored``: kept in the state file at all. ``listed``: read when jobs are
    listed (False: only when one job is read whole, e.g. its environment). ``queued``: read
    by every scheduling pass (a queue of thousands is read each second: keep it small).
    ``shown``/``json_key``/``under``: in ``--json``, and under which key (``under``: inside
    that nested object). ``encode``/``decode``: to and from the column's value, where JSON
    (lists, dicts) is not what is wanted."""
    metadata = {
        "sql": sql,
        "stored": stored,
        "listed": listed,
        "queued": queued,
        "shown": shown,
        "json_key": json_key,
        "under": under,
        "encode": encode,
        "decode": decode,
    }
    return dataclasses.field(default=default, default_factory=default_factory, metadata=metadata)


# column()'s own defaults: what a field declared without it has.
_DEFAULTS = {
    name: p.default
    for name, p in inspect.signature(column).parameters.items()
    if p.kind is inspect.Parameter.KEYWORD_ONLY and name != "default_factory"
}


def meta(f: dataclasses.Field, key: str) -> Any:
    """One of :func:`column`'s settings of ``f`` (its default where ``f`` did not use it)."""
    return f.metadata.get(key, _DEFAULTS[key])


@functools.cache  # a few annotations, read for every column of every row written
def _base(annotation: str) -> tuple[str, bool]:
    """The annotation without ``| None``, and whether it allowed None."""
    parts = [p.strip() for p in str(annotation).split("|")]
    return " | ".join(p for p in parts if p != "None"), "None" in parts


def is_json(f: dataclasses.Field) -> bool:
    """Kept as JSON text: a list or a dict."""
    base, _ = _base(str(f.type))
    return base.startswith(("list", "dict", "tuple"))


def sql_declaration(f: dataclasses.Field) -> str:
    """The column's declaration, from :func:`column`'s ``sql`` or from the annotation."""
    given = meta(f, "sql")
    if given:
        return f'"{f.name}" {given}'
    base, optional = _base(str(f.type))
    if is_json(f) or meta(f, "encode") is not None:
        kind = "TEXT"
    else:
        kind = {"str": "TEXT", "int": "INTEGER", "bool": "INTEGER", "float": "REAL"}[base]
    if optional:
        return f'"{f.name}" {kind}'
    default = ""
    if f.default is not _MISSING:
        default = f" DEFAULT {int(f.default) if isinstance(f.default, bool) else repr(f.default)}"
    elif f.default_factory is not dataclasses.MISSING:
        default = f" DEFAULT '{json.dumps(f.default_factory())}'"
    return f'"{f.name}" {kind} NOT NULL{default}'


def stored_fields(cls: type) -> list[dataclasses.Field]:
    return list(_stored(cls))


@functools.cache  # per record type: a sweep writes 100,000 rows
def _stored(cls: type) -> tuple[dataclasses.Field, ...]:
    return tuple(f for f in dataclasses.fields(cls) if meta(f, "stored"))


def to_column(f: dataclasses.Field, value: Any) -> Any:
    """A field's value as its column holds it."""
    return _writer(f)(value)


@functools.cache  # per field: worked out once, not for every column of every row written
def _writer(f: dataclasses.Field) -> Callable[[Any], Any]:
    encode = meta(f, "encode")
    if encode is not None:
        return lambda value: None if value is None else encode(value)
    if is_json(f):
        return json.dumps
    return lambda value: value


_EMPTY: dict[str, Callable[[], Any]] = {"[]": list, "{}": dict}  # no JSON parse for most rows


def _json_value(value: str) -> Any:
    return _EMPTY[value]() if value in _EMPTY else json.loads(value)


def same(value: Any) -> Any:
    """A column kept as the field holds it."""
    return value


def reader(f: dataclasses.Field) -> Callable[[Any], Any]:
    """What turns a (not None) column value into the field's: worked out once per field
    (a listing decodes thousands of rows)."""
    decode = meta(f, "decode")
    if decode is not None:
        return decode  # type: ignore[no-any-return]
    if is_json(f):
        return _json_value
    if _base(str(f.type))[0] == "bool":
        return bool
    return same
