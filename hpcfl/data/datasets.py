"""The data set registry: real data sets read offline from a data root (a cluster's compute nodes
rarely reach the internet), plus scikit-learn's bundled digits and a seeded synthetic mixture.

One module per file format: idx (Fashion-MNIST, MNIST, EMNIST letters), cifar, folders (CINIC-10,
Tiny-ImageNet), leaf (Shakespeare); base holds what they share.
"""
import dataclasses
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import torch

from hpcfl.data.base import Dataset, normalise
from hpcfl.data.cifar import load_cifar10, load_cifar100
from hpcfl.data.folders import load_cinic10, load_tiny_imagenet
from hpcfl.data.idx import EMNIST_LETTERS, FASHION_MNIST, MNIST, load_idx_set
from hpcfl.data.leaf import load_shakespeare
from hpcfl.errors import ConfigError, DataError
from hpcfl.plugins import Registry, callable_check
from hpcfl.seeding import numpy_rng

# Per-channel mean/std of each training set after scaling to [0, 1] (pixel statistics over the whole
# set), kept next to each format's loader. Fashion-MNIST and digits were computed here from the data;
# the others are the published full-precision values for their training sets (MNIST: PyTorch's MNIST
# example; EMNIST letters: Lightning Bolts' emnist_normalization; CIFAR: recomputed by many from the
# python batches; CINIC-10: its README; Tiny-ImageNet: the widely used values, not recomputed here).
_DIGITS_MEAN, _DIGITS_STD = (0.30474115,), (0.37591933,)

_SYNTHETIC_SHAPE = (1, 8, 8)       # 64 features (FedProx uses 60) as a square, so image models accept it too
_SYNTHETIC_SIZES = (60000, 10000)  # train, test: MNIST-sized
_SYNTHETIC_CLASSES = 10
_SYNTHETIC_SPREAD = 0.3            # std of the class means over unit noise: a linear model tops out near 75 %


def _load_synthetic(root: Path) -> Dataset:
    """A seeded Gaussian mixture for scale tests: one unit-variance Gaussian per class around a random mean.

    Same data on every rank and run (numpy_rng(0, "synthetic")); `root` is unused. Features are scaled
    by 1/sqrt(1 + spread^2) so each has variance ~1 without data-dependent constants."""
    rng = numpy_rng(0, "synthetic")
    dim = int(np.prod(_SYNTHETIC_SHAPE))
    means = rng.normal(0.0, _SYNTHETIC_SPREAD, (_SYNTHETIC_CLASSES, dim)).astype(np.float32)
    scale = np.float32(1.0 / np.sqrt(1.0 + _SYNTHETIC_SPREAD ** 2))

    def draw(n):
        y = rng.integers(0, _SYNTHETIC_CLASSES, n)
        x = rng.standard_normal((n, dim), dtype=np.float32)
        x += means[y]
        x *= scale
        return torch.from_numpy(x.reshape(n, *_SYNTHETIC_SHAPE)), torch.from_numpy(y.astype(np.int64))

    train_x, train_y = draw(_SYNTHETIC_SIZES[0])
    test_x, test_y = draw(_SYNTHETIC_SIZES[1])
    return Dataset(name="synthetic", train_x=train_x, train_y=train_y, test_x=test_x, test_y=test_y,
                   num_classes=_SYNTHETIC_CLASSES)


def _digits_split(labels: np.ndarray, test_fraction: float = 0.2) -> tuple[np.ndarray, np.ndarray]:
    """Sorted (train, test) indices: the same `test_fraction` of every class, fixed for all runs."""
    perm = numpy_rng(0, "digits-split").permutation(len(labels))
    test = []
    for c in np.unique(labels):
        members = perm[labels[perm] == c]
        test.append(members[:round(test_fraction * len(members))])
    test_idx = np.sort(np.concatenate(test))
    return np.setdiff1d(np.arange(len(labels)), test_idx), test_idx


