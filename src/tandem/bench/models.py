"""Small CNNs for the demo and benchmarks: different architectures, cheap on a CPU."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


def tiny_cnn(classes: int = 8, width: int = 16) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, width, 5, stride=4, padding=2),
        nn.ReLU(),
        nn.Conv2d(width, width * 2, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(width * 2, classes),
    )


class _Block(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(x + self.bn2(self.conv2(y)))


def small_resnet(classes: int = 8, width: int = 16) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, width, 7, stride=4, padding=3, bias=False),
        nn.BatchNorm2d(width),
        nn.ReLU(),
        nn.MaxPool2d(2),
        _Block(width),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(width, classes),
    )


def mlp_mixer_lite(classes: int = 8, patch: int = 28, dim: int = 32) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, dim, patch, stride=patch),
        nn.GELU(),
        nn.Conv2d(dim, dim, 1),
        nn.GELU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(dim, classes),
    )


MODELS: dict[str, Callable[..., nn.Module]] = {
    "tiny_cnn": tiny_cnn,
    "small_resnet": small_resnet,
    "mixer_lite": mlp_mixer_lite,
}
