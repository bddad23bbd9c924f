"""Decode and augment images once, on the producer's GPU, for every consumer to share.

A CPU-bound input pipeline decodes and augments each JPEG in DataLoader workers, once per
training process. With a shared producer the work is done once per batch; this module moves
the heavy part of it onto the GPU as well:

* ``EncodedImages`` + ``collate_encoded``: the DataLoader's workers only read the files'
  bytes (cheap: no decoding), and a batch is the encoded files packed into one buffer with
  their offsets, plus labels and the dataset indices. One buffer, not a list of tensors: a
  worker hands each tensor of a batch over in a shared-memory segment of its own, and 128
  of them a batch made the loader, not the GPU, the bound (2,200 against 10,000 images/s on
  two cores).
* ``decode_images``: batched nvJPEG decoding on CUDA (torchvision, imported lazily), or
  Pillow on the CPU.
* ``RandomResizedCropFlipNormalize``: torchvision's RandomResizedCrop + RandomHorizontalFlip
  + Normalize, on whichever device the images are on, writing one ``[N, 3, S, S]`` tensor
  (:mod:`tandem.share.augment`). Its randomness is drawn per sample from
  ``(seed, epoch, index)`` only, so a sample gets the same crop on the CPU and on a GPU and
  in any batch, and a run can be repeated exactly.
* ``ImagePipeline``: the two together, as the producer's ``batch_transform`` hook;
  ``Producer.from_files`` puts them together. They also work on their own:

    dataset = EncodedImages.from_folder("data/imagenet/train")
    loader = DataLoader(dataset, batch_size=256, num_workers=4, collate_fn=collate_encoded)
    pipeline = ImagePipeline("cuda", RandomResizedCropFlipNormalize(224, seed=0))
    for epoch in range(epochs):
        pipeline.set_epoch(epoch)
        for batch in loader:
            batch = pipeline(batch)  # {"image": [256, 3, 224, 224] on the GPU, "label", "index"}

Neither torchvision nor Pillow is a dependency of tandem.share: each is imported only when
a decode needs it, and a missing one is reported as a ``ShareError`` that says what to do.
"""

from __future__ import annotations

import io
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from tandem.share._cuda import check_device
from tandem.share.augment import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    RandomResizedCropFlipNormalize,
    SampleRandom,
    crop_params,
    sample_generator,
)
from tandem.share.errors import ShareError

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "IMAGE_EXTENSIONS",
    "EncodedImages",
    "ImagePipeline",
    "RandomResizedCropFlipNormalize",
    "SampleRandom",
    "collate_encoded",
    "crop_params",
    "decode_images",
    "sample_generator",
    "split_encoded",
]

IMAGE_EXTENSIONS: tuple[str, ...] = (".jpg", ".jpeg", ".png")

_JPEG_MAGIC = (0xFF, 0xD8, 0xFF)


# --------------------------------------------------------------------------------------------
# The dataset: encoded bytes only
# --------------------------------------------------------------------------------------------


class EncodedImages(torch.utils.data.Dataset):
    """Image files as their encoded bytes: ``(uint8 1-D tensor, label, index)`` per item.

    Nothing is decoded here: the loader workers only read files, and the decoding happens
    once per batch in the producer (``ImagePipeline``). ``labels`` defaults to -1 for every
    file (unlabelled: a loss that is fed it fails loudly instead of learning class 0).
    """

    def __init__(self, files: Sequence[str | os.PathLike[str]], labels: Sequence[int] | None = None):
        self.files: list[str] = [os.fspath(f) for f in files]
        if not self.files:
            raise ValueError("EncodedImages needs at least one image file; the file list is empty")
        if labels is None:
            self.labels: list[int] = [-1] * len(self.files)
        else:
            self.labels = [int(label) for label in labels]
            if len(self.labels) != len(self.files):
                raise ValueError(
                    f"EncodedImages got {len(self.files)} files but {len(self.labels)} labels; "
                    "give one label per file (or none)"
                )
        self.classes: list[str] = []

    @classmethod
    def from_folder(cls, root: str | os.PathLike[str]) -> EncodedImages:
        """The torchvision ImageFolder layout: ``root/<class>/**/*.jpg|jpeg|png``.

        Classes are the sub-folders in sorted order (label = position), files sorted within
        each class, so the indices, and with them the per-sample randomness, are the same on
        every machine that holds the same files.
        """
        root_path = Path(root)
        if not root_path.is_dir():
            raise FileNotFoundError(f"image folder {str(root_path)!r} does not exist or is not a directory")
        classes = sorted(p.name for p in root_path.iterdir() if p.is_dir())
        if not classes:
            raise FileNotFoundError(
                f"no class folders under {str(root_path)!r} (expected root/<class>/<image>.jpg)"
            )
        files: list[Path] = []
        labels: list[int] = []
        for label, name in enumerate(classes):
            found = sorted(
                p
                for p in (root_path / name).rglob("*")
                if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file()
            )
            files += found
            labels += [label] * len(found)
        if not files:
            raise FileNotFoundError(
                f"no images ({', '.join(IMAGE_EXTENSIONS)}) in the class folders under {str(root_path)!r}"
            )
        dataset = cls(files, labels)
        dataset.classes = classes
        return dataset

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int, int]:
        n = len(self.files)
        if not -n <= index < n:
            raise IndexError(f"index {index} out of range for {n} images")
        index = index % n  # the index returned keys the sample's randomness: never negative
        data = np.fromfile(self.files[index], dtype=np.uint8)
        return torch.from_numpy(data), self.labels[index], index


