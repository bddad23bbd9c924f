"""What a drop-in loader would send its workers, as bytes equal in every process that builds
it alike: the producer's payload, and by its hash the loader's fingerprint (its share's
name).

Two things pickle differently in each process and are written here so that they do not:

* cloudpickle names each class it writes by value (one defined in the training script) with
  a random id, which keeps one class one when read back; here the id is the class's name and
  its rank among the classes of that name met in this pickle, so distinct classes stay
  distinct and equal runs write equal bytes;
* torch writes a tensor's storage under its memory address, so a ``TensorDataset`` (or a
  Hugging Face iterable dataset, which keeps its epoch in a tensor) had a new fingerprint in
  every process; here a CPU tensor is written by value (dtype, shape, bytes) and rebuilt
  as it was, in shared memory where it was.
"""

from __future__ import annotations

import io
import threading
import types
from typing import Any

import torch

_PICKLING = threading.Lock()


class NotPicklable(Exception):
    """Why the objects cannot be sent to a producer (said by the loader, which reads privately)."""


def pickled(objects: Any, modules: set[str] | None = None) -> bytes:
    """``objects`` as cloudpickle writes them (what the training script defined, by value),
    the same bytes in every process that builds them alike (see the module). ``modules``,
    if given, gets the name of every module a class, function or module in them comes from
    (what is pickled by reference: the identity hashes those that are the user's code)."""
    import cloudpickle
    from cloudpickle import cloudpickle as internals

    seen: dict[type, str] = {}

    def tracker_id(cls: type) -> str:
        if cls not in seen:
            same = sum(1 for c in seen if c.__qualname__ == cls.__qualname__)
            seen[cls] = f"tandem:{cls.__module__}.{cls.__qualname__}#{same}"
        return seen[cls]

    if not hasattr(internals, "_get_or_create_tracker_id"):
        raise NotPicklable("this cloudpickle names classes in a way tandem does not know (pin cloudpickle<4)")

    class Pickler(cloudpickle.Pickler):
        def reducer_override(self, obj: Any) -> Any:
            if modules is not None:
                if isinstance(obj, types.ModuleType):
                    modules.add(obj.__name__)
                elif isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType)):
                    owner = getattr(obj, "__module__", None)
                    if isinstance(owner, str):
                        modules.add(owner)
            if type(obj) is torch.Tensor and obj.device.type == "cpu" and obj.layout == torch.strided:
                return _by_value(obj)
            return super().reducer_override(obj)

    with _PICKLING:
        original = internals._get_or_create_tracker_id
        internals._get_or_create_tracker_id = tracker_id
        try:
            out = io.BytesIO()
            Pickler(out, protocol=cloudpickle.DEFAULT_PROTOCOL).dump(objects)
            return out.getvalue()
        except Exception as exc:  # noqa: BLE001 - whatever the user's objects raise
            said = f"{type(exc).__name__}: {exc}"
            raise NotPicklable(f"its dataset or functions do not pickle ({said})") from None
        finally:
            internals._get_or_create_tracker_id = original


def _by_value(tensor: torch.Tensor) -> tuple[Any, tuple[Any, ...]]:
    data = tensor.detach().contiguous().reshape(-1)
    raw = data.view(torch.uint8).numpy().tobytes() if data.numel() else b""
    dtype = str(tensor.dtype).removeprefix("torch.")
    return rebuilt, (raw, dtype, tuple(tensor.shape), tensor.requires_grad, tensor.is_shared())


def rebuilt(
    raw: bytes, dtype: str, shape: tuple[int, ...], requires_grad: bool, shared: bool
) -> torch.Tensor:
    """A tensor written by :func:`pickled`, as it was."""
    kind = getattr(torch, dtype)
    if raw:
        tensor = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(kind).reshape(shape)
    else:
        tensor = torch.empty(shape, dtype=kind)
    if requires_grad:
        tensor.requires_grad_(True)
    return tensor.share_memory_() if shared else tensor
