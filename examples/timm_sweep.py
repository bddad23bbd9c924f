"""A sweep over timm models that shares decoding and augmentation once, and applies each
model's own input size and normalisation in its consumer (``Consumer(transform=...)``).

    tandem share serve imgs --dataset examples/timm_sweep.py:train_set --batch-size 64 --shuffle &
    python examples/timm_sweep.py resnet18 &
    python examples/timm_sweep.py efficientnet_b0 &

Needs timm (and torchvision, which timm imports): ``pip install timm``. The producer's
dataset decodes and augments to 256x256 float images in [0, 1]; every job resizes to its
model's input size and normalises with its model's mean and std.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from tandem.share import Consumer


def train_set(root: str = "data/images"):
    """ImageFolder with the augmentation every job shares, as float images in [0, 1]."""
    import torchvision.transforms as T
    from torchvision.datasets import ImageFolder

    return ImageFolder(root, T.Compose([T.RandomResizedCrop(256), T.RandomHorizontalFlip(), T.ToTensor()]))


def model_transform(model: torch.nn.Module):
    """The model's own resize and normalisation, from timm's data config."""
    import timm.data

    config = timm.data.resolve_data_config({}, model=model)
    size = config["input_size"][1:]
    mean = torch.tensor(config["mean"]).view(1, 3, 1, 1)
    std = torch.tensor(config["std"]).view(1, 3, 1, 1)

    def transform(batch):
        images, labels = batch
        images = F.interpolate(images, size=size, mode="bilinear", antialias=True, align_corners=False)
        return (images - mean.to(images.device)) / std.to(images.device), labels

    return transform


def main(name: str) -> None:
    import timm

    model = timm.create_model(name, num_classes=10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with Consumer("imgs", batch_size=32, transform=model_transform(model)) as loader:
        for epoch in range(3):
            for images, labels in loader:
                loss = F.cross_entropy(model(images), labels)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            print(f"{name}: epoch {epoch} loss {loss.item():.3f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "resnet18")
