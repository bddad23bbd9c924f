"""Demonstrations and benchmarks from the command line: ``tandem demo``, ``tandem bench share|io``."""

from __future__ import annotations

from pathlib import Path

import click

from tandem.cli._common import require


@click.command("demo")
@click.option("--images", type=click.IntRange(min=16), default=768, show_default=True)
@click.option("--epochs", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--workdir", type=click.Path(path_type=Path), default=Path("runs/demo"), show_default=True)
@click.option(
    "--track/--no-track",
    default=True,
    show_default=True,
    help="Track each job into the MLflow store and draw a report figure.",
)
def demo(images: int, epochs: int, workdir: Path, track: bool) -> None:
    """A producer plus 3 training processes (different models and batch sizes), shared vs private."""
    require("demo", "PIL", *(("mlflow", "matplotlib") if track else ()))
    from tandem.bench.demo import run_demo

    run_demo(images=images, epochs=epochs, workdir=workdir, track=track)


@click.group("bench")
def bench() -> None:
    """Benchmarks."""


@bench.command("share", context_settings={"ignore_unknown_options": True})
@click.option("--jobs", default="1,2,4", show_default=True, help="Comma-separated job counts.")
@click.option("--quick", is_flag=True, help="A small run, for a smoke test.")
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=None,
    help="Results folder (default benchmarks/results); with --gpu, the JSON file.",
)
@click.option(
    "--gpu",
    is_flag=True,
    help="Real models on one GPU: limit, private, host path, GPU path (needs CUDA). "
    "Its further options after --: tandem bench share --gpu -- --help.",
)
@click.argument("gpu_args", nargs=-1, type=click.UNPROCESSED)
def bench_share(jobs: str, quick: bool, out: Path | None, gpu: bool, gpu_args: tuple[str, ...]) -> None:
    """Shared against private data loading on a generated image folder."""
    require("bench", "PIL")
    if gpu:
        from tandem.bench.gpu_share import main as gpu_main

        argv = ["--jobs", jobs, *(["--smoke"] if quick else []), *(["--out", str(out)] if out else [])]
        raise SystemExit(gpu_main([*argv, *gpu_args], prog="tandem bench share --gpu"))
    if gpu_args:
        raise click.UsageError(f"unexpected arguments {' '.join(gpu_args)} (they are for --gpu)")
    from tandem.bench.share_bench import run

    run([int(j) for j in jobs.split(",")], quick=quick, out=out or Path("benchmarks/results"))


@bench.command("io")
@click.option(
    "--dir", "folder", type=click.Path(path_type=Path), default=Path("data/io-bench"), show_default=True
)
@click.option("--size-gib", type=click.FloatRange(min=0.001), default=8.0, show_default=True)
@click.option("--seconds", type=click.FloatRange(min=0.01), default=5.0, show_default=True)
@click.option("--threads", type=click.IntRange(min=1), default=8, show_default=True, help="= queue depth")
@click.option("--block-sizes", default="4K,64K,1M,4M", show_default=True)
@click.option("--device", default="auto", show_default=True, help="cuda:N, cpu, or auto.")
@click.option("--direct/--no-direct", default=True, show_default=True, help="O_DIRECT reads.")
@click.option("--drop-caches/--no-drop-caches", default=True, show_default=True, help="root only")
@click.option("--quick", is_flag=True, help="A small run (64 MiB, 0.2 s per cell), for a smoke test.")
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=Path("benchmarks/results/gpu_io.json"),
    show_default=True,
)
def bench_io(
    folder: Path,
    size_gib: float,
    seconds: float,
    threads: int,
    block_sizes: str,
    device: str,
    direct: bool,
    drop_caches: bool,
    quick: bool,
    out: Path,
) -> None:
    """Storage-to-GPU random reads: pread + copy against cuFile."""
    from tandem.bench.io_bench import parse_size, run  # needs only the core: no require()
    from tandem.share import ShareError

    try:
        sizes = tuple(parse_size(s) for s in block_sizes.split(","))
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--block-sizes'") from None
    if quick:
        size_gib, seconds = 1 / 16, 0.2
    try:
        run(
            folder=folder,
            size_gib=size_gib,
            seconds=seconds,
            threads=threads,
            block_sizes=sizes,
            device=device,
            direct=direct,
            drop=drop_caches,
            out=out,
        )
    except (ValueError, ShareError) as exc:
        raise click.ClickException(str(exc)) from None


COMMANDS = [demo, bench]
