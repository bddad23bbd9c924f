"""The job manager's job commands: ``tandem submit|ls|show|logs`` (``cancel`` and ``wait``:
:mod:`tandem.cli.ending`).

Reads (``ls``, ``show``, ``logs``, ``wait``) go to the state file and work with no daemon
running; ``submit`` starts one if needed (with the configuration the last ``tandem daemon
start`` kept); ``cancel`` talks to it.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import click

from tandem.cli._common import (
    EXIT_INTERRUPTED,
    daemon_call,
    job_ids,
    open_state,
    printable,
    to_gpu_mem,
    to_job_cpus,
    to_size,
    unknown_job,
)
from tandem.place import (
    FINAL_STATES,
    MAX_PRIORITY,
    STATES,
    WAITING_STATES,
    JobSpec,
    format_size,
    param_value,
    user_name,
)
from tandem.units import format_cores


def _reserved(value: str | None, source: str, what: str) -> str:
    """What a job reserves of one resource (``value``, shown; None: not yet known) and where
    that comes from: ``4 cores``, ``cores auto: 0.3 (probe)``, ``RAM auto: 1.1 GB (measured,
    job key r18)``."""
    if source == "given":
        return f"{value} {what}" if what == "cores" else f"{what} {value}"
    if value is None:
        return f"{what} {source}"
    return f"{what} auto: {value} ({source})"


@click.command("submit", context_settings={"ignore_unknown_options": False, "allow_interspersed_args": False})
@click.option("--name", help="Job name (measured peaks are remembered per name).")
@click.option(
    "--cpus",
    callback=to_job_cpus,
    default="auto",
    show_default=True,
    metavar="N|auto",
    help="Cores to reserve (0.5 allowed; a hard reservation); auto: what jobs of this name (else "
    "command) were measured to use, else a small probe raised to its measurement.",
)
@click.option(
    "--mem",
    callback=to_size,
    metavar="SIZE",
    help="RAM to reserve (512M, 10G) [default: auto: the peak measured for the same --name, "
    "else command, plus 10%; a job never seen: none until measured, the host's free memory decides].",
)
@click.option("--gpus", type=click.IntRange(min=0), help="GPUs [default: 1 if the manager has GPUs, else 0].")
@click.option(
    "--gpu-mem",
    callback=to_gpu_mem,
    default="auto",
    show_default=True,
    metavar="SIZE|auto",
    help="GPU memory per GPU; auto: the peak measured for this name before, else probe.",
)
@click.option(
    "--gpu-share",
    type=click.IntRange(1, 100),
    metavar="PCT",
    help="The share of a GPU's compute it needs: packing admits declared shares up to 100% at once "
    "(else it waits for a new job's measured activity); under MPS, its SM limit.",
)
@click.option(
    "--priority",
    type=click.IntRange(-MAX_PRIORITY, MAX_PRIORITY),
    default=0,
    show_default=True,
    help="Higher runs first.",
)
@click.option(
    "--retries",
    type=click.IntRange(0, 100),
    default=2,
    show_default=True,
    help="Retries after an out-of-memory ending (other failures are never retried).",
)
@click.option("--share", metavar="NAME", help="Read the shared dataset NAME (sets TANDEM_SHARE).")
@click.option("--group", metavar="G", help="Group name (shown in ls; tags the run).")
@click.option("--after", "after", multiple=True, metavar="ID,...", help="Start after these jobs succeeded.")
@click.option("--env", "env_pairs", multiple=True, metavar="K=V", help="Set a variable (repeatable).")
@click.option(
    "--param",
    "param_pairs",
    multiple=True,
    metavar="K=V",
    help="A parameter of the job (repeatable; V kept as the text given): shown in show, ls --json, the "
    "dashboard and the job's MLflow params.",
)
@click.option(
    "--grid",
    "grid",
    multiple=True,
    metavar="K=V1,V2|K=A..B",
    help="A sweep: one job per point of the cross product of the grids (repeatable), {K} in the "
    "command, --name and --env values replaced by the point's value; one request, one group.",
)
@click.option(
    "--params",
    "params_file",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE.jsonl",
    help="A sweep: one job per JSON object (a line) of FILE, as --grid.",
)
@click.option(
    "--prune",
    type=click.Choice(["asha", "median"]),
    help="Stop the trials of a sweep that do worse early (asynchronous successive halving: grace 1 "
    "step, reduction 3; or the median rule), by --metric as each logs it to its MLflow run; a stopped "
    "trial ends pruned.",
)
@click.option(
    "--metric",
    metavar="NAME:min|max",
    help="The metric --prune judges by, as the job logs it (mlflow.log_metric(NAME, v, step=epoch)).",
)
@click.option(
    "--cwd", type=click.Path(file_okay=False, path_type=Path), help="Working directory [default: .]."
)
@click.option("--json", "as_json", is_flag=True, help="Print the job as JSON.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def submit(
    grid: tuple[str, ...],
    params_file: Path | None,
    mem: int | None,
    after: tuple[str, ...],
    env_pairs: tuple[str, ...],
    param_pairs: tuple[str, ...],
    cwd: Path | None,
    as_json: bool,
    command: tuple[str, ...],
    **request: Any,
) -> None:
    """Queue COMMAND: tandem submit [OPTIONS] -- COMMAND...  Prints the job's id.

    The job runs in this directory with this environment (plus --env); a job that can never
    fit the daemon's cores, RAM or GPUs (with its share's producer) is refused (exit 2)."""
    if not command:
        raise click.UsageError("no command given: tandem submit [OPTIONS] -- COMMAND [ARGS]...")
    env = dict(os.environ)
    for pair in env_pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r} is not K=V", param_hint="'--env'")
        env[key] = value
    workdir = (cwd or Path.cwd()).resolve()
    if not workdir.is_dir():
        raise click.BadParameter(f"{workdir}: no such directory", param_hint="'--cwd'")
    # The options are JobSpec's fields, named alike: the request is named once.
    params = {}  # each value the text given: 1e3 stays 1e3 (in MLflow too), true stays true
    for pair in param_pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r} is not K=V", param_hint="'--param'")
        params[key] = value
    spec = JobSpec(
        list(command),
        str(workdir),
        env,
        mem=mem or 0,
        after=job_ids(after, "'--after'"),
        params=params,
        **request,
    )
    if grid or params_file:
        from tandem.cli._sweep import submit_sweep

        return submit_sweep(spec, grid, params_file, [p.partition("=")[0] for p in env_pairs], as_json)
    problem = spec.problem()
    if problem:
        raise click.UsageError(problem)
    from tandem.place import state_dir
    from tandem.place import submit as send

    # It starts a daemon where none answers (and again if one dies while it waits).
    reply = daemon_call(send, state_dir(), spec)
    if as_json:
        from tandem.place import job_json, strict_json

        job = open_state().job(reply.id)
        if job is None:  # removed (tandem rm) between its submit and this read
            raise unknown_job(reply.id)
        click.echo(strict_json(job_json(job), indent=2))
    else:
        click.echo(reply.id)


@click.command("ls")
@click.option("-a", "--all", "show_all", is_flag=True, help="Ended jobs too (default: the last 10 ended).")
@click.option(
    "--limit", type=click.IntRange(min=1), default=1000, show_default=True, help="With --all: jobs a page."
)
@click.option(
    "--before", type=click.IntRange(min=1), metavar="ID", help="With --all: the page before job ID."
)
@click.option("--json", "as_json", is_flag=True, help="A JSON list of jobs.")
def ls(show_all: bool, limit: int, before: int | None, as_json: bool) -> None:
    """The queue: waiting and running jobs (each waiting one with the reason), and the last
    ended ones. Reads only these rows, so it stays fast over a long history."""
    from tandem.place import LS_COLUMNS, job_json, ls_row, strict_json_lines

    st = open_state()
    if show_all:
        jobs = daemon_call(st.jobs, attempts=True, last=limit, before=before)
        more = bool(jobs) and st.any_before(jobs[0].id)
    else:
        active = daemon_call(st.jobs, tuple(s for s in STATES if s not in FINAL_STATES), attempts=True)
        ended = daemon_call(st.jobs, tuple(FINAL_STATES), attempts=True, last=10)
        jobs, more = sorted(ended + active, key=lambda j: j.id), False
    unserved = _unserved(st, jobs)
    if as_json:
        click.echo(strict_json_lines([job_json(j) for j in jobs]))  # one job a line
        if unserved:
            click.echo(unserved, err=True)
        return
    if not jobs:
        click.echo("no jobs")
        return
    now = time.time()
    rows = [[printable(v) for v in ls_row(j, now)] for j in jobs]
    columns = LS_COLUMNS
    if any(j.owner not in (None, os.getuid()) for j in jobs):  # the host's manager: whose each job is
        columns = [columns[0], "user", *columns[1:]]
        rows = [[row[0], user_name(j.owner), *row[1:]] for row, j in zip(rows, jobs, strict=True)]
    click.echo(_aligned(columns, rows, right=("id", "tries", "wait", "run", "mem", "gpu mem")))
    if more:
        click.echo(f"older jobs: tandem ls --all --before {jobs[0].id}")
    _print_share_groups(st, jobs)
    if unserved:
        click.echo(unserved, err=True)


def _unserved(st: Any, jobs: list[Any]) -> str | None:
    """Where jobs wait or run and no daemon serves the state directory ``st`` read, a line
    saying that their states are as last known (a running one may have ended since); else None."""
    from tandem.place import DaemonFile, RemoteState, state_dir

    if all(j.state in FINAL_STATES for j in jobs) or isinstance(st, RemoteState):
        return None  # the host's manager answered this command's reads: it serves

    directory = state_dir()
    # Where the last daemon listened, as it wrote it (a read: it makes no runtime directory).
    info = DaemonFile.read(directory)
    if info is not None and info.socket and _listening(info.socket):
        return None
    return (
        f"no daemon serves {directory}: states are as last known (running jobs go on, and a "
        "daemon started again takes them up: tandem daemon start)"
    )


def _listening(path: str) -> bool:
    """Does a daemon listen on ``path``? A connect, not a request: a listening daemon takes
    it at once, even a busy one; a killed daemon's socket file refuses it."""
    from tandem import _ipc

    try:
        with _ipc.new_socket() as sock:
            sock.settimeout(2.0)
            sock.connect(path)
        return True
    except TimeoutError:
        return True  # there, too busy to take it now: not "no daemon"
    except OSError:
        return False


