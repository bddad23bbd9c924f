"""Records what timm's train.py read, without a change to train.py: tests/share/test_timm.py
puts this folder on the PYTHONPATH of its train.py runs, and Python imports it at start-up.

In a ``train.py`` process with ``$TANDEM_TEST_RECORD`` set, every batch of every
``tandem.share.DataLoader`` adds one JSON line to ``$TANDEM_TEST_RECORD/<pid>.jsonl``: which
dataset split, which pass over the loader (epoch), the batch's dataset indices
(``last_indices``: None where the loader reads privately) and the producer's pid.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any


def _install(folder: Path) -> None:
    from tandem.share.loader import DataLoader

    out = (folder / f"{os.getpid()}.jsonl").open("a", buffering=1)  # a line a batch, kept if it dies
    epochs: dict[int, int] = {}
    original = DataLoader.__iter__

    def __iter__(self: DataLoader) -> Any:
        epoch = epochs[id(self)] = epochs.get(id(self), -1) + 1
        split = os.path.basename(str(getattr(getattr(self.dataset, "reader", None), "root", "?")))
        for batch in original(self):
            indices = self.last_indices
            consumer = self._consumer
            record = {
                "split": split,
                "epoch": epoch,
                "indices": indices.tolist() if indices is not None else None,
                "producer": consumer.producer_pid if consumer is not None else None,
            }
            out.write(json.dumps(record) + "\n")
            yield batch

    DataLoader.__iter__ = __iter__  # type: ignore[method-assign]


if os.environ.get("TANDEM_TEST_RECORD") and sys.argv and sys.argv[0].endswith("train.py"):
    _install(Path(os.environ["TANDEM_TEST_RECORD"]))
