"""What makes a drop-in loader's data *the same data*: its identity, and the check of items.

The fingerprint of a loader (:mod:`tandem.share._pickled`) pickles a class or function
imported from a module *by reference*: its module's and its own name. Two projects that
each have a ``mydata.DS`` of one length, or one ``mydata.py`` edited between two runs,
would pickle alike and share a producer serving the wrong items. So the identity also
covers:

* **the code**: the source of every module the payload refers to that is neither in the
  standard library nor an installed package (the user's own files: a content hash, so an
  edit is a new identity), and the user modules those modules refer to in turn;
* **the seed** the order is drawn with (the loader's ``generator=``, or
  ``torch.manual_seed``), and the values the objects were built with (pickled by value).

No fingerprint can see what ``__getitem__`` reads when it runs (a file that changed, an
environment variable), so a reader also compares a few items it loads itself with the
producer's (:func:`item_digests`, at indices it picks; each loaded with the random
generators seeded alike, so that random augmentations agree): a mismatch means a producer
of its own.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import random
import sys
import sysconfig
import types
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Any

# How many user modules the code digest follows at most (a project's data code is a few).
MAX_MODULES = 256
PROBE_ITEMS = 2  # items a reader checks when it attaches, beside the anchors
_SEED = 0x7A4D  # the generators' seed for a checked item (plus its index)


@lru_cache(maxsize=1)
def _installed_roots() -> tuple[str, ...]:
    """Folders whose modules are the interpreter's or installed packages'."""
    roots = set()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            roots.add(os.path.realpath(path))
    for path in sys.path:
        if path and os.path.basename(path) in ("site-packages", "dist-packages"):
            roots.add(os.path.realpath(path))
    return tuple(sorted(roots))


def _user_file(module: types.ModuleType) -> str | None:
    """The source file of ``module`` if it is the user's own code (not the standard
    library's, an installed package's, or tandem's), else None."""
    name = module.__name__
    if name == "__main__" or name.split(".")[0] == "tandem":
        return None  # __main__'s parts are pickled by value; tandem's version is its own check
    path = getattr(module, "__file__", None)
    if not path or not path.endswith(".py"):
        return None
    real = os.path.realpath(path)
    if any(real.startswith(root + os.sep) for root in _installed_roots()):
        return None
    return real


def _referred(module: types.ModuleType) -> Iterable[str]:
    """Names of the modules ``module``'s globals come from (modules, classes, functions)."""
    for value in list(vars(module).values()):
        if isinstance(value, types.ModuleType):
            yield value.__name__
        else:
            owner = (
                getattr(value, "__module__", None) if isinstance(value, (type, types.FunctionType)) else None
            )
            if isinstance(owner, str):
                yield owner


def code_digest(modules: Iterable[str]) -> str:
    """A digest of the user's modules among ``modules`` and those they refer to: their
    names and source bytes ("" when there are none)."""
    pending = sorted(set(modules))
    seen: dict[str, str] = {}
    visited: set[str] = set()
    while pending and len(visited) < MAX_MODULES:
        name = pending.pop()
        if name in visited:
            continue
        visited.add(name)
        module = sys.modules.get(name)
        if module is None:
            continue
        path = _user_file(module)
        if path is None:
            continue
        try:
            with open(path, "rb") as f:
                seen[name] = hashlib.sha256(f.read()).hexdigest()
        except OSError:
            seen[name] = "unreadable"
        pending.extend(n for n in _referred(module) if n not in visited)
    if not seen:
        return ""
    return hashlib.sha256(repr(sorted(seen.items())).encode()).hexdigest()


# --- items ---------------------------------------------------------------------------------------


def item_digests(dataset: Any, indices: Sequence[int]) -> list[str]:
    """A content digest of ``dataset[i]`` for each ``i``, each loaded with Python's, NumPy's
    and torch's generators seeded alike (and put back after), so that a reader and its
    producer loading one item with random augmentations load the same."""
    return [_digest(_seeded_item(dataset, i)) for i in indices]


def _seeded_item(dataset: Any, index: int) -> Any:
    import torch

    py_state = random.getstate()
    torch_state = torch.random.get_rng_state()
    np_state = None
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        np_state = numpy.random.get_state()
    try:
        random.seed(_SEED + index)
        torch.manual_seed(_SEED + index)
        if numpy is not None:
            numpy.random.seed((_SEED + index) % 2**32)
        return dataset[index]
    finally:
        random.setstate(py_state)
        torch.random.set_rng_state(torch_state)
        if numpy is not None and np_state is not None:
            numpy.random.set_state(np_state)


def _digest(item: Any) -> str:
    h = hashlib.sha256()
    _feed(h, item)
    return h.hexdigest()[:32]


def _feed(h: Any, item: Any) -> None:
    import torch

    if isinstance(item, torch.Tensor):
        t = item.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    elif isinstance(item, (tuple, list)):
        h.update(f"S{type(item).__name__}{len(item)}".encode())
        for part in item:
            _feed(h, part)
    elif isinstance(item, dict):
        h.update(f"D{len(item)}".encode())
        for key in sorted(item, key=repr):
            h.update(repr(key).encode())
            _feed(h, item[key])
    elif isinstance(item, (str, bytes, int, float, bool, type(None))):
        h.update(repr(item).encode())
    elif hasattr(item, "tobytes"):  # a NumPy array, a PIL image
        h.update(f"B{type(item).__name__}{getattr(item, 'shape', getattr(item, 'size', ''))}".encode())
        h.update(item.tobytes())
    else:
        out = io.BytesIO()
        try:
            pickle.dump(item, out, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:  # noqa: BLE001 - an item of a kind that does not pickle: its type only
            out.write(type(item).__qualname__.encode())
        h.update(out.getvalue())


def anchor_indices(length: int) -> list[int]:
    """The indices every reader checks (the first, middle and last item): a producer of a
    reader's own is named by their digests, so that readers that load alike share it."""
    return sorted({0, length // 2, length - 1}) if length > 0 else []


def probe_indices(length: int) -> list[int]:
    """Indices a reader checks: the anchors, and random others it picks (a producer cannot
    know them in advance)."""
    picked = set(anchor_indices(length))
    want = min(len(picked) + PROBE_ITEMS, length)
    rng = random.Random(os.urandom(8))
    while len(picked) < want:
        picked.add(rng.randrange(length))
    return sorted(picked)