def _aligned(columns: list[str], rows: list[list[str]], right: tuple[str, ...]) -> str:
    """A plain table (header, rule, rows): thousands of rows print at once, which a rich
    table (seconds for 5,000 rows) does not."""
    widths = [max([len(c)] + [len(r[i]) for r in rows]) for i, c in enumerate(columns)]

    def line(cells: list[str]) -> str:
        return "  ".join(
            cell.rjust(w) if col in right else cell.ljust(w) for cell, w, col in zip(cells, widths, columns)
        ).rstrip()

    rule = "  ".join("─" * w for w in widths)
    return "\n".join([line(columns), rule, *(line(r) for r in rows)])


def _print_share_groups(st: Any, jobs: list[Any]) -> None:
    """One line per shared dataset that jobs here use: its producer (a job) and its jobs."""
    from tandem.place import producer_status

    used = {j.share for j in jobs if j.share}
    for share in st.shares():
        if share.name not in used:
            continue
        members = [j for j in jobs if j.share == share.name and j.role != "producer"]
        running = sum(j.state == "running" for j in members)
        waiting = sum(j.state in WAITING_STATES for j in members)
        p = producer_status(st, share.name)
        producer = f"producer job {p.job} (pid {p.pid})" if p.pid else f"producer job {p.job} {p.state}"
        if p.outside:  # a hand-started run of the same script serves it: its jobs read that one
            producer = f"served by a producer outside the manager (pid {p.outside})"
        elif not p.live:
            producer = "no producer running" + (f" (last one: {p.error})" if p.error else "")
        live = [
            j
            for j in jobs
            if j.share == share.name and j.role == "producer" and j.state in ("running", *WAITING_STATES)
        ]
        if len(live) > 1:  # under Ray, one a node: a share whose node was full has a second
            producer = "producers " + ", ".join(f"job {j.id} ({_producer_where(j)})" for j in live)
        ids = ", ".join(str(j.id) for j in members[:20]) + (
            f" and {len(members) - 20} more" if len(members) > 20 else ""
        )
        # A job's second loader (its validation set's) reads an auto share no job names.
        readers = (
            f"jobs {ids} ({running} running, {waiting} waiting)" if members else "read by its group's jobs"
        )
        click.echo(printable(f"share {share.name}: {producer}; {readers}"))


