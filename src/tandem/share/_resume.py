"""What a consumer has delivered of its current epoch, for ``Consumer.state_dict()``, and
after ``load_state_dict()`` which items of the interrupted epoch to skip.

A producer that owns the order (``Producer.from_dataset`` over a map-style dataset) sends
each batch's dataset indices along (:mod:`tandem.share._tree`'s ``"I"`` node): the state is
then the set of items delivered, and a resumed consumer's first epoch delivers exactly the
others, in the order the stream brings them. Over a source without indices (an iterable
one) the state is only a count, and a resumed epoch skips that many samples: exact only if
the source yields the same order every pass.

The ranks of a job are one state: the items every rank has delivered (gathered when the
state is taken, see :func:`merge`), since a framework saves one rank's state and every rank
loads it. A resumed group splits the items none of them had seen: the ``j``-th unseen item of
the stream goes to rank ``j % W``, below ``W * (unseen // W)`` of them, so that every rank
has as many (as ``DistributedSampler(drop_last=True)``).

A state names the share and the dataset it was taken of (its length and fingerprint), and
is refused for another; one taken at an epoch's end resumes the next epoch, whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

STATE_VERSION = 2


@dataclass(frozen=True)
class Identity:
    """What a state is of: the share, its dataset, the job's ranks."""

    share: str
    length: int | None  # items an epoch (None: not known yet)
    fingerprint: str  # the producer's dataset fingerprint ("" when it has none)
    world_size: int


class EpochItems:
    """The items delivered in the current epoch; the items to skip in a resumed one."""

    def __init__(self) -> None:
        self.size: int | None = None  # items in the producer's epoch
        self.seen: np.ndarray | None = None  # by dataset index, where the producer sends them
        self.samples = 0  # delivered in this epoch
        self.in_epoch = False
        self._pending: tuple[np.ndarray | None, int] | None = None  # from load(), for the next epoch
        self.skip: np.ndarray | None = None  # this epoch's items delivered before the resume
        self.skip_samples = 0  # the same, as a count (a source without indices)
        self.ordinal = 0  # a resumed group's unseen items passed so far (see the module doc)
        self.limit: int | None = None  # a resumed group takes the unseen items below this

    def begin(self, size: int | None, world_size: int) -> None:
        self.size = size
        self.skip, self.skip_samples = self._pending if self._pending is not None else (None, 0)
        self._pending = None
        self.seen = self.skip.copy() if self.skip is not None else None
        self.samples = self.skip_samples if self.skip is None else int(self.skip.sum()) // world_size
        self.ordinal = 0
        self.limit = None
        if self.skip is not None and size is not None:
            unseen = size - int(self.skip.sum())
            self.limit = unseen // world_size * world_size
        self.in_epoch = True

    def end(self) -> None:
        self.in_epoch = False
        self.skip, self.skip_samples, self.limit = None, 0, None

    def delivered(self, indices: torch.Tensor | None, samples: int) -> None:
        self.samples += samples
        if indices is None or self.size is None:
            return
        if self.seen is None:
            self.seen = np.zeros(self.size, dtype=bool)
        self.seen[indices.numpy()] = True

    def unseen(self, indices: torch.Tensor) -> torch.Tensor:
        """Which of these rows were not delivered before the resume."""
        assert self.skip is not None
        return torch.from_numpy(~self.skip[indices.numpy()]).nonzero().flatten()

    # ------------------------------------------------------------------------ state
    def state(self, who: Identity, rank: int, full_epoch: int | None) -> dict[str, Any]:
        """This rank's state; ``full_epoch``: the samples it delivers in a whole epoch."""
        done = not self.in_epoch or (full_epoch is not None and self.samples >= full_epoch)
        seen = None
        if not done and self.seen is not None:
            seen = torch.from_numpy(np.packbits(self.seen))
        samples = [0] * who.world_size
        samples[rank] = 0 if done else self.samples
        return {
            "version": STATE_VERSION,
            "share": who.share,
            "dataset": {"length": who.length, "fingerprint": who.fingerprint},
            "world_size": who.world_size,
            "epoch_done": done,
            "samples": samples,  # delivered in the epoch, by rank
            "seen": seen,  # the items delivered, packed bits by dataset index, or None
        }

    def load(self, state: Any, who: Identity, full_epoch: int | None) -> None:
        """Check ``state`` against this consumer (a clear error for another share, another
        dataset, a malformed or out-of-range state); its next epoch resumes it."""
        seen, samples = check_state(state, who, full_epoch)
        if seen is None and not any(samples):
            self._pending = None
            return
        self._pending = (seen, samples[0] if seen is None else 0)


