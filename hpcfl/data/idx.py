"""IDX-format sets: Fashion-MNIST, MNIST and EMNIST letters, gzip-compressed or not, in Debian's,
torchvision's or a flat layout."""
import gzip
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from hpcfl.data.base import DEBIAN_ROOT, Dataset, image_dataset, not_found, partly_there, torchvision_fix
from hpcfl.data.cache import cached
from hpcfl.errors import DataError

# Per-channel mean/std after scaling to [0, 1]; their sources are listed in hpcfl/data/datasets.py.
_FASHION_MEAN, _FASHION_STD = (0.28604060,), (0.35302424,)
_MNIST_MEAN, _MNIST_STD = (0.13066052,), (0.30810780,)
_EMNIST_LETTERS_MEAN, _EMNIST_LETTERS_STD = (0.17222731,), (0.33091591,)

_MNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
_EMNIST_LETTERS_FILES = tuple(f"emnist-letters-{split}-{kind}"
                              for split in ("train", "test") for kind in ("images-idx3-ubyte", "labels-idx1-ubyte"))


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


@dataclass(frozen=True)
class _IdxSet:
    """Where an IDX-format set may lie and what its files must hold."""

    name: str
    title: str
    folders: tuple[str, ...]        # relative to the root; "" is the root itself
    files: tuple[str, ...]          # train images, train labels, test images, test labels (each optionally .gz)
    num_classes: int
    first_label: int                # EMNIST letters number their classes from 1
    transposed: bool                # EMNIST stores every image transposed relative to MNIST
    mean: tuple[float, ...]
    std: tuple[float, ...]
    fix: Callable[[Path], str]


def _find_idx(folder: Path, name: str) -> Path | None:
    for candidate in (folder / f"{name}.gz", folder / name):
        if candidate.is_file():
            return candidate
    return None


def load_idx_set(spec: _IdxSet, root: Path, train_images: bool = True) -> Dataset:
    """An IDX set from the first folder under `root` that holds all four files (the training images
    only if `train_images`)."""
    folders = [root / f if f else root for f in spec.folders]
    for folder in folders:
        paths = [_find_idx(folder, name) for name in spec.files]
        if all(paths):
            break
    else:
        raise not_found(spec.title, folders, ", ".join(f + "(.gz)" for f in spec.files), spec.fix(root),
                        partly_there(folders, [f + "(.gz)" for f in spec.files],
                                     lambda folder, name: _find_idx(folder, name.removesuffix("(.gz)")) is not None))
    arrays = cached(spec.name, paths, partial(_decode, spec, paths), train_images)
    if folder == root:
        _check_not_a_twin(spec, root, arrays["test_x"])
    return image_dataset(spec.name, (arrays["train_x"], arrays["train_y"]), (arrays["test_x"], arrays["test_y"]),
                          spec.num_classes, spec.mean, spec.std)


def _check_not_a_twin(spec: _IdxSet, root: Path, test_x: np.ndarray) -> None:
    """MNIST and Fashion-MNIST name their files alike, so a root holding one set's files flat would
    answer for both: the test images' mean pixel (0.13 against 0.29) says which set they are."""
    mean = float(test_x.mean()) / 255
    nearest = min((s for s in IDX_SETS if s.files == spec.files), key=lambda s: abs(mean - s.mean[0]))
    if nearest is not spec:
        raise DataError(f"{root} holds {nearest.title}'s files, not {spec.title}'s (their test images' mean pixel is "
                        f"{mean:.3f}; {nearest.title}'s is {nearest.mean[0]:.3f}, {spec.title}'s "
                        f"{spec.mean[0]:.3f}): put each set in its own folder ({root / spec.folders[0]}), or "
                        "point --data-root at the folder that holds this set")


def _decode(spec: "_IdxSet", paths: list[Path], train_images: bool) -> dict:
    """The four files checked and decoded: uint8 N x 1 x 28 x 28 pixels, labels from 0."""
    train_img, train_lbl, test_img, test_lbl = (read_idx(p) if train_images or p != paths[0] else None for p in paths)
    last = spec.first_label + spec.num_classes - 1
    for img, lbl, img_path, lbl_path in ((train_img, train_lbl, paths[0], paths[1]),
                                         (test_img, test_lbl, paths[2], paths[3])):
        bad_images = img is not None and (img.ndim != 3 or img.shape[1:] != (28, 28) or len(img) != len(lbl))
        if (bad_images or lbl.ndim != 1
                or lbl.min(initial=spec.first_label) < spec.first_label or lbl.max(initial=last) > last):
            shape = "not read" if img is None else img.shape
            raise DataError(f"{img_path} ({shape}) and {lbl_path} ({lbl.shape}) are not a matching {spec.title} "
                            f"pair of 28x28 images and labels {spec.first_label}..{last}; "
                            "replace them with intact copies")

    def pixels(img):
        if img is None:
            return None
        return np.ascontiguousarray((img.transpose(0, 2, 1) if spec.transposed else img)[:, None])

    return {"train_x": pixels(train_img), "train_y": train_lbl.astype(np.int64) - spec.first_label,
            "test_x": pixels(test_img), "test_y": test_lbl.astype(np.int64) - spec.first_label}


FASHION_MNIST = _IdxSet(
    "fashion_mnist", "Fashion-MNIST", ("fashion-mnist", "FashionMNIST/raw", ""), _MNIST_FILES, 10, 0, False,
    _FASHION_MEAN, _FASHION_STD,
    lambda root: f"`apt-get install dataset-fashion-mnist` (installs to {DEBIAN_ROOT / 'fashion-mnist'})")
MNIST = _IdxSet(
    "mnist", "MNIST", ("mnist", "MNIST/raw", ""), _MNIST_FILES, 10, 0, False, _MNIST_MEAN, _MNIST_STD,
    lambda root: torchvision_fix("MNIST", root))
# The official archive (gzip.zip) unpacks to gzip/; torchvision unpacks it into EMNIST/raw/.
EMNIST_LETTERS = _IdxSet(
    "emnist_letters", "EMNIST letters", ("emnist", "emnist/gzip", "EMNIST/raw", ""), _EMNIST_LETTERS_FILES,
    26, 1, True, _EMNIST_LETTERS_MEAN, _EMNIST_LETTERS_STD,
    lambda root: torchvision_fix("EMNIST", root, ", split='letters'"))
IDX_SETS = (FASHION_MNIST, MNIST, EMNIST_LETTERS)