def _load_digits(root: Path) -> Dataset:
    """scikit-learn's bundled 8x8 digits (real scans, no download); `root` is unused: the data ships with sklearn."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    pixels = bunch.images[:, None]
    labels = bunch.target.astype(np.int64)
    train, test = _digits_split(labels)
    return Dataset(
        name="digits",
        train_x=normalise(pixels[train], 16.0, _DIGITS_MEAN, _DIGITS_STD),
        train_y=torch.from_numpy(labels[train]),
        test_x=normalise(pixels[test], 16.0, _DIGITS_MEAN, _DIGITS_STD),
        test_y=torch.from_numpy(labels[test]),
        num_classes=10, mean=_DIGITS_MEAN, std=_DIGITS_STD,
    )


def _inputs_cheap(loader: Callable[[Path], Dataset]) -> Callable[[Path, bool], Dataset]:
    """A set whose training inputs cost little to make (bundled, generated or text): made anyway, and
    dropped when not wanted."""
    def load(root: Path, train_images: bool) -> Dataset:
        data = loader(root)
        return data if train_images else dataclasses.replace(data, train_x=data.train_x[:0])
    return load


# data.dataset -> load(root, train_images=...) -> Dataset; or a plug-in's "package.module:load" (hpcfl.plugins)
DATASETS = Registry("data.dataset", callable_check("a data-set loader", "loader(root, train_images=...)", Path("."),
                                                   train_images=True), {
    "fashion_mnist": partial(load_idx_set, FASHION_MNIST),
    "mnist": partial(load_idx_set, MNIST),
    "emnist_letters": partial(load_idx_set, EMNIST_LETTERS),
    "cifar10": load_cifar10,
    "cifar100": load_cifar100,
    "cinic10": load_cinic10,
    "tiny_imagenet": load_tiny_imagenet,
    "shakespeare": _inputs_cheap(load_shakespeare),
    "synthetic": _inputs_cheap(_load_synthetic),
    "digits": _inputs_cheap(_load_digits),
})


def load_dataset(name: str, root: Path, train_images: bool = True) -> Dataset:
    """The data set `name` from `root`; an unknown name is a config error listing the valid ones.
    train_images=False (the server: it needs the labels and the test set): train_x has no rows, and
    the image-file sets do not decode or normalise the training images at all."""
    data = DATASETS[name](Path(root), train_images=train_images)
    if not isinstance(data, Dataset):
        raise ConfigError(f"data.dataset = {name!r} returned {type(data).__name__}, not an hpcfl.data.base.Dataset")
    _check_tensors(name, data, train_images)
    return data


def _check_tensors(name: str, data: Dataset, train_images: bool) -> None:
    """A loader's inputs and labels as training reads them: torch tensors, labels 1-d int64, inputs
    float32 (int64 for token sequences), one label per input. The built-ins pass by construction;
    a plug-in's mistake is named here rather than as a dtype error in round 1."""
    train_x = data.train_x if train_images and data.train_pixels is None else None   # the server's has no rows
    for split, x, y in (("test", data.test_x, data.test_y), ("train", train_x, data.train_y)):
        fault = _tensor_fault(split, x, y)
        if fault:
            raise DataError(f"data.dataset = {name!r}: {fault} (docs: add a data set or model)")


def _tensor_fault(split: str, x, y) -> str | None:
    if not isinstance(y, torch.Tensor):
        return f"{split}_y is {type(y).__name__}, not a torch.Tensor"
    if y.dtype != torch.int64 or y.dim() != 1:
        return f"{split}_y is {y.dtype} of shape {tuple(y.shape)}, not 1-d int64 labels"
    if x is None:
        return None
    if not isinstance(x, torch.Tensor):
        return f"{split}_x is {type(x).__name__}, not a torch.Tensor"
    if x.dtype not in (torch.float32, torch.int64):
        return f"{split}_x is {x.dtype}, not float32 (or int64 tokens)"
    if len(x) != len(y):
        return f"{split}_x has {len(x)} rows but {split}_y {len(y)} labels"
    return None
