"""Batched on-device augmentation: seeded, shape-preserving, and doing exactly the advertised geometry."""
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
