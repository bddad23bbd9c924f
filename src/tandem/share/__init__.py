"""Shared data loading: one producer process feeds many training processes, zero-copy.

    # producer process
    with Producer.from_dataset(dataset, "imagenet", batch_size=64, shuffle=True) as p:
        p.serve(epochs=10)

    # each training process
    for batch in Consumer("imagenet", batch_size=32):
        ...

The public API is what this package exports; modules with a leading ``_`` are internal.
The layers, top down:

* ``producer`` / ``consumer``: the public classes. ``_order`` (epochs, late joiners'
  cuts) and ``_rebatch`` (a consumer's own batch size) hold their semantics.
* ``_window`` (the producer's entries, slots and pacing policy, as pure state) and
  ``_control`` (the producer's thread that admits and answers consumers).
* transports: ``_transport`` (the producer's view of each consumer, a *link*) and
  ``_channel`` (the consumer's), each over the announcement table (``_table``) or the socket.
* ``protocol``: the one definition of the messages between the two sides.
* data plane: ``_slab`` (shared memory the batches are written into once), ``_tree``
  (batch structures), ``_cuda`` (copies to a GPU).
* ``tandem._ipc``: the private runtime directory and framed Unix sockets, shared with
  tandem's other local endpoints; ``_registry`` names producers there.
"""

from tandem.share._registry import live_producers
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
