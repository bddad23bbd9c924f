"""The Hugging Face ``Trainer`` reading its training data from a shared producer
(``pip install transformers``).

::

    from tandem.share.hf import SharedTrainer

    trainer = SharedTrainer(model=model, args=args, train_dataset=train, data_collator=collate)
    trainer.train()

:class:`SharedTrainer` is the ``Trainer`` with one method changed: the training loader it
builds (after removing the columns the model does not take, with its collator and workers,
prepared by Accelerate) is made a drop-in with :func:`~tandem.share.shared`, so that every
process on the host training on the same data reads one producer (under ``tandem submit``,
a producer job of the daemon's). Under ``torchrun``/``accelerate launch`` each rank reads
its own part of every epoch. Evaluation reads the ``Trainer``'s own loader.

The ``Trainer``'s worker-init function seeds each loader worker from its rank; the producer's
workers serve every rank, so it is given rank 0's (the ranks then build one loader, and
read one producer). Resuming mid-epoch (``resume_from_checkpoint``): Accelerate's
``skip_first_batches`` builds a loader of torch's for the rest of that epoch, which reads
privately, in an order of its own; the epochs after it are shared again.
"""

from __future__ import annotations

import functools
from typing import Any

import transformers

from tandem.share.library_loaders import shared
from tandem.share.loader import DataLoader


class SharedTrainer(transformers.Trainer):
    """``transformers.Trainer`` whose training loader reads from the host's producer of
    its data (see the module)."""

    def get_train_dataloader(self) -> DataLoader:
        loader = shared(super().get_train_dataloader())
        loader.worker_init_fn = _rank_free(loader.worker_init_fn)
        return loader


def _rank_free(init: Any) -> Any:
    """The ``Trainer``'s ``seed_worker`` bound to rank 0 (the producer's workers are every
    rank's); any other function as it is."""
    if isinstance(init, functools.partial) and "rank" in init.keywords:
        return functools.partial(init.func, *init.args, **{**init.keywords, "rank": 0})
    return init
