"""A producer served on a thread of the test process, stopped and joined at the end."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from tandem.share import Producer
from tests.timing import scaled


@contextlib.contextmanager
def serving(producer: Producer, epochs: int | None = None) -> Iterator[list]:
    """Serve ``producer`` on a thread; yields the list its error (if any) lands in."""
    errors: list = []

    def run() -> None:
        try:
            producer.serve(epochs=epochs)
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield errors
    finally:
        producer.stop()
        thread.join(scaled(30))
        assert not thread.is_alive(), "the producer did not stop"
