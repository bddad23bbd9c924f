"""The GPU share benchmark's arithmetic, pure: rates over the union of the jobs' windows,
epoch accounting (samples lost and duplicated), worker counts."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

import numpy as np


# --------------------------------------------------------------------------- pure parts
def samples_at(timeline: Sequence[tuple[float, int]], t: float) -> float:
    """A job's samples trained by time ``t``, from its ``(step end time, samples so far)``
    timeline, linear between steps (0 before the first, all after the last)."""
    if not timeline or t <= timeline[0][0]:
        return 0.0 if not timeline or t < timeline[0][0] else float(timeline[0][1])
    for (ta, sa), (tb, sb) in zip(timeline, timeline[1:]):
        if t <= tb:
            return sa + (sb - sa) * (t - ta) / (tb - ta) if tb > ta else float(sb)
    return float(timeline[-1][1])


def union_rate(
    windows: Iterable[tuple[float, float]], timelines: Iterable[Sequence[tuple[float, int]]]
) -> tuple[float, float, float, int]:
    """All jobs' rate over the union of their timed windows ``(start, end)``:
    ``(samples/s, first start, last end, samples)``. The span runs from the earliest start
    to the latest end, so a job that starts late or ends early lowers the rate (unlike a sum
    of per-job rates, which counts each job over its own window only); every sample any job
    trained inside the span counts, from the jobs' timelines (another job's warm-up or
    cool-down steps inside the span included: they are work done in it)."""
    windows = [w for w in windows if w[1] > w[0]]
    if not windows:
        return 0.0, 0.0, 0.0, 0
    t0 = min(w[0] for w in windows)
    t1 = max(w[1] for w in windows)
    samples = round(sum(samples_at(tl, t1) - samples_at(tl, t0) for tl in timelines))
    return samples / (t1 - t0), t0, t1, samples


def epoch_accounting(epochs: Sequence[Sequence[int]], size: int, expected_epochs: int) -> tuple[int, int]:
    """``(lost, duplicated)`` samples of one job, from the dataset indices it trained on in
    each epoch; each epoch should be exactly a permutation of ``range(size)``. Lost: indices
    an epoch missed (a missing epoch loses them all). Duplicated: indices an epoch had more
    than once, plus indices out of range and any epoch beyond ``expected_epochs``."""
    lost = dup = 0
    for e in range(max(expected_epochs, len(epochs))):
        idx = np.asarray(epochs[e] if e < len(epochs) else (), dtype=np.int64).reshape(-1)
        if e >= expected_epochs:
            dup += idx.size
            continue
        valid = (idx >= 0) & (idx < size)
        counts = np.bincount(idx[valid], minlength=size)
        lost += int((counts == 0).sum())
        dup += int(np.maximum(counts - 1, 0).sum()) + int((~valid).sum())
    return lost, dup


def label_mismatches(
    indices: Sequence[Sequence[int]], labels: Sequence[Sequence[int]], truth: np.ndarray
) -> int:
    """Samples whose label is not the dataset's label of their index."""
    bad = 0
    for given_idx, given_lab in zip(indices, labels):
        idx = np.asarray(given_idx, dtype=np.int64).reshape(-1)
        lab = np.asarray(given_lab, dtype=np.int64).reshape(-1)
        if idx.size != lab.size:
            bad += max(idx.size, lab.size)
            continue
        ok = (idx >= 0) & (idx < truth.size)
        bad += int((~ok).sum()) + int((truth[idx[ok]] != lab[ok]).sum())
    return bad


def private_workers(setting: int | str, jobs: int, cores: int) -> int:
    """Loader workers per private job: the cores shared out among the jobs (at most 8)."""
    if setting == "auto":
        return max(1, min(8, (cores - jobs) // jobs))
    return int(setting)


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
