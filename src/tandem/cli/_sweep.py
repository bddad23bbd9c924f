"""``tandem submit --grid ... / --params FILE.jsonl``: a sweep, submitted as one request."""

from __future__ import annotations

import json
from pathlib import Path

import click

from tandem.cli._common import daemon_call
from tandem.place import JobSpec


def submit_sweep(
    template: JobSpec, grid: tuple[str, ...], params_file: Path | None, fill_env: list[str], as_json: bool
) -> None:
    """Expand the points here (so a bad grid or file is said before anything is sent), send
    the template and the points, print the group first, then what was made."""
    from tandem.place import SweepError, grid_points, job_of, parse_grid, read_params, state_dir
    from tandem.place import submit_sweep as send
    from tandem.place import unused_params as unused

    if grid and params_file:
        raise click.UsageError("give --grid or --params, not both")
    try:
        points = grid_points(parse_grid(grid)) if grid else read_params(params_file)  # type: ignore[arg-type]
        problem = job_of(template, points[0], 0, fill_env).problem()  # the first point, checked here
    except SweepError as exc:
        raise click.UsageError(str(exc)) from None
    if problem:
        raise click.UsageError(problem)
    missing = unused(template.command, template.name, {k: template.env[k] for k in fill_env}, points)
    if missing:
        click.echo(
            f"warning: no {{{missing[0]}}} in the command, --name or --env: the jobs differ only in params",
            err=True,
        )
    reply = daemon_call(send, state_dir(), template, points, fill_env)
    if as_json:
        click.echo(json.dumps({"group": reply.group, "ids": reply.ids}))
        return
    click.echo(f"group {reply.group}")
    ids = reply.ids
    span = f"{ids[0]}-{ids[-1]}" if ids == list(range(ids[0], ids[-1] + 1)) else ", ".join(map(str, ids))
    click.echo(f"submitted {len(ids)} job(s): {span}")
