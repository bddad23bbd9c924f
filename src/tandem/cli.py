"""The ``tandem`` command line: ``share serve|ls``, ``run``, ``ui``, ``report``, ``demo``, ``bench``,
and the job manager's ``submit|ls|show|logs|cancel|wait|daemon`` (:mod:`tandem.place.cli`)."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import pkgutil
import sys
from pathlib import Path
from typing import Any

import click

from tandem import __version__

OBJECT_FORMS = "MODULE:FUNCTION or path/to/file.py:FUNCTION"


def _load_file(path: Path, attr: str) -> Any:
    """``path/to/file.py:ATTR``: run the file as a module named after it."""
    if not path.is_file():
        raise click.BadParameter(f"no such file: {path}")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    if spec is None or spec.loader is None:
        raise click.BadParameter(f"{path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module  # so that pickle and dataclasses find its classes
    try:
        spec.loader.exec_module(module)
    except ImportError as exc:
        raise click.BadParameter(f"cannot import {str(path)!r}: {exc}") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise click.BadParameter(f"{path} has no attribute {attr!r}") from None


def load_object(ref: str) -> Any:
    """Resolve ``MODULE:ATTR`` (``pkgutil.resolve_name``; ATTR may be dotted) or
    ``path/to/file.py:ATTR``."""
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise click.BadParameter(f"{ref!r} is not of the form {OBJECT_FORMS}")
    if module_name.endswith(".py") or "/" in module_name:
        return _load_file(Path(module_name), attr)
    # A console script's sys.path starts at its bin/ directory, not at the current one (as
    # ``python -m`` does): add it, as uvicorn and gunicorn do, so that a module of the
    # project one is in can be named.
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return pkgutil.resolve_name(ref)
    except ImportError as exc:
        raise click.BadParameter(f"cannot import {module_name!r}: {exc}") from None
    except AttributeError:
        raise click.BadParameter(f"module {module_name!r} has no attribute {attr!r}") from None
    except ValueError as exc:
        raise click.BadParameter(f"{ref!r}: {exc}") from None


# The extra each command needs ([bench] includes [watch]); pyproject.toml lists what each brings.
_EXTRA_OF_COMMAND = {"run": "watch", "ui": "watch", "report": "watch", "demo": "bench", "bench": "bench"}


def require(command: str, *modules: str) -> None:
    """Fail at once, naming the extra to install, if a module ``command`` needs is missing
    (before any work, and before a lookup could fail for another reason)."""
    for module in modules:
        if importlib.util.find_spec(module) is None:
            extra = _EXTRA_OF_COMMAND[command]
            raise click.ClickException(
                f"`tandem {command}` needs {module!r}, which is not installed; it comes with the "
                f"{extra!r} extra: pip install 'tandem[{extra}]'"
            )


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-V", "--version", prog_name="tandem")
@click.option("-v", "--verbose", count=True, help="More log output (-v info, -vv debug).")
def main(verbose: int) -> None:
    """tandem: train more models on fewer resources on one server."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s: %(message)s")


def _workers(value: str) -> int | str:
    if value == "auto":
        return value
    if not value.isdigit():
        raise click.BadParameter(f"{value!r} is not a number of workers or 'auto'")
    return int(value)


@main.group()
def share() -> None:
    """Shared data loading: one producer feeds many training processes."""


