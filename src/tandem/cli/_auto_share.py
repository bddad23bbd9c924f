"""``tandem share auto SPEC`` (hidden): how a job's drop-in loader has the job manager serve
its data. The daemon tells its jobs this command in ``$TANDEM_SHARE_STARTER``
(:func:`tandem.place.producers.auto_share_command`); :class:`tandem.share.DataLoader` runs
it with the file it wrote its :class:`~tandem.share.serving.AutoSpec` to, since share
knows no job manager. The daemon defines the share (source ``auto``), queues its producer
job (reserved, recorded and stopped as ``--share`` producers are) and binds the job's
waiting sweep to it; this command waits until the producer serves, then prints the share's
name, or fails with the producer's own error and log. A producer job whose share another
process serves already ends as not needed (:func:`not_needed`), its jobs reading that one."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import click

from tandem.cli._common import EXIT_FAILED, EXIT_USAGE, Exit, daemon_call

SERVE_WITHIN_S = 600.0  # for the producer job to be admitted, import the dataset and serve


@click.command("auto", hidden=True)
@click.argument("spec_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--system", is_flag=True, help="Ask the host's system manager (through its socket).")
def share_auto(spec_file: Path, state_dir: Path | None, system: bool) -> None:
    """Have the daemon of STATE_DIR (or the host's system manager) serve SPEC_FILE (a drop-in
    loader's) to this job ($TANDEM_JOB_ID) and its sweep; print the share's name once its
    producer serves."""
    from tandem.place import RemoteState, StateReader, protocol, request, request_at, system_manager
    from tandem.share.serving import AutoSpec
    from tandem.share.spec import ShareSpec

    if (state_dir is None) == (not system):
        raise Exit("tandem share auto: give --state-dir DIR or --system", EXIT_USAGE)

    job = os.environ.get("TANDEM_JOB_ID", "")
    if not job.isdigit():
        raise Exit("tandem share auto is run by a job's loader (TANDEM_JOB_ID is not set)", EXIT_USAGE)
    try:
        auto = AutoSpec.read(spec_file)
    except (OSError, ValueError, EOFError) as exc:
        raise Exit(f"{spec_file}: {exc}", EXIT_USAGE) from None
    # The loader's batch size is the producer's (each reader rebatches to its own); its
    # workers are the manager's to size, as a defined share's are.
    ref = str(spec_file.resolve())
    spec = ShareSpec(
        auto.name,
        "auto",
        ref,
        batch_size=auto.batch_size,
        shuffle=auto.shuffle,
        seed=auto.seed,
        python=auto.python,
    )
    asked = protocol.AutoShare(int(job), spec)
    reader: StateReader | RemoteState
    if state_dir is not None:
        reply = daemon_call(request, state_dir, asked)
        reader = StateReader(state_dir)
    else:
        socket = system_manager()
        if socket is None:
            raise Exit("the host's system manager does not answer: the loader reads privately", EXIT_FAILED)
        reply = daemon_call(request_at, socket, asked, 10.0)
        reader = RemoteState(socket)  # its producer is this user's: read through the manager
    _until_served(reader, reply.name, reply.producer)
    click.echo(reply.name)


def _until_served(reader: Any, name: str, producer: int) -> None:
    """Wait until share ``name`` is served, or its producer job has ended (its error), as
    ``reader`` (the state's :class:`StateReader` or :class:`RemoteState`) says; closed here."""
    from tandem.place import FINAL_STATES, StateReader, producer_ended
    from tandem.place import producer_error as error
    from tandem.share.serving import served

    deadline = time.monotonic() + SERVE_WITHIN_S
    try:
        while not served(name):
            job = reader.job(producer)
            if job is None:
                raise Exit(f"the producer of share {name!r} (job {producer}) is gone", EXIT_FAILED)
            if job.state in FINAL_STATES:
                if isinstance(reader, StateReader):  # as its group's jobs are told
                    raise Exit(error(reader, job), EXIT_FAILED)
                said = f"the producer of share {name!r} (job {producer}) ended ({producer_ended(job)})"
                raise Exit(f"{said}; its log: tandem logs {producer}", EXIT_FAILED)
            if time.monotonic() > deadline:
                why = f": {job.reason}" if job.reason else ""
                raise Exit(
                    f"the producer of share {name!r} (job {producer}, {job.state}{why}) did not serve "
                    f"within {SERVE_WITHIN_S:g} s",
                    EXIT_FAILED,
                )
            time.sleep(0.2)
    finally:
        reader.close()


def served(name: str) -> bool:
    """Does a producer serve share ``name`` on this host now (this user's runtime directory)?"""
    from tandem.share import serving

    return serving.served(name)


def not_needed(spec_file: Path, name: str) -> None:
    """The manager's producer of auto share ``name`` (spec ``spec_file``) found it served by a
    process outside the manager (a hand-started run of the same script): it is not needed, and
    says so (:mod:`tandem.place.outside`); it ends with exit 0, its jobs read that one."""
    from tandem.place import outside_report as report
    from tandem.share.serving import server_pid

    click.echo(report(spec_file, name, server_pid(name)), err=True)
