"""Ending jobs: ``tandem cancel`` (ids, ``group:G``, ``--all``) and ``tandem wait`` (until
they end; ids or ``group:G``). ``wait`` reads the state file; ``cancel`` talks to the daemon."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import click

from tandem.cli._common import (
    EXIT_CANCELLED,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_NO_DAEMON,
    EXIT_TIMEOUT,
    EXIT_UNKNOWN_JOB,
    EXIT_USAGE,
    EXIT_WAIT_ERROR,
    daemon_call,
    job_ids,
    open_state,
    request,
    unknown_job,
)
from tandem.place import CANCELLED, DONE_STATES, FINAL_STATES, PRUNED, SUCCEEDED


@click.command("cancel")
@click.argument("ids", nargs=-1)
@click.option("--all", "everything", is_flag=True, help="Every waiting and running job.")
def cancel(ids: tuple[str, ...], everything: bool) -> None:
    """Cancel jobs (IDS, group:G for a group's): a waiting job leaves the queue; a running
    job's whole process tree gets SIGTERM, then SIGKILL after a grace period."""
    from tandem.place import Cancel

    groups, ids = _groups(ids)
    if not (ids or groups or everything):
        raise click.UsageError("name the jobs: tandem cancel ID..., group:G, or --all")
    wanted = job_ids(ids, "'IDS'")
    st = open_state()  # an unknown job is said as every command says it, daemon or not
    # another user's job, from the host's manager: refused (exit 2), said as the manager says it
    unknown = [i for i in wanted if daemon_call(st.job, i, attempts=False) is None]
    known = [i for i in wanted if i not in unknown]
    if not (known or groups or everything):
        for i in unknown[1:]:
            click.echo(f"Error: {unknown_job(i).message}", err=True)
        raise unknown_job(unknown[0])
    reply = request(Cancel(known, everything=everything), timeout=120)
    for group in groups:
        more = request(Cancel([], group=group), timeout=120)
        reply.cancelled.extend(more.cancelled)
    if len(reply.cancelled) > 20:  # a sweep's: one line
        click.echo(f"cancelled {len(reply.cancelled)} jobs ({reply.cancelled[0]}-{reply.cancelled[-1]})")
        reply.cancelled.clear()
    reply.unknown[:0] = unknown
    for i in reply.cancelled:
        click.echo(f"cancelled {i}")
    for i in reply.ended:
        click.echo(f"job {i} had already ended", err=True)
    for i in reply.unknown[1:]:
        click.echo(f"Error: {unknown_job(i).message}", err=True)
    if reply.unknown:
        raise unknown_job(reply.unknown[0])


class _OwnErrorsApart(click.Command):
    """A command whose own usage errors and unknown jobs exit :data:`EXIT_WAIT_ERROR`, not
    2: ``tandem wait`` passes a job's exit code on, and a job may exit 2 itself."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.ClickException as exc:
            raise _apart(exc) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.ClickException as exc:
            raise _apart(exc) from None


def _apart(exc: click.ClickException) -> click.ClickException:
    if exc.exit_code in (EXIT_UNKNOWN_JOB, EXIT_USAGE, EXIT_NO_DAEMON):
        exc.exit_code = EXIT_WAIT_ERROR  # type: ignore[misc]  # an instance's, as Exit sets it
    return exc


@click.command("wait", cls=_OwnErrorsApart)
@click.argument("ids", nargs=-1)  # and group:G
@click.option("--timeout", type=float, help="Give up after this many seconds (exit 124).")
def wait(ids: tuple[str, ...], timeout: float | None) -> None:
    """Block until the jobs end (default: every job now waiting or running; a share's producer
    only where named). Exit with the job's exit code (one job), 1 if any of several did not
    succeed (a trial its sweep pruned did, as asked), 4 if the one job was cancelled, 124 if
    --timeout ran out, and 125 if tandem wait itself could not wait (no such job, bad input,
    no daemon): a job's own exit 2 is not tandem's "no such job"."""
    st = open_state()
    groups, ids = _groups(ids)
    # A share's producer (a job row, role producer) is not waited for unless named: it ends
    # after its group's last job, and one that fails fails its jobs.
    mine = (None, os.getuid())  # under the host's manager, the jobs of others are theirs to wait for
    wanted = (
        job_ids(ids, "'IDS'")
        if ids or groups
        else [
            j.id
            for j in st.jobs()
            if j.state not in FINAL_STATES and j.role != "producer" and j.owner in mine
        ]
    )
    for group in groups:
        members = [j.id for j in st.jobs(group=group) if j.role != "producer" and j.owner in mine]
        if not members:
            raise click.BadParameter(f"group {group!r} has no job", param_hint="'IDS'")
        wanted += members
    for i in wanted:
        try:
            found = daemon_call(st.job, i, attempts=False)  # another user's: refused
        except click.ClickException as exc:
            raise _apart(exc) from None
        if found is None:
            raise unknown_job(i)
    try:
        jobs = _wait_for(st, wanted, timeout)
    except KeyboardInterrupt:
        click.echo("tandem wait: interrupted (the jobs go on)", err=True)
        sys.exit(EXIT_INTERRUPTED)
    if len(jobs) == 1:
        j = jobs[0]
        if j.state == SUCCEEDED:
            sys.exit(0)
        if j.state == PRUNED:  # its sweep stopped it early, as asked: not a failure
            click.echo(f"job {j.id} {j.cause}", err=True)
            sys.exit(0)
        if j.state == CANCELLED:
            click.echo(
                f"job {j.id} was cancelled{f' ({j.cause})' if j.cause != 'cancelled' else ''}", err=True
            )
            sys.exit(EXIT_CANCELLED)
        click.echo(f"job {j.id} {j.state}: {j.cause or ''}", err=True)
        sys.exit(j.exit_code if j.exit_code not in (None, 0) else EXIT_FAILED)
    bad = [j for j in jobs if j.state not in DONE_STATES]
    for j in bad:
        click.echo(f"job {j.id} {j.state}: {j.cause or ''}", err=True)
    sys.exit(EXIT_FAILED if bad else 0)


def _groups(args: tuple[str, ...]) -> tuple[list[str], tuple[str, ...]]:
    """``group:G`` arguments apart from job ids."""
    groups = [a.removeprefix("group:") for a in args if a.startswith("group:")]
    return groups, tuple(a for a in args if not a.startswith("group:"))


def _wait_for(state: Any, wanted: list[int], timeout: float | None) -> list[Any]:
    """The jobs once all have ended; exits 124 after ``timeout`` s, 125 when no daemon runs."""
    from tandem.place import is_running, state_dir

    deadline = None if timeout is None else time.monotonic() + timeout
    next_check = time.monotonic() + 5.0
    while True:
        jobs = [state.job(i, attempts=False) for i in wanted]
        if all(j is not None and j.state in FINAL_STATES for j in jobs):
            return jobs
        if deadline is not None and time.monotonic() >= deadline:
            click.echo(f"tandem wait: jobs still running after {timeout:g} s", err=True)
            sys.exit(EXIT_TIMEOUT)
        if time.monotonic() >= next_check:
            # Only a daemon moves jobs on: without one, waiting would never end.
            next_check = time.monotonic() + 5.0
            if not daemon_call(is_running, state_dir()):
                click.echo(
                    "tandem wait: no daemon is running, so these jobs cannot end; "
                    "start one with `tandem daemon start` (it adopts running jobs)",
                    err=True,
                )
                sys.exit(EXIT_WAIT_ERROR)
        time.sleep(0.3)


COMMANDS = [cancel, wait]
