"""``tandem report group:G``'s sweep table: the job manager's group as one table (a row per
job, its producers, the totals, what sharing saved), from
:func:`tandem.place.sweep_report.group_report` (the dashboard's group page shows the same)."""

from __future__ import annotations

import html
from typing import Any

from rich.console import Console
from rich.table import Table

from tandem.place import params_text


def sweep_reports(refs: tuple[str, ...], metrics: tuple[str, ...], best: str | None) -> list[dict[str, Any]]:
    """The report of each ``group:G`` among ``refs`` that is a group of the job manager:
    under the host's system manager, this user's group of that name, its jobs read through
    the manager and their runs from this user's store; else their own daemon's."""
    import os

    from tandem.dirs import state_dir_path
    from tandem.place import (
        RemoteState,
        StateReader,
        group_report,
        manager_store,
        state_dir,
        system_manager,
        system_user_store,
    )
    from tandem.watch.stores.mlflow_store import sqlite_path

    groups = [r.removeprefix("group:") for r in refs if r.startswith("group:")]
    if not groups:
        return []
    state: StateReader | RemoteState
    if (socket := system_manager()) is not None:
        state, runs_db = RemoteState(socket), sqlite_path(system_user_store(os.getuid()))
    elif state_dir_path().exists():
        directory = state_dir()
        state, runs_db = StateReader(directory), sqlite_path(manager_store(directory))
    else:
        return []
    try:
        found = (group_report(state, g, runs_db, metrics, best) for g in groups)
        return [r for r in found if r is not None]
    finally:
        state.close()


def _num(v: float | None, fmt: str = "{:,.1f}") -> str:
    return "-" if v is None else fmt.format(v)


def _joules(measured: float | None, estimated: float | None) -> str:
    parts = [f"{measured:,.0f} J" if measured is not None else None]
    parts.append(f"~{estimated:,.0f} J est." if estimated is not None else None)
    return " / ".join(p for p in parts if p) or "-"


def _metric(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g}"


def sweep_grid(data: dict[str, Any]) -> tuple[list[str], list[tuple[list[str], str]]]:
    """The table's columns and its rows, each with its style ("" for a job, "producer",
    "total")."""
    keys = data["metric_keys"]
    best = data["best"]
    columns = [
        "job",
        "name",
        "state",
        "where",
        "params",
        "run s",
        "CPU-s",
        "energy (measured / estimated)",
        *keys,
    ]
    rows: list[tuple[list[str], str]] = []
    for r in data["jobs"]:
        mark = " *" if best and best["job"] == r["id"] else ""
        cells = [
            f"{r['id']}{mark}",
            r["name"] or "-",
            r["state"],
            r["where"] or "-",
            params_text(r["params"]) or "-",
            _num(r["run_s"]),
            _num(r["cpu_s"]),
            _joules(r["energy_measured_joules"], r["energy_estimated_joules"]),
            *(_metric(r["metrics"].get(k)) for k in keys),
        ]
        rows.append((cells, ""))
    for p in data["producers"]:
        c = p["charged"]
        cells = [
            "producer",
            p["share"],
            f"fed {p['group_jobs']} of {p['fed_jobs']} job(s) here",
            "",
            "charged its share" if p["group_jobs"] < p["fed_jobs"] else "",
            _num(p["run_s"]),
            _num(c["cpu_s"]),
            _joules(c["energy_measured_joules"], c["energy_estimated_joules"]),
            *("" for _ in keys),
        ]
        rows.append((cells, "producer"))
    t = data["totals"]
    cells = [
        "total",
        "",
        ", ".join(f"{n} {s}" for s, n in t["states"].items()),
        "",
        "run s summed; CPU-s jobs + producers" if data["producers"] else "run s summed",
        _num(t["jobs_run_s"]),
        _num(t["cpu_s"]),
        _joules(t["energy_measured_joules"], t["energy_estimated_joules"]),
        *("" for _ in keys),
    ]
    rows.append((cells, "total"))
    return columns, rows


def _title(data: dict[str, Any]) -> str:
    return f"group {data['group']}: {data['totals']['jobs']} job(s)"


def sweep_table(data: dict[str, Any]) -> Table:
    columns, rows = sweep_grid(data)
    table = Table(title=_title(data), title_justify="left")
    for col in columns:
        table.add_column(col, justify="right" if col in ("job", "run s", "CPU-s") else "left")
    for cells, kind in rows:
        table.add_row(*cells, style={"producer": "magenta", "total": "bold"}.get(kind, ""))
    return table


def sweep_html(data: dict[str, Any]) -> str:
    """The same table and lines as HTML (for ``tandem report -o FILE.html``)."""
    esc = html.escape
    columns, rows = sweep_grid(data)
    head = "".join(f"<th>{esc(c)}</th>" for c in columns)
    body = "".join(
        f'<tr class="{kind}">' + "".join(f"<td>{esc(c)}</td>" for c in cells) + "</tr>"
        for cells, kind in rows
    )
    lines = "".join(f"<p>{esc(line)}</p>" for line in data["said"])
    return f"<h2>{esc(_title(data))}</h2><table><tr>{head}</tr>{body}</table>{lines}"


def print_sweep(data: dict[str, Any], console: Console) -> None:
    console.print(sweep_table(data))
    for line in data["said"]:
        console.print(line, highlight=False, markup=False)
