"""Per-sample random crops and flips, and the augmentation built on them: torchvision's
RandomResizedCrop + RandomHorizontalFlip + Normalize on a list of decoded images, on
whichever device they are on (part of :mod:`tandem.share.images`, which exports it).

Every random draw comes from ``(seed, epoch, index)`` alone (:class:`SampleRandom`), so a
sample gets the same crop on the CPU and on a GPU, in any batch and any order, and a run can
be repeated exactly.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

IMAGENET_MEAN: tuple[float, float, float] = (0.485, 0.456, 0.406)
IMAGENET_STD: tuple[float, float, float] = (0.229, 0.224, 0.225)

_TWO_TO_MINUS_53 = 1.0 / (1 << 53)
_MASK64 = (1 << 64) - 1


# --------------------------------------------------------------------------------------------
# Per-sample randomness
# --------------------------------------------------------------------------------------------


def _mix64(x: int) -> int:
    """SplitMix64's finaliser: a bijection of 64-bit integers that spreads every input bit."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def sample_generator(seed: int, epoch: int, index: int) -> torch.Generator:
    """A CPU generator seeded from ``(seed, epoch, index)`` alone.

    The seed is a 64-bit mix of the three integers (no ``hash()``, which is salted per
    process for strings), so it is the same in every process and run, and differs for every
    change of any one of them.
    """
    h = _mix64(int(seed) & _MASK64)
    h = _mix64(h ^ (int(epoch) & _MASK64))
    h = _mix64(h ^ (int(index) & _MASK64))
    return torch.Generator(device="cpu").manual_seed(h)


class SampleRandom:
    """A sample's own random stream, a function of ``(seed, epoch, index)`` alone.

    Counter-based: draw ``k`` is SplitMix64 of the sample's key plus ``k`` times the golden
    ratio, so a draw costs about a microsecond of plain Python. The producer draws crops for
    thousands of samples a second in one thread; a ``torch.Generator`` per sample cost about
    100 us each (two thirds of the augmentation's time, measured on the CPU with 128 small
    images). Same distributions as torchvision; not the same numbers as its global RNG.
    """

    __slots__ = ("_key", "_k")

    def __init__(self, seed: int, epoch: int, index: int):
        h = _mix64(int(seed) & _MASK64)
        h = _mix64(h ^ (int(epoch) & _MASK64))
        self._key = _mix64(h ^ (int(index) & _MASK64))
        self._k = 0

    def random(self) -> float:
        """Uniform on [0, 1), 53 random bits."""
        self._k += 1
        return (_mix64((self._key + self._k * 0x9E3779B97F4A7C15) & _MASK64) >> 11) * _TWO_TO_MINUS_53

    def uniform(self, lo: float, hi: float) -> float:
        return lo + (hi - lo) * self.random()

    def randint(self, lo: int, hi: int) -> int:
        """Uniform on the integers ``lo .. hi - 1`` (as ``torch.randint``)."""
        return lo + min(int(self.random() * (hi - lo)), hi - lo - 1)


@functools.lru_cache(maxsize=16)
def _log_ratio(lo: float, hi: float) -> tuple[float, float]:
    """log of the ratio bounds in float32, as torchvision computes them (cached: ~7 us a call)."""
    log_lo, log_hi = torch.log(torch.tensor((lo, hi))).tolist()
    return log_lo, log_hi


def crop_params(
    height: int,
    width: int,
    generator: torch.Generator | SampleRandom,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
) -> tuple[int, int, int, int]:
    """``(top, left, h, w)`` of a random crop: torchvision's ``RandomResizedCrop.get_params``.

    The same algorithm, draw for draw (10 tries at a random area and log-uniform aspect
    ratio, then the central crop at the nearest allowed ratio), but from ``generator``
    instead of the global RNG: with a generator seeded ``s`` it returns what torchvision
    returns after ``torch.manual_seed(s)``.
    """
    area = height * width
    if isinstance(generator, SampleRandom):
        return _crop_params_fast(height, width, generator, scale, ratio)
    log_lo, log_hi = _log_ratio(ratio[0], ratio[1])
    for _ in range(10):
        # torch ops on float32, not math on doubles: the same values as torchvision, bit for bit
        target_area = area * torch.empty(1).uniform_(scale[0], scale[1], generator=generator).item()
        aspect = torch.empty(1).uniform_(log_lo, log_hi, generator=generator).exp_().item()
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(torch.randint(0, height - h + 1, size=(1,), generator=generator).item())
            left = int(torch.randint(0, width - w + 1, size=(1,), generator=generator).item())
            return top, left, h, w
    return _central_crop(height, width, ratio)


def _crop_params_fast(
    height: int, width: int, rng: SampleRandom, scale: tuple[float, float], ratio: tuple[float, float]
) -> tuple[int, int, int, int]:
    """torchvision's algorithm in plain Python floats, drawing from a :class:`SampleRandom`."""
    area = height * width
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_lo, log_hi))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return rng.randint(0, height - h + 1), rng.randint(0, width - w + 1), h, w
    return _central_crop(height, width, ratio)


def _central_crop(height: int, width: int, ratio: tuple[float, float]) -> tuple[int, int, int, int]:
    """The fallback: the central crop, at the allowed ratio nearest the image's."""
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


# --------------------------------------------------------------------------------------------
# Augmentation
# --------------------------------------------------------------------------------------------


