"""timm's data API with its loaders shared: ``timm.data`` with a ``create_loader`` that returns
timm's loader reading from the host's one producer of its data (``pip install timm``).

timm's ``train.py`` shares its data with one line changed::

    from tandem.share.timm import create_dataset, create_loader, create_naflex_loader, \\
        resolve_data_config, Mixup, FastCollateMixup, AugMixDataset

Every name of ``timm.data`` is here as it is there, except :func:`create_loader`, which calls
timm's own and hands back what it built, the torch ``DataLoader`` in it (the ``.loader`` of
a ``PrefetchLoader``, timm's default) made a :func:`tandem.share.shared` one.

What a producer cannot reproduce reads privately, said once in a warning: timm's
``RepeatAugSampler`` (the drop-in's own), and, returned as timm built it, a loader with a
batch sampler of its own (timm's scheduled input and batch sizes). A ``MultiEpochsDataLoader``
(``--use-multi-epochs-loader``) is shared like any other: its endless ``_RepeatSampler`` wraps
only the batch sampler, and the drop-in takes the sampler under it, one pass an epoch as
there; a producer keeps its workers from epoch to epoch anyway, which is what that loader is
for. ``create_naflex_loader`` is timm's own, not shared: its dataset makes its batches itself.

The producer collates with its own copy of the ``collate_fn``: ``--mixup-off-epoch`` (which
turns this process's copy off) leaves it mixing, as timm's own persistent workers do (its
default with ``--workers`` above 0).
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

from timm.data import *  # noqa: F403 - timm.data's names, re-exported as they are
from timm.data import create_loader as _timm_create_loader
from timm.data.loader import PrefetchLoader

from tandem.share.library_loaders import shared


@functools.wraps(_timm_create_loader)  # type: ignore[no-redef]  # timm's, replaced here
def create_loader(*args: Any, **kwargs: Any) -> Any:
    """timm's ``create_loader``: its arguments, its loader, read from a shared producer."""
    return share_loader(_timm_create_loader(*args, **kwargs))


def share_loader(loader: Any) -> Any:
    """``loader`` (a torch ``DataLoader`` or timm's ``PrefetchLoader`` around one), reading
    from a shared producer: the same ``PrefetchLoader`` with a drop-in inside, or a drop-in."""
    inner = loader.loader if isinstance(loader, PrefetchLoader) else loader
    if inner.batch_size is None:  # the drop-in would read it privately: timm's own loader does
        warnings.warn(
            "tandem.share.DataLoader reads privately (torch's own loading), not from a shared producer: "
            f"it has a batch_sampler of its own ({type(inner.batch_sampler).__name__}), which a producer "
            "cannot reproduce",
            stacklevel=3,
        )
        return loader
    drop_in = shared(inner)
    if inner is loader:
        return drop_in
    loader.loader = drop_in
    return loader
