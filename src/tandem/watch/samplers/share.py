"""tandem share inside the run: its producers' and consumers' pace, lag and data stall.

Each sample asks the live producers on this host for their statistics (the same query as
``tandem share ls``) and keeps what belongs to the run: a producer whose process is in the
run's tree, and every consumer in the run's tree, whichever producer (in this run or
another) it reads from. Data stall is the time a consumer waited for a batch: the figure
that says whether the loader keeps the model fed.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from tandem.share.stats import query_all
from tandem.watch.samplers.base import Sampler

_UNSAFE = re.compile(r"[^A-Za-z0-9_.\- ]")


def metric_name(name: str) -> str:
    """A share's name as it stands in metric keys."""
    return _UNSAFE.sub("_", name)  # MLflow metric keys allow letters, digits, _ - . space /


class ShareSampler(Sampler):
    name = "share"

    def __init__(self, run_pids: Callable[[], Iterable[int]], timeout: float = 0.5):
        self._run_pids = run_pids
        self._timeout = timeout

    def available(self) -> tuple[bool, str]:
        return True, ""  # reports nothing until a producer or consumer runs in the run

    def sample(self) -> dict[str, float]:
        pids = set(self._run_pids())
        if not pids:
            return {}
        out: dict[str, float] = {}
        for reply in query_all(self._timeout):
            if isinstance(reply, dict):  # a producer that did not answer
                continue
            name = metric_name(reply.name)
            if reply.pid in pids:
                p = f"system/share/{name}/producer/"
                out[p + "batches_per_s"] = reply.batches_per_s
                out[p + "published_batches"] = float(reply.published)
                out[p + "blocked_seconds"] = reply.blocked_s
                out[p + "consumers"] = float(len(reply.consumers))
                out[p + "slab_bytes"] = float(reply.slab_bytes)
            for c in reply.consumers:
                if c.pid not in pids:
                    continue
                p = f"system/share/{name}/consumer_{c.consumer_id}/"
                out[p + "batches_per_s"] = c.batches_per_s
                out[p + "samples"] = float(c.samples)
                out[p + "lag_batches"] = float(c.lag)
                out[p + "stall_seconds"] = c.stall_s
                out[p + "missed_batches"] = float(c.missed_batches)
        return out