def collate_encoded(samples: Sequence[tuple[torch.Tensor, int, int]]) -> dict[str, Any]:
    """The DataLoader's ``collate_fn`` for ``EncodedImages``: ``{"data": uint8 [total bytes],
    "offsets": int64 [N + 1], "label", "index"}``; file ``i`` is ``data[offsets[i]:offsets[i+1]]``
    (:func:`split_encoded`)."""
    if not samples:
        raise ValueError("collate_encoded got no samples")
    sizes = torch.tensor([s[0].numel() for s in samples], dtype=torch.int64)
    offsets = torch.zeros(len(samples) + 1, dtype=torch.int64)
    torch.cumsum(sizes, 0, out=offsets[1:])
    return {
        "data": torch.cat([s[0] for s in samples]),
        "offsets": offsets,
        "label": torch.tensor([s[1] for s in samples], dtype=torch.int64),
        "index": torch.tensor([s[2] for s in samples], dtype=torch.int64),
    }


def split_encoded(batch: dict[str, Any]) -> list[torch.Tensor]:
    """The encoded files of a :func:`collate_encoded` batch, as views of its buffer (no copy).
    A batch whose ``data`` is already a list of tensors (one per file) is passed through."""
    data = batch["data"]
    if isinstance(data, (list, tuple)):
        return list(data)
    offsets = batch.get("offsets")
    if not isinstance(data, torch.Tensor) or data.dim() != 1 or offsets is None:
        raise TypeError(
            "an encoded batch needs 'data' as a list of uint8 tensors, or as one uint8 buffer "
            "with 'offsets' (what collate_encoded makes)"
        )
    bounds = offsets.tolist()
    if (
        len(bounds) < 2
        or bounds[0] != 0
        or bounds[-1] != data.numel()
        or any(b > e for b, e in zip(bounds, bounds[1:]))
    ):
        raise ValueError(
            f"offsets {bounds[:4]}... do not split a buffer of {data.numel()} bytes: they must "
            "start at 0, never decrease and end at its size"
        )
    return [data[b:e] for b, e in zip(bounds, bounds[1:])]


# --------------------------------------------------------------------------------------------
# Decoding
# --------------------------------------------------------------------------------------------


def _resolve_device(device: torch.device | str) -> torch.device:
    """``device`` as a ``torch.device``; a CUDA one checked and numbered by ``check_device``."""
    dev = torch.device(device)
    return check_device(str(dev)) if dev.type == "cuda" else dev


def _is_jpeg(data: torch.Tensor) -> bool:
    return data.numel() >= 3 and tuple(data[:3].tolist()) == _JPEG_MAGIC


def _decode_cpu(data: torch.Tensor) -> torch.Tensor:
    """One encoded image to a uint8 CHW RGB tensor on the CPU: Pillow, else torchvision."""
    try:
        from PIL import Image
    except ImportError:
        pass  # torchvision's decoder below
    else:
        buf = data.cpu().numpy().tobytes()
        with Image.open(io.BytesIO(buf)) as img:
            pixels = np.array(img.convert("RGB"))  # HWC; a copy that torch may own
        return torch.from_numpy(pixels).permute(2, 0, 1).contiguous()
    try:
        from torchvision.io import ImageReadMode, decode_image
    except ImportError:
        raise ShareError(
            "decoding images on the CPU needs Pillow (pip install pillow) or torchvision"
        ) from None
    return decode_image(data.cpu(), mode=ImageReadMode.RGB)


def _torchvision_batched_jpeg(torchvision: Any) -> bool:
    """torchvision >= 0.19 decodes a list of JPEGs in one batched nvJPEG call."""
    try:
        major, minor = (int(p) for p in torchvision.__version__.split(".")[:2])
    except ValueError:
        return True  # a development build: assume a current one
    return (major, minor) >= (0, 19)


