"""The selection methods: each scores every item, and states which end it keeps.

==============  =====  =========================================================  ==========
method          keeps  score                                                      needs
==============  =====  =========================================================  ==========
``random``      low    a seeded random number                                     -
``small-loss``  low    the loss after a warm-up: noisy labels are learnt last,    labels, model
                       so the small-loss end is the clean one
``el2n``        high   ``||softmax(logits) - onehot(label)||`` after a warm-up:   labels, model
                       the hardest examples (for clean data: noisy labels rank first)
``grand``       high   the norm of the example's loss gradient over all the       labels, model
                       proxy's parameters, after a warm-up: the same, by gradients
``kcenter``     low    the order greedy k-center picks it in, in the warm-up      - (model
                       model's embedding (the inputs without a model): coverage      optional)
``less``        high   LESS: the cosine of its Adam-aware gradient, randomly      labels, model,
                       projected, to the target set's mean gradient                ``target``
==============  =====  =========================================================  ==========

What a method needs is declared on it (``needs_labels``, ``needs_model``, ``model_optional``,
``needs_target``) and only there: :func:`tandem.select.select` and ``tandem select run``
read these, never a method's name. The module imports neither torch nor numpy (a method's
score imports them when it runs), so the command line can list the methods at once.

A method's ``version`` is part of every selection id: a change to what it computes gets a
new version, so stored selections of the old one are not taken for the new.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tandem.select.context import Context
from tandem.select.context import warm as _warm

if TYPE_CHECKING:
    import numpy as np

    from tandem.select.data import Items


@dataclass(frozen=True)
class Method:
    name: str
    keep: str  # "low" or "high": the end of the scores that is selected
    score: Callable[[Items, Context], np.ndarray]
    needs_labels: bool  # the dataset's items must be (input, label, ...)
    needs_model: bool  # trains a proxy: model= (--model) is required
    defaults: dict[str, Any]
    version: int = 1
    needs_target: bool = False  # selects for a labelled target set: target= (--target) is required
    model_optional: bool = False  # uses model= when given (another selection), works without

    def __post_init__(self) -> None:
        if self.keep not in ("low", "high"):
            raise ValueError(f"method {self.name}: keep {self.keep!r}, not low or high")
        if self.needs_model and self.model_optional:
            raise ValueError(f"method {self.name}: a model is needed or optional, not both")

    def uses_model(self, model: Any) -> bool:
        """Whether a selection by this method with ``model`` (None: none given) trains it."""
        return self.needs_model or (self.model_optional and model is not None)

    @property
    def needs(self) -> str:
        """What it needs, in words: ``"labels, model, target"``, ``"model optional"``, ``"nothing"``."""
        words = [
            w
            for w, on in (
                ("labels", self.needs_labels),
                ("model", self.needs_model),
                ("target", self.needs_target),
            )
            if on
        ]
        if self.model_optional:
            words.append("model optional")
        return ", ".join(words) or "nothing"


def random_scores(items: Items, ctx: Context) -> np.ndarray:
    import numpy as np

    return np.random.default_rng(ctx.seed).random(len(items))


def small_loss(items: Items, ctx: Context) -> np.ndarray:
    import numpy as np

    from tandem.select import proxy

    model, _ = _warm(items, ctx)
    return proxy.losses(model, items).numpy().astype(np.float64)


def el2n(items: Items, ctx: Context) -> np.ndarray:
    import numpy as np
    import torch.nn.functional as F

    from tandem.select import proxy

    model, _ = _warm(items, ctx)
    assert items.labels is not None
    probs = proxy.logits(model, items.inputs).softmax(dim=1)
    onehot = F.one_hot(items.labels, probs.shape[1]).float()
    return (probs - onehot).norm(dim=1).numpy().astype(np.float64)


def grand(items: Items, ctx: Context) -> np.ndarray:
    import numpy as np

    from tandem.select import proxy

    model, _ = _warm(items, ctx)
    assert items.labels is not None
    grads = proxy.per_example_grads(model, items.inputs, items.labels)
    return grads.norm(dim=1).numpy().astype(np.float64)


def kcenter(items: Items, ctx: Context) -> np.ndarray:
    """Greedy k-center: the score is the step at which an item is picked (the first is the
    item nearest the mean; each next the farthest from those picked), for as many steps as
    the budget keeps; the rest follow, farthest from the picked first."""
    import numpy as np
    import torch

    from tandem.select import proxy

    if ctx.model_fn is not None and items.labels is not None:
        model, _ = _warm(items, ctx)
        points = proxy.embeddings(model, items.inputs)
    else:
        points = items.inputs.flatten(1)
    points = points.double()
    n = len(points)
    steps = min(n, int(ctx.param("count", n)))
    rank = np.full(n, np.inf)
    taken = torch.zeros(n, dtype=torch.bool)
    pick = int(torch.cdist(points.mean(0, keepdim=True), points).argmin())
    nearest = torch.full((n,), np.inf, dtype=torch.float64)
    for step in range(steps):
        rank[pick] = step
        taken[pick] = True
        nearest = torch.minimum(nearest, torch.cdist(points[pick : pick + 1], points)[0])
        nearest[taken] = -1.0
        pick = int(nearest.argmax())
    rest = np.flatnonzero(~taken.numpy())
    rank[rest] = steps + np.argsort(np.argsort(-nearest.numpy()[rest], kind="stable"), kind="stable")
    return rank


def less(items: Items, ctx: Context) -> np.ndarray:
    from tandem.select.less import less_scores

    return less_scores(items, ctx)


METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method("random", "low", random_scores, needs_labels=False, needs_model=False, defaults={}),
        Method("small-loss", "low", small_loss, True, True, {"warmup_epochs": 3, "lr": 1e-3}),
        Method("el2n", "high", el2n, True, True, {"warmup_epochs": 3, "lr": 1e-3}),
        Method("grand", "high", grand, True, True, {"warmup_epochs": 3, "lr": 1e-3}),
        Method(
            "kcenter", "low", kcenter, False, False, {"warmup_epochs": 3, "lr": 1e-3}, model_optional=True
        ),
        Method(
            "less",
            "high",
            less,
            True,
            True,
            {"warmup_epochs": 3, "lr": 1e-3, "proj_dim": 512},
            needs_target=True,
        ),
    )
}
