"""Shared data loading from the command line: ``tandem share serve|ls|define|rm``.

``serve`` and ``define`` take one option set (:func:`share_options`), which fills one
:class:`tandem.share.spec.ShareSpec`: ``serve`` runs its producer here, ``define`` checks it
(the dataset or loader reference must import and be callable) and hands it to the job
manager's daemon (the state's one writer), which starts the producer with the first job that
reads it (``share serve-spec``, hidden). The data selection a share serves is resolved here,
through :mod:`tandem.select.for_share`: share itself takes only the items.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import click

from tandem.cli._auto_share import share_auto
from tandem.cli._common import EXIT_USAGE, Exit, daemon_call, to_cpus, to_size
from tandem.place import format_size
from tandem.share.spec import DTYPES, OBJECT_FORMS, ShareSpec, SpecError


def _workers(_ctx: click.Context, _param: click.Parameter, value: str) -> int | None:
    if value == "auto":
        return None
    if not value.isdigit() or int(value) > 256:
        raise click.BadParameter(f"{value!r} is not a number of workers (0 to 256) or 'auto'")
    return int(value)


_SHARE_OPTIONS = [
    click.argument("name"),
    click.option(
        "--loader",
        "loader_ref",
        metavar="REF",
        help=f"{OBJECT_FORMS}: returns a re-iterable of batches (a DataLoader, say).",
    ),
    click.option(
        "--dataset", "dataset_ref", metavar="REF", help=f"{OBJECT_FORMS}: returns a map-style dataset."
    ),
    click.option(
        "--images",
        "images_dir",
        type=click.Path(exists=True, file_okay=False, path_type=Path),
        help="An image folder (DIR/<class>/*.jpg): decoded and augmented once by the producer, on "
        "--device (random-resized-crop to --crop, flip, normalise).",
    ),
    click.option(
        "--device",
        default=None,
        metavar="cpu|cuda:N",
        help="Where batches are kept: cuda:N keeps them in that GPU's memory, shared over CUDA IPC "
        "[default: host memory; with --images: cuda if there is one, else cpu].",
    ),
    click.option("--crop", type=click.IntRange(min=1), default=224, show_default=True, help="With --images."),
    click.option(
        "--dtype",
        type=click.Choice(DTYPES),
        default="float32",
        show_default=True,
        help="With --images: the images' dtype.",
    ),
    click.option(
        "--batch-size",
        type=click.IntRange(min=1),
        default=32,
        show_default=True,
        help="With --dataset or --images: the producer's batch size.",
    ),
    click.option(
        "--shuffle/--no-shuffle", default=False, help="With --dataset or --images: shuffle each epoch."
    ),
    click.option(
        "--num-workers",
        callback=_workers,
        default="auto",
        show_default=True,
        metavar="N|auto",
        help="Loader worker processes; auto: the cores the jobs leave free, less one (under the "
        "job manager: one per core it has, at most 8; with --cpus, those less one).",
    ),
    click.option(
        "--worker-nice",
        type=click.IntRange(0, 19),
        default=0,
        show_default=True,
        help="How much lower the workers' CPU priority is than the jobs' (0: the same).",
    ),
    click.option("--seed", type=int, default=0, show_default=True),
    click.option(
        "--epochs",
        type=click.IntRange(min=1),
        default=None,
        help="Stop after this many epochs (default: serve until stopped).",
    ),
    click.option(
        "--window-mem",
        callback=to_size,
        metavar="SIZE",
        default=None,
        help="Memory the batches in flight may take (e.g. 2G); consumers drift apart within it "
        "[default: a tenth of the RAM free at start, or of the GPU's for a GPU slab].",
    ),
    click.option(
        "--window",
        type=click.IntRange(min=2, max=1024),
        default=None,
        help="At most this many batches in flight (alone: exactly this many, as before "
        "--window-mem) [default: up to 64, as memory allows].",
    ),
    click.option(
        "--policy",
        type=click.Choice(["wait", "skip"]),
        default="wait",
        show_default=True,
        help="wait: the slowest consumer sets the pace; skip: laggards miss batches.",
    ),
    click.option(
        "--selection",
        metavar="ID",
        default=None,
        help="With --dataset or --images: serve only the items of this stored selection "
        "(tandem select run; tandem select ls).",
    ),
    click.option(
        "--select",
        metavar="METHOD:BUDGET",
        default=None,
        help="With --dataset: serve a selection made once for this share (share define: by a job "
        "of the manager's, which the group's jobs wait for), e.g. small-loss:0.3.",
    ),
    click.option(
        "--select-model",
        metavar="REF",
        default=None,
        help=f"With --select: {OBJECT_FORMS} returning a fresh torch.nn.Module (the proxy).",
    ),
]


def share_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """The options of a shared dataset, for every command that describes one."""
    for option in reversed(_SHARE_OPTIONS):
        f = option(f)
    return f


def spec_from(
    name: str, loader_ref: str | None, dataset_ref: str | None, images_dir: Path | None, **rest: Any
) -> ShareSpec:
    """The :class:`ShareSpec` the options describe, or a usage error saying what is wrong."""
    refs = {"loader": loader_ref, "dataset": dataset_ref, "images": images_dir}
    given = [(k, v) for k, v in refs.items() if v is not None]
    if len(given) != 1:
        raise click.UsageError(f"give exactly one of --loader, --dataset ({OBJECT_FORMS}) or --images DIR")
    source, ref = given[0]
    try:
        return ShareSpec(name=name, source=source, ref=str(ref), **rest)
    except SpecError as exc:
        raise click.UsageError(str(exc)) from None


@click.group("share")
def share() -> None:
    """Shared data loading: one producer feeds many training processes."""


def _items(spec: ShareSpec) -> Any:
    """What the producer of ``spec`` serves of its dataset: the stored selection it names
    (its use noted), or the one ``--select`` describes, made (or found stored) when it
    starts; None for all of it. :class:`Exit` (2) saying what is wrong."""
    if spec.selection is None and spec.select is None:
        return None
    from tandem.select import SelectError
    from tandem.select.for_share import chooser, served
    from tandem.share.spec import load_object

    try:
        if spec.selection is not None:
            return served(spec.selection, spec.name)
        model = load_object(spec.select_model) if spec.select_model else None
        return chooser(spec.select or "", model, spec.seed, spec.name)
    except (SelectError, SpecError) as exc:
        raise Exit(f"{spec.name}: {exc}", EXIT_USAGE) from None


def _serve(spec: ShareSpec, taken: Callable[[], None] | None = None) -> None:
    """Serve ``spec`` here; ``taken``: what is done instead where its name is served already
    (else that is an error)."""
    from tandem.share import ShareError
    from tandem.share.errors import ProducerExists
    from tandem.share.spec import serve

    items = _items(spec)
    try:
        serve(spec, say=lambda m: click.echo(m, err=True), selection=items)
    except (TypeError, ValueError, FileNotFoundError) as exc:  # SpecError among them
        raise click.UsageError(str(exc)) from None
    except ProducerExists as exc:
        if taken is None:
            raise click.ClickException(str(exc)) from None
        taken()
    except ShareError as exc:
        raise click.ClickException(str(exc)) from None


@share.command("serve")
@share_options
def share_serve(**options: Any) -> None:
    """Serve NAME to consumers on this host until stopped (Ctrl-C) or --epochs are done.

    \b
    Examples:
    tandem share serve imagenet --dataset mypkg.data:train_set --shuffle
    tandem share serve stream --loader path/to/loaders.py:make_loader --epochs 10
    tandem share serve imagenet --images data/imagenet/train --device cuda:0 --shuffle
    """
    _serve(spec_from(**options))


@share.command("serve-spec", hidden=True)
@click.argument("spec_file", type=click.Path(dir_okay=False, path_type=Path))
def share_serve_spec(spec_file: Path) -> None:
    """The job manager's producer: serve the share its environment gives ($TANDEM_SHARE_SPEC,
    as the daemon wrote it into SPEC_FILE: its selection and its loader workers resolved),
    else SPEC_FILE's."""
    import logging

    from tandem.place import SHARE_SPEC_ENV

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    # Not passed on to its loader workers, nor to anything they start.
    given = os.environ.pop(SHARE_SPEC_ENV, None)
    try:
        spec = ShareSpec.from_json(given if given is not None else spec_file.read_text())
    except OSError as exc:
        raise Exit(f"cannot read the share to serve: {spec_file}: {exc.strerror}", EXIT_USAGE) from None
    taken: Callable[[], None] | None = None
    if spec.source == "auto":  # a drop-in loader's data, which a run of its own may serve already
        from functools import partial

        from tandem.cli._auto_share import not_needed, served

        taken = partial(not_needed, spec_file, spec.name)
        if served(spec.name):
            return taken()
    try:
        _serve(spec, taken)
    except KeyboardInterrupt:
        raise SystemExit(130) from None


