"""``tandem select run|ls|show|rm|report``: data selections, computed once and stored
(:mod:`tandem.select`)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from typing import Any

import click

from tandem.cli._common import Exit
from tandem.place import params_text
from tandem.select.methods import METHODS  # the registry alone: no torch

EXIT_BAD_INPUT = 2

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")


class _MethodChoice(click.Choice):
    """A method of the registry; an unknown one is refused in the words of ``select()``."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value not in METHODS:
            self.fail(f"unknown method {value!r}; one of {', '.join(METHODS)}", param, ctx)
        return super().convert(value, param, ctx)


def _names(which: Callable[[Any], bool]) -> str:
    return ", ".join(m.name for m in METHODS.values() if which(m)) or "none"


# Every word of the --method, --model and --target help is the registry's declared needs.
METHOD_HELP = "One of (what it needs): " + ", ".join(f"{m.name} ({m.needs})" for m in METHODS.values()) + "."
MODEL_HELP = (
    f"Returns a fresh torch.nn.Module (inputs -> logits); needed by {_names(lambda m: m.needs_model)}; "
    f"optional for {_names(lambda m: m.model_optional)}."
)
TARGET_HELP = f"Returns the labelled target dataset; needed by {_names(lambda m: m.needs_target)}."


def _load_ref(ref: str, what: str, call: bool) -> Any:
    from tandem.share.spec import SpecError, load_object

    try:
        obj = load_object(ref)
    except SpecError as exc:
        raise click.BadParameter(str(exc), param_hint=what) from None
    if not call:
        return obj
    try:
        return obj()
    except Exception as exc:  # noqa: BLE001 - the user's function: say what it raised
        raise click.BadParameter(f"{ref}() raised {type(exc).__name__}: {exc}", param_hint=what) from None


def _budget(_ctx: click.Context, _param: click.Parameter, value: str) -> float | int:
    from tandem.select import SelectError
    from tandem.select.pick import parse_budget

    try:
        return parse_budget(value)
    except SelectError as exc:
        raise click.BadParameter(str(exc)) from None


def _selection(sel_id: str) -> Any:
    from tandem.select import SelectError, load

    try:
        return load(sel_id)
    except SelectError as exc:
        raise Exit(str(exc), EXIT_BAD_INPUT) from None


def _cost_line(cost: dict[str, Any]) -> str:
    parts = [f"{cost.get('wall_s', 0):.1f} s", f"{cost.get('cpu_s', 0):.1f} CPU-s"]
    if "energy_measured_joules" in cost:
        parts.append(f"{cost['energy_measured_joules']:.0f} J measured")
    if "energy_estimated_joules" in cost:
        parts.append(f"{cost['energy_estimated_joules']:.0f} J estimated")
    return ", ".join(parts) + (f" (MLflow run {cost['mlflow_run_id']})" if cost.get("mlflow_run_id") else "")


@click.group("select")
def select_group() -> None:
    """Data selections: computed once, stored with their cost, shared by every job."""


@select_group.command("run")
@click.option(
    "--dataset", "dataset_ref", required=True, metavar="MOD:FN", help="Returns a map-style dataset."
)
@click.option("--method", required=True, metavar="M", type=_MethodChoice(list(METHODS)), help=METHOD_HELP)
@click.option(
    "--budget", required=True, callback=_budget, metavar="B", help="A fraction (0.3) or a count (300)."
)
@click.option("--model", "model_ref", metavar="MOD:FN", help=MODEL_HELP)
@click.option("--target", "target_ref", metavar="MOD:FN", help=TARGET_HELP)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--balance/--no-balance", default=True, show_default=True, help="Each class its share.")
@click.option(
    "--version", "data_version", metavar="V", help="Names the dataset's content (else 64 items are hashed)."
)
@json_option
def select_run(
    dataset_ref: str,
    method: str,
    budget: float | int,
    model_ref: str | None,
    target_ref: str | None,
    seed: int,
    balance: bool,
    data_version: str | None,
    as_json: bool,
) -> None:
    """Compute a selection (or find it stored) and print its id."""
    from tandem.dirs import state_dir

    state_dir()  # one that may not be used is said before torch and the dataset are loaded (seconds)
    from tandem.select import SelectError, select

    dataset = _load_ref(dataset_ref, "--dataset", call=True)
    model = _load_ref(model_ref, "--model", call=False) if model_ref else None
    target = _load_ref(target_ref, "--target", call=True) if target_ref else None
    try:
        sel = select(
            dataset,
            method,
            budget,
            model=model,
            target=target,
            seed=seed,
            balance=balance,
            version=data_version,
        )
    except SelectError as exc:
        raise Exit(str(exc), EXIT_BAD_INPUT) from None
    if os.environ.get("TANDEM_JOB_ID", "").isdigit():  # a job of the manager's: say which made it
        from tandem.select.for_share import note_made
        from tandem.select.store import record_use

        record_use(sel, {"role": "made-by-job", "job": int(os.environ["TANDEM_JOB_ID"])})
        note_made(sel.id)  # for the daemon: the share it was made for serves it
    if as_json:
        out = {"id": sel.id, "size": len(sel), "cached": sel.cached, "cost": sel.meta["cost"]}
        click.echo(json.dumps(out, indent=2))
        return
    click.echo(sel.id)
    how = "stored before: not scored again" if sel.cached else f"cost {_cost_line(sel.meta['cost'])}"
    click.echo(f"{method}: {len(sel)} of {sel.meta['dataset']['length']} items; {how}", err=True)


