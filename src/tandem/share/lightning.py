"""A ``LightningDataModule`` over a shared dataset (``pip install tandem[lightning]``).

::

    from tandem.share.lightning import SharedDataModule

    data = SharedDataModule("imagenet", batch_size=64)        # the producer's name
    trainer.fit(model, datamodule=data)                       # ckpt_path=... resumes exactly

Training batches come from a :class:`~tandem.share.Consumer` made when Lightning asks for
them: under DDP each rank gets its own part of every epoch (rank and world size from
``torch.distributed``), and the consumer's position goes into Lightning's checkpoints, so
that a run resumed mid-epoch trains on exactly the items that epoch had not yet seen. Under
DDP the state is the whole job's (every rank's items, gathered when Lightning saves), so the
one state Lightning keeps, rank 0's, resumes every rank.
Validation and test data are the user's own loaders (``val_dataloader=``), since a share
serves one stream.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning

from tandem.share.consumer import Consumer


class SharedDataModule(lightning.LightningDataModule):
    """``name``: the producer's (or ``None``: ``$TANDEM_SHARE``, as the job manager sets
    it). Other keyword arguments go to :class:`~tandem.share.Consumer` (``transform=``,
    ``device=``, ``drop_last=``, ...). ``val_dataloader``/``test_dataloader``: functions
    that return those loaders."""

    def __init__(
        self,
        name: str | None = None,
        batch_size: int | None = None,
        *,
        val_dataloader: Callable[[], Any] | None = None,
        test_dataloader: Callable[[], Any] | None = None,
        **consumer_kwargs: Any,
    ):
        super().__init__()
        self.name = name
        self.batch_size = batch_size
        self._consumer_kwargs = consumer_kwargs
        # Set only when given: Lightning runs a loop for a hook the module overrides.
        if val_dataloader is not None:
            self.val_dataloader = val_dataloader  # type: ignore[method-assign]
        if test_dataloader is not None:
            self.test_dataloader = test_dataloader  # type: ignore[method-assign]
        self._consumer: Consumer | None = None
        self._resume: dict[str, Any] | None = None

    def train_dataloader(self) -> Consumer:
        if self._consumer is not None:
            self._consumer.close()  # a reload: the old one must not hold the others
        if self.name is None:
            consumer = Consumer.from_env(batch_size=self.batch_size, **self._consumer_kwargs)
        else:
            consumer = Consumer(self.name, batch_size=self.batch_size, **self._consumer_kwargs)
        if self._resume is not None:
            consumer.load_state_dict(self._resume)
            self._resume = None
        self._consumer = consumer
        return consumer

    def state_dict(self) -> dict[str, Any]:
        return {"consumer": self._consumer.state_dict()} if self._consumer is not None else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        consumer_state = state_dict.get("consumer")
        if consumer_state is None:
            return
        if self._consumer is not None:
            self._consumer.load_state_dict(consumer_state)
        else:
            self._resume = consumer_state

    def teardown(self, stage: str) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