@share.command("define")
@share_options
@click.option(
    "--cpus",
    callback=to_cpus,
    default=None,
    help="Cores the producer reserves [default: its workers plus one, else sized to the daemon's "
    "cores, leaving room for a job].",
)
@click.option("--mem", callback=to_size, metavar="SIZE", help="RAM the producer reserves [default: none].")
@click.option(
    "--public",
    is_flag=True,
    help="Other users' jobs may read it too (the host's system manager only): from host memory, "
    "read-only, its producer still run as you [default: your jobs only].",
)
def share_define(cpus: float | None, mem: int | None, public: bool, **options: Any) -> None:
    """Register NAME for the job manager: jobs submitted with --share NAME read it from one
    producer, started with the first such job and stopped after the last. Takes every
    option of tandem share serve. The reference is checked now (from its module's source
    where that suffices: an error in the module's own imports fails its producer's jobs)."""
    from tandem.place import ensure_daemon, protocol, request, state_dir
    from tandem.select import SelectError

    # Its producer runs this interpreter: the daemon may have been started from another
    # environment, which cannot import this dataset's module.
    spec = spec_from(**options, cpus=cpus, mem=mem or 0, python=sys.executable, public=public).resolved()
    directory = state_dir()
    # The daemon starts while the reference is checked: read from its module's source where
    # that settles it, else an import of the user's dataset module (torch: seconds, and the
    # producer imports it again; reading the source saved 3.7 CPU-s of a 2-core sweep's).
    with ThreadPoolExecutor(1) as pool:
        started = pool.submit(daemon_call, ensure_daemon, directory)
        try:
            spec.check(import_module=False)
            select_job = _selection_job(spec)
        except (SpecError, SelectError) as exc:
            raise Exit(f"{spec.name}: {exc}; nothing was defined", EXIT_USAGE) from None
        started.result()
    # The daemon is the state's one writer: it stores the definition (and queues the job that
    # makes its selection) in one transaction.
    # A public share's producer runs in its definer's environment, whoever's job starts it.
    where = (dict(os.environ), os.getcwd()) if spec.public else (None, None)
    reply = daemon_call(request, directory, protocol.DefineShare(spec, select_job, *where))
    if reply.select_job is not None:
        click.echo(
            f"{spec.name}: its selection ({spec.select}) is made once by job {reply.select_job}", err=True
        )
    reserve = f"{spec.cpus:g} cores" if spec.cpus is not None else "cores sized to the daemon's"
    ram = f"{format_size(spec.mem)} of RAM" if spec.mem else "no RAM (--mem to reserve some)"
    click.echo(
        f"defined {spec.name!r}: jobs submitted with --share {spec.name} read it from one producer "
        f"(reserving {reserve} and {ram})"
    )


