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

from typing import TYPE_CHECKING

from tandem.share._registry import live_producers
from tandem.share.errors import (
    BatchKeptWarning,
    ConsumerInterrupted,
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

if TYPE_CHECKING:  # for type checkers and IDEs; at run time they load on first use
    from tandem.share._workers import auto_workers
    from tandem.share.consumer import Consumer, clone_batch
    from tandem.share.library_loaders import shared
    from tandem.share.loader import DataLoader
    from tandem.share.producer import Producer

# Producer and Consumer import torch (seconds); loaded on first use (PEP 562), so that
# `tandem share ls` and the registry need only the standard library.
_LAZY = {
    "Consumer": "consumer",
    "clone_batch": "consumer",
    "Producer": "producer",
    "DataLoader": "loader",
    "shared": "library_loaders",
    "auto_workers": "_workers",
}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f"tandem.share.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'tandem.share' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "DataLoader",
    "shared",
    "Consumer",
    "ConsumerInterrupted",
    "ConsumerTimeout",
    "BatchKeptWarning",
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
    "auto_workers",
    "clone_batch",
    "live_producers",
]
