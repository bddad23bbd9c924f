"""tandem.select: compute a data selection once, store it with its cost, share it.

    from tandem.select import select, load
    sel = select(train_set, "small-loss", 0.3, model=make_mlp, seed=0)
    sel.id, sel.indices, sel.meta["cost"]     # content-addressed, stored once
    subset = load(sel.id).subset(train_set)   # in any process: the same items

A selection's id hashes what it is made of (the dataset's fingerprint, the method and its
version and settings, the budget, the model's initial weights, the seed), so the same
inputs give the same id on any machine and a second ``select`` returns the stored copy.
The methods and their directions: :mod:`tandem.select.methods`; the store:
:mod:`tandem.select.store`; the cost (an MLflow run): :mod:`tandem.select.cost`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tandem.select.errors import SelectError
from tandem.select.methods import METHODS

if TYPE_CHECKING:
    from tandem.select.core import select
    from tandem.select.store import Selection, ids, load, remove, uses

__all__ = ["METHODS", "SelectError", "Selection", "ids", "load", "remove", "select", "uses"]

# Imported when first used: the registry and the error above need neither torch nor numpy,
# so ``tandem --help`` and ``tandem select run --help`` can list the methods at once; and
# reading a stored selection (``load``: the dashboard, ``select report``) needs no torch.
_LAZY = {
    "load": "store",
    "select": "core",
    "Selection": "store",
    "ids": "store",
    "remove": "store",
    "uses": "store",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    globals()[name] = value
    return value
