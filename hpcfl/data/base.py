"""What every data set loader shares: the Dataset record, the data root, the missing-data message,
and normalisation of uint8 images into float32 tensors.

Nothing in hpcfl.data downloads; a missing file is a `DataError` that says where we looked and how to
fix it. Images come out as normalised float32 N x C x H x W tensors on the CPU, labels as int64.
"""
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from hpcfl.errors import DataError

DEBIAN_ROOT = Path("/usr/share/datasets")


@dataclass(frozen=True, eq=False)
class Dataset:
    """A normalised train/test pair on the CPU; `eq=False` because tensors have no single truth value.

    `mean`/`std` are the per-channel constants the images were normalised with (None for non-images),
    so on-device augmentation can work in pixel space. `groups`/`test_groups` give each sample's natural
    owner (the LEAF user for Shakespeare, one numbering for both splits; None where there is none)."""

    name: str
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    groups: np.ndarray | None = None
    test_groups: np.ndarray | None = None

    @property
    def input_shape(self) -> tuple[int, ...]:
        """(C, H, W) of one image, or (seq_len,) of one token sequence, to build a model before data reaches it."""
        return tuple(self.train_x.shape[1:])


def resolve_data_root(explicit: str | None) -> Path:
    """The data root: `explicit` (--data-root or data.root), else $HPCFL_DATA, else Debian's dataset folder."""
    if explicit:
        return Path(explicit).expanduser()
    env = os.environ.get("HPCFL_DATA")
    return Path(env).expanduser() if env else DEBIAN_ROOT


def not_found(title: str, searched: list[Path], wanted: str, fix: str) -> DataError:
    """The one shape of every missing-data message: where we looked, for what, and how to get it."""
    return DataError(f"{title} not found; searched {', '.join(str(p) for p in searched)} for {wanted}. "
                     f"Fix: {fix}, or point --data-root / HPCFL_DATA at a folder holding them")


def torchvision_fix(cls: str, root: Path, extra: str = "") -> str:
    """How to fetch a set that torchvision can download: on a machine with internet, then copy it over."""
    return (f"on a machine with internet run `python -c \"import torchvision; torchvision.datasets.{cls}"
            f"('DIR'{extra}, download=True)\"` and copy what it writes under DIR into {root}")


def normalise(pixels: np.ndarray, scale: float, mean: tuple[float, ...], std: tuple[float, ...]) -> torch.Tensor:
    """float32 (pixels / scale - mean) / std per channel (axis 1), computed as pixels * (1 / (scale std)) -
    mean / std: NumPy converts and multiplies in one pass into the one float32 copy, row-major even from a
    channels-last view (the convolutions' fast path), then subtracts in place; 3x faster than converting
    first and making two more passes, and the same floats."""
    shape = (1, len(mean)) + (1,) * (pixels.ndim - 2)
    mean64, std64 = np.asarray(mean, dtype=np.float64), np.asarray(std, dtype=np.float64)
    x = np.multiply(pixels, (1.0 / (scale * std64)).astype(np.float32).reshape(shape), dtype=np.float32, order="C")
    np.subtract(x, (mean64 / std64).astype(np.float32).reshape(shape), out=x)
    return torch.from_numpy(x)


def image_dataset(name: str, train: tuple[np.ndarray, np.ndarray], test: tuple[np.ndarray, np.ndarray],
                   num_classes: int, mean: tuple[float, ...], std: tuple[float, ...]) -> Dataset:
    """A Dataset from uint8 N x C x H x W pixels and integer labels; train pixels None (a loader told
    to skip the training images): train_x has no rows."""
    test_x = normalise(test[0], 255.0, mean, std)
    return Dataset(name=name,
                   train_x=normalise(train[0], 255.0, mean, std) if train[0] is not None else test_x[:0],
                   train_y=torch.from_numpy(np.asarray(train[1], dtype=np.int64)),
                   test_x=test_x,
                   test_y=torch.from_numpy(np.asarray(test[1], dtype=np.int64)),
                   num_classes=num_classes, mean=mean, std=std)
