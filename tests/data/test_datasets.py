"""Data loading on real files: Fashion-MNIST from Debian's package, and scikit-learn's bundled digits."""
import gzip
import shutil

import numpy as np
import pytest
import torch

from hpcfl.data.datasets import DEBIAN_ROOT, DATASETS, Dataset, load_dataset, read_idx, resolve_data_root
from hpcfl.errors import ConfigError, DataError

torch.set_num_threads(1)

FASHION_DIR = DEBIAN_ROOT / "fashion-mnist"
FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


@pytest.fixture(scope="module")
def fashion() -> Dataset:
    return load_dataset("fashion_mnist", DEBIAN_ROOT)


def test_fashion_mnist_shapes_labels_and_normalisation(fashion):
    assert fashion.name == "fashion_mnist" and fashion.num_classes == 10
    assert fashion.train_x.shape == (60000, 1, 28, 28) and fashion.test_x.shape == (10000, 1, 28, 28)
    assert fashion.input_shape == (1, 28, 28)
    assert fashion.train_x.dtype == torch.float32 and fashion.train_y.dtype == torch.int64
    assert fashion.train_x.device.type == "cpu"
    assert torch.equal(torch.bincount(fashion.train_y), torch.full((10,), 6000))
    assert torch.equal(torch.bincount(fashion.test_y), torch.full((10,), 1000))
    assert abs(fashion.train_x.mean().item()) < 1e-3 and abs(fashion.train_x.std().item() - 1) < 1e-3
    assert abs(fashion.test_x.mean().item()) < 0.05 and abs(fashion.test_x.std().item() - 1) < 0.05


def _uncompress(src_dir, dst_dir):
    dst_dir.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        (dst_dir / name).write_bytes(gzip.decompress((src_dir / f"{name}.gz").read_bytes()))


def _assert_same(a: Dataset, b: Dataset):
    for field in ("train_x", "train_y", "test_x", "test_y"):
        assert torch.equal(getattr(a, field), getattr(b, field)), field


def test_uncompressed_flat_root_loads_identically(fashion, tmp_path):
    _uncompress(FASHION_DIR, tmp_path)
    _assert_same(load_dataset("fashion_mnist", tmp_path), fashion)


def test_torchvision_layout_loads_identically(fashion, tmp_path):
    _uncompress(FASHION_DIR, tmp_path / "FashionMNIST" / "raw")
    _assert_same(load_dataset("fashion_mnist", tmp_path), fashion)


def test_missing_root_names_paths_and_fix(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(DataError) as err:
        load_dataset("fashion_mnist", missing)
    msg = str(err.value)
    assert str(missing / "fashion-mnist") in msg and str(missing / "FashionMNIST" / "raw") in msg
    assert "dataset-fashion-mnist" in msg and "HPCFL_DATA" in msg


@pytest.mark.parametrize("compressed", [True, False])
def test_truncated_file_names_the_file(tmp_path, compressed):
    folder = tmp_path / "fashion-mnist"
    folder.mkdir()
    for name in FILES:
        shutil.copy(FASHION_DIR / f"{name}.gz", folder / f"{name}.gz")
    bad = folder / "train-labels-idx1-ubyte.gz"
    if compressed:
        bad.write_bytes(bad.read_bytes()[:1000])
    else:
        raw = gzip.decompress(bad.read_bytes())
        bad.unlink()
        bad = folder / "train-labels-idx1-ubyte"
        bad.write_bytes(raw[:-7])
    with pytest.raises(DataError, match="train-labels-idx1-ubyte"):
        load_dataset("fashion_mnist", tmp_path)


def test_bad_magic_number_is_rejected(tmp_path):
    path = tmp_path / "x-idx1-ubyte"
    path.write_bytes(b"\x00\x00\x0d\x01\x00\x00\x00\x01\x00\x00\x00\x00")  # 0x0d: float32, not ubyte
    with pytest.raises(DataError, match="magic"):
        read_idx(path)


def test_read_idx_round_trip(tmp_path):
    data = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    path = tmp_path / "tiny-idx3-ubyte.gz"
    path.write_bytes(gzip.compress(b"\x00\x00\x08\x03" + np.array([2, 3, 4], dtype=">u4").tobytes() + data.tobytes()))
    assert np.array_equal(read_idx(path), data)


def test_digits_shapes_and_stratified_split():
    d = load_dataset("digits", DEBIAN_ROOT)
    assert d.input_shape == (1, 8, 8) and d.num_classes == 10
    assert len(d.train_x) + len(d.test_x) == 1797 and d.train_x.dtype == torch.float32
    assert abs(d.train_x.mean().item()) < 1e-3 and abs(d.train_x.std().item() - 1) < 1e-3
    train_counts = torch.bincount(d.train_y, minlength=10).float()
    test_counts = torch.bincount(d.test_y, minlength=10).float()
    fraction = test_counts / (train_counts + test_counts)
    assert torch.all((fraction - 0.2).abs() < 0.01), fraction
    again = load_dataset("digits", DEBIAN_ROOT)
    _assert_same(d, again)
    train_rows = {tuple(r) for r in d.train_x.flatten(1).tolist()}
    assert not any(tuple(r) in train_rows for r in d.test_x.flatten(1).tolist())  # no test image leaks into train


def test_resolve_data_root_precedence(monkeypatch, tmp_path):
    monkeypatch.delenv("HPCFL_DATA", raising=False)
    assert resolve_data_root(None) == DEBIAN_ROOT
    monkeypatch.setenv("HPCFL_DATA", str(tmp_path / "env"))
    assert resolve_data_root(None) == tmp_path / "env"
    assert resolve_data_root(str(tmp_path / "cli")) == tmp_path / "cli"


def test_unknown_dataset_is_config_error():
    with pytest.raises(ConfigError) as err:
        load_dataset("imagenet", DEBIAN_ROOT)
    assert "data.dataset" in str(err.value)
    assert all(name in str(err.value) for name in DATASETS)
