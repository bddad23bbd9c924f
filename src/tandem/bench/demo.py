"""The main demo: one producer feeds 3 training processes (different models and batch sizes)
on a generated image folder; the same 3 jobs with private DataLoaders for comparison.

Every job (and the producer) is tracked by ``tandem.watch`` into the MLflow store
(``./mlflow.db`` unless ``MLFLOW_TRACKING_URI`` says otherwise), grouped as
``demo-<time>-private`` and ``demo-<time>-tandem``; a report figure of both groups is
written next to the images."""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from tandem.bench.images import make_image_folder
from tandem.bench.share_bench import Config, JobSpec, RunResult, run_one

JOBS = [
    JobSpec("cnn", "tiny_cnn", 16),
    JobSpec("cnn", "small_resnet", 32),
    JobSpec("cnn", "mixer_lite", 48),
]


def _open_store() -> str:
    """Open (and if new, create) the store before any clock starts: importing MLflow and
    creating a SQLite store take seconds of CPU that must not land inside a measurement."""
    from tandem.watch.sinks.store import MlflowStore

    store = MlflowStore()
    store.prepare()
    return store.uri


def run_demo(
    images: int = 768, epochs: int = 1, workdir: Path = Path("runs/demo"), track: bool = True
) -> dict:
    console = Console()
    cfg = Config(
        images=images,
        epochs=epochs,
        crop=128,
        workers=2,
        batch_size=32,
        run_timeout_s=600,
        data_dir=str(workdir / "images"),
    )
    console.print(
        f"[bold]tandem demo[/]: {images} JPEGs, 3 training jobs "
        f"({', '.join(f'{j.model} batch {j.batch_size}' for j in JOBS)}), "
        f"{epochs} epoch(s), {cfg.workers} loader workers"
    )
    root = str(make_image_folder(Path(cfg.data_dir), images=images))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    uri = _open_store() if track else ""
    runs: dict[str, RunResult] = {}
    for mode, what in (
        ("private", "each job with its own DataLoader"),
        ("tandem", "one tandem producer, 3 consumers"),
    ):
        console.print(f"running {what}...")
        runs[mode] = run_one(
            mode, JOBS, "cnn", cfg, root, track_group=f"demo-{stamp}-{mode}" if track else None
        )
        if runs[mode].note:
            console.print(f"[red]{mode}: {runs[mode].note}[/]")

    table = Table(title="shared against private data loading (this machine, measured now)")
    for col in ("job", "private samples/s", "tandem samples/s", "private stall s", "tandem stall s"):
        table.add_column(col)
    by_label = {m: {j.label: j for j in r.per_job} for m, r in runs.items()}
    for job in JOBS:
        label = job.label(cfg)
        p, t = by_label["private"].get(label), by_label["tandem"].get(label)
        table.add_row(
            label,
            f"{p.samples_per_s:.0f}" if p else "-",
            f"{t.samples_per_s:.0f}" if t else "-",
            f"{p.stall_s:.1f}" if p else "-",
            f"{t.stall_s:.1f}" if t else "-",
        )
    private, shared = runs["private"], runs["tandem"]
    table.add_row(
        "[bold]all jobs[/]",
        f"{private.samples_per_s:.0f}",
        f"{shared.samples_per_s:.0f}",
        "",
        "",
        end_section=True,
    )
    console.print(table)
    summary = Table(show_header=True)
    for col in ("", "private", "tandem", "tandem / private"):
        summary.add_column(col)
    summary.add_row(
        "wall time s",
        f"{private.wall_s:.1f}",
        f"{shared.wall_s:.1f}",
        f"{shared.wall_s / private.wall_s:.2f}x",
    )
    summary.add_row(
        "CPU s per 1k samples",
        f"{private.cpu_s_per_1k:.1f}",
        f"{shared.cpu_s_per_1k:.1f}",
        f"{shared.cpu_s_per_1k / private.cpu_s_per_1k:.2f}x",
    )
    summary.add_row(
        "peak memory (PSS) MiB",
        f"{private.peak_pss_mib:.0f}",
        f"{shared.peak_pss_mib:.0f}",
        f"{shared.peak_pss_mib / private.peak_pss_mib:.2f}x",
    )
    console.print(summary)
    if track:
        from tandem.watch.report import load_runs, plot

        figure = workdir / "report.png"
        tracked = load_runs([f"group:demo-{stamp}-private", f"group:demo-{stamp}-tandem"], uri)
        plot(tracked, figure)
        console.print(
            f"tracked runs: {uri} (groups demo-{stamp}-private and demo-{stamp}-tandem); "
            f"figure: {figure}; browse them with `tandem ui`"
        )
    return {"private": private, "tandem": shared}
