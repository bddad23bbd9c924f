"""The main demo: one producer feeds 3 training processes (different models and batch sizes)
on a generated image folder; the same 3 jobs with private DataLoaders for comparison.

Every job (and the producer) is tracked by ``tandem.watch`` into the MLflow store
(``./mlflow.db`` unless ``MLFLOW_TRACKING_URI`` says otherwise), grouped as
``demo-<time>-private`` and ``demo-<time>-tandem``; a report figure of both groups is
written next to the images.

Before anything is timed, both modes run once, untimed and untracked, on a few images: the
first run after an install or a reboot pays one-time costs (files not yet in the page
cache, first-use initialisation) that once made private loading look 1.7x slower (25.3 s)
than on a re-run (14.5 s), and it would always land on the mode measured first."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.table import Table

from tandem.bench.images import make_image_folder
from tandem.bench.share_bench import CLOCK, JobSpec, RunResult, ShareBenchConfig, run_one

JOBS = [
    JobSpec("cnn", "tiny_cnn", 16),
    JobSpec("cnn", "small_resnet", 32),
    JobSpec("cnn", "mixer_lite", 48),
]


def _open_store() -> str:
    """Open (and if new, create) the store before any clock starts: importing MLflow and
    creating a SQLite store take seconds of CPU that must not land inside a measurement."""
    from tandem.watch.stores import MlflowStore

    store = MlflowStore()
    store.prepare()
    return store.uri


WARMUP_IMAGES = 96  # two batches of the largest batch size, a few seconds per mode


def _warm_up(cfg: ShareBenchConfig, workdir: Path) -> None:
    """Run both modes untimed and untracked on a few images, so that the measured runs
    that follow start warm (see the module docstring)."""
    small = replace(cfg, images=WARMUP_IMAGES, data_dir=str(workdir / "warmup-images"))
    root = str(make_image_folder(Path(small.data_dir), images=WARMUP_IMAGES))
    for mode in ("private", "tandem"):
        run_one(mode, JOBS, "cnn", small, root)


def _caption(cfg: ShareBenchConfig) -> str:
    jobs = ", ".join(j.label(cfg) for j in JOBS)
    return (
        f"tandem demo: the same three training jobs ({jobs}) on {cfg.images} JPEGs, in the left "
        f"column each with its own DataLoader ({cfg.workers} worker processes each), in the right one "
        f"fed by one tandem producer ({cfg.workers} workers). Each column is one group of jobs that "
        "ran at the same time; both share one time axis, whose 0 (the dotted line) is where the "
        "printed table's clock starts. Before it is start-up (importing torch, building models and "
        "loaders, attaching to the producer), which the table does not time; the lines end when "
        "the jobs' processes have exited. Dashed: the sum over the group's own runs (its jobs and, on "
        "the right, the producer), not the whole machine's load; it is summed from each run's 1-s "
        "samples, so its peaks can differ from the table's, which the runner reads every 0.2 s over "
        "all the group's processes at once. Waiting for data: each job's running total of time "
        "blocked waiting for its next batch, counted as each wait ends. CPU energy is RAPL's where "
        "readable, else estimated from CPU time."
    )


def run_demo(
    images: int = 768, epochs: int = 1, workdir: Path = Path("runs/demo"), track: bool = True
) -> dict:
    console = Console()
    cfg = ShareBenchConfig(
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
    uri = _open_store() if track else ""
    console.print("warming up (both modes on a few images, untimed)...")
    _warm_up(cfg, workdir)
    stamp = time.strftime("%Y%m%d-%H%M%S")
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
    table.add_column("job", no_wrap=True)
    for col in ("private\nsamples/s", "tandem\nsamples/s", "private\nstall s", "tandem\nstall s"):
        table.add_column(col, justify="right")  # two-line headers: the table fits in 80 columns
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
        plot(tracked, figure, caption=_caption(cfg), zero=CLOCK)  # time 0: where the table's clock starts
        console.print(
            f"tracked runs: {uri} (groups demo-{stamp}-private and demo-{stamp}-tandem); "
            f"figure: {figure}; browse them with `tandem ui`"
        )
    return {"private": private, "tandem": shared}