def _producer_where(job: Any) -> str:
    """Where a live producer is: its node, or its state while it waits."""
    placed = job.attempts[-1].placement if job.attempts and job.state == "running" else None
    return (placed.node_name or "running") if placed is not None else job.state


@click.command("show")
@click.argument("job_id", type=int)
@click.option("--json", "as_json", is_flag=True)
def show(job_id: int, as_json: bool) -> None:
    """One job: its request, attempts, placement, how it ended (with the log line), peaks."""
    from tandem.place import is_starting as starting
    from tandem.place import job_json, strict_json

    st = open_state()
    job = daemon_call(st.job, job_id)  # another user's, from the host's manager: refused
    if job is None:
        raise unknown_job(job_id)
    data = job_json(job)
    share = st.share(job.share) if job.share else None
    data["selection"] = share.selection if share is not None else None
    r = data["reservation"]
    cores = None if r["cpus"] is None else format_cores(r["cpus"])
    ram = format_size(r["mem_bytes"]) if r["mem_bytes"] else None
    unserved = _unserved(st, [job])
    if as_json:
        click.echo(strict_json(data, indent=2))
        if unserved:
            click.echo(unserved, err=True)
        return
    lines = [
        f"job {job.id}  {job.name or ''}  [{'starting' if starting(job) else job.state}]",
        f"  command   {' '.join(job.command)}",
        f"  cwd       {job.cwd}",
        f"  request   {_reserved(cores, r['from'], 'cores')}, {_reserved(ram, r['mem_from'], 'RAM')}, "
        f"{job.gpus} GPU(s), GPU memory {format_size(job.gpu_mem) if job.gpu_mem else 'auto'}",
        f"  priority  {job.priority}   retries {job.retries}   group {job.group or '-'}   "
        f"share {job.share or '-'}",
        f"  waited    {data['wait_s']:.1f} s   ran {data['run_s'] or 0:.1f} s   "
        f"peak RAM {format_size(job.peak_mem)}   peak GPU memory {format_size(job.peak_gpu_mem)}",
    ]
    if job.params:
        lines.append("  params    " + "   ".join(f"{k}={param_value(v)}" for k, v in job.params.items()))
    if data["selection"]:
        lines.append(f"  selection {data['selection']} (tandem select show {data['selection']})")
    if job.share and job.role != "producer" and job.state not in FINAL_STATES:
        from tandem.place import producer_status as status

        elsewhere = status(st, job.share).outside
        if elsewhere:
            lines.append(f"  producer  served by a producer outside the manager (pid {elsewhere})")
    if data["reason"]:
        lines.append(f"  waiting   {data['reason']}")
    if unserved:
        lines.append(f"  daemon    {unserved}")
    if job.cause and job.cause != job.state:
        code = f" (exit {job.exit_code})" if job.exit_code is not None and "exit" not in job.cause else ""
        lines.append(f"  ended     {job.cause}{code}")
    if job.cause_line:
        lines.append(f"  log       {job.cause_line}")
    for a in data["attempts"]:
        p = a["placement"]
        cause = a["cause"] if a["cause"] and a["cause"] != a["state"] else ""
        lines.append(
            f"  attempt {a['n']}: {a['state']} on {(p['node'] + '/') if p.get('node') else ''}{p['device']}"
            f"{' mps' if p['mps'] else ''}"
            f"{' alone' if p['alone'] else ''}  {cause}".rstrip()
        )
    for e in st.events(job_id):
        lines.append(f"  {time.strftime('%H:%M:%S', time.localtime(e['t']))} {e['kind']} {e['detail']}")
    click.echo("\n".join(printable(line) for line in lines))


