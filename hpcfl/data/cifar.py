"""CIFAR-10 and CIFAR-100 from torchvision's (= the official archive's) pickled python batches, read with
an unpickler that admits only NumPy arrays, so a tampered file cannot run code."""
import pickle
from functools import partial
from pathlib import Path

import numpy as np

from hpcfl.data.base import Dataset, image_dataset, not_found, partly_there, torchvision_fix
from hpcfl.data.cache import cached
from hpcfl.errors import DataError

# Per-channel mean/std after scaling to [0, 1]; their sources are listed in hpcfl/data/datasets.py.
_CIFAR10_MEAN, _CIFAR10_STD = (0.49139968, 0.48215841, 0.44653091), (0.24703223, 0.24348513, 0.26158784)
_CIFAR100_MEAN, _CIFAR100_STD = (0.50707516, 0.48654887, 0.44091784), (0.26733429, 0.25643846, 0.27615047)
CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


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
                test_files: tuple[str, ...], label_key: bytes, num_classes: int, mean, std, tv_class: str,
                train_images: bool) -> Dataset:
    """CIFAR from torchvision's (= the official archive's) folder under `root` (the training images
    normalised only if `train_images`: each batch file holds both, so they are read anyway)."""
    base = root / folder
    files = [base / f for f in (*train_files, *test_files)]
    if not all(p.is_file() for p in files):
        raise not_found(title, [base], ", ".join(train_files + test_files), torchvision_fix(tv_class, root),
                        partly_there([base], [*train_files, *test_files], lambda at, name: (at / name).is_file()))

    def read(names):
        parts = [_read_cifar_batch(base / n, label_key, num_classes) for n in names]
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    def decode(train_images: bool) -> dict:
        (train_x, train_y), (test_x, test_y) = read(train_files), read(test_files)
        return {"train_x": train_x if train_images else None, "train_y": train_y, "test_x": test_x, "test_y": test_y}

    arrays = cached(name, files, decode, train_images)
    return image_dataset(name, (arrays["train_x"], arrays["train_y"]), (arrays["test_x"], arrays["test_y"]),
                         num_classes, mean, std)


load_cifar10 = partial(_load_cifar, name="cifar10", title="CIFAR-10", folder="cifar-10-batches-py",
                       train_files=tuple(f"data_batch_{i}" for i in range(1, 6)), test_files=("test_batch",),
                       label_key=b"labels", num_classes=10, mean=_CIFAR10_MEAN, std=_CIFAR10_STD, tv_class="CIFAR10")
load_cifar100 = partial(_load_cifar, name="cifar100", title="CIFAR-100", folder="cifar-100-python",
                        train_files=("train",), test_files=("test",), label_key=b"fine_labels", num_classes=100,
                        mean=_CIFAR100_MEAN, std=_CIFAR100_STD, tv_class="CIFAR100")
