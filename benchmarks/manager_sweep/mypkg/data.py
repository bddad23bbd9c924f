"""``mypkg.data:train_set`` of the README's sweep: the JPEGs in ``$SWEEP_DATA`` (64x64 px,
made by ``benchmarks/manager_cost.py``), decoded, randomly cropped to 56 px and flipped."""

from __future__ import annotations

import os

from tandem.bench.data import ImageFolder


def train_set() -> ImageFolder:
    return ImageFolder(os.environ["SWEEP_DATA"], crop=56, resize=64)