def _selection_job(spec: ShareSpec) -> Any:
    """The job that makes the share's selection once (``--select``), or None; a stored
    selection it names (``--selection``) must exist. :class:`SelectError` otherwise."""
    from tandem.place import JobSpec
    from tandem.select import SelectError
    from tandem.select.for_share import select_command
    from tandem.select.store import load

    if spec.selection is not None:
        try:
            load(spec.selection)
        except SelectError as exc:
            raise SelectError(f"--selection: {exc}") from None
    if spec.select is None:
        return None
    command = select_command(spec.ref, spec.select, spec.seed, spec.select_model)
    return JobSpec(
        command,
        os.getcwd(),
        dict(os.environ),
        name=f"select-{spec.name}",
        group=spec.name,
        cpus=1.0,
        token=uuid.uuid4().hex,
    )


@share.command("rm")
@click.argument("names", nargs=-1, required=True)
def share_rm(names: tuple[str, ...]) -> None:
    """Remove the definitions NAMES (not while a waiting or running job reads one)."""
    from tandem.place import ensure_daemon, protocol, request, state_dir

    directory = state_dir()
    daemon_call(ensure_daemon, directory)
    reply = daemon_call(request, directory, protocol.RemoveShares(list(names)))
    for name in reply.removed:
        click.echo(f"removed {name!r}")
    problems = [
        f"no shared dataset {name!r} is defined (tandem share ls --defined)" for name in reply.unknown
    ]
    problems += [
        f"{name!r} is read by job(s) {', '.join(map(str, users))}, not yet ended: cancel them first"
        for name, users in reply.in_use.items()
    ]
    if problems:
        raise Exit("; ".join(problems), EXIT_USAGE)


def _bound(window_mem: int | None) -> str:
    return f" (bound {format_size(window_mem)})" if window_mem is not None else ""


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

    from tandem.share import ShareError
    from tandem.share.stats import query_all

    try:
        rows = query_all(timeout)
    except ShareError as exc:  # a runtime directory that may not be used
        raise Exit(str(exc), EXIT_USAGE) from None
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
            f"[bold]{r.name}[/]  pid {r.pid}  policy {r.policy}  window {r.window_used}/{r.window}"
            f"{_bound(r.window_mem)}  slab {r.slab_bytes / 2**20:.1f} MiB\n"
            f"  epoch {r.epoch}  published {r.published}  {r.batches_per_s:.1f} batches/s  "
            f"blocked {r.blocked_s:.1f} s"
            + (f"  drift {r.drift} ({r.drift_bytes / 2**20:.1f} MiB)" if len(r.consumers) > 1 else "")
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


share.add_command(share_auto)  # hidden: a job's drop-in loader asks the daemon for its producer
COMMANDS = [share]
