"""What a consumer has delivered of its current epoch, for ``Consumer.state_dict()``, and
after ``load_state_dict()`` which items of the interrupted epoch to skip.

A producer that owns the order (``Producer.from_dataset`` over a map-style dataset) sends
each batch's dataset indices along (:mod:`tandem.share._tree`'s ``"I"`` node): the state is
then the set of items delivered, and a resumed consumer's first epoch delivers exactly the
others, in the order the stream brings them. Over a source without indices (an iterable
one) the state is only a count, and a resumed epoch skips that many samples: exact only if
the source yields the same order every pass.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

STATE_VERSION = 1


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

    def begin(self, size: int | None) -> None:
        self.size = size
        self.skip, self.skip_samples = self._pending if self._pending is not None else (None, 0)
        self._pending = None
        self.seen = self.skip.copy() if self.skip is not None else None
        self.samples = self.skip_samples if self.skip is None else int(self.skip.sum())
        self.in_epoch = True

    def end(self) -> None:
        self.in_epoch = False
        self.skip, self.skip_samples = None, 0

    def delivered(self, indices: torch.Tensor | None, samples: int) -> None:
        self.samples += samples
        if indices is None or self.size is None:
            return
        if self.seen is None:
            self.seen = np.zeros(self.size, dtype=bool)
        self.seen[indices.numpy()] = True

    def unseen(self, indices: torch.Tensor) -> torch.Tensor | None:
        """Which of these rows to deliver in a resumed epoch (None: all of them)."""
        if self.skip is None:
            return None
        return torch.from_numpy(~self.skip[indices.numpy()]).nonzero().flatten()

    # ------------------------------------------------------------------------ state
    def state(self, per_epoch: int | None) -> dict[str, Any]:
        complete = not self.in_epoch or (per_epoch is not None and self.samples >= per_epoch)
        seen = None
        if not complete and self.seen is not None:
            seen = torch.from_numpy(np.packbits(self.seen))
        return {
            "version": STATE_VERSION,
            "size": self.size,
            "samples": 0 if complete else self.samples,
            "seen": seen,  # packed bits by dataset index, or None
        }

    def load(self, state: dict[str, Any], size: int | None) -> None:
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise ValueError(
                "not a tandem consumer state (Consumer.state_dict() of this tandem version); "
                f"got {type(state).__name__}"
            )
        seen = state["seen"]
        if seen is not None:
            if size is not None and state["size"] != size:
                raise ValueError(
                    f"the state is of an epoch of {state['size']} items, but this producer's epoch "
                    f"has {size}: it serves another dataset (or selection)"
                )
            bits = np.unpackbits(np.asarray(seen, dtype=np.uint8))[: state["size"]].astype(bool)
            self._pending = (bits, 0)
        else:
            self._pending = (None, int(state["samples"]))