@click.command("logs")
@click.argument("job_id", type=int)
@click.option("-f", "--follow", is_flag=True, help="Keep printing as the job writes, until it ends.")
@click.option(
    "--raw",
    is_flag=True,
    help="The bytes as the job wrote them, terminal escapes included [default: control characters "
    "other than newlines and tabs shown escaped, as \\x1b].",
)
def logs(job_id: int, follow: bool, raw: bool) -> None:
    """A job's output (every attempt, in order)."""
    st = open_state()
    job = daemon_call(st.job, job_id)  # another user's, from the host's manager: refused
    if job is None:
        raise unknown_job(job_id)
    from tandem.place import log_looks

    out: Any = sys.stdout.buffer if raw else _Escaped(sys.stdout.buffer)
    shown: dict[int, tuple[int, int]] = {}  # attempt -> (inode, end) of output.log shown

    def dump() -> None:
        # Read in this process, or by the host's manager for the job's owner: the same parts.
        for parts in log_looks(lambda job, seen: daemon_call(st.log_parts, job, seen), job_id, shown):
            for part in parts:
                out.write(log_text(part, shown, several=len(parts) > 1))
            out.flush()

    try:
        dump()
        while follow:
            job = st.job(job_id, attempts=False)
            if job is None or job.state in FINAL_STATES:
                dump()
                break
            time.sleep(0.5)
            dump()
        if isinstance(out, _Escaped):
            out.close()
    except KeyboardInterrupt:
        sys.exit(EXIT_INTERRUPTED)


