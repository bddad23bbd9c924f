"""``select()``: compute a data selection once, or find it stored."""

from __future__ import annotations

import platform
import socket
import time
from typing import Any

import torch

from tandem import __version__
from tandem.select import store
from tandem.select.cost import measure
from tandem.select.data import fingerprint, fingerprint_how, model_fingerprint, read_items
from tandem.select.errors import SelectError
from tandem.select.methods import METHODS, Context
from tandem.select.pick import budget_count, top
from tandem.select.store import Selection


def select(
    dataset: Any,
    method: str,
    budget: float | int,
    *,
    model: Any = None,
    target: Any = None,
    seed: int = 0,
    balance: bool = True,
    input_key: str = "input",
    label_key: str = "label",
    version: str | None = None,
    params: dict[str, Any] | None = None,
    track: bool = True,
) -> Selection:
    """The ``budget`` items of ``dataset`` that ``method`` keeps (see
    :mod:`tandem.select.methods`), stored under its content address; a second call with the
    same inputs returns the stored one (``cached``) without scoring again.

    ``budget``: a fraction (0.3) or a count (300). ``model``: a function returning a fresh
    ``torch.nn.Module`` (inputs -> logits) for the methods that train a proxy (``needs_model``;
    ``model_optional``: used when given). ``target``: the labelled dataset a ``needs_target``
    method selects for (ignored by the others). ``balance``: each class gets its share of the
    budget. ``version``: names the dataset's content instead of sampling 64 of its items.
    ``params``: a method's settings (``warmup_epochs``, ``lr``, ``proj_dim``)."""
    chosen = METHODS.get(method)
    if chosen is None:
        raise SelectError(f"unknown method {method!r}; one of {', '.join(METHODS)}")
    try:
        n = len(dataset)
    except TypeError:
        raise SelectError("the dataset has no len(): selection needs a map-style dataset") from None
    count = budget_count(budget, n)
    unknown = set(params or {}) - set(chosen.defaults)
    if unknown:
        raise SelectError(
            f"{method} takes no {', '.join(sorted(unknown))}; it takes {sorted(chosen.defaults) or 'none'}"
        )
    settings = {**chosen.defaults, **(params or {})}
    if "warmup_epochs" in settings and not (
        isinstance(settings["warmup_epochs"], int) and settings["warmup_epochs"] >= 1
    ):
        raise SelectError(
            f"warmup_epochs {settings['warmup_epochs']!r}: a whole number of epochs, at least 1"
        )
    if chosen.needs_model and model is None:
        raise SelectError(
            f"{method} trains a proxy: pass model= (a function returning a fresh torch.nn.Module)"
        )
    if chosen.needs_target and target is None:
        raise SelectError(
            f"{method} selects for a target: pass target= (a labelled dataset of what to be good at)"
        )
    uses_model = chosen.uses_model(model)
    key = {
        "dataset": fingerprint(dataset, version),
        "method": method,
        "method_version": chosen.version,
        "count": count,
        "seed": int(seed),
        "balance": bool(balance),
        "params": settings,
        "model": model_fingerprint(model, seed) if uses_model else None,
        "target": fingerprint(target) if chosen.needs_target else None,
        "keys": [input_key, label_key],  # another label field is another selection
    }
    sel_id = store.selection_id(key)
    if store.exists(sel_id):
        return store.load(sel_id, cached=True)
    items = read_items(dataset, input_key, label_key)
    if chosen.needs_labels and items.labels is None:
        raise SelectError(
            f"{method} needs labels, and the dataset's items have none (items are (input, label, ...))"
        )
    target_items = read_items(target, input_key, label_key) if chosen.needs_target else None
    ctx = Context(model if uses_model else None, int(seed), target_items, {**settings, "count": count})
    tags = {"tandem.role": "selection", "tandem.select.id": sel_id, "tandem.select.method": method}
    with torch.random.fork_rng(devices=[]), measure(f"select {method} {sel_id}", tags, track) as cost:
        torch.manual_seed(seed)
        scores = chosen.score(items, ctx)
    labels = None if items.labels is None else items.labels.numpy()
    indices = top(scores, chosen.keep, count, labels, balance)
    meta = {
        "id": sel_id,
        **key,
        "keep": chosen.keep,
        "budget": float(budget) if isinstance(budget, float) else int(budget),  # numpy's too: JSON
        "size": int(indices.size),
        "dataset": {
            "fingerprint": key["dataset"],
            "length": n,
            "version": version,
            "how": fingerprint_how(n),
        },
        "cost": cost,
        "created": time.time(),
        "lineage": {
            "tandem": __version__,
            "torch": torch.__version__,
            "python": platform.python_version(),
            "host": socket.gethostname(),
        },
    }
    return store.save(sel_id, indices, scores, meta)
