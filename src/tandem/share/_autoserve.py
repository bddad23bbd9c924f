"""The producer a drop-in :class:`~tandem.share.loader.DataLoader` starts when none serves
its data yet: ``python -m tandem.share._autoserve SPEC``.

``SPEC`` is a private file (0600, in the runtime directory) written by the first loader to
arrive: an :class:`AutoSpec`, whose ``payload`` is what a ``DataLoader`` would send its
workers (the dataset, the collate and worker-init functions), pickled by value where they
were defined in the training script (cloudpickle), so that this process needs neither the
script nor its ``if __name__ == "__main__"`` guard. It serves, each epoch in the order the
loader's options say, until no consumer has been attached for ``linger_s`` (a reader between
epochs, or the next process of a sweep, comes back within it), then ends and removes SPEC.
Its output goes to ``SPEC`` with the suffix ``.log``, which the loader shows where it fails.
"""

from __future__ import annotations

import pickle
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LINGER_S = 60.0  # without a consumer, then it ends


@dataclass(frozen=True)
class AutoSpec:
    """What the first loader asks its producer to serve."""

    name: str
    payload: bytes  # cloudpickle of (dataset, collate_fn, worker_init_fn)
    batch_size: int
    shuffle: bool
    seed: int
    num_workers: int | str
    linger_s: float = LINGER_S
    python: str | None = None  # the loader's interpreter (a job manager's producer runs it)
    # Where the loader's process found its own modules (its script's folder, say): searched
    # after this process's own paths, never before them (a folder the producer starts in
    # is not one of them: nothing is imported from a working directory).
    paths: tuple[str, ...] = ()

    @staticmethod
    def read(path: Path) -> AutoSpec:
        with path.open("rb") as f:
            spec = pickle.load(f)
        if not isinstance(spec, AutoSpec):
            raise ValueError(f"{path}: not a drop-in loader's spec")
        return spec

    def objects(self) -> tuple[Any, Any, Any]:
        """``(dataset, collate_fn, worker_init_fn)`` as the loader pickled them."""
        import cloudpickle  # noqa: F401 - what the payload's by-value parts need to load

        sys.path.extend(p for p in self.paths if p not in sys.path)
        dataset, collate_fn, worker_init_fn = pickle.loads(self.payload)
        return dataset, collate_fn, worker_init_fn

    def write(self, path: Path) -> None:
        import os

        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            pickle.dump(self, f)
        os.replace(tmp, path)


def _linger(producer: Any, linger_s: float, done: threading.Event) -> None:
    """Stop ``producer`` once no consumer has been attached for ``linger_s``."""
    last_seen = time.monotonic()
    while not done.wait(0.5):
        if producer.stats().consumers:
            last_seen = time.monotonic()
        elif time.monotonic() - last_seen >= linger_s:
            producer.stop(f"no reader for {linger_s:g} s")
            return


def main(spec_file: str) -> int:
    path = Path(spec_file)
    spec = AutoSpec.read(path)
    from tandem.share.errors import ProducerExists
    from tandem.share.producer import Producer

    dataset, collate_fn, worker_init_fn = spec.objects()
    producer = Producer.from_dataset(
        dataset,
        spec.name,
        batch_size=spec.batch_size,
        shuffle=spec.shuffle,
        seed=spec.seed,
        num_workers=spec.num_workers,
        collate_fn=collate_fn,
        worker_init_fn=worker_init_fn,
    )
    try:
        producer.start()  # claims the name
    except ProducerExists:  # another loader's producer came first: it serves them all
        return 0
    done = threading.Event()
    watcher = threading.Thread(target=_linger, args=(producer, spec.linger_s, done), daemon=True)
    watcher.start()
    try:
        producer.serve()
    finally:
        done.set()
        path.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    # As the module it is, not __main__: the spec unpickles as tandem.share._autoserve.AutoSpec.
    from tandem.share._autoserve import main as module_main

    sys.exit(module_main(sys.argv[1]))
