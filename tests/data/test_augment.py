"""Batched on-device augmentation: seeded, shape-preserving, and doing exactly the advertised geometry."""
import functools
import math

import pytest
import torch
import torch.nn.functional as F

from hpcfl.data.augment import random_crop_flip, simclr_views

torch.set_num_threads(1)

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU"))]
MEAN, STD = (0.49, 0.48, 0.45), (0.25, 0.24, 0.26)


def _gen(seed: int, device="cpu") -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def _distinct(n: int, c: int = 3, side: int = 8, device="cpu", dtype=torch.float32) -> torch.Tensor:
    """Images whose every pixel value is unique (and nonzero, so none matches the zero padding)."""
    return torch.arange(1, n * c * side * side + 1, dtype=dtype, device=device).view(n, c, side, side)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_crop_flip_keeps_shape_dtype_device_and_is_seeded(device, dtype):
    x = _distinct(16, device=device, dtype=dtype)
    out = random_crop_flip(x, _gen(1, device))
    assert out.shape == x.shape and out.dtype == dtype and out.device == x.device
    assert torch.equal(out, random_crop_flip(x, _gen(1, device)))
    assert not torch.equal(out, random_crop_flip(x, _gen(2, device)))


def test_crop_flip_output_is_a_window_of_the_padded_image():
    pad, side = 4, 8
    x = _distinct(64, side=side)
    out = random_crop_flip(x, _gen(3), padding=pad)
    padded = F.pad(x, (pad, pad, pad, pad))

    def window(i, dy, dx, flip):
        w = padded[i, :, dy:dy + side, dx:dx + side]
        return w.flip(-1) if flip else w

    seen = set()
    for i in range(len(x)):
        matches = [(dy, dx, flip) for dy in range(2 * pad + 1) for dx in range(2 * pad + 1) for flip in (False, True)
                   if torch.equal(out[i], window(i, dy, dx, flip))]
        assert len(matches) == 1, (i, matches)
        seen.add(matches[0])
    assert len({(dy, dx) for dy, dx, _ in seen}) > 20 and {f for _, _, f in seen} == {False, True}


def test_crop_flip_pads_with_the_fill_of_each_channel():
    """Normalised images pad with a black pixel, -mean / std, as torchvision pads before normalising."""
    x = torch.full((64, 2, 4, 4), 7.0)
    out = random_crop_flip(x, _gen(5), padding=2, fill=[-2.0, 0.5])
    assert set(out[:, 0].unique().tolist()) == {7.0, -2.0} and set(out[:, 1].unique().tolist()) == {7.0, 0.5}
    assert set(random_crop_flip(x, _gen(5), padding=2).unique().tolist()) == {7.0, 0.0}     # default: zeros
    assert torch.equal(random_crop_flip(x, _gen(5), padding=2, fill=[-2.0, 0.5]) == 7.0, out == 7.0)   # same windows


def test_flip_probability_is_one_half():
    x = _distinct(4000, c=1, side=4)
    out = random_crop_flip(x, _gen(4), padding=0)
    flipped = (out == x.flip(-1)).flatten(1).all(1)
    assert torch.all(flipped | (out == x).flatten(1).all(1))   # no padding: only the flip can change an image
    assert abs(flipped.float().mean().item() - 0.5) < 0.05


@pytest.mark.parametrize("device", DEVICES)
def test_simclr_views_keep_shape_dtype_device_and_are_seeded(device):
    x = torch.randn(8, 3, 16, 16, device=device, generator=_gen(0, device))
    a, b = simclr_views(x, _gen(5, device), MEAN, STD)
    for v in (a, b):
        assert v.shape == x.shape and v.dtype == x.dtype and v.device == x.device
    assert not torch.equal(a, b) and not torch.equal(a, x)
    again = simclr_views(x, _gen(5, device), MEAN, STD)
    assert torch.equal(a, again[0]) and torch.equal(b, again[1])
    other = simclr_views(x, _gen(6, device), MEAN, STD)
    assert not torch.equal(a, other[0])


def test_simclr_views_stay_valid_images_and_use_every_op():
    n = 2000
    mean, std = torch.tensor(MEAN).view(1, 3, 1, 1), torch.tensor(STD).view(1, 3, 1, 1)
    pixels = torch.rand(n, 3, 12, 12, generator=_gen(7))
    views = simclr_views((pixels - mean) / std, _gen(8), MEAN, STD)
    for v in views:
        back = v * std + mean
        assert back.min() > -1e-5 and back.max() < 1 + 1e-5          # clipped in pixel space, then renormalised
        gray = ((back - back.mean(1, keepdim=True)).abs().flatten(1).amax(1) < 1e-5)
        assert 0.14 < gray.float().mean().item() < 0.26              # random grayscale, p = 0.2


def test_simclr_crop_flip_of_a_ramp_is_a_monotone_ramp_half_of_them_mirrored():
    """A left-to-right grey ramp stays a ramp under crop/resize (rows identical, each monotone); a flip
    reverses it; jitter and clipping are monotone per pixel, so they keep that. One channel works too."""
    n, side = 2000, 12
    ramp = torch.linspace(0, 1, side).expand(n, 1, side, side)
    for v in simclr_views((ramp - 0.5) / 0.2, _gen(9), (0.5,), (0.2,)):
        assert v.shape == ramp.shape
        assert torch.allclose(v, v[:, :, :1].expand_as(v), atol=1e-5)           # rows identical
        steps = v[:, 0, 0].diff()
        rising, falling = (steps >= -1e-5).all(1), (steps <= 1e-5).all(1)
        assert torch.all(rising | falling)
        strict = rising ^ falling                                               # not flattened to a constant
        assert abs(falling[strict].float().mean().item() - 0.5) < 0.05


