"""Generate an image-folder dataset of JPEG files locally (nothing can be downloaded).

Layout follows torchvision's ImageFolder: ``root/<class>/<index>.jpg``. Images are smooth
colour fields with shapes and noise, of varied sizes, so that decoding costs what real
photographs of that size cost (roughly: JPEG decode time depends on pixels, not content).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw


def make_image_folder(
    root: str | Path,
    images: int = 512,
    classes: int = 8,
    min_side: int = 256,
    max_side: int = 400,
    seed: int = 0,
    quality: int = 90,
) -> Path:
    """Write ``images`` JPEGs under ``root`` (reused when an identical set is already there)."""
    root = Path(root)
    params = {
        "images": images,
        "classes": classes,
        "min_side": min_side,
        "max_side": max_side,
        "seed": seed,
        "quality": quality,
    }
    marker = root / "tandem-images.json"
    if marker.exists() and json.loads(marker.read_text()) == params:
        return root
    rng = np.random.default_rng(seed)
    for c in range(classes):
        (root / f"class{c:02d}").mkdir(parents=True, exist_ok=True)
    for i in range(images):
        c = i % classes
        w, h = (int(v) for v in rng.integers(min_side, max_side + 1, size=2))
        yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
        base = rng.uniform(0, 255, size=3).astype(np.float32)
        slope = rng.uniform(-0.5, 0.5, size=(3, 2)).astype(np.float32)
        pixels = base[None, None, :] + xx[..., None] * slope[:, 0] + yy[..., None] * slope[:, 1]
        pixels += rng.normal(0, 12, size=pixels.shape).astype(np.float32)
        img = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")
        draw = ImageDraw.Draw(img)
        for _ in range(4):
            x0, y0 = int(rng.integers(0, w - 8)), int(rng.integers(0, h - 8))
            x1, y1 = x0 + int(rng.integers(8, w // 2)), y0 + int(rng.integers(8, h // 2))
            colour = tuple(int(v) for v in rng.integers(0, 256, size=3))
            (draw.ellipse if rng.random() < 0.5 else draw.rectangle)((x0, y0, x1, y1), fill=colour)
        img.save(root / f"class{c:02d}" / f"{i:06d}.jpg", quality=quality)
    marker.write_text(json.dumps(params))
    return root
