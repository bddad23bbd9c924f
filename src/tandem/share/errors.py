"""Exceptions raised by tandem.share, each named for what went wrong."""

from __future__ import annotations


class ShareError(Exception):
    """Base class of every error tandem.share raises."""


class ProducerNotFound(ShareError):
    """No producer serves the requested name (within the consumer's timeout)."""


class ProducerExists(ShareError):
    """A producer with this name is already live on this host."""


class ProducerGone(ShareError):
    """The producer died or closed the connection while this consumer was attached."""


class ProducerStopped(ShareError):
    """The producer stopped (signal, ``stop()``) before this consumer's epoch was complete."""


class ProducerFinished(ShareError):
    """The producer has served every epoch it was asked to; there is no further epoch."""


class ProducerError(ShareError):
    """The producer failed while loading or publishing a batch; the message says where."""


class ConsumerTimeout(ShareError):
    """The consumer waited longer than its ``timeout`` for the producer to answer."""


class RefusedByProducer(ShareError):
    """The producer refused this consumer (protocol version, bad options, shutting down)."""


class ReaderSetAside(ShareError):
    """The producer set this consumer aside: it took no batch for its ``aside_after_s``
    while other readers waited, so they went on without it. Its epoch continues on a new
    consumer given this one's ``state_dict()`` (the drop-in loader does so itself)."""


class UnsupportedBatch(ShareError, TypeError):
    """A batch holds an element tandem cannot carry; the message names where it sits."""


class ProtocolError(ShareError):
    """A control message could not be understood."""


class MissedBatchesWarning(UserWarning):
    """Under the ``"skip"`` policy, this consumer fell behind and missed batches."""


class BatchKeptWarning(UserWarning):
    """A batch was still referenced when its shared memory went back to the producer (past
    the consumer's contract); it was copied out so that it stays correct."""


class ConsumerInterrupted(SystemExit):
    """SIGTERM arrived while the consumer waited for the producer: the process ends (exit
    status 143) as it would without a handler, once the handler it had (Lightning's, which
    only notes the signal) has run. A ``SystemExit``, as Lightning's own ``SIGTERMException``."""
