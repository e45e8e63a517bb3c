"""What every data set loader shares: the Dataset record, the data root, the missing-data message,
and normalisation of uint8 images into float32 tensors.

Nothing in hpcfl.data downloads; a missing file is a `DataError` that says where we looked and how to
fix it. Images come out as normalised float32 N x C x H x W tensors on the CPU, labels as int64.
"""
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from hpcfl.errors import DataError

DEBIAN_ROOT = Path("/usr/share/datasets")


@dataclass(frozen=True, eq=False)
class Dataset:
    """A normalised train/test pair on the CPU; `eq=False` because tensors have no single truth value.

    `mean`/`std` are the per-channel constants the images were normalised with (None for non-images),
    so on-device augmentation can work in pixel space. `groups` gives each training sample's natural
    owner, for the `natural` partition (the LEAF user for Shakespeare; None where there is none).

    An image set may hand over its training images as decoded uint8 `train_pixels` (N x C x H x W,
    divided by `pixel_scale` before normalising) with `train_x` None, and no float32 copy of the whole
    set is made (for Fashion-MNIST 188 MB to touch, most of what a new run's set-up spent): a CPU
    client keeps its rows as pixels and normalises each batch (`pixel_normalization`, Client.inputs),
    a GPU client's rows are normalised into its tensor (`train_rows`). Reading `train_x` still works:
    it normalises all the pixels on first use and keeps them."""

    name: str
    train_x: torch.Tensor | None = field(repr=False)   # hasattr and dataclasses.replace make all of it
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    groups: np.ndarray | None = None
    train_pixels: np.ndarray | None = field(default=None, repr=False)
    pixel_scale: float = 255.0

    def __post_init__(self):
        if self.train_x is None:
            if self.train_pixels is None or self.mean is None or self.std is None:
                raise ValueError(f"data set {self.name!r}: train_x None needs train_pixels, mean and std")
            object.__delattr__(self, "train_x")        # read through __getattr__: normalised on first use

    def __getattr__(self, name: str):
        """Called only for attributes not set: `train_x` of a set that holds pixels, made once."""
        if name != "train_x" or "train_pixels" not in self.__dict__:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        x = normalise(self.train_pixels, self.pixel_scale, self.mean, self.std)
        object.__setattr__(self, "train_x", x)
        return x

    @property
    def input_shape(self) -> tuple[int, ...]:
        """(C, H, W) of one image, or (seq_len,) of one token sequence, to build a model before data reaches it."""
        return tuple((self.train_x if "train_x" in self.__dict__ else self.train_pixels).shape[1:])

    def train_rows(self, index: np.ndarray, normalised: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """The training samples `index` (inputs, labels) as new CPU tensors; from pixels, only these
        rows are normalised, to the same floats `train_x` holds. `normalised=False` gives a set that has
        pixels as contiguous uint8 rows (`pixel_normalization` turns them into those floats)."""
        index = np.asarray(index, dtype=np.int64)
        labels = take(self.train_y, index)
        if self.train_pixels is None or (normalised and "train_x" in self.__dict__):
            return take(self.train_x, index), labels
        rows = self.train_pixels[index]          # copies these rows only, even from a channels-last view
        if normalised:
            return normalise(rows, self.pixel_scale, self.mean, self.std), labels
        return torch.from_numpy(np.ascontiguousarray(rows)), labels

    def pixel_normalization(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(scale, shift), float32 shaped 1 x C x 1 x 1: pixels.float() * scale - shift are the floats
        `train_x` holds, bit for bit (the two float32 operations `normalise` makes)."""
        scale, shift = _constants(self.pixel_scale, self.mean, self.std, self.train_pixels.ndim)
        return torch.from_numpy(scale), torch.from_numpy(shift)


def take(x: torch.Tensor, index: np.ndarray) -> torch.Tensor:
    """Rows `index` of a tensor as a new tensor (index_select: 4x faster than x[index] on the CPU)."""
    return x.index_select(0, torch.from_numpy(np.asarray(index, dtype=np.int64)).to(x.device))


def resolve_data_root(explicit: str | None) -> Path:
    """The data root: `explicit` (--data-root or data.root), else $HPCFL_DATA, else Debian's dataset folder."""
    if explicit:
        return Path(explicit).expanduser()
    env = os.environ.get("HPCFL_DATA")
    return Path(env).expanduser() if env else DEBIAN_ROOT


def not_found(title: str, searched: list[Path], wanted: str, fix: str,
              lacking: tuple[Path, list[str]] | None = None) -> DataError:
    """The one shape of every missing-data message: where we looked, for what, and how to get it; and a
    folder holding only some of the files (a copy cut short), with those it `lacking` (`partly_there`)."""
    partly = (f"{lacking[0]} holds some of its files but lacks {', '.join(lacking[1])} (a copy cut short?); "
              if lacking else "")
    return DataError(f"{title} not found; {partly}searched {', '.join(str(p) for p in searched)} for {wanted}. "
                     f"Fix: {fix}, or point --data-root / HPCFL_DATA at a folder holding them")


def partly_there(folders: list[Path], names: list[str], has: Callable[[Path, str], bool]
                 ) -> tuple[Path, list[str]] | None:
    """Of `folders` holding some of the files `names` (`has(folder, name)`) but not all, the one
    holding the most, with the names it lacks; None if none holds any."""
    absent = [(folder, [name for name in names if not has(folder, name)]) for folder in folders]
    return min(((f, a) for f, a in absent if len(a) < len(names)), key=lambda fa: len(fa[1]), default=None)


def torchvision_fix(cls: str, root: Path, extra: str = "") -> str:
    """How to fetch a set that torchvision can download: on a machine with internet, then copy it over."""
    return (f"on a machine with internet run `python -c \"import torchvision; torchvision.datasets.{cls}"
            f"('DIR'{extra}, download=True)\"` and copy what it writes under DIR into {root}")


def normalise(pixels: np.ndarray, scale: float, mean: tuple[float, ...], std: tuple[float, ...]) -> torch.Tensor:
    """float32 (pixels / scale - mean) / std per channel (axis 1), computed as pixels * (1 / (scale std)) -
    mean / std: NumPy converts and multiplies in one pass into the one float32 copy, row-major even from a
    channels-last view (the convolutions' fast path), then subtracts in place; 3x faster than converting
    first and making two more passes, and the same floats."""
    multiply, shift = _constants(scale, mean, std, pixels.ndim)
    x = np.multiply(pixels, multiply, dtype=np.float32, order="C")
    np.subtract(x, shift, out=x)
    return torch.from_numpy(x)


def _constants(scale: float, mean: tuple[float, ...], std: tuple[float, ...], ndim: int) -> tuple[np.ndarray, ...]:
    """float32 1 / (scale std) and mean / std per channel, shaped to broadcast over axis 1 of `ndim` axes."""
    shape = (1, len(mean)) + (1,) * (ndim - 2)
    mean64, std64 = np.asarray(mean, dtype=np.float64), np.asarray(std, dtype=np.float64)
    return (1.0 / (scale * std64)).astype(np.float32).reshape(shape), (mean64 / std64).astype(np.float32).reshape(shape)


def image_dataset(name: str, train: tuple[np.ndarray | None, np.ndarray], test: tuple[np.ndarray, np.ndarray],
                  num_classes: int, mean: tuple[float, ...], std: tuple[float, ...]) -> Dataset:
    """A Dataset from uint8 N x C x H x W pixels and integer labels, the training images kept as
    pixels (normalised as rows are taken); train pixels None (a loader told to skip the training
    images): no training rows."""
    pixels = train[0] if train[0] is not None else test[0][:0]
    return Dataset(name=name, train_x=None,
                   train_y=torch.from_numpy(np.asarray(train[1], dtype=np.int64)),
                   test_x=normalise(test[0], 255.0, mean, std),
                   test_y=torch.from_numpy(np.asarray(test[1], dtype=np.int64)),
                   num_classes=num_classes, mean=mean, std=std, train_pixels=pixels)
