"""Cut and join producer batches into a consumer's own batch size.

A *piece* is samples ``[a, b)`` of one producer batch. A consumer batch that lies inside one
producer batch is returned as views of the shared memory (zero copies). One that spans
producer batches is assembled into fresh tensors: each piece is copied in exactly once,
before its producer batch is released, so a consumer never holds more than the producer
batch it is reading plus the next. Pieces of a CUDA slab are assembled on their GPU.

Per-sample elements are tensors whose first dimension equals the producer batch's sample
count, and lists or tuples of plain values of that length; they are sliced and joined.
Anything else (a scalar, a tensor of another length) is taken from the first piece. A list or
tuple of one element per sample that is not plain values (a detection model's targets: a
dict of tensors per image) cannot be cut: cutting a batch that holds one is a clear error,
never a batch whose parts belong to other samples.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch

from tandem.share._tree import Spec, map_plain_lists, plain_lists, unflatten
from tandem.share.errors import ShareError


@dataclass(slots=True)
class Piece:
    """Samples ``a, a + step, ...`` below ``b`` of one producer batch (``step`` > 1: one
    rank's part of it, see :mod:`tandem.share._reading`)."""

    spec: Spec
    leaves: list[torch.Tensor]
    count: int  # samples in the whole producer batch
    a: int
    b: int
    step: int = 1
    pick: torch.Tensor | None = None  # else: only these rows (a resumed epoch's unseen items)

    @property
    def n(self) -> int:
        return len(self.pick) if self.pick is not None else len(range(self.a, self.b, self.step))

    @property
    def is_view(self) -> bool:
        return self.step == 1 and self.pick is None

    def _per_sample(self, t: torch.Tensor) -> bool:
        return t.dim() >= 1 and t.shape[0] == self.count

    def rows(self, t: torch.Tensor) -> torch.Tensor:
        """This piece's samples of per-sample tensor ``t``: a view (a copy with ``pick``)."""
        if self.pick is not None:
            return t[self.pick]
        return t[self.a : self.b : self.step]

    def values(self, v: list) -> list:
        """This piece's samples of a per-sample list."""
        if self.pick is not None:
            return [v[i] for i in self.pick.tolist()]
        return v[self.a : self.b : self.step]

    def view(self) -> Any:
        """The piece as a batch: views of the slot when ``step`` is 1, else contiguous copies
        (a strided batch would surprise code that calls ``.view()`` on it)."""
        if self.a == 0 and self.b == self.count and self.is_view:
            return unflatten(self.spec, self.leaves)
        check_cuttable(self)
        if self.is_view:
            leaves = [t.narrow(0, self.a, self.n) if self._per_sample(t) else t for t in self.leaves]
        else:
            leaves = [self.rows(t).contiguous() if self._per_sample(t) else t.clone() for t in self.leaves]
        spec = map_plain_lists(self.spec, lambda v: self.values(v) if len(v) == self.count else v)
        return unflatten(spec, leaves)


class Assembler:
    """Builds one consumer batch of up to ``size`` samples from pieces."""

    def __init__(self, size: int):
        self.size = size
        self.n = 0
        self._first: Piece | None = None
        self._out: list[torch.Tensor | None] | None = None
        self._keep: list[torch.Tensor | None] = []
        self._lists: list[list] = []
        self._list_per_sample: list[bool] = []
        self._spec: Spec | None = None

    @property
    def empty(self) -> bool:
        return self.n == 0

    @property
    def indexed(self) -> bool:
        """Whether its pieces carry the items' dataset indices (as their last tensor)."""
        return self._spec is not None and self._spec[0] == "I"

    @property
    def holds_views(self) -> bool:
        """True while the batch still points into a producer slot (not yet copied)."""
        return self._first is not None

    def add(self, piece: Piece) -> None:
        if piece.n == 0:
            return
        if self._first is None and self._out is None:
            self._first = piece
            self._spec = piece.spec
            self.n = piece.n
            if piece.is_view:
                return
            self.materialize()  # a rank's strided part: copied at once (see Piece.view)
            return
        if self._first is not None:
            self.materialize()
        self._copy_in(piece)

    def materialize(self) -> None:
        """Copy the pieces gathered so far out of shared memory (before their release)."""
        first = self._first
        if first is None:
            return
        check_cuttable(first)
        self._first = None
        self._spec = first.spec
        self._out = []
        # Elements that are not per-sample are kept from the first piece: copied, since its
        # slot is released before the batch is used.
        # (None for the per-sample ones: a view kept here would keep the slot's memory.)
        self._keep = [None if first._per_sample(t) else t.clone() for t in first.leaves]
        for t in first.leaves:
            if first._per_sample(t):
                self._out.append(torch.empty((self.size, *t.shape[1:]), dtype=t.dtype, device=t.device))
            else:
                self._out.append(None)
        lists = plain_lists(first.spec)
        self._list_per_sample = [len(v) == first.count for v in lists]
        self._lists = [[] if ps else list(v) for v, ps in zip(lists, self._list_per_sample)]
        self.n = 0
        self._copy_in(first)

    def _copy_in(self, piece: Piece) -> None:
        assert self._out is not None
        m = piece.n
        check_cuttable(piece)
        if len(piece.leaves) != len(self._out):
            raise ShareError(
                "cannot join producer batches of different structure into one consumer batch; "
                "use batch_size=None or a batch size that divides the producer's"
            )
        for i, (t, out) in enumerate(zip(piece.leaves, self._out)):
            if out is None:
                continue
            if not piece._per_sample(t) or t.shape[1:] != out.shape[1:] or t.dtype != out.dtype:
                raise ShareError(
                    f"cannot join producer batches into one consumer batch: tensor {i} has "
                    f"shape {tuple(t.shape)} {t.dtype} in one and {tuple(out.shape[1:])} per "
                    f"sample {out.dtype} in another; use batch_size=None or a batch size "
                    "that divides the producer's"
                )
            out[self.n : self.n + m].copy_(piece.rows(t))
        for j, values in enumerate(plain_lists(piece.spec)):
            if j < len(self._lists) and self._list_per_sample[j]:
                self._lists[j].extend(piece.values(values))
        self.n += m

    def last_rows(self) -> torch.Tensor:
        """The batch's rows of its last tensor (the items' indices, where the producer
        sends them)."""
        if self._first is not None:
            return self._first.rows(self._first.leaves[-1])
        assert self._out is not None and self._out[-1] is not None
        return self._out[-1][: self.n]

    def result(self) -> Any:
        if self._first is not None:
            return self._first.view()
        assert self._out is not None and self._spec is not None
        leaves = [keep if out is None else out[: self.n] for out, keep in zip(self._out, self._keep)]
        it = iter(self._lists)
        spec = map_plain_lists(self._spec, lambda _v: next(it))
        return unflatten(spec, cast("list[torch.Tensor]", leaves))  # kept wherever out is None


def check_cuttable(piece: Piece) -> None:
    """Raise if the piece's producer batch holds a per-sample element that cannot be cut."""
    path = _uncuttable(piece.spec, piece.leaves, piece.count, "batch")
    if path is not None:
        raise ShareError(
            f"{path} holds one element per sample ({piece.count}) that are not plain values "
            "(int, float, bool, str, bytes, None), which a consumer cannot cut to its own batch "
            "size: use batch_size=None (the producer's batches as they are), or collate them into "
            "a tensor or a list of plain values"
        )


def _uncuttable(spec: Spec, leaves: list[torch.Tensor], count: int, path: str) -> str | None:
    """Where ``spec`` holds a list or tuple of ``count`` elements none of which holds a
    per-sample tensor or list (so: one per sample, not the batch's structure), if anywhere."""
    kind = spec[0]
    if kind == "I":
        return _uncuttable(spec[1], leaves, count, path)
    if kind in ("tuple", "list"):
        children = [(f"{path}[{i}]", node) for i, node in enumerate(spec[1])]
        structure = any(_per_sample(n, leaves, count) for _, n in children)
        if count > 1 and len(children) == count and not structure:
            return path
    elif kind == "nt":
        children = [(f"{path}.{f}", node) for f, node in zip(spec[1]._fields, spec[2])]
    elif kind == "dict":
        children = [(f"{path}[{k!r}]", node) for k, node in spec[1]]
    elif kind == "dc":
        children = [(f"{path}.{f}", node) for f, node in spec[2]]
    else:
        return None
    for child_path, node in children:
        found = _uncuttable(node, leaves, count, child_path)
        if found is not None:
            return found
    return None


def _per_sample(spec: Spec, leaves: list[torch.Tensor], count: int) -> bool:
    """Whether ``spec`` holds a per-sample tensor or list of plain values."""
    kind = spec[0]
    if kind == "T":
        t = leaves[spec[1]]
        return t.dim() >= 1 and t.shape[0] == count
    if kind == "P":
        return len(spec[1]) == count
    if kind in ("tuple", "list"):
        return any(_per_sample(n, leaves, count) for n in spec[1])
    if kind == "nt":
        return any(_per_sample(n, leaves, count) for n in spec[2])
    if kind in ("dict", "dc"):
        return any(_per_sample(n, leaves, count) for _, n in spec[1 if kind == "dict" else 2])
    return kind == "I" and _per_sample(spec[1], leaves, count)
