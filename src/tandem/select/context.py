"""What a selection method is given (:class:`Context`) and the warm-up the model-based
methods share: below both :mod:`tandem.select.methods` and the methods kept in modules of
their own (:mod:`tandem.select.less`), so neither imports the other. Imports neither torch
nor numpy at import time."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from tandem.select.data import Items


@dataclass
class Context:
    model_fn: Any
    seed: int
    target: Items | None = None
    params: dict[str, Any] = field(default_factory=dict)

    def param(self, name: str, default: Any) -> Any:
        return self.params.get(name, default)


def warm(items: Items, ctx: Context) -> tuple[torch.nn.Module, torch.optim.Adam]:
    """A proxy model of ``ctx.model_fn`` warmed up on ``items``, with its optimiser."""
    from tandem.select import proxy

    model = proxy.make_model(ctx.model_fn, ctx.seed)
    opt = proxy.warm_up(
        model, items, int(ctx.param("warmup_epochs", 3)), ctx.seed, float(ctx.param("lr", 1e-3))
    )
    return model, opt
