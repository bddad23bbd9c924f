"""The proxy model the scoring methods train and read: a short seeded warm-up, then
per-example losses, probabilities, embeddings and gradients.

Everything runs on the CPU (one device, so that the same seed gives the same numbers on
every machine) in float32, in batches; the warm-up's shuffles come from a generator seeded
with the selection's seed.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from tandem.select.data import Items
from tandem.select.errors import SelectError

BATCH = 256


def make_model(model_fn: Any, seed: int) -> torch.nn.Module:
    if model_fn is None:
        raise SelectError(
            "this method trains a proxy: pass model= (a function returning a fresh torch.nn.Module)"
        )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_fn()
    if not isinstance(model, torch.nn.Module):
        raise SelectError(f"model() must return a torch.nn.Module, not {type(model).__name__}")
    return model.float().cpu()


def check_logits(model: torch.nn.Module, items: Items) -> None:
    """A model that maps a batch of inputs to one row of class scores each, with a column
    for every label; else a clear error."""
    with torch.no_grad():
        try:
            out = model(items.inputs[:2])
        except Exception as exc:  # noqa: BLE001 - any failure here is the model's
            raise SelectError(
                f"the model fails on the dataset's inputs ({type(exc).__name__}: {exc})"
            ) from None
    want = items.classes
    if out.ndim != 2 or out.shape[0] != min(2, len(items)) or out.shape[1] < want:
        raise SelectError(
            f"the model must return logits of shape [batch, classes] (at least {want} classes for these "
            f"labels); for a batch of {min(2, len(items))} it returned {tuple(out.shape)}"
        )


def warm_up(
    model: torch.nn.Module, items: Items, epochs: int, seed: int, lr: float = 1e-3
) -> torch.optim.Adam:
    """Train ``model`` on every item for ``epochs`` (Adam, batches of 256, seeded shuffles);
    returns the optimizer (LESS reads its moments)."""
    if items.labels is None:
        raise SelectError("this method needs labels, and the dataset's items have none")
    check_logits(model, items)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(items), generator=gen)
        for k in range(0, len(items), BATCH):
            idx = order[k : k + BATCH]
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(items.inputs[idx]), items.labels[idx]).backward()
            opt.step()
    model.eval()
    return opt


def logits(model: torch.nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat([model(inputs[k : k + BATCH]) for k in range(0, len(inputs), BATCH)])


def losses(model: torch.nn.Module, items: Items) -> torch.Tensor:
    assert items.labels is not None
    return F.cross_entropy(logits(model, items.inputs), items.labels, reduction="none")


def last_linear(model: torch.nn.Module) -> torch.nn.Linear:
    layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    if not layers:
        raise SelectError("this method reads the model's last torch.nn.Linear layer, and the model has none")
    return layers[-1]


def embeddings(model: torch.nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    """What goes into the model's last linear layer, for every input."""
    seen: list[torch.Tensor] = []
    hook = last_linear(model).register_forward_hook(lambda _m, args, _out: seen.append(args[0].detach()))
    try:
        logits(model, inputs)
    finally:
        hook.remove()
    return torch.cat(seen).flatten(1)


def per_example_grads(
    model: torch.nn.Module, inputs: torch.Tensor, labels: torch.Tensor, names: list[str] | None = None
) -> torch.Tensor:
    """``[N, P]``: each example's gradient of its loss over the parameters ``names`` (all:
    None), flattened; torch.func's vmap over one example at a time."""
    from torch.func import functional_call, grad, vmap

    params = {k: v.detach() for k, v in model.named_parameters() if names is None or k in names}
    frozen = {k: v.detach() for k, v in model.named_parameters() if k not in params}
    buffers = dict(model.named_buffers())

    def loss(p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = functional_call(model, {**p, **frozen, **buffers}, (x.unsqueeze(0),))
        return F.cross_entropy(out, y.unsqueeze(0))

    per = vmap(grad(loss), in_dims=(None, 0, 0))
    rows = []
    for k in range(0, len(inputs), BATCH):
        g = per(params, inputs[k : k + BATCH], labels[k : k + BATCH])
        rows.append(torch.cat([g[name].flatten(1) for name in params], dim=1))
    return torch.cat(rows)