@select_group.command("ls")
@json_option
def select_ls(as_json: bool) -> None:
    """The stored selections."""
    from tandem.select import SelectError, ids, load

    rows: list[Any] = []
    for sel_id in ids():  # a damaged one is listed as such: it hides no other
        try:
            rows.append(load(sel_id))
        except SelectError as exc:
            rows.append({"id": sel_id, "damaged": str(exc)})
    if as_json:
        click.echo(json.dumps([s if isinstance(s, dict) else _summary(s) for s in rows], indent=2))
        return
    if not rows:
        click.echo("no stored selections (tandem select run ... makes one)")
    for s in rows:
        if isinstance(s, dict):
            click.echo(f"{s['id']}  DAMAGED: {s['damaged']}")
            continue
        m = s.meta
        click.echo(
            f"{s.id}  {m['method']:<10} {len(s):>7} of {m['dataset']['length']:<7} seed {m['seed']}  "
            f"{_cost_line(m['cost'])}"
        )


def _summary(sel: Any) -> dict[str, Any]:
    m = sel.meta
    return {
        "id": sel.id,
        "method": m["method"],
        "size": len(sel),
        "dataset": m["dataset"],
        "seed": m["seed"],
        "balance": m["balance"],
        "cost": m["cost"],
        "created": m["created"],
    }


@select_group.command("show")
@click.argument("sel_id", metavar="ID")
@json_option
def select_show(sel_id: str, as_json: bool) -> None:
    """A selection: what it was made of, its cost, and the jobs that trained on it."""
    from tandem.select import uses
    from tandem.select.report import jobs_of

    sel = _selection(sel_id)
    used = uses(sel_id)
    state = _state_or_none()
    trained = jobs_of(sel_id, state)  # the jobs report counts: one definition
    counted = {j["job"] for j in trained}
    others = [j for j in _manager_jobs(state, sel_id) if j.id not in counted]  # waiting, or never ran
    if as_json:
        jobs = [{"id": j["job"], **{k: v for k, v in j.items() if k != "job"}} for j in trained]
        waiting = [{"id": j.id, "state": j.state, "share": j.share} for j in others]
        click.echo(json.dumps({**sel.meta, "uses": used, "jobs": jobs, "not_run": waiting}, indent=2))
        return
    m = sel.meta
    click.echo(
        f"selection {sel.id}: {m['method']} keeps the {m['keep']} end, {len(sel)} of "
        f"{m['dataset']['length']} items (budget {m['budget']}, seed {m['seed']}, "
        f"balance {'on' if m['balance'] else 'off'})"
    )
    click.echo(
        f"  dataset {m['dataset']['fingerprint']}  model {m['model'] or '-'}  params {_params(m['params'])}"
    )
    click.echo(f"  cost    {_cost_line(m['cost'])}")
    click.echo(
        f"  jobs    {len(trained)} trained on it"
        + (f": {_some(map(_job_words, trained))}" if trained else "")
    )
    if others:
        click.echo(f"  not run {_some(f'{j.id} ({j.state})' for j in others)}")
    click.echo(f"  uses    {len(used)} noted" + (f", the last {min(len(used), 10)}:" if used else ""))
    for u in used[-10:]:
        click.echo(f"    {_use_line(u)}")


def _some(words: Iterable[str], most: int = 20) -> str:
    """At most ``most`` of ``words``, then how many more (a sweep has thousands of jobs)."""
    listed = list(words)
    more = f", and {len(listed) - most} more (--json lists them)" if len(listed) > most else ""
    return ", ".join(listed[:most]) + more


def _params(params: Any) -> str:
    """A method's settings as ``k=v`` (never a dict)."""
    if not isinstance(params, dict) or not params:
        return "-"
    return params_text(dict(sorted(params.items())))


def _job_words(j: dict[str, Any]) -> str:
    """A job that trained on a selection, in words: ``15 (succeeded, group sweep)``, or a
    run noted among its uses: ``MLflow run abc``."""
    if j.get("job") is None:
        return f"MLflow run {j['mlflow_run_id']}"
    said = [j["state"] or "noted", *([f"group {j['group']}"] if j.get("group") else [])]
    return f"{j['job']} ({', '.join(said)})"


