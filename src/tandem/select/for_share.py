"""What a shared dataset's selection needs of :mod:`tandem.select`, kept here so that
:mod:`tandem.share` never imports it: ``--select METHOD:BUDGET`` checked against the
methods' declared needs, the command of the manager's job that makes it once, the id that
job leaves for the daemon, and the stored selection a producer serves (its use noted).

Share takes the items it serves (``Producer.from_dataset(selection=...)``); the daemon keeps
which selection a share serves in its state (the share's ``selection`` column), written when
its selection job succeeds from the file :func:`note_made` leaves in the job's directory.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tandem._safepath import module_command
from tandem.select.errors import SelectError
from tandem.select.methods import METHODS
from tandem.select.pick import parse_budget

# The file a selection job leaves in its attempt's directory ($TANDEM_JOB_DIR), which the
# daemon reads (tandem.place.attempts) when the job succeeds.
MADE_FILE = "selection.json"


def parse_select(text: str, model_given: bool) -> tuple[str, float | int]:
    """A share's ``--select METHOD:BUDGET``: the method and budget, or :class:`SelectError`
    saying what is wrong (the method's declared needs decide what it must be given)."""
    method, _, budget = text.partition(":")
    if method not in METHODS or not budget:
        raise SelectError(f"--select {text!r}: METHOD:BUDGET, METHOD one of {', '.join(METHODS)}")
    chosen = METHODS[method]
    if chosen.needs_target:
        raise SelectError(
            f"--select {method} needs a target set: make it with tandem select run --target, "
            "then define the share with --selection ID"
        )
    if chosen.needs_model and not model_given:
        raise SelectError(f"--select {text}: {method} trains a proxy: give --select-model MOD:FN")
    try:
        return method, parse_budget(budget)
    except SelectError as exc:
        raise SelectError(f"--select {text!r}: {exc}") from None


def select_command(dataset_ref: str, select: str, seed: int, model_ref: str | None) -> list[str]:
    """The command of the job that makes a share's selection (``tandem select run``)."""
    method, budget = parse_select(select, model_ref is not None)
    argv = module_command(
        "tandem.cli", "select", "run", "--dataset", dataset_ref, "--method", method,
        "--budget", str(budget), "--seed", str(seed),
    )  # fmt: skip
    return argv + (["--model", model_ref] if model_ref else [])


def chooser(select: str, model: Any, seed: int, share: str) -> Callable[[Any], Any]:
    """A function of the dataset that makes (or finds stored) the selection ``select``
    describes, its use noted (for share ``share``'s producer, started without the manager)."""
    from tandem.select.core import select as make
    from tandem.select.store import record_use

    method, budget = parse_select(select, model is not None)

    def choose(dataset: Any) -> Any:
        sel = make(dataset, method, budget, model=model, seed=seed)
        record_use(
            sel,
            {"role": "producer", "share": share, "pid": os.getpid(), "job": os.environ.get("TANDEM_JOB_ID")},
        )
        return sel

    return choose


def served(sel_id: str, share: str) -> Any:
    """The stored selection ``sel_id`` that share ``share``'s producer serves, its use noted
    beside it (``tandem select show``)."""
    from tandem.select.store import load, record_use

    sel = load(sel_id)
    record_use(
        sel, {"role": "producer", "share": share, "pid": os.getpid(), "job": os.environ.get("TANDEM_JOB_ID")}
    )
    return sel


def note_made(sel_id: str) -> None:
    """Under a job of the manager's, leave the selection's id in the job's directory, where
    the daemon reads it when the job succeeds (written whole: a rename)."""
    job_dir = os.environ.get("TANDEM_JOB_DIR")
    if not job_dir or not Path(job_dir).is_dir():
        return
    tmp = Path(job_dir) / f".{MADE_FILE}.tmp"
    tmp.write_text(json.dumps({"id": sel_id}))
    os.replace(tmp, Path(job_dir) / MADE_FILE)
