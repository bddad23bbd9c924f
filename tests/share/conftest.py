from __future__ import annotations

import multiprocessing as mp
import os
import queue as queue_mod
import signal
import time
from pathlib import Path

import pytest

from tests.timing import scaled

CTX = mp.get_context("spawn")


class Procs:
    """Starts real processes (spawn) and reaps every one of them at teardown."""

    def __init__(self):
        self.procs: list = []
        self.queue = CTX.Queue()
        self._queues: list = []

    def own_queue(self):
        """A queue for a child the test will kill: a SIGKILL while it writes to the shared
        queue would leave that queue's lock held, and every other child blocked on it."""
        q = CTX.Queue()
        self._queues.append(q)
        return q

    def start(self, target, *args, **kwargs):
        p = CTX.Process(target=target, args=args, kwargs=kwargs, daemon=True)
        p.start()
        self.procs.append(p)
        return p

    def queue_get(self, timeout):
        """The next message within ``timeout`` s (already a scaled deadline's remainder)."""
        try:
            return self.queue.get(timeout=timeout)
        except queue_mod.Empty:
            raise AssertionError(f"no message from a child within {timeout:.1f} s") from None

    def event(self):
        return CTX.Event()

    def get(self, timeout=60.0):
        timeout = scaled(timeout)
        try:
            return self.queue.get(timeout=timeout)
        except queue_mod.Empty:
            raise AssertionError(f"no message from a child within {timeout} s") from None

    def errors(self, n, timeout=10.0):
        """The next ``n`` ("error", ...) reports (of consume_forever), others skipped; each
        within ``timeout`` seconds of the one before."""
        found = []
        while len(found) < n:
            msg = self.get(timeout=timeout)  # scaled there
            if msg[0] == "error":
                found.append(msg)
        return found

    def collect(self, tags, timeout=60.0):
        """Gather messages until every tag said 'done'; returns {tag: {epoch: (ids, sizes)}}."""
        results: dict = {t: {} for t in tags}
        pending = set(tags)
        deadline = time.monotonic() + scaled(timeout)
        while pending:
            msg = self.queue_get(max(0.1, deadline - time.monotonic()))
            tag, what = msg[0], msg[1]
            if tag not in results:
                continue  # another child's report
            if what == "error":
                raise AssertionError(f"consumer {tag} failed: {msg[2]}")
            if what == "done":
                results[tag]["stats"] = msg[2]
                pending.discard(tag)
            elif what == "paused":
                continue
            elif what == "start":
                results[tag]["start"] = msg[2]
            else:
                results[tag][what] = (msg[2], msg[3])
        return results

    def close(self):
        for p in self.procs:
            if p.is_alive():
                p.kill()
            p.join(10)
        for q in [self.queue, *self._queues]:
            q.close()


@pytest.fixture
def procs():
    p = Procs()
    yield p
    p.close()


def wait_for(predicate, timeout=20.0, interval=0.02, what="condition"):
    timeout = scaled(timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@pytest.fixture
def drop_in_producers_end(runtime_dir: str, monkeypatch):
    """Producers that a test's drop-in loaders start go with it (they would linger a minute)."""
    monkeypatch.setenv("TANDEM_SHARE_LINGER_S", "2")
    yield
    for lock in Path(runtime_dir).glob("auto-*.lock"):
        try:
            os.kill(int(lock.read_text().split()[0]), signal.SIGTERM)
        except (OSError, ValueError, IndexError):
            pass
