"""Shared data loading: one producer process feeds many training processes, zero-copy.

    # producer process
    with Producer.from_dataset(dataset, "imagenet", batch_size=64, shuffle=True) as p:
        p.serve(epochs=10)

    # each training process
    for batch in Consumer("imagenet", batch_size=32):
        ...

See :mod:`tandem.share.protocol` for the wire protocol and :mod:`tandem.share.order` for
how epochs work for consumers that join late.
"""

from tandem.share.consumer import Consumer, clone_batch
from tandem.share.errors import (
    ConsumerTimeout,
    MissedBatchesWarning,
    ProducerError,
    ProducerExists,
    ProducerFinished,
    ProducerGone,
    ProducerNotFound,
    ProducerStopped,
    ProtocolError,
    RefusedByProducer,
    ShareError,
    UnsupportedBatch,
)
from tandem.share.producer import Producer
from tandem.share.registry import live_producers

__all__ = [
    "Consumer",
    "ConsumerTimeout",
    "MissedBatchesWarning",
    "Producer",
    "ProducerError",
    "ProducerExists",
    "ProducerFinished",
    "ProducerGone",
    "ProducerNotFound",
    "ProducerStopped",
    "ProtocolError",
    "RefusedByProducer",
    "ShareError",
    "UnsupportedBatch",
    "clone_batch",
    "live_producers",
]
