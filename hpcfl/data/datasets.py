"""Real data sets, read offline from a data root: a cluster's compute nodes rarely reach the internet.

Nothing here downloads; a missing file is a `DataError` that says where we looked and how to fix it.
Images come out as normalised float32 N x C x H x W tensors on the CPU, labels as int64.
"""
import gzip
import json
import os
import pickle
import struct
import zlib
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from hpcfl.errors import ConfigError, DataError
from hpcfl.seeding import numpy_rng

DEBIAN_ROOT = Path("/usr/share/datasets")

# Per-channel mean/std of each training set after scaling to [0, 1] (pixel statistics over the whole
# set). Fashion-MNIST and digits were computed here from the data; the others are the published
# full-precision values for their training sets (MNIST: PyTorch's MNIST example; EMNIST letters:
# Lightning Bolts' emnist_normalization; CIFAR: recomputed by many from the python batches; CINIC-10:
# its README; Tiny-ImageNet: the widely used values, not recomputed here).
_FASHION_MEAN, _FASHION_STD = (0.28604060,), (0.35302424,)
_DIGITS_MEAN, _DIGITS_STD = (0.30474115,), (0.37591933,)
_MNIST_MEAN, _MNIST_STD = (0.13066052,), (0.30810780,)
_EMNIST_LETTERS_MEAN, _EMNIST_LETTERS_STD = (0.17222731,), (0.33091591,)
_CIFAR10_MEAN, _CIFAR10_STD = (0.49139968, 0.48215841, 0.44653091), (0.24703223, 0.24348513, 0.26158784)
_CIFAR100_MEAN, _CIFAR100_STD = (0.50707516, 0.48654887, 0.44091784), (0.26733429, 0.25643846, 0.27615047)
_CINIC10_MEAN, _CINIC10_STD = (0.47889522, 0.47227842, 0.43047404), (0.24205776, 0.23828046, 0.25874835)
_TINY_IMAGENET_MEAN, _TINY_IMAGENET_STD = (0.4802, 0.4481, 0.3975), (0.2302, 0.2265, 0.2262)

_MNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
_EMNIST_LETTERS_FILES = tuple(f"emnist-letters-{split}-{kind}"
                              for split in ("train", "test") for kind in ("images-idx3-ubyte", "labels-idx1-ubyte"))
_CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")

# LEAF's Shakespeare vocabulary: index = position in this string (newline, space, punctuation, digits,
# letters, and "}"); 80 symbols, so the next-character task has 80 classes.
SHAKESPEARE_VOCAB = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
_SHAKESPEARE_SEQ_LEN = 80

_SYNTHETIC_SHAPE = (1, 8, 8)       # 64 features (FedProx uses 60) as a square, so image models accept it too
_SYNTHETIC_SIZES = (60000, 10000)  # train, test: MNIST-sized
_SYNTHETIC_CLASSES = 10
_SYNTHETIC_SPREAD = 0.3            # std of the class means over unit noise: a linear model tops out near 75 %


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


def _not_found(title: str, searched: list[Path], wanted: str, fix: str) -> DataError:
    """The one shape of every missing-data message: where we looked, for what, and how to get it."""
    return DataError(f"{title} not found; searched {', '.join(str(p) for p in searched)} for {wanted}. "
                     f"Fix: {fix}, or point --data-root / HPCFL_DATA at a folder holding them")


def _torchvision_fix(cls: str, root: Path, extra: str = "") -> str:
    """How to fetch a set that torchvision can download: on a machine with internet, then copy it over."""
    return (f"on a machine with internet run `python -c \"import torchvision; torchvision.datasets.{cls}"
            f"('DIR'{extra}, download=True)\"` and copy what it writes under DIR into {root}")


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


def _normalise(pixels: np.ndarray, scale: float, mean: tuple[float, ...], std: tuple[float, ...]) -> torch.Tensor:
    """float32 (pixels / scale - mean) / std per channel (axis 1), built in place to keep peak memory at one copy."""
    x = torch.from_numpy(np.ascontiguousarray(pixels, dtype=np.float32))
    shape = (1, len(mean)) + (1,) * (x.dim() - 2)
    mean64, std64 = np.asarray(mean, dtype=np.float64), np.asarray(std, dtype=np.float64)
    factor = torch.from_numpy((1.0 / (scale * std64)).astype(np.float32)).view(shape)
    shift = torch.from_numpy((mean64 / std64).astype(np.float32)).view(shape)
    return x.mul_(factor).sub_(shift)