@share.command("serve")
@click.argument("name")
@click.option(
    "--loader",
    "loader_ref",
    metavar="REF",
    help=f"{OBJECT_FORMS}: returns a re-iterable of batches (a DataLoader, say).",
)
@click.option("--dataset", "dataset_ref", metavar="REF", help=f"{OBJECT_FORMS}: returns a map-style dataset.")
@click.option(
    "--images",
    "images_dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="An image folder (DIR/<class>/*.jpg): decoded and augmented once by the producer, on "
    "--device (random-resized-crop to --crop, flip, normalise).",
)
@click.option(
    "--device",
    default=None,
    metavar="cpu|cuda:N",
    help="Where batches are kept: cuda:N keeps them in that GPU's memory, shared over CUDA IPC "
    "[default: host memory; with --images: cuda if there is one, else cpu].",
)
@click.option("--crop", type=click.IntRange(min=1), default=224, show_default=True, help="With --images.")
@click.option(
    "--dtype",
    type=click.Choice(["float32", "bfloat16", "float16"]),
    default="float32",
    show_default=True,
    help="With --images: the images' dtype.",
)
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=32,
    show_default=True,
    help="With --dataset: the producer's batch size.",
)
@click.option("--shuffle/--no-shuffle", default=False, help="With --dataset: shuffle each epoch.")
@click.option(
    "--num-workers",
    callback=lambda _c, _p, v: _workers(v),
    default="auto",
    show_default=True,
    metavar="N|auto",
    help="With --dataset: DataLoader worker processes; auto: the cores the jobs leave free, less one.",
)
@click.option(
    "--worker-nice",
    type=click.IntRange(0, 19),
    default=10,
    show_default=True,
    help="With --dataset: how much lower the workers' CPU priority is than the jobs' (0: the same).",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--epochs",
    type=click.IntRange(min=1),
    default=None,
    help="Stop after this many epochs (default: serve until stopped).",
)
@click.option(
    "--window",
    type=click.IntRange(min=2),
    default=8,
    show_default=True,
    help="Batches in flight (shared-memory slots).",
)
@click.option(
    "--policy",
    type=click.Choice(["wait", "skip"]),
    default="wait",
    show_default=True,
    help="wait: the slowest consumer sets the pace; skip: laggards miss batches.",
)
def share_serve(
    name: str, loader_ref: str | None, dataset_ref: str | None, images_dir: Path | None,
    device: str | None, crop: int, dtype: str, batch_size: int, shuffle: bool,
    num_workers: int | str, worker_nice: int, seed: int, epochs: int | None, window: int, policy: str,
) -> None:  # fmt: skip
    """Serve NAME to consumers on this host until stopped (Ctrl-C) or --epochs are done.

    \b
    Examples:
    tandem share serve imagenet --dataset mypkg.data:train_set --shuffle
    tandem share serve stream --loader path/to/loaders.py:make_loader --epochs 10
    tandem share serve imagenet --images data/imagenet/train --device cuda:0 --shuffle
    """
    if sum(ref is not None for ref in (loader_ref, dataset_ref, images_dir)) != 1:
        raise click.UsageError(f"give exactly one of --loader, --dataset ({OBJECT_FORMS}) or --images DIR")
    import torch

    from tandem.share import Producer, ShareError

    try:
        if loader_ref is not None:
            producer = Producer(load_object(loader_ref)(), name, window=window, policy=policy, device=device)
        elif dataset_ref is not None:
            producer = Producer.from_dataset(
                load_object(dataset_ref)(), name, batch_size=batch_size, shuffle=shuffle, device=device,
                num_workers=num_workers, worker_nice=worker_nice, seed=seed, window=window, policy=policy,
            )  # fmt: skip
        else:
            producer = Producer.from_files(
                images_dir, name, device=device or ("cuda" if torch.cuda.is_available() else "cpu"),
                batch_size=batch_size, shuffle=shuffle, seed=seed, crop=crop, dtype=getattr(torch, dtype),
                num_workers=2 if num_workers == "auto" else num_workers, worker_nice=worker_nice,
                window=window, policy=policy,
            )  # fmt: skip
    except (TypeError, ValueError, FileNotFoundError) as exc:
        raise click.UsageError(str(exc)) from None
    except ShareError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        with producer:  # claims the name (ProducerExists if it is live) before saying so
            click.echo(f"serving {name!r} (pid {os.getpid()}); Ctrl-C to stop", err=True)
            producer.serve(epochs=epochs)
    except ShareError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{name!r}: served {producer.epochs_served} epoch(s)", err=True)


@share.command("ls")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option(
    "--timeout",
    type=float,
    default=2.0,
    show_default=True,
    help="Seconds to wait for each producer's answer.",
)
def share_ls(as_json: bool, timeout: float) -> None:
    """List the producers on this host with their consumers, positions, lag and stalls."""
    from dataclasses import asdict

    from tandem.share._stats import query_all

    rows = query_all(timeout)
    if as_json:
        click.echo(json.dumps([asdict(r) if not isinstance(r, dict) else r for r in rows], indent=2))
        return
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not rows:
        console.print("no producers on this host")
        return
    for r in rows:
        if isinstance(r, dict):  # a producer that did not answer
            console.print(f"[bold]{r['name']}[/] (pid {r['pid']}): {r['error']}")
            continue
        # Two short lines and only the columns that say something, so that it reads in 80 columns.
        console.print(
            f"[bold]{r.name}[/]  pid {r.pid}  policy {r.policy}  window {r.window}  "
            f"slab {r.slab_bytes / 2**20:.1f} MiB\n"
            f"  epoch {r.epoch}  published {r.published}  {r.batches_per_s:.1f} batches/s  "
            f"blocked {r.blocked_s:.1f} s"
        )
        if not r.consumers:
            console.print("  no consumers")
            continue
        columns = ["id", "pid", "batch", "position", "lag", "batch/s", "samples", "stall s", "attached s"]
        show_device = any(c.device != "cpu" for c in r.consumers)
        show_missed = r.policy == "skip" or any(c.missed_batches for c in r.consumers)
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
        for name in columns[:3] + ["device"] * show_device + columns[3:] + ["missed"] * show_missed:
            table.add_column(name, justify="left" if name == "device" else "right", no_wrap=True)
        for c in r.consumers:
            values = [str(c.consumer_id), str(c.pid), str(c.batch_size or "-")]
            values += [c.device] * show_device
            values += [f"{c.epoch}:{c.offset}", str(c.lag), f"{c.batches_per_s:.1f}", str(c.samples)]
            values += [f"{c.stall_s:.2f}", f"{c.attached_s:.0f}"]
            values += [str(c.missed_batches)] * show_missed
            table.add_row(*values)
        console.print(table)


def _parse_tags(values: tuple[str, ...], group: str | None) -> dict[str, str]:
    from tandem.watch._checks import check_tags  # standard library only: a usage error comes at once

    tags = {}
    for raw in values:
        key, sep, value = raw.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{raw!r} is not KEY=VALUE", param_hint="'--tag'")
        tags[key.strip()] = value
    if group is not None:
        tags["group"] = group
    try:
        return check_tags(tags)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--tag'") from None


def _check_interval(_ctx: click.Context, _param: click.Parameter, value: float) -> float:
    from tandem.watch._checks import check_interval  # standard library only: a usage error comes at once

    try:
        return check_interval(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _make_store(sink: str, store_uri: str | None, out: Path, experiment: str) -> Any:
    from tandem.watch.stores import FileStore, MlflowStore

    if sink == "mlflow":
        return MlflowStore(store_uri, experiment=experiment)
    if store_uri is not None:
        raise click.UsageError("--store is for --sink mlflow; use --out DIR with --sink csv|parquet")
    return FileStore(out, fmt=sink)


@main.command("run", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("-e", "--experiment", default="tandem", show_default=True, help="MLflow experiment.")
@click.option("-n", "--name", help="Run name (default: the command's name).")
@click.option(
    "-i",
    "--interval",
    type=float,
    default=1.0,
    show_default=True,
    callback=_check_interval,
    help="Seconds between samples (0.1 to 3600).",
)
@click.option("-t", "--tag", "tag_values", multiple=True, metavar="KEY=VALUE", help="A tag (repeatable).")
@click.option("-g", "--group", help="Group tag: collocated runs with the same group are shown together.")
@click.option("--sink", type=click.Choice(["mlflow", "csv", "parquet"]), default="mlflow", show_default=True)
@click.option(
    "--store",
    "store_uri",
    metavar="URI",
    help="MLflow tracking URI [default: $MLFLOW_TRACKING_URI or sqlite:///./mlflow.db].",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=Path("tandem-runs"),
    show_default=True,
    help="Directory for --sink csv|parquet (and the fall-back if MLflow fails).",
)
@click.option("-q", "--quiet", is_flag=True, help="No summary table.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
def run_cmd(
    experiment: str, name: str | None, interval: float, tag_values: tuple[str, ...], group: str | None,
    sink: str, store_uri: str | None, out: Path, quiet: bool, command: tuple[str, ...],
) -> None:  # fmt: skip
    """Run COMMAND and track its processes' hardware use and energy: tandem run [OPTIONS] -- COMMAND..."""
    tags = _parse_tags(tag_values, group)  # usage errors first, before the tracker's imports
    store = _make_store(sink, store_uri, out, experiment)
    from tandem.watch.runner import CommandNotExecutable, CommandNotFound, SignalForwarder, start

    # Process-wide signal handlers: this entry point tracks one command, so its signals are
    # the command's (the library's start() and wait() install none). From before the start,
    # so that none is missed while the command and its tracking start.
    with SignalForwarder() as signals:
        try:
            cmd = start(list(command), name=name, experiment=experiment, tags=tags, interval=interval,
                        store=store, quiet=quiet, fallback_dir=out)  # fmt: skip
        except (CommandNotFound, CommandNotExecutable) as exc:
            click.echo(f"tandem run: {exc}", err=True)
            sys.exit(exc.exit_code)
        except ValueError as exc:  # a bad setting, such as TANDEM_WATTS_PER_CORE
            raise click.UsageError(str(exc)) from None
        signals.attach(cmd)
        sys.exit(cmd.wait())


@main.command("ui")
@click.option(
    "--store",
    "store_uri",
    metavar="URI",
    help="MLflow tracking URI [default: $MLFLOW_TRACKING_URI or sqlite:///./mlflow.db].",
)
@click.option("--port", type=click.IntRange(1, 65535), default=5000, show_default=True)
def ui(store_uri: str | None, port: int) -> None:
    """Serve the MLflow UI for the tracked runs on 127.0.0.1 (this machine only)."""
    import os

    from tandem.watch.stores import default_store_uri

    uri = store_uri or default_store_uri()
    click.echo(f"MLflow UI for {uri} at http://127.0.0.1:{port} (Ctrl-C to stop)", err=True)
    argv = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri,
            "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]  # fmt: skip
    # MLflow's job runner (GenAI evaluation jobs; nothing a tracked run uses) keeps its queue
    # in a new /dev/shm/tmpXXXXXXXX directory per launch and never removes it.
    env = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **os.environ}
    os.execve(sys.executable, argv, env)


@main.command("report")
@click.argument("runs", nargs=-1, required=True)
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    default=Path("tandem-report.png"),
    show_default=True,
    help="FILE.png, .pdf or .svg (a figure) or FILE.html (figure and table).",
)
@click.option(
    "-m",
    "--metric",
    "metrics",
    multiple=True,
    metavar="KEY",
    help="Plot this metric (a full key or a regex; repeatable) instead of the default panels.",
)
@click.option(
    "--store",
    "store_uri",
    metavar="URI",
    help="MLflow tracking URI [default: $MLFLOW_TRACKING_URI or sqlite:///./mlflow.db].",
)
def report(runs: tuple[str, ...], output: Path, metrics: tuple[str, ...], store_uri: str | None) -> None:
    """Plot RUNS over time (collocated groups side by side) and print their summaries.

    A RUN is an MLflow run id, a run name, group:NAME (every run with that group tag) or
    the directory of a run kept with --sink csv|parquet.
    """
    require("report", "matplotlib")  # every output format is drawn
    from rich.console import Console

    from tandem.watch.report import (
        DEFAULT_PANELS,
        RunNotFound,
        load_runs,
        panels_for,
        plot,
        summary_rich,
        write_html,
    )

    if output.suffix.lower() not in (".png", ".pdf", ".svg", ".html"):
        raise click.BadParameter(f"{output}: use a .png, .pdf, .svg or .html file", param_hint="'-o'")
    panels = panels_for(metrics) if metrics else DEFAULT_PANELS
    try:
        loaded = load_runs(runs, store_uri)
    except RunNotFound as exc:
        click.echo(f"tandem report: {exc}", err=True)
        sys.exit(2)
    try:
        if output.suffix.lower() == ".html":
            write_html(loaded, output, panels)
        else:
            plot(loaded, output, panels)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    # Piped or redirected: no terminal width to wrap to, so keep each row on one line.
    Console(width=None if sys.stdout.isatty() else 240).print(summary_rich(loaded))
    click.echo(f"wrote {output}", err=True)


@main.command("demo")
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


@main.group()
def bench() -> None:
    """Benchmarks."""


@bench.command("share", context_settings={"ignore_unknown_options": True})
@click.option("--jobs", default="1,2,4", show_default=True, help="Comma-separated job counts.")
@click.option("--quick", is_flag=True, help="A small run, for a smoke test.")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Results folder (default benchmarks/results); with --gpu, the JSON file.")  # fmt: skip
@click.option("--gpu", is_flag=True,
              help="Real models on one GPU: limit, private, host path, GPU path (needs CUDA). "
              "Its further options after --: tandem bench share --gpu -- --help.")  # fmt: skip
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
def bench_io(folder: Path, size_gib: float, seconds: float, threads: int, block_sizes: str, device: str,
             direct: bool, drop_caches: bool, quick: bool, out: Path) -> None:  # fmt: skip
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
        run(folder=folder, size_gib=size_gib, seconds=seconds, threads=threads, block_sizes=sizes,
            device=device, direct=direct, drop=drop_caches, out=out)  # fmt: skip
    except (ValueError, ShareError) as exc:
        raise click.ClickException(str(exc)) from None


def _add_place_commands() -> None:
    from tandem.place.cli import COMMANDS, SHARE_COMMANDS

    for command in COMMANDS:
        main.add_command(command)
    for command in SHARE_COMMANDS:
        share.add_command(command)


_add_place_commands()

if __name__ == "__main__":
    main()