def log_text(part: Any, shown: dict[int, tuple[int, int]], several: bool) -> bytes:
    """What ``logs`` prints of ``part`` (:class:`~tandem.place.reads.LogPart`), given what it
    showed of each attempt (``shown``: its file's inode and the end shown; updated here);
    ``several``: the job has several attempts, each under a header of its own."""
    said = b""
    if part.n not in shown and several:
        said += f"== attempt {part.n} ==\n".encode()
    if part.older:  # the part rotated away (--log-max), the first time
        said += b"[older output rotated away; its newest part:]\n" + part.older
    if shown.get(part.n, (0, 0))[0] not in (0, part.inode):  # another file: rotated since
        said += b"[log rotated]\n"  # (inode 0: there was no file yet, so nothing rotated)
    shown[part.n] = (part.inode, part.end)
    return said + part.data


class _Escaped:
    """A job's output as ``logs`` prints it: its control characters (a terminal escape that
    clears the screen or sets the window's title, a carriage return that writes over a line)
    shown escaped (:func:`~tandem.cli._common.printable`), its lines and tabs kept; bytes that
    are not UTF-8 shown as ``\\xNN``. A character split between two reads is decoded whole."""

    def __init__(self, out: Any) -> None:
        import codecs

        self.out = out
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="backslashreplace")

    def write(self, data: bytes) -> None:
        text = self.decoder.decode(data)
        self.out.write("\n".join(printable(line, keep="\t") for line in text.split("\n")).encode())

    def flush(self) -> None:
        self.out.flush()

    def close(self) -> None:
        """The bytes held for a character the output ended inside, as ``\\xNN``."""
        self.out.write(printable(self.decoder.decode(b"", final=True)).encode())
        self.out.flush()


COMMANDS = [submit, ls, show, logs]
