"""Batched image augmentation that runs where the client's data already lives (GPU or CPU).

A per-sample Python loop of torchvision transforms would dominate a round on the GPU, so every op
here draws all of a batch's random parameters at once from the caller's `torch.Generator` (seeded
per round and client, e.g. `torch_generator(seed, "augment", round, client, device=x.device)`) and
applies them with tensor ops. The generator must live on x's device.
"""
import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

# SupCon's CIFAR recipe (FedClassAvg's contrastive term is SupCon's loss): RandomResizedCrop(scale=(0.2, 1)),
# ColorJitter(0.4, 0.4, 0.4, 0.1) applied with p=0.8, RandomGrayscale(p=0.2).
_CROP_SCALE = (0.2, 1.0)
_CROP_RATIO = (3 / 4, 4 / 3)
_JITTER = 0.4
_P_JITTER = 0.8
_P_GRAY = 0.2
_GRAY_WEIGHTS = (0.299, 0.587, 0.114)  # ITU-R 601 luma, as PIL's convert("L") under SupCon's transforms


def random_crop_flip(x: torch.Tensor, generator: torch.Generator, padding: int = 4,
                     fill: Sequence[float] | None = None, reflect: bool = False) -> torch.Tensor:
    """Each image of N x C x H x W `x` cropped back to H x W at a random offset of its padded copy, then
    mirrored left-right with probability 1/2 (the standard CIFAR augmentation). The padding is `fill`
    per channel, default 0: for normalised images pass a black pixel, -mean / std, which is what
    torchvision's RandomCrop(32, padding=4) pads a PIL image with before ToTensor and Normalize (a
    0 there would be the mean colour). `reflect` mirrors the image's border into the padding instead
    (F.pad's "reflect"), as FedMA's authors' CIFAR-10 loader pads.

    Two gathers with per-sample row/column indices do the whole batch; a flip just reverses the column index."""
    n, c, h, w = x.shape
    rows = torch.randint(0, 2 * padding + 1, (n, 1), generator=generator, device=x.device)
    cols = torch.randint(0, 2 * padding + 1, (n, 1), generator=generator, device=x.device)
    flip = torch.rand(n, 1, generator=generator, device=x.device) < 0.5
    row_idx = rows + torch.arange(h, device=x.device)
    col_range = torch.arange(w, device=x.device)
    col_idx = cols + torch.where(flip, col_range.flip(0), col_range)
    if reflect:
        padded = F.pad(x, (padding, padding, padding, padding), mode="reflect")
    else:
        fill_t = (torch.tensor(fill, dtype=x.dtype, device=x.device).view(1, -1, 1, 1) if fill is not None
                  else x.new_zeros(()))
        padded = F.pad(x - fill_t, (padding, padding, padding, padding)) + fill_t
    out = padded.gather(2, row_idx[:, None, :, None].expand(n, c, h, w + 2 * padding))
    return out.gather(3, col_idx[:, None, None, :].expand(n, c, h, w))


def simclr_views(x: torch.Tensor, generator: torch.Generator, mean: Sequence[float],
                 std: Sequence[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """Two independently augmented views of every image in normalised N x C x H x W `x`, for contrastive
    losses (SupCon, FedClassAvg): random resized crop + horizontal flip, colour jitter (brightness,
    contrast, saturation) and random grayscale.

    `mean`/`std` are the per-channel constants `x` was normalised with (`Dataset.mean`/`std`): the colour
    ops are defined on [0, 1] pixels, so each view is un-normalised, augmented, clipped and normalised back.
    Simplified relative to torchvision's transforms: an out-of-range crop box is clamped to the image
    instead of re-drawn (up to 10 times, then a centre crop); the crop is resampled bilinearly without
    antialiasing; jitter has no hue component and applies its three ops in a fixed order, not a random one;
    no Gaussian blur (SimCLR uses it only on ImageNet)."""
    shape = (1, -1, 1, 1)
    mean_t = torch.tensor(mean, dtype=x.dtype, device=x.device).view(shape)
    std_t = torch.tensor(std, dtype=x.dtype, device=x.device).view(shape)
    pixels = x * std_t + mean_t
    first, second = ((_simclr_view(pixels, generator) - mean_t) / std_t for _ in range(2))
    return first, second


def _uniform(n: int, low: float, high: float, generator: torch.Generator, like: torch.Tensor) -> torch.Tensor:
    return torch.rand(n, generator=generator, device=like.device, dtype=like.dtype) * (high - low) + low


def _gray(pixels: torch.Tensor) -> torch.Tensor:
    """N x 1 x H x W luma of [0, 1] pixels (single-channel images are their own luma)."""
    if pixels.shape[1] != 3:
        return pixels.mean(1, keepdim=True)
    weights = torch.tensor(_GRAY_WEIGHTS, dtype=pixels.dtype, device=pixels.device).view(1, 3, 1, 1)
    return (pixels * weights).sum(1, keepdim=True)


def _simclr_view(pixels: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One augmented view of [0, 1] pixels."""
    n, _, h, w = pixels.shape
    # Random resized crop + flip as one affine resampling: the output grid spans the crop box, and a
    # flip negates its x extent. Box sides are fractions of the image's sides (area fraction `area`,
    # width/height in pixels `ratio`), the centre is in grid_sample's [-1, 1] coordinates.
    area = _uniform(n, *_CROP_SCALE, generator, pixels)
    ratio = torch.exp(_uniform(n, math.log(_CROP_RATIO[0]), math.log(_CROP_RATIO[1]), generator, pixels))
    box_w = torch.sqrt(area * ratio * h / w).clamp(max=1.0)
    box_h = torch.sqrt(area / ratio * w / h).clamp(max=1.0)
    centre_x = (1 - box_w) * (2 * torch.rand(n, generator=generator, device=pixels.device, dtype=pixels.dtype) - 1)
    centre_y = (1 - box_h) * (2 * torch.rand(n, generator=generator, device=pixels.device, dtype=pixels.dtype) - 1)
    sign = torch.where(torch.rand(n, generator=generator, device=pixels.device) < 0.5, -1.0, 1.0).to(pixels.dtype)
    theta = torch.zeros(n, 2, 3, dtype=pixels.dtype, device=pixels.device)
    theta[:, 0, 0], theta[:, 0, 2] = box_w * sign, centre_x
    theta[:, 1, 1], theta[:, 1, 2] = box_h, centre_y
    grid = F.affine_grid(theta, list(pixels.shape), align_corners=False)
    out = F.grid_sample(pixels, grid, mode="bilinear", padding_mode="border", align_corners=False)

    # Colour jitter on a random 80 % of the batch; the rest get factor 1, which is the identity.
    jitter = (torch.rand(n, generator=generator, device=pixels.device) < _P_JITTER).view(n, 1, 1, 1)
    factors = _uniform(3 * n, 1 - _JITTER, 1 + _JITTER, generator, pixels).view(3, n, 1, 1, 1)
    brightness, contrast, saturation = (torch.where(jitter, f, torch.ones_like(f)) for f in factors)
    out = (out * brightness).clamp_(0, 1)
    out = (contrast * out + (1 - contrast) * _gray(out).mean((2, 3), keepdim=True)).clamp_(0, 1)
    out = (saturation * out + (1 - saturation) * _gray(out)).clamp_(0, 1)

    gray = (torch.rand(n, generator=generator, device=pixels.device) < _P_GRAY).view(n, 1, 1, 1)
    return torch.where(gray, _gray(out).expand_as(out), out)
