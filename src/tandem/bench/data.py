"""A JPEG image-folder dataset with the usual training transforms, in PIL and numpy.

decode -> resize shorter side -> random crop -> random horizontal flip -> float CHW,
normalised with ImageNet's mean and std. The randomness is per sample and seeded from the
sample index and an epoch counter, so runs are repeatable.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32) * 255
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32) * 255


class ImageFolder(torch.utils.data.Dataset):
    def __init__(self, root: str | Path, crop: int = 224, resize: int | None = None):
        self.root = Path(root)
        classes = sorted(p.name for p in self.root.iterdir() if p.is_dir())
        if not classes:
            raise FileNotFoundError(f"no class folders under {self.root}")
        self.classes = classes
        self.samples = [
            (path, label)
            for label, name in enumerate(classes)
            for path in sorted((self.root / name).glob("*.jpg"))
        ]
        if not self.samples:
            raise FileNotFoundError(f"no .jpg files under {self.root}")
        self.crop = crop
        self.resize = resize or int(crop * 256 / 224)
        self._calls = 0

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[index]
        self._calls += 1
        rng = np.random.default_rng([index, self._calls])
        with Image.open(path) as file:
            img = file.convert("RGB")
            w, h = img.size
            scale = self.resize / min(w, h)
            img = img.resize(
                (max(self.crop, round(w * scale)), max(self.crop, round(h * scale))),
                Image.Resampling.BILINEAR,
            )
            w, h = img.size
            x, y = int(rng.integers(0, w - self.crop + 1)), int(rng.integers(0, h - self.crop + 1))
            img = img.crop((x, y, x + self.crop, y + self.crop))
            if rng.random() < 0.5:
                img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            arr = np.asarray(img, dtype=np.float32)
        arr = (arr - MEAN) / STD
        return torch.from_numpy(np.ascontiguousarray(arr.transpose(2, 0, 1))), label
