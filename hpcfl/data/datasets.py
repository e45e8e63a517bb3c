"""Real data sets, read offline from a data root: a cluster's compute nodes rarely reach the internet.

Nothing here downloads; a missing file is a `DataError` that says where we looked and how to fix it.
"""
import gzip
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from hpcfl.errors import ConfigError, DataError
from hpcfl.seeding import numpy_rng

DEBIAN_ROOT = Path("/usr/share/datasets")

# Per-channel mean/std of each training set after scaling to [0, 1], computed once from the data.
_FASHION_MEAN, _FASHION_STD = 0.28604060, 0.35302424
_DIGITS_MEAN, _DIGITS_STD = 0.30474115, 0.37591933

_FASHION_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                  "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


@dataclass(frozen=True, eq=False)
class Dataset:
    """A normalised train/test pair on the CPU; `eq=False` because tensors have no single truth value."""

    name: str
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of one sample, for building a model before any data reaches it."""
        return tuple(self.train_x.shape[1:])


def resolve_data_root(explicit: str | None) -> Path:
    """The data root: `explicit` (--data-root or data.root), else $HPCFL_DATA, else Debian's dataset folder."""
    if explicit:
        return Path(explicit).expanduser()
    env = os.environ.get("HPCFL_DATA")
    return Path(env).expanduser() if env else DEBIAN_ROOT


def read_idx(path: Path) -> np.ndarray:
    """An unsigned-byte IDX array from `path` (gzip-compressed if it ends in .gz), checked against its header."""
    try:
        raw = path.read_bytes()
        if path.suffix == ".gz":
            raw = gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(f"cannot read IDX file {path}: {exc}; replace it with an intact copy") from exc
    if len(raw) < 4 or raw[:3] != b"\x00\x00\x08":
        raise DataError(f"{path} is not an unsigned-byte IDX file (bad magic number); replace it with an intact copy")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{path} is truncated inside its header; replace it with an intact copy")
    dims = struct.unpack(f">{ndim}I", raw[4:header])
    if len(raw) - header != int(np.prod(dims)):
        raise DataError(f"{path} holds {len(raw) - header} data bytes but its header {dims} needs "
                        f"{int(np.prod(dims))}; the file is truncated or corrupt: replace it with an intact copy")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims)


def _normalise(pixels: np.ndarray, scale: float, mean: float, std: float) -> torch.Tensor:
    """float32 (pixels / scale - mean) / std, built in place to keep peak memory at one copy."""
    x = torch.from_numpy(pixels.astype(np.float32))
    return x.mul_(1.0 / (scale * std)).sub_(mean / std)


def _find_idx(folder: Path, name: str) -> Path | None:
    for candidate in (folder / f"{name}.gz", folder / name):
        if candidate.is_file():
            return candidate
    return None


def _load_fashion_mnist(root: Path) -> Dataset:
    """Fashion-MNIST from Debian's, torchvision's or a flat layout under `root`."""
    folders = [root / "fashion-mnist", root / "FashionMNIST" / "raw", root]
    for folder in folders:
        paths = [_find_idx(folder, name) for name in _FASHION_FILES]
        if all(paths):
            break
    else:
        searched = ", ".join(str(f) for f in folders)
        raise DataError(
            f"Fashion-MNIST not found; searched {searched} for {', '.join(f + '(.gz)' for f in _FASHION_FILES)}. "
            f"Fix: `apt-get install dataset-fashion-mnist` (installs to {DEBIAN_ROOT / 'fashion-mnist'}), "
            "or point --data-root / HPCFL_DATA at a folder holding those files")
    train_img, train_lbl, test_img, test_lbl = (read_idx(p) for p in paths)
    for img, lbl, img_path, lbl_path in ((train_img, train_lbl, paths[0], paths[1]),
                                         (test_img, test_lbl, paths[2], paths[3])):
        if img.ndim != 3 or img.shape[1:] != (28, 28) or lbl.ndim != 1 or len(img) != len(lbl) or lbl.max() > 9:
            raise DataError(f"{img_path} ({img.shape}) and {lbl_path} ({lbl.shape}) are not a matching "
                            "Fashion-MNIST pair of 28x28 images and labels 0..9; replace them with intact copies")
    return Dataset(
        name="fashion_mnist",
        train_x=_normalise(train_img[:, None], 255.0, _FASHION_MEAN, _FASHION_STD),
        train_y=torch.from_numpy(train_lbl.astype(np.int64)),
        test_x=_normalise(test_img[:, None], 255.0, _FASHION_MEAN, _FASHION_STD),
        test_y=torch.from_numpy(test_lbl.astype(np.int64)),
        num_classes=10,
    )


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
        train_x=_normalise(pixels[train], 16.0, _DIGITS_MEAN, _DIGITS_STD),
        train_y=torch.from_numpy(labels[train]),
        test_x=_normalise(pixels[test], 16.0, _DIGITS_MEAN, _DIGITS_STD),
        test_y=torch.from_numpy(labels[test]),
        num_classes=10,
    )


DATASETS: dict[str, Callable[[Path], Dataset]] = {
    "fashion_mnist": _load_fashion_mnist,
    "digits": _load_digits,
}


def load_dataset(name: str, root: Path) -> Dataset:
    """The data set `name` from `root`; an unknown name is a config error listing the valid ones."""
    if name not in DATASETS:
        raise ConfigError(f"data.dataset = {name!r} is not a known data set; valid: {', '.join(sorted(DATASETS))}")
    return DATASETS[name](Path(root))