def _image_dataset(name: str, train: tuple[np.ndarray, np.ndarray], test: tuple[np.ndarray, np.ndarray],
                   num_classes: int, mean: tuple[float, ...], std: tuple[float, ...]) -> Dataset:
    """A Dataset from uint8 N x C x H x W pixels and integer labels."""
    return Dataset(name=name,
                   train_x=_normalise(train[0], 255.0, mean, std),
                   train_y=torch.from_numpy(np.asarray(train[1], dtype=np.int64)),
                   test_x=_normalise(test[0], 255.0, mean, std),
                   test_y=torch.from_numpy(np.asarray(test[1], dtype=np.int64)),
                   num_classes=num_classes, mean=mean, std=std)


# ---------------------------------------------------------------- IDX sets: Fashion-MNIST, MNIST, EMNIST letters

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


def _load_idx_set(spec: _IdxSet, root: Path) -> Dataset:
    """An IDX set from the first folder under `root` that holds all four files."""
    folders = [root / f if f else root for f in spec.folders]
    for folder in folders:
        paths = [_find_idx(folder, name) for name in spec.files]
        if all(paths):
            break
    else:
        raise _not_found(spec.title, folders, ", ".join(f + "(.gz)" for f in spec.files), spec.fix(root))
    train_img, train_lbl, test_img, test_lbl = (read_idx(p) for p in paths)
    last = spec.first_label + spec.num_classes - 1
    for img, lbl, img_path, lbl_path in ((train_img, train_lbl, paths[0], paths[1]),
                                         (test_img, test_lbl, paths[2], paths[3])):
        if (img.ndim != 3 or img.shape[1:] != (28, 28) or lbl.ndim != 1 or len(img) != len(lbl)
                or lbl.min(initial=spec.first_label) < spec.first_label or lbl.max(initial=last) > last):
            raise DataError(f"{img_path} ({img.shape}) and {lbl_path} ({lbl.shape}) are not a matching {spec.title} "
                            f"pair of 28x28 images and labels {spec.first_label}..{last}; "
                            "replace them with intact copies")

    def pixels(img):
        return (img.transpose(0, 2, 1) if spec.transposed else img)[:, None]

    return _image_dataset(spec.name, (pixels(train_img), train_lbl.astype(np.int64) - spec.first_label),
                          (pixels(test_img), test_lbl.astype(np.int64) - spec.first_label),
                          spec.num_classes, spec.mean, spec.std)


_FASHION_MNIST = _IdxSet(
    "fashion_mnist", "Fashion-MNIST", ("fashion-mnist", "FashionMNIST/raw", ""), _MNIST_FILES, 10, 0, False,
    _FASHION_MEAN, _FASHION_STD,
    lambda root: f"`apt-get install dataset-fashion-mnist` (installs to {DEBIAN_ROOT / 'fashion-mnist'})")
_MNIST = _IdxSet(
    "mnist", "MNIST", ("mnist", "MNIST/raw", ""), _MNIST_FILES, 10, 0, False, _MNIST_MEAN, _MNIST_STD,
    lambda root: _torchvision_fix("MNIST", root))
# The official archive (gzip.zip) unpacks to gzip/; torchvision unpacks it into EMNIST/raw/.
_EMNIST_LETTERS = _IdxSet(
    "emnist_letters", "EMNIST letters", ("emnist", "emnist/gzip", "EMNIST/raw", ""), _EMNIST_LETTERS_FILES,
    26, 1, True, _EMNIST_LETTERS_MEAN, _EMNIST_LETTERS_STD,
    lambda root: _torchvision_fix("EMNIST", root, ", split='letters'"))


# ---------------------------------------------------------------- CIFAR-10/100: pickled python batches

class _BatchUnpickler(pickle.Unpickler):
    """Unpickles only what a CIFAR batch is made of: dicts, lists, bytes, numbers and numpy arrays.

    CIFAR ships as pickles, and a pickle may name any callable, so a plain `pickle.load` (what
    torchvision's CIFAR classes do, after an md5 check we cannot use on re-packed or fixture files)
    would run whatever a tampered file asks. The allowed names are those that numpy arrays pickle to:
    Python 2's originals and today's numpy under protocols 2 to 5."""

    ALLOWED = {("numpy", "ndarray"), ("numpy", "dtype"),
               ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
               ("numpy._core.numeric", "_frombuffer"), ("_codecs", "encode")}

    def find_class(self, module: str, name: str):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}, which a CIFAR batch never holds")
        return super().find_class(module, name)


