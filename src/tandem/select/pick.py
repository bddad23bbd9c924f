"""From scores to the selected indices: the budget, the direction, class balance.

Every method states which end of its scores it keeps (``low`` or ``high``). With
``balance`` and labels, each class gets a share of the budget proportional to its size
(largest remainders first), and the best of each class by score fill it; ties go to the
lower index, so a selection is the same on every machine.
"""

from __future__ import annotations

import numbers

import numpy as np

from tandem.select.errors import SelectError


def parse_budget(text: str) -> float | int:
    """A budget as written (``0.3``, ``300``): a count where it is a whole number of at
    least 1 written without a point, else a fraction (``1.0`` is all of it)."""
    try:
        number = float(text)
    except ValueError:
        raise SelectError(f"budget {text!r}: a fraction (0.3) or a count of items (300)") from None
    return int(number) if number.is_integer() and number >= 1 and "." not in text else number


def budget_count(budget: float | int, n: int) -> int:
    """How many of ``n`` items a budget keeps: a fraction in (0, 1] or a count in [1, n]."""
    if isinstance(budget, bool) or not isinstance(budget, numbers.Real):
        raise SelectError(f"budget {budget!r}: a fraction (0.3) or a count of items (300)")
    if isinstance(budget, numbers.Integral) or (
        isinstance(budget, float) and budget > 1 and budget.is_integer()
    ):
        count = int(budget)
        if not 1 <= count <= n:
            raise SelectError(f"budget {count}: the dataset has {n} items; keep 1 to {n}")
        return count
    if not 0 < float(budget) <= 1:
        raise SelectError(f"budget {budget}: a fraction must be above 0 and at most 1 (or give a count)")
    return max(1, round(float(budget) * n))


def order(scores: np.ndarray, keep: str) -> np.ndarray:
    """Indices from the most to the least wanted (stable: ties by index)."""
    key = scores if keep == "low" else -scores
    return np.argsort(key, kind="stable")


def quotas(labels: np.ndarray, count: int) -> dict[int, int]:
    classes, sizes = np.unique(labels, return_counts=True)
    exact = sizes * count / sizes.sum()
    base = np.floor(exact).astype(int)
    for i in np.argsort(-(exact - base), kind="stable")[: count - int(base.sum())]:
        base[i] += 1
    return {int(c): int(q) for c, q in zip(classes, base)}


def top(scores: np.ndarray, keep: str, count: int, labels: np.ndarray | None, balance: bool) -> np.ndarray:
    """The ``count`` most wanted indices, sorted (int64)."""
    ranked = order(scores, keep)
    if not balance or labels is None:
        return np.sort(ranked[:count]).astype(np.int64)
    wanted = quotas(labels, count)
    chosen = [ranked[labels[ranked] == c][:q] for c, q in wanted.items()]
    return np.sort(np.concatenate(chosen)).astype(np.int64)
