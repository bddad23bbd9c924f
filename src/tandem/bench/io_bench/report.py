"""The io benchmark's tables: text and markdown."""

from __future__ import annotations

import sys
from typing import Any

from tandem.bench.io_bench.records import human
from tandem.units import GiB


def _rows(result: dict[str, Any]) -> list[list[str]]:
    rows = []
    for c in result["results"]:
        per = c["cpu_cores_per_gb_per_s"]
        rows.append(
            [
                c["path"],
                human(c["block_bytes"]),
                f"{c['gb_per_s']:.3f}",
                f"{c['iops']:,.0f}",
                f"{c['cpu_cores_busy']:.2f}",
                "-" if per is None else f"{per:.2f}",
                f"{c['lat_p50_us']:,.0f}",
                f"{c['lat_p99_us']:,.0f}",
            ]
        )
    return rows


_HEADER = ["path", "block", "GB/s", "IOPS", "CPU cores busy", "cores per GB/s", "p50 µs", "p99 µs"]


def markdown(result: dict[str, Any]) -> str:
    cfg, host, cache = result["config"], result["host"], result["page_cache"]
    lines = [
        "# Storage to GPU: random reads, CPU-centric against GPU-centric",
        "",
        f"{result['created']}; {host.get('gpu', 'no GPU')}, {host['cpu_cores']} CPU cores, "
        f"{host['ram_bytes'] / GiB:.0f} GiB RAM, torch {host['torch']}.",
        f"File set: {cfg['files']} files of {human(cfg['file_bytes'])} "
        f"({cfg['file_set_bytes'] / GiB:.2f} GiB) on {cfg['filesystem']}; {cfg['threads']} threads "
        f"(queue depth {cfg['queue_depth']}), {cfg['seconds_per_cell']} s per cell, "
        "4 KiB-aligned random offsets.",
        f"Page cache bypass: **{cache['method']}** ({'; '.join(cache['notes'])}).",
        "",
    ]
    for name, label in result["paths"].items():
        lines.append(f"- `{name}`: {label}")
    for name, why in result["skipped"].items():
        lines.append(f"- `{name}`: not run: {why}")
    for name, why in result["errors"].items():
        lines.append(f"- `{name}`: failed: {why}")
    lines += ["", "| " + " | ".join(_HEADER) + " |", "|" + " --- |" * len(_HEADER)]
    lines += ["| " + " | ".join(r) + " |" for r in _rows(result)]
    lines += [
        "",
        "CPU cores busy: this process's CPU time (user + system, every thread) over wall time; "
        "cores per GB/s: that over the throughput.",
        "",
    ]
    return "\n".join(lines)


def print_table(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    cfg, cache = result["config"], result["page_cache"]
    table = Table(
        title=f"storage to {cfg['device']}: {cfg['files']} x {human(cfg['file_bytes'])}, "
        f"{cfg['threads']} threads, page cache bypass: {cache['method']}"
    )
    for i, h in enumerate(_HEADER):
        table.add_column(h, justify="left" if i == 0 else "right")
    for row in _rows(result):
        table.add_row(*row)
    console = Console(width=None if sys.stdout.isatty() else 160)
    console.print(table)
    for name, label in result["paths"].items():
        console.print(f"{name}: {label}", markup=False, highlight=False)
    for name, why in {**result["skipped"], **result["errors"]}.items():
        console.print(f"{name}: not measured: {why}", markup=False, highlight=False)