def merge(states: list[dict[str, Any]]) -> dict[str, Any]:
    """The group's state of its ranks' states (rank ``r``'s at ``states[r]``)."""
    out = dict(states[0])
    out["samples"] = [s["samples"][r] for r, s in enumerate(states)]
    out["epoch_done"] = all(s["epoch_done"] for s in states)
    bits = [s["seen"] for s in states if s["seen"] is not None]
    out["seen"] = None
    if bits and not out["epoch_done"]:
        union = np.bitwise_or.reduce([np.asarray(b, dtype=np.uint8) for b in bits])
        out["seen"] = torch.from_numpy(union)
    return out


def check_state(state: Any, who: Identity, full_epoch: int | None) -> tuple[np.ndarray | None, list[int]]:
    """``(seen items or None, samples by rank)`` of a state this consumer may resume."""
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        version = state.get("version") if isinstance(state, dict) else None
        raise ValueError(
            "not a tandem consumer state of this version (Consumer.state_dict()); got "
            + (f"version {version!r}" if version is not None else type(state).__name__)
        )
    missing = {"share", "dataset", "world_size", "epoch_done", "samples", "seen"} - set(state)
    if missing:
        raise ValueError(f"malformed consumer state: it has no {', '.join(sorted(missing))}")
    if state["share"] != who.share:
        raise ValueError(
            f"the state is of share {state['share']!r}; this consumer reads {who.share!r}: "
            "a state resumes only the share it was taken of"
        )
    dataset = state["dataset"]
    length = dataset.get("length") if isinstance(dataset, dict) else None
    fingerprint = dataset.get("fingerprint") if isinstance(dataset, dict) else None
    if length is not None and who.length is not None and length != who.length:
        raise ValueError(
            f"the state is of an epoch of {length} items, but share {who.share!r} now serves "
            f"{who.length}: another dataset (or selection)"
        )
    if fingerprint and who.fingerprint and fingerprint != who.fingerprint:
        raise ValueError(
            f"the state is of another dataset than the one share {who.share!r} serves now "
            f"(fingerprint {fingerprint} against {who.fingerprint}): another dataset or selection"
        )
    samples = state["samples"]
    if not isinstance(samples, list) or any(type(k) is not int or k < 0 for k in samples):
        raise ValueError(f"malformed consumer state: samples must be a list of counts, got {samples!r}")
    if len(samples) != state["world_size"]:
        raise ValueError("malformed consumer state: one sample count per rank expected")
    if state["epoch_done"]:
        return None, [0] * who.world_size
    seen = _seen_items(state["seen"], length, sum(samples), len(samples))
    if seen is None:
        if len(samples) != who.world_size:
            raise ValueError(
                f"the state is of {len(samples)} ranks and this job has {who.world_size}: a state "
                "without item indices (an iterable source) resumes only the same ranks"
            )
        if full_epoch is not None and samples[0] > full_epoch:
            raise ValueError(
                f"the state has {samples[0]} samples delivered, but an epoch of this consumer has "
                f"{full_epoch}: it is not of this share, batch size and ranks"
            )
        if full_epoch is not None and samples[0] == full_epoch:
            return None, [0] * who.world_size  # taken at the epoch's end: the next is whole
        return None, [max(samples)] * who.world_size
    if who.length is not None and int(seen.sum()) >= who.length // who.world_size * who.world_size:
        return None, [0] * who.world_size  # every item the group takes was seen: the next epoch
    return seen, samples


def _seen_items(packed: Any, length: Any, total: int, world_size: int) -> np.ndarray | None:
    if packed is None:
        return None
    if type(length) is not int or length < 1:
        raise ValueError("malformed consumer state: its items come without the dataset's length")
    try:
        raw = np.asarray(packed, dtype=np.uint8).reshape(-1)
    except (TypeError, ValueError):
        raise ValueError("malformed consumer state: seen is not packed bits") from None
    if len(raw) != (length + 7) // 8:
        raise ValueError(f"malformed consumer state: seen holds {len(raw)} bytes for {length} items")
    bits = np.unpackbits(raw)[:length].astype(bool)
    if abs(int(bits.sum()) - total) >= max(1, world_size):  # ranks deliver as many each
        raise ValueError(
            f"malformed consumer state: {int(bits.sum())} items marked seen for {total} samples delivered"
        )
    return bits
