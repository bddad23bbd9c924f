"""SIGTERM ends a consumer that waits for the producer's data.

A training framework often installs a SIGTERM handler that only notes the signal (Lightning's
sets ``trainer.received_sigterm`` and lets the loop stop at the next batch). A process waiting
in ``poll`` for a batch that does not come would then retry the wait for ever: SIGTERM would
not end it. While the consumer waits, :func:`sigterm_ends_wait` chains the handler in place:
it runs it, then raises :class:`~tandem.share.errors.ConsumerInterrupted`. The default
disposition ends the process anyway, and an ignored SIGTERM stays ignored.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator
from types import FrameType

from tandem.share.errors import ConsumerInterrupted

log = logging.getLogger("tandem.share")
EXIT_STATUS = 128 + signal.SIGTERM


@contextlib.contextmanager
def sigterm_ends_wait(who: str, doing: str) -> Iterator[None]:
    """Within this block, a SIGTERM runs the process's handler, then raises."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers (and only it runs them)
        return
    previous = signal.getsignal(signal.SIGTERM)
    if not callable(previous):
        yield  # SIG_DFL ends the process already; SIG_IGN was asked for; None: not Python's
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        previous(signum, frame)
        log.warning("SIGTERM while %s from %s: the consumer's process ends", doing, who)
        raise ConsumerInterrupted(EXIT_STATUS)

    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
