"""The ``train.py`` of the README's sweep, for ``benchmarks/manager_cost.py``: a ResNet-18
trained with SGD over the share the job manager names (``Consumer.from_env``), for
``--epochs`` epochs (default ``$SWEEP_EPOCHS``, else 3)."""

from __future__ import annotations

import argparse
import os

import torch
from torch import nn

from tandem.share import Consumer


class Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x)))))
        return torch.relu(y + (x if self.down is None else self.down(x)))


def resnet18(classes: int) -> nn.Module:
    layers: list[nn.Module] = [
        nn.Conv2d(3, 64, 7, 2, 3, bias=False),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.MaxPool2d(3, 2, 1),
    ]
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [Block(cin, cout, stride), Block(cout, cout, 1)]
        cin = cout
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, classes))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--epochs", type=int, default=int(os.environ.get("SWEEP_EPOCHS", "3")))
    args = ap.parse_args()
    torch.manual_seed(0)
    model = resnet18(8)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    with Consumer.from_env(batch_size=128) as loader:
        for epoch in range(args.epochs):
            for images, labels in loader:
                loss = nn.functional.cross_entropy(model(images), labels)
                opt.zero_grad()
                loss.backward()
                opt.step()
            print(f"epoch {epoch}: loss {loss.item():.3f}", flush=True)


if __name__ == "__main__":
    main()