def _read_cifar_batch(path: Path, label_key: bytes, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """uint8 N x 3 x 32 x 32 images and int64 labels from one pickled CIFAR batch."""
    try:
        with path.open("rb") as f:
            # The batches are Python 2 pickles: encoding="bytes" keeps their str fields (and keys) as bytes.
            batch = _BatchUnpickler(f, encoding="bytes").load()
    except Exception as exc:  # a corrupt pickle can fail with almost any exception type
        raise DataError(f"cannot read CIFAR batch {path}: {type(exc).__name__}: {exc}; "
                        "replace it with an intact copy") from exc
    data = batch.get(b"data") if isinstance(batch, dict) else None
    labels = batch.get(label_key) if isinstance(batch, dict) else None
    if (not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072
            or not isinstance(labels, (list, np.ndarray)) or len(labels) != len(data)):
        raise DataError(f"{path} is not a CIFAR batch (a dict with b'data': uint8 N x 3072 and "
                        f"{label_key!r}: N labels); replace it with an intact copy")
    labels = np.asarray(labels, dtype=np.int64)
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise DataError(f"{path} has labels {labels.min()}..{labels.max()}, outside 0..{num_classes - 1}; "
                        "replace it with an intact copy")
    return data.reshape(-1, 3, 32, 32), labels


def _load_cifar(root: Path, name: str, title: str, folder: str, train_files: tuple[str, ...],
                test_files: tuple[str, ...], label_key: bytes, num_classes: int, mean, std, tv_class: str) -> Dataset:
    """CIFAR from torchvision's (= the official archive's) folder under `root`."""
    base = root / folder
    files = [base / f for f in (*train_files, *test_files)]
    if not all(p.is_file() for p in files):
        raise _not_found(title, [base], ", ".join(train_files + test_files), _torchvision_fix(tv_class, root))

    def read(names):
        parts = [_read_cifar_batch(base / n, label_key, num_classes) for n in names]
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    return _image_dataset(name, read(train_files), read(test_files), num_classes, mean, std)


# ---------------------------------------------------------------- image folders: CINIC-10, Tiny-ImageNet

def _decode_images(paths: list[str], side: int) -> np.ndarray:
    """uint8 N x 3 x side x side RGB pixels of `paths`, decoded once (grey images are expanded to RGB)."""
    from PIL import Image, UnidentifiedImageError

    out = np.empty((len(paths), side, side, 3), dtype=np.uint8)
    for i, path in enumerate(paths):
        try:
            with Image.open(path) as img:
                rgb = np.asarray(img.convert("RGB"))
        except (OSError, UnidentifiedImageError) as exc:
            raise DataError(f"cannot decode image {path}: {exc}; replace it with an intact copy") from exc
        if rgb.shape != (side, side, 3):
            raise DataError(f"{path} is {rgb.shape[1]}x{rgb.shape[0]} pixels, not {side}x{side}; "
                            "replace it with an intact copy")
        out[i] = rgb
    return out.transpose(0, 3, 1, 2)


def _image_folder(folder: Path) -> tuple[list[str], list[str], np.ndarray]:
    """(classes, image paths, labels) of a class-per-subfolder tree, via torchvision's ImageFolder."""
    from torchvision.datasets import ImageFolder

    try:
        tree = ImageFolder(str(folder))
    except OSError as exc:
        raise DataError(f"{folder} is not a folder of class subfolders holding images: {exc}") from exc
    return tree.classes, [p for p, _ in tree.samples], np.array([c for _, c in tree.samples], dtype=np.int64)


def _load_cinic10(root: Path) -> Dataset:
    """CINIC-10 (32x32 RGB): train + valid (180,000 images) form the training set, as is usual; test is the test set."""
    folders = [root / "cinic10", root / "CINIC-10"]
    base = next((f for f in folders if all((f / s).is_dir() for s in ("train", "valid", "test"))), None)
    if base is None:
        raise _not_found("CINIC-10", folders, "train/, valid/ and test/ folders of <class>/*.png",
                         "download CINIC-10.tar.gz from https://datashare.ed.ac.uk/handle/10283/3192 on a machine "
                         f"with internet and unpack it into {root / 'cinic10'}")
    paths, labels = {}, {}
    for split in ("train", "valid", "test"):
        classes, paths[split], labels[split] = _image_folder(base / split)
        if tuple(classes) != _CIFAR10_CLASSES:
            raise DataError(f"{base / split} has class folders {classes}, not CINIC-10's {list(_CIFAR10_CLASSES)}; "
                            "re-extract the archive")
    train = (_decode_images(paths["train"] + paths["valid"], 32), np.concatenate([labels["train"], labels["valid"]]))
    test = (_decode_images(paths["test"], 32), labels["test"])
    return _image_dataset("cinic10", train, test, 10, _CINIC10_MEAN, _CINIC10_STD)


def _load_tiny_imagenet(root: Path) -> Dataset:
    """Tiny-ImageNet (64x64 RGB, 200 classes): its labelled val split is the test set (test/ has no labels).

    Class c is the c-th wnid in sorted order (ImageFolder's order); wnids.txt must list exactly train's folders."""
    base = root / "tiny-imagenet-200"
    needed = [base / "wnids.txt", base / "train", base / "val" / "images", base / "val" / "val_annotations.txt"]
    if not all(p.exists() for p in needed):
        raise _not_found("Tiny-ImageNet", [base], "wnids.txt, train/<wnid>/images/, val/images/ and "
                         "val/val_annotations.txt", "download tiny-imagenet-200.zip from "
                         "http://cs231n.stanford.edu/tiny-imagenet-200.zip on a machine with internet and "
                         f"unzip it into {root}")
    wnids = sorted(set(needed[0].read_text().split()))
    classes, train_paths, train_labels = _image_folder(base / "train")
    if classes != wnids:
        raise DataError(f"{base / 'train'} has {len(classes)} class folders but {needed[0]} lists {len(wnids)} "
                        "different wnids; re-extract the archive")
    index = {w: i for i, w in enumerate(wnids)}
    test_paths, test_labels = [], []
    for line_no, line in enumerate(needed[3].read_text().splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) < 2 or fields[1] not in index:
            raise DataError(f"{needed[3]} line {line_no} is not '<file>\\t<wnid from wnids.txt>...': {line!r}")
        test_paths.append(str(needed[2] / fields[0]))
        test_labels.append(index[fields[1]])
    return _image_dataset("tiny_imagenet", (_decode_images(train_paths, 64), train_labels),
                          (_decode_images(test_paths, 64), np.array(test_labels, dtype=np.int64)),
                          len(wnids), _TINY_IMAGENET_MEAN, _TINY_IMAGENET_STD)


# ---------------------------------------------------------------- Shakespeare (LEAF JSON)

_VOCAB_INDEX = np.full(128, -1, dtype=np.int16)   # ASCII code -> vocabulary index, -1 outside it
_VOCAB_INDEX[np.frombuffer(SHAKESPEARE_VOCAB.encode("ascii"), dtype=np.uint8)] = np.arange(len(SHAKESPEARE_VOCAB))


def _encode_chars(text: str, where: str) -> np.ndarray:
    """uint8 vocabulary indices of `text`; a character outside LEAF's vocabulary is a DataError, not a guess."""
    try:
        codes = _VOCAB_INDEX[np.frombuffer(text.encode("ascii"), dtype=np.uint8)]
    except UnicodeEncodeError:
        codes = None
    if codes is None or (codes < 0).any():
        unknown = sorted(set(text) - set(SHAKESPEARE_VOCAB))
        raise DataError(f"{where} holds characters outside LEAF's 80-symbol vocabulary: {unknown!r}; "
                        "regenerate it with LEAF's preprocessing")
    return codes.astype(np.uint8)


def _read_leaf_split(folder: Path) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """uint8 x (N x 80), uint8 y (N) and each sample's user, from every *.json under `folder` in name order."""
    xs, ys, users = [], [], []
    for path in sorted(folder.glob("*.json")):
        try:
            blob = json.loads(path.read_text())
            for user in blob["users"]:
                x, y = blob["user_data"][user]["x"], blob["user_data"][user]["y"]
                if len(x) != len(y) or any(len(s) != _SHAKESPEARE_SEQ_LEN for s in x) or any(len(c) != 1 for c in y):
                    raise DataError(f"{path}: user {user!r} must have as many 80-character x strings as "
                                    "1-character y strings; regenerate it with LEAF's preprocessing")
                xs.append(_encode_chars("".join(x), f"{path} (user {user!r})"))
                ys.append(_encode_chars("".join(y), f"{path} (user {user!r})"))
                users.extend([user] * len(y))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise DataError(f"cannot read LEAF file {path}: {type(exc).__name__}: {exc}; "
                            "it must hold 'users' and 'user_data': {user: {'x': [...], 'y': [...]}}") from exc
    x = np.concatenate(xs) if xs else np.empty(0, dtype=np.uint8)
    y = np.concatenate(ys) if ys else np.empty(0, dtype=np.uint8)
    return x.reshape(-1, _SHAKESPEARE_SEQ_LEN), y, users


def _load_shakespeare(root: Path) -> Dataset:
    """LEAF's Shakespeare next-character task: x is N x 80 int64 character indices, y the next character.

    `groups`/`test_groups` number the LEAF users (speaking roles) in sorted-name order over both splits."""
    folders = [root / "shakespeare", root / "shakespeare" / "data"]   # ours, and LEAF's own repository layout
    base = next((f for f in folders if any((f / "train").glob("*.json")) and any((f / "test").glob("*.json"))), None)
    if base is None:
        raise _not_found("Shakespeare (LEAF)", [f / s for f in folders for s in ("train", "test")], "*.json",
                         "run LEAF's data/shakespeare/preprocess.sh (github.com/TalwalkarLab/leaf) on a machine with "
                         f"internet and copy its data/train and data/test folders into {root / 'shakespeare'}")
    train_x, train_y, train_users = _read_leaf_split(base / "train")
    test_x, test_y, test_users = _read_leaf_split(base / "test")
    names = sorted(set(train_users) | set(test_users))
    index = {u: i for i, u in enumerate(names)}
    def ints(a):
        return torch.from_numpy(a.astype(np.int64))

    return Dataset(name="shakespeare", train_x=ints(train_x), train_y=ints(train_y), test_x=ints(test_x),
                   test_y=ints(test_y),
                   num_classes=len(SHAKESPEARE_VOCAB),
                   groups=np.array([index[u] for u in train_users], dtype=np.int64),
                   test_groups=np.array([index[u] for u in test_users], dtype=np.int64))


# ---------------------------------------------------------------- generated and bundled sets

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
        train_x=_normalise(pixels[train], 16.0, _DIGITS_MEAN, _DIGITS_STD),
        train_y=torch.from_numpy(labels[train]),
        test_x=_normalise(pixels[test], 16.0, _DIGITS_MEAN, _DIGITS_STD),
        test_y=torch.from_numpy(labels[test]),
        num_classes=10, mean=_DIGITS_MEAN, std=_DIGITS_STD,
    )


