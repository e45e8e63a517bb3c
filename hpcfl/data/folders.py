"""Image-folder sets, decoded once into uint8 arrays: CINIC-10 and Tiny-ImageNet."""
from pathlib import Path

import numpy as np

from hpcfl.data.base import Dataset, image_dataset, not_found
from hpcfl.data.cache import cached
from hpcfl.data.cifar import CIFAR10_CLASSES
from hpcfl.errors import DataError

# Per-channel mean/std after scaling to [0, 1]; their sources are listed in hpcfl/data/datasets.py.
_CINIC10_MEAN, _CINIC10_STD = (0.47889522, 0.47227842, 0.43047404), (0.24205776, 0.23828046, 0.25874835)
_TINY_IMAGENET_MEAN, _TINY_IMAGENET_STD = (0.4802, 0.4481, 0.3975), (0.2302, 0.2265, 0.2262)


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


def load_cinic10(root: Path, train_images: bool) -> Dataset:
    """CINIC-10 (32x32 RGB): train + valid (180,000 images) form the training set, as is usual (decoded
    only if `train_images`); test is the test set."""
    folders = [root / "cinic10", root / "CINIC-10"]
    base = next((f for f in folders if all((f / s).is_dir() for s in ("train", "valid", "test"))), None)
    if base is None:
        raise not_found("CINIC-10", folders, "train/, valid/ and test/ folders of <class>/*.png",
                         "download CINIC-10.tar.gz from https://datashare.ed.ac.uk/handle/10283/3192 on a machine "
                         f"with internet and unpack it into {root / 'cinic10'}")
    paths, labels = {}, {}
    for split in ("train", "valid", "test"):
        classes, paths[split], labels[split] = _image_folder(base / split)
        if tuple(classes) != CIFAR10_CLASSES:
            raise DataError(f"{base / split} has class folders {classes}, not CINIC-10's {list(CIFAR10_CLASSES)}; "
                            "re-extract the archive")
    train_paths = paths["train"] + paths["valid"]
    arrays = cached("cinic10", train_paths + paths["test"], lambda train_images: {
        "train_x": _decode_images(train_paths, 32) if train_images else None,
        "train_y": np.concatenate([labels["train"], labels["valid"]]),
        "test_x": _decode_images(paths["test"], 32), "test_y": labels["test"]}, train_images)
    return image_dataset("cinic10", (arrays["train_x"], arrays["train_y"]), (arrays["test_x"], arrays["test_y"]),
                         10, _CINIC10_MEAN, _CINIC10_STD)


def load_tiny_imagenet(root: Path, train_images: bool) -> Dataset:
    """Tiny-ImageNet (64x64 RGB, 200 classes): its labelled val split is the test set (test/ has no labels);
    the training images are decoded only if `train_images`.

    Class c is the c-th wnid in sorted order (ImageFolder's order); wnids.txt must list exactly train's folders."""
    base = root / "tiny-imagenet-200"
    needed = [base / "wnids.txt", base / "train", base / "val" / "images", base / "val" / "val_annotations.txt"]
    if not all(p.exists() for p in needed):
        raise not_found("Tiny-ImageNet", [base], "wnids.txt, train/<wnid>/images/, val/images/ and "
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
    arrays = cached("tiny_imagenet", [needed[0], needed[3], *train_paths, *test_paths], lambda train_images: {
        "train_x": _decode_images(train_paths, 64) if train_images else None, "train_y": train_labels,
        "test_x": _decode_images(test_paths, 64), "test_y": np.array(test_labels, dtype=np.int64)}, train_images)
    return image_dataset("tiny_imagenet", (arrays["train_x"], arrays["train_y"]), (arrays["test_x"], arrays["test_y"]),
                          len(wnids), _TINY_IMAGENET_MEAN, _TINY_IMAGENET_STD)
