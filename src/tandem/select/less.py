"""LESS-style targeted selection (Xia et al., ICML'24), for any classifier.

1. Warm up the proxy on every item (Adam, a few epochs: LESS warms up LoRA adapters; here
   the proxy is small and its last layer is what is read).
2. Each training item's gradient over the proxy's last linear layer, turned into the step
   Adam would take for it alone from the warm-up's moments
   (``m' / (sqrt(v') + eps)`` with ``m' = b1 m + (1 - b1) g``, ``v' = b2 v + (1 - b2) g^2``):
   LESS's "Adam-aware" feature.
3. Each target item's plain gradient over the same layer (LESS uses SGD gradients for the
   validation set).
4. Both projected with one random matrix (Rademacher, +-1/sqrt(d)) drawn on the CPU from
   the selection's seed: the same matrix on every machine and device, so the selection is
   too (LESS's TRAK projector can fall back to another one silently and change it).
5. The score: the cosine of an item's projected feature to the mean of the target's
   normalised projected gradients; the highest are kept.
"""

from __future__ import annotations

import numpy as np
import torch

from tandem.select import proxy
from tandem.select.context import Context, warm
from tandem.select.data import Items
from tandem.select.errors import SelectError


def projection(dim_in: int, dim_out: int, seed: int) -> torch.Tensor:
    """The ``[dim_in, dim_out]`` Rademacher projection of ``seed`` (CPU, deterministic)."""
    gen = torch.Generator().manual_seed(seed ^ 0x5EED_1E55)
    signs = torch.randint(0, 2, (dim_in, dim_out), generator=gen, dtype=torch.int8)
    return (signs.float() * 2 - 1) / float(np.sqrt(dim_out))


def less_scores(items: Items, ctx: Context) -> np.ndarray:
    target = ctx.target
    if target is None or target.labels is None:
        raise SelectError(
            "less selects for a target: pass target= (a labelled dataset of what to be good at)"
        )
    if target.inputs.shape[1:] != items.inputs.shape[1:]:
        raise SelectError(
            f"the target's inputs have shape {tuple(target.inputs.shape[1:])}, the dataset's "
            f"{tuple(items.inputs.shape[1:])}: they must match"
        )
    model, opt = warm(items, ctx)
    layer = proxy.last_linear(model)
    names = [n for n, p in model.named_parameters() if any(p is q for q in layer.parameters())]
    assert items.labels is not None
    train = proxy.per_example_grads(model, items.inputs, items.labels, names)
    aim = proxy.per_example_grads(model, target.inputs, target.labels, names)
    # Adam's moments for the same parameters, flattened in the same order.
    group = opt.param_groups[0]
    b1, b2 = group["betas"]
    eps = group["eps"]
    m = torch.cat([opt.state[p]["exp_avg"].flatten() for n, p in model.named_parameters() if n in names])
    v = torch.cat([opt.state[p]["exp_avg_sq"].flatten() for n, p in model.named_parameters() if n in names])
    step = float(opt.state[layer.weight]["step"]) + 1
    m_new = b1 * m + (1 - b1) * train
    v_new = b2 * v + (1 - b2) * train**2
    adam = (m_new / (1 - b1**step)) / ((v_new / (1 - b2**step)).sqrt() + eps)
    dim = min(int(ctx.param("proj_dim", 512)), train.shape[1])
    proj = projection(train.shape[1], dim, ctx.seed)
    feats = torch.nn.functional.normalize(adam @ proj, dim=1)
    goal = torch.nn.functional.normalize(aim @ proj, dim=1).mean(0)
    goal = goal / goal.norm().clamp_min(1e-12)
    return (feats @ goal).numpy().astype(np.float64)