class RandomResizedCropFlipNormalize:
    """RandomResizedCrop + RandomHorizontalFlip + Normalize on a list of uint8 CHW images.

    Returns one ``[N, 3, size, size]`` tensor of ``dtype`` on the images' device. Each
    sample's crop and flip come from ``SampleRandom(seed, epoch, index)``: crop first (as
    torchvision's ``get_params``), then one draw for the flip. So the result depends on the
    sample's dataset index and the epoch, not on its batch or position or the device.
    Resizing is bilinear with antialiasing (torchvision's tensor default) on float values,
    without rounding back to uint8 in between. Grayscale images are repeated to 3 channels.
    """

    def __init__(
        self,
        size: int = 224,
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        flip_p: float = 0.5,
        mean: Sequence[float] = IMAGENET_MEAN,
        std: Sequence[float] = IMAGENET_STD,
        dtype: torch.dtype = torch.float32,
        seed: int = 0,
    ):
        if size < 1:
            raise ValueError(f"size must be positive, got {size}")
        if not 0 < scale[0] <= scale[1]:
            raise ValueError(f"scale must be (lo, hi) with 0 < lo <= hi, got {scale}")
        if not 0 < ratio[0] <= ratio[1]:
            raise ValueError(f"ratio must be (lo, hi) with 0 < lo <= hi, got {ratio}")
        if not 0.0 <= flip_p <= 1.0:
            raise ValueError(f"flip_p must be in [0, 1], got {flip_p}")
        if len(mean) != 3 or len(std) != 3 or any(s <= 0 for s in std):
            raise ValueError(f"mean and std need 3 values each, std positive; got {mean}, {std}")
        if not dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating-point dtype, got {dtype}")
        self.size = int(size)
        self.scale = (float(scale[0]), float(scale[1]))
        self.ratio = (float(ratio[0]), float(ratio[1]))
        self.flip_p = float(flip_p)
        self.mean = tuple(float(m) for m in mean)
        self.std = tuple(float(s) for s in std)
        self.dtype = dtype
        self.seed = int(seed)
        self.epoch = 0
        # (x/255 - mean)/std as one multiply-add per element: x * a - b.
        self._mul = torch.tensor([1.0 / (255.0 * s) for s in self.std]).view(1, 3, 1, 1)
        self._sub = torch.tensor([m / s for m, s in zip(self.mean, self.std)]).view(1, 3, 1, 1)
        self._on_device: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def params(self, height: int, width: int, index: int) -> tuple[tuple[int, int, int, int], bool]:
        """Sample ``index``'s ``((top, left, h, w), flip)`` for the current epoch."""
        rng = SampleRandom(self.seed, self.epoch, index)
        crop = _crop_params_fast(height, width, rng, self.scale, self.ratio)
        return crop, rng.random() < self.flip_p

    def __call__(self, images: Sequence[torch.Tensor], indices: Sequence[int] | torch.Tensor) -> torch.Tensor:
        if len(images) == 0:
            raise ValueError("RandomResizedCropFlipNormalize got no images")
        idx = indices.tolist() if isinstance(indices, torch.Tensor) else [int(i) for i in indices]
        if len(idx) != len(images):
            raise ValueError(f"got {len(images)} images but {len(idx)} indices; one index per image")
        device = images[0].device
        s = self.size
        # Two kernels a sample (to float, resize), then one join: the per-sample Python and
        # launch overhead is what bounds a producer feeding several jobs, not the GPU.
        resized: list[torch.Tensor] = []
        for n, (img, index) in enumerate(zip(images, idx)):
            if img.device != device:
                raise ValueError(f"images are on several devices ({device} and {img.device})")
            if img.dtype != torch.uint8 or img.dim() != 3 or img.shape[0] not in (1, 3):
                raise ValueError(
                    f"image {n}: expected a uint8 CHW tensor with 1 or 3 channels, "
                    f"got {img.dtype} of shape {tuple(img.shape)}"
                )
            (top, left, h, w), flip = self.params(img.shape[1], img.shape[2], index)
            crop = img[:, top : top + h, left : left + w].unsqueeze(0).float()
            one = F.interpolate(crop, size=(s, s), mode="bilinear", antialias=True, align_corners=False)
            if flip:  # here, not by an index tensor after the join: that would be a host copy
                one = one.flip(-1)
            resized.append(one.expand(1, 3, s, s))  # a grayscale channel to all 3
        # Resized samples are joined in float32 and normalised there (more precise than in
        # bf16/fp16), then cast once to the output dtype.
        out = torch.cat(resized)
        mul, sub = self._constants(device)
        out.mul_(mul).sub_(sub)
        return out if self.dtype == torch.float32 else out.to(self.dtype)

    def _constants(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The normalisation's factors on ``device``, copied there once (a copy from host
        memory waits for the device's stream, which would serialise producer threads)."""
        cached = self._on_device.get(device)
        if cached is None:
            cached = self._on_device[device] = (self._mul.to(device), self._sub.to(device))
        return cached

    def describe(self) -> str:
        return (
            f"RandomResizedCrop({self.size}, scale={self.scale}, ratio=({self.ratio[0]:.3g}, "
            f"{self.ratio[1]:.3g})) + HorizontalFlip(p={self.flip_p}) + Normalize -> "
            f"{str(self.dtype).removeprefix('torch.')}, seed {self.seed}"
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.describe()})"
