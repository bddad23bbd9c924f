"""How many loader workers a producer runs when not told (:func:`auto_workers`).

Apart from :mod:`tandem.share._order` because it imports no torch: the job manager sizes a
share's producer with it (:meth:`tandem.share.spec.ShareSpec.loader_workers`), and the daemon
importing torch for that took 1.8 CPU-s of its loop at a sweep's first start, while the
sweep's jobs waited for that pass.
"""

from __future__ import annotations

import math
import os

MAX_AUTO_WORKERS = 8


def auto_workers(reserved_cpus: float | None = None) -> int:
    """How many loader workers to run when not told: the cores the producer was given less
    one for itself (``reserved_cpus``, as the job manager reserves them), else the cores the
    jobs leave free now (this process's cores less those busy over a quarter second), less
    one, but at least one where there are two cores: the jobs it feeds are often that load,
    and with none the producer's one thread decoded for all of them (measured on a busy
    2-core machine: auto gave 0); at most 8."""
    import psutil

    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = psutil.cpu_count() or 1
    # A worker decodes with one torch thread; the producer's own thread decoding with torch's
    # default threads (one per core) spins them against the jobs it feeds: under the manager
    # (one core reserved on 2 cores, no worker) it used 33 CPU-s where one worker used 19.
    least = 1 if cores >= 2 else 0
    if reserved_cpus is not None:
        return max(least, min(MAX_AUTO_WORKERS, math.ceil(reserved_cpus) - 1))
    busy = psutil.cpu_percent(interval=0.25) / 100.0 * (psutil.cpu_count() or cores)
    return max(least, min(MAX_AUTO_WORKERS, int(cores - busy) - 1))
