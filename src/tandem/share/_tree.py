"""Batch structures: flatten a nested batch into tensors plus a picklable spec, and rebuild it.

A batch may nest tuples, lists, dicts, namedtuples and dataclasses, with tensors and plain
values (int, float, bool, str, bytes, None) at the leaves. ``flatten`` checks every element
and raises :class:`UnsupportedBatch` naming where a bad one sits (``batch['meta'][2]``).

Spec nodes (plain tuples so they pickle small and fast)::

    ("T", i)                 the i-th tensor leaf
    ("V", value)             a plain value
    ("P", [values])          a list of plain values (e.g. file names: one per sample)
    ("P", [values], "tuple") the same as a tuple (``default_collate``'s strings)
    ("tuple", [nodes]) ("list", [nodes]) ("dict", [(key, node)])
    ("nt", cls, [nodes])     namedtuple
    ("dc", cls, [(field, node)])  dataclass
    ("I", node)              the batch ``node``, with its items' dataset indices as the
                             last tensor leaf (added by a producer that owns the order)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeGuard

import torch

from tandem.share.errors import UnsupportedBatch

PLAIN = (int, float, bool, str, bytes, type(None))
Spec = tuple


def _is_namedtuple(obj: object) -> TypeGuard[tuple[Any, ...]]:
    return isinstance(obj, tuple) and hasattr(type(obj), "_fields")


def flatten(batch: object) -> tuple[Spec, list[torch.Tensor]]:
    leaves: list[torch.Tensor] = []
    return _walk(batch, "batch", leaves), leaves


# A module-level recursion, not a closure: a recursive closure is a reference cycle that
# would keep every batch's tensors alive until the garbage collector's next full pass.
def _walk(obj: object, path: str, leaves: list[torch.Tensor]) -> Spec:
    if isinstance(obj, torch.Tensor):
        if obj.is_sparse or obj.layout != torch.strided:
            raise UnsupportedBatch(
                f"{path}: a {obj.layout} tensor cannot be shared; convert it with .to_dense()"
            )
        if obj.requires_grad:
            obj = obj.detach()
        leaves.append(obj)
        return ("T", len(leaves) - 1)
    if isinstance(obj, PLAIN):
        return ("V", obj)
    if type(obj).__module__ == "numpy":
        return _walk(_from_numpy(obj, path), path, leaves)
    if _is_namedtuple(obj):
        members = zip(obj._fields, obj)  # type: ignore[attr-defined]
        return ("nt", type(obj), [_walk(v, f"{path}.{f}", leaves) for f, v in members])
    if isinstance(obj, (list, tuple)) and obj and all(isinstance(v, PLAIN) for v in obj):
        # file names, keys: one per sample (default_collate makes str values a tuple)
        return ("P", list(obj)) if isinstance(obj, list) else ("P", list(obj), "tuple")
    if isinstance(obj, (tuple, list)):
        kind = "tuple" if isinstance(obj, tuple) else "list"
        return (kind, [_walk(v, f"{path}[{i}]", leaves) for i, v in enumerate(obj)])
    if isinstance(obj, dict):
        items = []
        for k, v in obj.items():
            if not isinstance(k, PLAIN):
                raise UnsupportedBatch(
                    f"{path}: dict key {k!r} of type {type(k).__name__} cannot be shared; "
                    "use str, int, float, bool or None keys"
                )
            items.append((k, _walk(v, f"{path}[{k!r}]", leaves)))
        return ("dict", items)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        fields = [
            (f.name, _walk(getattr(obj, f.name), f"{path}.{f.name}", leaves))
            for f in dataclasses.fields(obj)
            if f.init
        ]
        return ("dc", type(obj), fields)
    raise UnsupportedBatch(
        f"{path}: an element of type {type(obj).__module__}.{type(obj).__qualname__} "
        "cannot be shared; a batch may hold tensors, numpy arrays and numbers, int, float, "
        "bool, str, bytes, None, and tuples, lists, dicts, namedtuples and dataclasses of them"
    )


def _from_numpy(obj: Any, path: str) -> object:
    """A numpy array or number as ``default_collate`` makes it: a tensor (strings: a list
    of str, or a str)."""
    import numpy as np

    if isinstance(obj, (np.ndarray, np.generic)):
        if obj.dtype.kind in "biufc":
            return torch.as_tensor(np.ascontiguousarray(obj) if isinstance(obj, np.ndarray) else obj)
        if obj.dtype.kind in "US" and obj.ndim <= 1:
            return obj.tolist()
    raise UnsupportedBatch(
        f"{path}: a numpy {type(obj).__name__} of dtype {getattr(obj, 'dtype', '?')} cannot be shared; "
        "numeric and boolean arrays become tensors, 1-d string arrays lists: convert it in your "
        "collate function"
    )


def unflatten(spec: Spec, leaves: list[torch.Tensor]) -> Any:
    kind = spec[0]
    if kind == "I":
        return unflatten(spec[1], leaves)
    if kind == "T":
        return leaves[spec[1]]
    if kind == "V":
        return spec[1]
    if kind == "P":
        return tuple(spec[1]) if len(spec) > 2 else list(spec[1])
    if kind == "tuple":
        return tuple(unflatten(s, leaves) for s in spec[1])
    if kind == "list":
        return [unflatten(s, leaves) for s in spec[1]]
    if kind == "dict":
        return {k: unflatten(s, leaves) for k, s in spec[1]}
    if kind == "nt":
        return spec[1](*(unflatten(s, leaves) for s in spec[2]))
    if kind == "dc":
        return spec[1](**{name: unflatten(s, leaves) for name, s in spec[2]})
    raise ValueError(f"unknown spec node {kind!r}")


def map_plain_lists(spec: Spec, fn: Callable[[list], list]) -> Spec:
    """A copy of ``spec`` with every per-sample plain list replaced by ``fn(list)``."""
    kind = spec[0]
    if kind == "I":
        return ("I", map_plain_lists(spec[1], fn))
    if kind == "P":
        return ("P", fn(spec[1]), *spec[2:])
    if kind in ("T", "V"):
        return spec
    if kind in ("tuple", "list"):
        return (kind, [map_plain_lists(s, fn) for s in spec[1]])
    if kind == "dict":
        return ("dict", [(k, map_plain_lists(s, fn)) for k, s in spec[1]])
    if kind == "nt":
        return ("nt", spec[1], [map_plain_lists(s, fn) for s in spec[2]])
    return ("dc", spec[1], [(n, map_plain_lists(s, fn)) for n, s in spec[2]])


def plain_lists(spec: Spec) -> list[list]:
    """Every per-sample plain list in ``spec``, in a fixed walk order."""
    out: list[list] = []

    def collect(values: list) -> list:
        out.append(values)
        return values

    map_plain_lists(spec, collect)
    return out


def sample_count(spec: Spec, leaves: list[torch.Tensor]) -> int:
    """Samples in a batch: the first dimension of its first tensor (or first plain list)."""
    for t in leaves:
        if t.dim() >= 1:
            return int(t.shape[0])
    lists = plain_lists(spec)
    if lists:
        return len(lists[0])
    raise UnsupportedBatch(
        "batch: cannot tell how many samples it holds (no tensor with a batch dimension "
        "and no per-sample list); give it at least one tensor whose first dimension is the "
        "batch size"
    )