def _bilinear_row(row: torch.Tensor, xs: torch.Tensor) -> torch.Tensor:
    """`row` (... x W) read at continuous pixel positions `xs` (pixel k spans [k, k + 1]), linearly
    between pixel centres, clamped to the edge pixels (grid_sample's border mode)."""
    p = (xs - 0.5).clamp(0, row.shape[-1] - 1)
    low = p.floor().long()
    high = (low + 1).clamp(max=row.shape[-1] - 1)
    t = p - low
    return row[..., low] * (1 - t) + row[..., high] * t


def _luma(image: torch.Tensor) -> torch.Tensor:
    """1 x H x W luma of a C x H x W image: PIL's convert("L") weights (the pipeline SupCon's transforms
    ran on; torchvision's tensor path weighs red 0.2989), or the image itself with one channel."""
    if len(image) == 1:
        return image
    return 0.299 * image[0:1] + 0.587 * image[1:2] + 0.114 * image[2:3]


def _reference_view(pixels: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One SimCLR view written the slow way, image by image: RandomResizedCrop's box in pixels (area
    fraction in [0.2, 1], width/height ratio log-uniform in [3/4, 4/3], each side at most the image's,
    placed uniformly inside it) resampled bilinearly, a flip with p = 1/2, then, with p = 0.8,
    torchvision's brightness, contrast and saturation formulas at factors uniform in [0.6, 1.4], and a
    grayscale with p = 0.2. The random numbers are drawn in the order the batched code draws them."""
    n, c, h, w = pixels.shape
    rand = functools.partial(torch.rand, generator=generator, dtype=pixels.dtype)
    area = rand(n) * 0.8 + 0.2
    ratio = torch.exp(rand(n) * (math.log(4 / 3) - math.log(3 / 4)) + math.log(3 / 4))
    place_x, place_y = rand(n), rand(n)
    flip = torch.rand(n, generator=generator) < 0.5
    jitter = torch.rand(n, generator=generator) < 0.8
    factors = (rand(3 * n) * 0.8 + 0.6).view(3, n)
    gray = torch.rand(n, generator=generator) < 0.2
    views = []
    for i in range(n):
        box_w = min(math.sqrt(area[i] * h * w * ratio[i]), w)            # pixels
        box_h = min(math.sqrt(area[i] * h * w / ratio[i]), h)
        left, top = place_x[i] * (w - box_w), place_y[i] * (h - box_h)
        cols = left + (torch.arange(w, dtype=pixels.dtype) + 0.5) * box_w / w
        rows = top + (torch.arange(h, dtype=pixels.dtype) + 0.5) * box_h / h
        image = _bilinear_row(_bilinear_row(pixels[i], cols).transpose(1, 2), rows).transpose(1, 2)
        image = image.flip(-1) if flip[i] else image
        if jitter[i]:
            brightness, contrast, saturation = factors[:, i]
            image = (brightness * image).clamp(0, 1)
            image = (contrast * image + (1 - contrast) * _luma(image).mean()).clamp(0, 1)
            image = (saturation * image + (1 - saturation) * _luma(image)).clamp(0, 1)
        views.append(_luma(image).expand_as(image) if gray[i] else image)
    return torch.stack(views)


@pytest.mark.parametrize("channels, h, w", [(3, 5, 7), (3, 7, 5), (1, 5, 7)])
def test_simclr_views_match_an_image_by_image_reference(channels, h, w):
    """Both views against the slow reference on non-square images (each orientation clamps the other
    side of the box): the crop box's area, ratio, clamp and placement, the flip, each jitter op and its
    range, the grayscale, and the un-/re-normalising."""
    n = 64
    mean, std = MEAN[:channels], STD[:channels]
    pixels = torch.rand(n, channels, h, w, generator=_gen(10), dtype=torch.float64)
    mean_t, std_t = (torch.tensor(v, dtype=torch.float64).view(1, -1, 1, 1) for v in (mean, std))
    views = simclr_views((pixels - mean_t) / std_t, _gen(11), mean, std)
    generator = _gen(11)
    for view in views:
        expected = (_reference_view(pixels, generator) - mean_t) / std_t
        torch.testing.assert_close(view, expected, rtol=0, atol=1e-9)


def test_crop_flip_pads_by_four_by_default():
    x = _distinct(32)
    assert torch.equal(random_crop_flip(x, _gen(12)), random_crop_flip(x, _gen(12), padding=4))


def test_crop_flip_can_pad_by_reflecting_the_border():
    """FedMA's authors pad CIFAR-10 by reflection (F.pad(..., mode="reflect")) before cropping."""
    x = _distinct(64, side=8)
    out = random_crop_flip(x, _gen(6), padding=2, reflect=True)
    reflected = F.pad(x, (2, 2, 2, 2), mode="reflect")
    for i in range(len(x)):
        windows = [reflected[i, :, dy:dy + 8, dx:dx + 8] for dy in range(5) for dx in range(5)]
        assert any(torch.equal(out[i], w) or torch.equal(out[i], w.flip(-1)) for w in windows)
    assert set(out.unique().tolist()) <= set(x.unique().tolist())              # no value from outside the image