def decode_images(data: list[torch.Tensor], device: torch.device | str) -> list[torch.Tensor]:
    """Decode encoded JPEG/PNG files (uint8 1-D tensors) to uint8 CHW RGB tensors on ``device``.

    On CUDA the JPEGs are decoded together by nvJPEG (``torchvision.io.decode_jpeg``); any
    other format (PNG, ...) is decoded on the CPU and copied to the device, since nvJPEG reads
    only JPEG. nvJPEG and libjpeg differ by a few levels per pixel, never in size. Elsewhere
    Pillow decodes. EXIF orientation is not applied, on either path.
    """
    dev = _resolve_device(device)
    for i, d in enumerate(data):
        if not isinstance(d, torch.Tensor) or d.dtype != torch.uint8 or d.dim() != 1:
            raise TypeError(f"decode_images: item {i} is not a uint8 1-D tensor of encoded bytes")
    if dev.type != "cuda":
        return [_decode_cpu(d).to(dev) for d in data]

    try:
        import torchvision
        from torchvision.io import ImageReadMode, decode_jpeg
    except ImportError:
        raise ShareError(
            "decoding images on the GPU needs torchvision with nvJPEG: install the torchvision "
            f"that matches torch {torch.__version__} (pip install torchvision), or decode on "
            "device='cpu'"
        ) from None
    out: list[torch.Tensor | None] = [None] * len(data)
    jpegs = [i for i, d in enumerate(data) if _is_jpeg(d)]
    caller = torch.cuda.current_stream(dev)
    # torchvision's nvJPEG writes its output on a stream of its own that waits for nothing
    # of ours, into blocks taken from the caching allocator on the current stream. On the
    # caller's stream those could be blocks that kernels still queued there (the previous
    # batch's resize) are reading: decoded images would overwrite them (pytorch/vision#9606).
    # So decode under a stream of this thread's own, whose blocks are reused only after the
    # caller's stream is done with them (record_stream), and have the caller's wait for it.
    side = _decode_stream(dev)
    # (under dev as the current device too: torchvision makes the stream current where its
    # decoder was made wait for the decode)
    with torch.cuda.device(dev), torch.cuda.stream(side):
        if jpegs:
            encoded = [data[i].cpu().contiguous() for i in jpegs]  # nvJPEG reads host memory
            if _torchvision_batched_jpeg(torchvision):
                decoded = decode_jpeg(encoded, device=dev, mode=ImageReadMode.RGB)
            else:
                decoded = [decode_jpeg(e, device=dev, mode=ImageReadMode.RGB) for e in encoded]
            for i, img in zip(jpegs, decoded):
                out[i] = img
        for i, d in enumerate(data):
            if out[i] is None:  # not a JPEG: nvJPEG cannot, the CPU can
                out[i] = _decode_cpu(d).to(dev, non_blocking=True)
    caller.wait_stream(side)
    images = cast(list[torch.Tensor], out)  # every slot was filled above
    for img in images:
        img.record_stream(caller)
    return images


_decode_streams = threading.local()


def _decode_stream(device: torch.device) -> torch.cuda.Stream:
    """This thread's side stream on ``device`` for decoding (one each: threads decode at once)."""
    streams = getattr(_decode_streams, "by_device", None)
    if streams is None:
        streams = _decode_streams.by_device = {}
    stream = streams.get(device)
    if stream is None:
        stream = streams[device] = torch.cuda.Stream(device)
    return stream


# --------------------------------------------------------------------------------------------
# The producer's hook
# --------------------------------------------------------------------------------------------


class ImagePipeline:
    """Decode + augment a ``collate_encoded`` batch on ``device``: the producer's ``batch_transform``.

    Returns ``{"image": [N, 3, S, S], "label": int64, "index": int64}``, all on ``device``.
    ``transform=None`` means the default ``RandomResizedCropFlipNormalize()`` (224, ImageNet's
    statistics, float32, seed 0); any ``transform(images, indices) -> [N, 3, S, S]`` will do
    (``Producer.from_files`` passes the user's), told the epoch where it has ``set_epoch``.
    """

    def __init__(
        self,
        device: torch.device | str,
        transform: Callable[..., torch.Tensor] | None = None,
    ):
        self.device = _resolve_device(device)
        self.transform = transform if transform is not None else RandomResizedCropFlipNormalize()

    def set_epoch(self, epoch: int) -> None:
        set_epoch = getattr(self.transform, "set_epoch", None)
        if set_epoch is not None:  # a user's plain function has no epoch to be told
            set_epoch(epoch)

    def __call__(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        index = batch["index"]
        if not isinstance(index, torch.Tensor):
            index = torch.as_tensor(index, dtype=torch.int64)
        images = decode_images(split_encoded(batch), self.device)
        image = self.transform(images, index.cpu())  # the indices are read on the host anyway
        label = batch["label"]
        if not isinstance(label, torch.Tensor):
            label = torch.as_tensor(label, dtype=torch.int64)
        return {
            "image": image,
            "label": label.to(self.device, dtype=torch.int64, non_blocking=True),
            "index": index.to(self.device, dtype=torch.int64, non_blocking=True),
        }

    def describe(self) -> str:
        decoder = "nvJPEG" if self.device.type == "cuda" else "Pillow"
        describe = getattr(self.transform, "describe", None)
        transform = describe() if describe is not None else repr(self.transform)
        return f"decode on {self.device} ({decoder}), {transform}"

    def __repr__(self) -> str:
        return f"ImagePipeline({self.describe()})"