def _use_line(u: dict[str, Any]) -> str:
    """One noted use, readable: a local time, the role in words, then who (the job, the
    share, the process, the MLflow run); never a raw dict."""
    t = u.get("time")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if isinstance(t, (int, float)) else "-"
    role = str(u.get("role") or "used")
    if role == "made-by-job":
        words = f"made by job {u.get('job') or '-'}"
    elif role == "producer":
        words = f"served by share {u.get('share') or '-'}'s producer" + (
            f" (job {u['job']})" if u.get("job") not in (None, "") else ""
        )
    else:
        words = role.replace("-", " ") + (f" by job {u['job']}" if u.get("job") not in (None, "") else "")
    rest = {k: v for k, v in u.items() if k not in ("time", "role", "job", "share") and v not in (None, "")}
    if "mlflow_run_id" in rest:
        words += f", MLflow run {rest.pop('mlflow_run_id')}"
    rest.pop("pid", None)  # a process long gone: it says nothing to a reader
    return f"{when}  {words}" + (f"  {_params(rest)}" if rest else "")


@select_group.command("rm")
@click.argument("sel_ids", metavar="ID...", nargs=-1, required=True)
@click.option(
    "--force", is_flag=True, help="Remove it even if a defined share or a job not yet ended reads it."
)
@json_option
def select_rm(sel_ids: tuple[str, ...], force: bool, as_json: bool) -> None:
    """Remove stored selections (all named must exist, and none be in use: none is removed
    otherwise)."""
    from tandem.select import SelectError, ids, remove

    missing = [i for i in sel_ids if i not in ids()]
    if missing:
        raise Exit(f"no selection {', '.join(missing)} (tandem select ls lists them); nothing removed", 2)
    readers = {} if force else _readers(sel_ids)
    if readers:
        said = "; ".join(f"{sel_id} is read by {who}" for sel_id, who in readers.items())
        raise Exit(f"{said}: nothing removed (remove the share first, or --force)", EXIT_BAD_INPUT)
    for sel_id in sel_ids:
        try:
            remove(sel_id)
        except SelectError as exc:
            raise Exit(str(exc), EXIT_BAD_INPUT) from None
    if as_json:
        click.echo(json.dumps({"removed": list(sel_ids)}))
    else:
        click.echo(f"removed {' '.join(sel_ids)}", err=True)


@select_group.command("report")
@click.argument("sel_id", metavar="ID")
@click.option(
    "--baseline", "baseline_run", metavar="RUN_ID", help="A measured full-data run of the same job."
)
@json_option
def select_report(sel_id: str, baseline_run: str | None, as_json: bool) -> None:
    """When it pays: the selection's cost against what its jobs saved, and the break-even
    count of jobs in time and in energy."""
    from tandem.select.report import report_for

    sel = _selection(sel_id)
    data = report_for(sel, _state_or_none(), baseline_run)  # as the dashboard's group page
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    click.echo(
        f"selection {sel.id} ({data['method']}, {data['size']} items, {data['ratio']:.0%} of the "
        f"data); {len(data['jobs'])} job(s) trained on it, {data['measured_jobs']} measured; "
        f"baseline {data['baseline']}"
    )
    fmt: dict[str, Callable[[float], str]] = {
        "wall_s": lambda v: f"{v:.1f} s",
        "cpu_s": lambda v: f"{v:.1f} CPU-s",
        "energy_measured_joules": lambda v: f"{v:.0f} J",
        "energy_estimated_joules": lambda v: f"{v:.0f} J",
    }
    for what, row in data["break_even"].items():
        show = {k: ("-" if v is None else fmt[what](v)) for k, v in row.items() if k != "break_even_jobs"}
        even = row["break_even_jobs"]
        even_text = "-" if even is None else (even if isinstance(even, str) else f"{even:.1f} jobs")
        click.echo(
            f"  {what:<24} selection {show['selection']:>12}  a job {show['job_mean']:>12} "
            f"(start-up {show['job_startup_mean']})  full data {show['full_data']:>12}  "
            f"pays after {even_text}"
        )


def _manager_state() -> Any:
    """The job manager's state, if it has one (None before its first job or share)."""
    from tandem.place import StateReader, state_dir_path

    return StateReader(state_dir_path()) if (state_dir_path() / "place.db").exists() else None


def _state_or_none() -> Any:
    """The job manager's state; None where it has none, or it cannot be read (a report
    then counts the runs noted among the selection's uses alone)."""
    from tandem.place import StateError

    try:
        return _manager_state()
    except StateError:
        return None


def _manager_jobs(state: Any, sel_id: str) -> list[Any]:
    from tandem.select.report import manager_jobs

    return manager_jobs(state, sel_id)


def _readers(sel_ids: tuple[str, ...]) -> dict[str, str]:
    """Who reads each of ``sel_ids``: the defined shares that serve it and their jobs not yet
    ended, in words (none: not listed)."""
    from tandem.select.report import serving

    state = _manager_state()
    out: dict[str, str] = {}
    for sel_id in sel_ids if state is not None else ():
        shares = serving(state, sel_id)
        if shares:
            jobs = [j.id for j in state.jobs(("queued", "running", "retrying"), shares=tuple(shares))]
            out[sel_id] = f"share(s) {', '.join(shares)}" + (
                f" and job(s) {', '.join(map(str, jobs))}" if jobs else ""
            )
    return out


COMMANDS = [select_group]
