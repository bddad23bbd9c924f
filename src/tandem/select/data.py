"""A dataset as the selection methods see it, and its fingerprint.

Items are ``(input, label, ...)`` tuples (further elements ignored) or dicts (``input_key``
and ``label_key``, default ``"input"`` and ``"label"``); a bare tensor is an input without a
label. The methods read every item once into one input tensor and one label tensor
(:class:`Items`): selection is for datasets whose inputs (or features) fit in memory.

The fingerprint names the dataset: its length and a hash of every item up to 100,000 items
(of 64 items spread over it beyond that), or a ``version`` the user gives, which then stands
for the content (what names a large dataset's content).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from tandem.select.errors import SelectError

SAMPLED_ITEMS = 64
HASH_ALL_UP_TO = 100_000  # items: every one is hashed up to this many (a stale selection is seen)


@dataclass
class Items:
    inputs: torch.Tensor  # [N, ...] float
    labels: torch.Tensor | None  # [N] int64, or None (no labels)

    def __len__(self) -> int:
        return int(self.inputs.shape[0])

    @property
    def classes(self) -> int:
        return 0 if self.labels is None else int(self.labels.max()) + 1


def split_item(item: Any, input_key: str, label_key: str) -> tuple[Any, Any]:
    """``(input, label or None)`` of one dataset item."""
    if isinstance(item, dict):
        if input_key not in item:
            raise SelectError(
                f"a dataset item has no {input_key!r} key (its keys: {sorted(item)}); "
                "pass input_key= and label_key="
            )
        return item[input_key], item.get(label_key)
    if isinstance(item, (tuple, list)):
        if not item:
            raise SelectError("a dataset item is an empty tuple: items are (input, label, ...)")
        return item[0], item[1] if len(item) > 1 else None
    return item, None


def _tensor(value: Any) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    return torch.as_tensor(np.asarray(value))


def read_items(dataset: Any, input_key: str = "input", label_key: str = "label") -> Items:
    """Every item of ``dataset`` (a map-style dataset: ``len`` and ``[i]``) into :class:`Items`."""
    try:
        n = len(dataset)
    except TypeError:
        raise SelectError("the dataset has no len(): selection needs a map-style dataset") from None
    if n == 0:
        raise SelectError("the dataset is empty: nothing to select from")
    inputs, labels = [], []
    for i in range(n):
        x, y = split_item(dataset[i], input_key, label_key)
        inputs.append(_tensor(x))
        labels.append(y)
    try:
        stacked = torch.stack(inputs).float()
    except RuntimeError as exc:
        raise SelectError(f"the dataset's inputs do not have one shape ({exc})") from None
    if any(y is None for y in labels):
        return Items(stacked, None)
    try:
        y = torch.as_tensor([int(_tensor(v).item()) for v in labels], dtype=torch.int64)
    except (ValueError, RuntimeError) as exc:
        raise SelectError(f"labels must be whole class numbers ({exc})") from None
    if int(y.min()) < 0:
        raise SelectError("labels must be class numbers from 0")
    return Items(stacked, y)


def _hash_value(h: Any, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        h.update(str((value.dtype.str, value.shape)).encode())
        h.update(np.ascontiguousarray(value).tobytes())
    elif isinstance(value, dict):
        for k in sorted(value, key=str):
            h.update(repr(k).encode())
            _hash_value(h, value[k])
    elif isinstance(value, (tuple, list)):
        h.update(f"seq{len(value)}".encode())
        for v in value:
            _hash_value(h, v)
    elif value is None or isinstance(value, (bool, int, float, complex, str, bytes, np.generic)):
        h.update(repr(value).encode())
    elif hasattr(value, "__array_interface__") or hasattr(value, "__array__"):  # a PIL image, say
        _hash_value(h, np.asarray(value))
    else:
        # Its repr may hold a memory address (a new fingerprint on every read): refuse.
        raise SelectError(
            f"cannot fingerprint dataset items holding a {type(value).__name__}: pass version= (a name "
            "for the dataset's content), or return tensors, arrays, numbers or strings"
        )


def fingerprint(dataset: Any, version: str | None = None, how: str | None = None) -> str:
    """The dataset's name in selection ids: its length and a hash of every item (``how``
    ``"all"``, the default up to :data:`HASH_ALL_UP_TO` items) or of 64 items spread over it
    (``"sampled"``, beyond: an item changed elsewhere is not seen; name the content with
    ``version`` there), or ``version``, when given, instead of the items."""
    n = len(dataset)
    h = hashlib.sha256(f"len={n}".encode())
    how = how or fingerprint_how(n)
    if version is not None:
        h.update(f"version={version}".encode())
    else:
        chosen = (
            range(n)
            if how == "all"
            else sorted({int(k) for k in np.linspace(0, n - 1, min(n, SAMPLED_ITEMS))})
        )
        if how == "all":
            h.update(b"all")
        for i in chosen:
            h.update(f"[{i}]".encode())
            _hash_value(h, dataset[i])
    return h.hexdigest()[:24]


def fingerprint_how(n: int) -> str:
    """How a dataset of ``n`` items is fingerprinted: every item, or (beyond the bound) 64."""
    return "all" if n <= HASH_ALL_UP_TO else "sampled"


def model_fingerprint(model_fn: Any, seed: int) -> str | None:
    """The model's name in selection ids: its class and its initial weights (made with
    ``seed``), hashed; None when there is no model."""
    if model_fn is None:
        return None
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_fn()
    if not isinstance(model, torch.nn.Module):
        raise SelectError(f"model() must return a torch.nn.Module, not {type(model).__name__}")
    h = hashlib.sha256(type(model).__qualname__.encode())
    for name, tensor in model.state_dict().items():
        h.update(name.encode())
        _hash_value(h, tensor)
    return h.hexdigest()[:24]