DATASETS: dict[str, Callable[[Path], Dataset]] = {
    "fashion_mnist": partial(_load_idx_set, _FASHION_MNIST),
    "mnist": partial(_load_idx_set, _MNIST),
    "emnist_letters": partial(_load_idx_set, _EMNIST_LETTERS),
    "cifar10": partial(_load_cifar, name="cifar10", title="CIFAR-10", folder="cifar-10-batches-py",
                       train_files=tuple(f"data_batch_{i}" for i in range(1, 6)), test_files=("test_batch",),
                       label_key=b"labels", num_classes=10, mean=_CIFAR10_MEAN, std=_CIFAR10_STD,
                       tv_class="CIFAR10"),
    "cifar100": partial(_load_cifar, name="cifar100", title="CIFAR-100", folder="cifar-100-python",
                        train_files=("train",), test_files=("test",), label_key=b"fine_labels", num_classes=100,
                        mean=_CIFAR100_MEAN, std=_CIFAR100_STD, tv_class="CIFAR100"),
    "cinic10": _load_cinic10,
    "tiny_imagenet": _load_tiny_imagenet,
    "shakespeare": _load_shakespeare,
    "synthetic": _load_synthetic,
    "digits": _load_digits,
}


def load_dataset(name: str, root: Path) -> Dataset:
    """The data set `name` from `root`; an unknown name is a config error listing the valid ones."""
    if name not in DATASETS:
        raise ConfigError(f"data.dataset = {name!r} is not a known data set; valid: {', '.join(sorted(DATASETS))}")
    return DATASETS[name](Path(root))
