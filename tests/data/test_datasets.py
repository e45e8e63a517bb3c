"""Data loading. Fashion-MNIST (Debian's package) and scikit-learn's digits are real; every other set
is a small fixture written here in its real on-disk format (IDX, Python 2 pickles, PNG/JPEG folders,
LEAF JSON), since nothing may be downloaded."""
import gzip
import json
import os
import pickle
import shutil
import struct

import numpy as np
import pytest
import torch
from helpers import idx_bytes
from PIL import Image

from hpcfl.data.base import DEBIAN_ROOT, Dataset, resolve_data_root
from hpcfl.data.datasets import DATASETS, load_dataset
from hpcfl.data.leaf import SHAKESPEARE_VOCAB, _read_leaf_split
from hpcfl.errors import ConfigError, DataError
from hpcfl.seeding import numpy_rng

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


def test_training_rows_are_normalised_from_the_pixels_without_a_float_copy_of_the_set():
    d = load_dataset("fashion_mnist", DEBIAN_ROOT)
    assert "train_x" not in vars(d) and d.train_pixels.dtype == np.uint8 and d.input_shape == (1, 28, 28)
    index = np.array([59999, 3, 3, 17, 0])
    x, y = d.train_rows(index)
    assert "train_x" not in vars(d)                         # only these rows were normalised
    assert x.dtype == torch.float32 and x.is_contiguous() and x.shape == (5, 1, 28, 28)
    assert torch.equal(x, d.train_x[index]) and torch.equal(y, d.train_y[index])   # the whole set's floats
    assert "train_x" in vars(d) and d.train_x is d.train_x                       # made once, on first read
    _assert_pixels_normalise_to(d, index, x)
    assert torch.equal(d.train_rows(index)[0], x)            # and taken from it afterwards
    for missing in ({"train_pixels": None}, {"mean": None}, {"std": None}):     # each one is needed
        given = {"train_pixels": d.train_pixels, "mean": d.mean, "std": d.std, **missing}
        with pytest.raises(ValueError, match="train_x None needs train_pixels, mean and std"):
            Dataset("bad", None, d.train_y, d.test_x, d.test_y, 10, **given)


def test_a_set_holding_pixels_is_an_ordinary_frozen_dataset_that_makes_no_float_copy_unasked():
    """Only `train_x` is made on first read: other missing attributes raise as on any object, and
    printing a set or comparing it makes no float copy (nor prints the pixels)."""
    import dataclasses

    d = load_dataset("fashion_mnist", DEBIAN_ROOT)
    assert not hasattr(d, "train_xs") and getattr(d, "no_such", None) is None
    text = repr(d)
    assert "train_x" not in vars(d) and "train_pixels" not in text and "train_x=" not in text
    other = load_dataset("fashion_mnist", DEBIAN_ROOT)
    assert d == d and d != other and len({d, other}) == 2                          # by identity, hashable
    assert "train_x" not in vars(d)
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.num_classes = 11


def test_a_set_without_pixels_gives_its_float_rows_either_way():
    d = load_dataset("digits", DEBIAN_ROOT)
    assert d.train_pixels is None
    index = np.array([4, 0, 4])
    for normalised in (True, False):
        x, y = d.train_rows(index, normalised=normalised)
        assert x.dtype == torch.float32 and torch.equal(x, d.train_x[index]) and torch.equal(y, d.train_y[index])


def test_training_rows_from_a_channels_last_view_copy_only_those_rows():
    """CINIC-10 and Tiny-ImageNet decode N x H x W x C and hand over a transposed view: taking a client's
    rows must not copy the whole set first (np.take would: 60 MB here, for each client)."""
    import tracemalloc

    pixels = np.random.default_rng(0).integers(0, 256, (20000, 32, 32, 3), dtype=np.uint8).transpose(0, 3, 1, 2)
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
    d = Dataset("view", None, torch.zeros(20000, dtype=torch.int64), torch.zeros(0, 3, 32, 32), torch.zeros(0),
                3, mean, std, train_pixels=pixels)
    index = np.array([19999, 5, 7])
    tracemalloc.start()
    x, _ = d.train_rows(index)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1_000_000, peak                           # three images, not the 61 MB set
    assert torch.allclose(x, _expected(np.ascontiguousarray(pixels[index]), mean, std), atol=1e-5)
    assert torch.equal(x, d.train_x[index]) and x.is_contiguous()
    _assert_pixels_normalise_to(d, index, x)


def _assert_pixels_normalise_to(d: Dataset, index, floats):
    """The uint8 rows a CPU client holds give, through Client.inputs, the very floats of the set."""
    from hpcfl.algorithms.base import Client

    pixels, labels = d.train_rows(index, normalised=False)
    assert pixels.dtype == torch.uint8 and pixels.is_contiguous() and torch.equal(labels, d.train_y[index])
    client = Client(0, pixels, labels, np.zeros(d.num_classes), normalization=d.pixel_normalization())
    assert torch.equal(client.inputs(), floats)
    some = torch.tensor([2, 0])
    assert torch.equal(client.inputs(some), floats[some]) and client.inputs(some).dtype == torch.float32


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
    _assert_server_view("fashion_mnist", tmp_path, fashion)
    (tmp_path / "train-images-idx3-ubyte").write_bytes(b"not idx")
    _assert_server_view("fashion_mnist", tmp_path, fashion)             # the training images are never read


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


def test_a_folder_holding_some_of_the_files_is_named_with_the_ones_it_lacks(tmp_path):
    """A copy cut short: the message names the folder and its missing files, not only every file sought."""
    folder = tmp_path / "fashion-mnist"
    folder.mkdir()
    for name in FILES[1:]:
        (folder / f"{name}.gz").write_bytes(b"")
    (tmp_path / "FashionMNIST" / "raw").mkdir(parents=True)
    (tmp_path / "FashionMNIST" / "raw" / FILES[2]).write_bytes(b"")       # fewer here: not the one named
    with pytest.raises(DataError, match=f"{folder} holds some of its files but lacks {FILES[0]}\\(.gz\\) "):
        load_dataset("fashion_mnist", tmp_path)
    cifar = tmp_path / "cifar-10-batches-py"
    cifar.mkdir()
    (cifar / "test_batch").write_bytes(b"")
    with pytest.raises(DataError, match="lacks data_batch_1, data_batch_2, data_batch_3, data_batch_4, data_batch_5"):
        load_dataset("cifar10", tmp_path)
    with pytest.raises(DataError) as nothing:
        load_dataset("fashion_mnist", tmp_path / "nowhere")
    assert "holds some" not in str(nothing.value)


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


def test_digits_shapes_and_stratified_split():
    d = load_dataset("digits", DEBIAN_ROOT)
    _assert_server_view("digits", DEBIAN_ROOT, d)
    assert d.input_shape == (1, 8, 8) and d.num_classes == 10
    assert len(d.train_x) + len(d.test_x) == 1797 and d.train_x.dtype == torch.float32
    assert abs(d.train_x.mean().item()) < 1e-3 and abs(d.train_x.std().item() - 1) < 1e-3
    assert abs(d.test_x.mean().item()) < 0.1 and abs(d.test_x.std().item() - 1) < 0.1     # the same constants
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


# ---------------------------------------------------------------- fixtures in the real formats

def _assert_server_view(name, root, whole: Dataset):
    """What the server loads (train_images=False): no training inputs, everything else the same."""
    server = load_dataset(name, root, train_images=False)
    assert server.train_x.shape == (0, *whole.input_shape) and server.input_shape == whole.input_shape
    assert torch.equal(server.train_y, whole.train_y) and torch.equal(server.test_x, whole.test_x)
    assert torch.equal(server.test_y, whole.test_y) and (server.mean, server.std) == (whole.mean, whole.std)
    assert np.array_equal(server.groups, whole.groups) or server.groups is whole.groups is None
    return server


def _write_idx(path, array: np.ndarray, compress=True):
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = idx_bytes(array)
    path.write_bytes(gzip.compress(raw) if compress else raw)


def _expected(pixels: np.ndarray, mean, std) -> torch.Tensor:
    shape = (1, len(mean), 1, 1)
    return ((torch.from_numpy(pixels.astype(np.float32)) / 255 - torch.tensor(mean).view(shape))
            / torch.tensor(std).view(shape))


def _assert_normalised(d: Dataset, name, train_pixels, test_pixels, num_classes):
    assert d.name == name and d.num_classes == num_classes
    assert d.train_x.dtype == torch.float32 and d.train_y.dtype == torch.int64 and d.test_y.dtype == torch.int64
    assert d.train_x.is_contiguous() and d.test_x.is_contiguous()
    for x in (d.train_x, d.test_x):             # row-major strides even with one channel (not channels-last,
        assert x.stride() == torch.empty(x.shape).stride()       # which picks other convolution kernels)
    assert torch.allclose(d.train_x, _expected(train_pixels, d.mean, d.std), atol=1e-5)
    assert torch.allclose(d.test_x, _expected(test_pixels, d.mean, d.std), atol=1e-5)
    assert len(d.mean) == len(d.std) == d.input_shape[0]


@pytest.mark.parametrize("folder,compress", [("mnist", True), ("MNIST/raw", False), ("", True)])
def test_mnist_from_each_layout(tmp_path, folder, compress):
    rng = np.random.default_rng(0)
    img = rng.integers(0, 67, (30, 28, 28), dtype=np.uint8)            # MNIST's mean pixel: the root itself holds
    lbl = np.arange(30, dtype=np.uint8) % 10                            # MNIST's or Fashion-MNIST's files alike
    base = tmp_path / folder
    for prefix, sl in (("train", slice(0, 20)), ("t10k", slice(20, 30))):
        _write_idx(base / f"{prefix}-images-idx3-ubyte{'.gz' * compress}", img[sl], compress)
        _write_idx(base / f"{prefix}-labels-idx1-ubyte{'.gz' * compress}", lbl[sl], compress)
    d = load_dataset("mnist", tmp_path)
    _assert_server_view("mnist", tmp_path, d)
    assert d.input_shape == (1, 28, 28) and len(d.train_x) == 20 and len(d.test_x) == 10
    assert torch.equal(d.train_y, torch.from_numpy(lbl[:20].astype(np.int64)))
    _assert_normalised(d, "mnist", img[:20, None], img[20:, None], 10)
    assert d.mean == pytest.approx((0.1307,), abs=1e-4) and d.std == pytest.approx((0.3081,), abs=1e-4)


def _write_emnist(folder, img, lbl, compress=True):
    for split, sl in (("train", slice(0, 26)), ("test", slice(26, None))):
        _write_idx(folder / f"emnist-letters-{split}-images-idx3-ubyte{'.gz' * compress}", img[sl], compress)
        _write_idx(folder / f"emnist-letters-{split}-labels-idx1-ubyte{'.gz' * compress}", lbl[sl], compress)


@pytest.mark.parametrize("folder,compress", [("emnist", True), ("emnist/gzip", True), ("EMNIST/raw", False)])
def test_emnist_letters_shifts_labels_and_fixes_orientation(tmp_path, folder, compress):
    rng = np.random.default_rng(1)
    img = rng.integers(0, 256, (36, 28, 28), dtype=np.uint8)
    lbl = (np.arange(36) % 26 + 1).astype(np.uint8)                      # EMNIST letters: 1 = a ... 26 = z
    _write_emnist(tmp_path / folder, img, lbl, compress)
    d = load_dataset("emnist_letters", tmp_path)
    assert d.num_classes == 26 and d.input_shape == (1, 28, 28)
    assert torch.equal(d.train_y, torch.arange(26)) and torch.equal(d.test_y, torch.arange(10))
    upright = img.transpose(0, 2, 1)                                      # the files hold each image transposed
    _assert_normalised(d, "emnist_letters", upright[:26, None], upright[26:, None], 26)
    assert d.mean == pytest.approx((0.1722,), abs=1e-4) and d.std == pytest.approx((0.3309,), abs=1e-4)   # published


def test_emnist_letters_label_zero_is_rejected(tmp_path):
    img = np.zeros((36, 28, 28), dtype=np.uint8)
    lbl = np.zeros(36, dtype=np.uint8)
    _write_emnist(tmp_path / "emnist", img, lbl)
    with pytest.raises(DataError, match=r"labels 1\.\.26"):
        load_dataset("emnist_letters", tmp_path)
    with pytest.raises(DataError, match=r"\(not read\).*labels 1\.\.26"):    # the server checks the labels too
        load_dataset("emnist_letters", tmp_path, train_images=False)


def _py2_str(b: bytes) -> bytes:
    return b"U" + bytes([len(b)]) + b if len(b) < 256 else b"T" + struct.pack("<I", len(b)) + b


def _py2_int(v: int) -> bytes:
    return b"J" + struct.pack("<i", v)


def _py2_cifar_batch(data: np.ndarray, labels, label_key: bytes) -> bytes:
    """A batch as the CIFAR archives hold it: a Python 2 protocol-2 pickle of {str: ...} with a uint8
    numpy array under 'data' (numpy.core.multiarray._reconstruct, the array bytes as a py2 str)."""
    dtype = (b"cnumpy\ndtype\n" + _py2_str(b"u1") + _py2_int(0) + _py2_int(1) + b"\x87R("
             + _py2_int(3) + _py2_str(b"|") + b"NNN" + _py2_int(-1) + _py2_int(-1) + _py2_int(0) + b"tb")
    array = (b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\n" + _py2_int(0) + b"\x85" + _py2_str(b"b")
             + b"\x87R(" + _py2_int(1) + _py2_int(data.shape[0]) + _py2_int(data.shape[1]) + b"\x86" + dtype
             + b"\x89" + _py2_str(data.tobytes()) + b"tb")
    label_list = b"](" + b"".join(_py2_int(int(v)) for v in labels) + b"e"
    return (b"\x80\x02}(" + _py2_str(b"batch_label") + _py2_str(b"fixture") + _py2_str(b"data") + array
            + _py2_str(label_key) + label_list + b"u.")


def test_cifar10_reads_python2_batches_in_order(tmp_path):
    rng = np.random.default_rng(2)
    base = tmp_path / "cifar-10-batches-py"
    base.mkdir()
    data = rng.integers(0, 256, (13, 3072), dtype=np.uint8)
    labels = np.arange(13) % 10
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for k, name in enumerate(names):                                    # 2 images per training batch, 3 test
        sl = slice(2 * k, 2 * k + (3 if name == "test_batch" else 2))
        (base / name).write_bytes(_py2_cifar_batch(data[sl], labels[sl], b"labels"))
    d = load_dataset("cifar10", tmp_path)
    _assert_server_view("cifar10", tmp_path, d)
    assert d.input_shape == (3, 32, 32) and len(d.train_x) == 10 and len(d.test_x) == 3
    assert d.train_y.tolist() == labels[:10].tolist() and d.test_y.tolist() == labels[10:].tolist()
    pixels = data.reshape(-1, 3, 32, 32)                                # rows are R plane, G plane, B plane
    _assert_normalised(d, "cifar10", pixels[:10], pixels[10:], 10)
    assert d.mean == pytest.approx((0.4914, 0.4822, 0.4465), abs=1e-4)                 # the published values
    assert d.std == pytest.approx((0.2470, 0.2435, 0.2616), abs=1e-4)


def _write_cifar100(base, train, test, protocol=4):
    base.mkdir(parents=True)
    for name, (data, fine) in (("train", train), ("test", test)):
        batch = {b"filenames": [b"x.png"] * len(data), b"batch_label": b"fixture", b"fine_labels": list(fine),
                 b"coarse_labels": [f // 5 for f in fine], b"data": data}
        (base / name).write_bytes(pickle.dumps(batch, protocol=protocol))


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_cifar100_uses_fine_labels_from_python3_pickles(tmp_path, protocol):
    rng = np.random.default_rng(3)
    data = rng.integers(0, 256, (8, 3072), dtype=np.uint8)
    fine = [0, 17, 42, 99, 5, 63, 98, 1]
    _write_cifar100(tmp_path / "cifar-100-python", (data[:5], fine[:5]), (data[5:], fine[5:]), protocol)
    d = load_dataset("cifar100", tmp_path)
    assert d.num_classes == 100 and torch.equal(d.train_y, torch.tensor(fine[:5]))
    pixels = data.reshape(-1, 3, 32, 32)
    _assert_normalised(d, "cifar100", pixels[:5], pixels[5:], 100)
    assert d.mean == pytest.approx((0.5071, 0.4865, 0.4409), abs=1e-4)                 # the published values
    assert d.std == pytest.approx((0.2673, 0.2564, 0.2762), abs=1e-4)


class _Evil:
    def __reduce__(self):
        return os.getcwd, ()


def test_cifar_pickle_naming_other_callables_is_refused(tmp_path):
    data = np.zeros((2, 3072), dtype=np.uint8)
    _write_cifar100(tmp_path / "cifar-100-python", (data, [0, 1]), (data, [0, 1]))
    bad = tmp_path / "cifar-100-python" / "test"
    bad.write_bytes(pickle.dumps({b"data": data, b"fine_labels": [0, 1], b"x": _Evil()}))
    with pytest.raises(DataError, match=r"refusing to load \w+\.getcwd") as err:
        load_dataset("cifar100", tmp_path)
    assert str(bad) in str(err.value)


@pytest.mark.parametrize("batch", [
    [1, 2],                                                                              # not a dict
    {b"data": np.zeros((2, 3072), np.float32), b"fine_labels": [0, 1]},                  # not uint8
    {b"data": np.zeros(3072, np.uint8), b"fine_labels": [0]},                            # not N x 3072
    {b"data": np.zeros((2, 3071), np.uint8), b"fine_labels": [0, 1]},
    {b"data": np.zeros((2, 3072), np.uint8), b"fine_labels": [0]},                       # a label short
    {b"data": np.zeros((2, 3072), np.uint8), b"fine_labels": "01"},                      # labels not a list
    {b"data": [[0] * 3072] * 2, b"fine_labels": [0, 1]},                                 # data not an array
])
def test_a_pickle_that_is_not_a_cifar_batch_is_refused_naming_it(tmp_path, batch):
    data = np.zeros((2, 3072), dtype=np.uint8)
    _write_cifar100(tmp_path / "cifar-100-python", (data, [0, 1]), (data, [0, 1]))
    bad = tmp_path / "cifar-100-python" / "train"
    bad.write_bytes(pickle.dumps(batch))
    with pytest.raises(DataError, match=f"^{bad} is not a CIFAR batch .*b'fine_labels': N labels"):
        load_dataset("cifar100", tmp_path)


def test_cifar_labels_out_of_range_are_rejected(tmp_path):
    data = np.zeros((2, 3072), dtype=np.uint8)
    _write_cifar100(tmp_path / "cifar-100-python", (data, [0, 100]), (data, [0, 1]))
    with pytest.raises(DataError, match=r"outside 0\.\.99"):
        load_dataset("cifar100", tmp_path)


CINIC_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def test_cinic10_train_and_valid_form_the_training_set(tmp_path):
    rng = np.random.default_rng(4)
    pixels = {}
    for split in ("train", "valid", "test"):
        for c, name in enumerate(CINIC_CLASSES):
            folder = tmp_path / "cinic10" / split / name
            folder.mkdir(parents=True)
            img = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
            if split == "valid" and c == 3:                              # CINIC-10 holds some greyscale PNGs
                img = np.repeat(img[:, :, :1], 3, axis=2)
                Image.fromarray(img[:, :, 0], mode="L").save(folder / "grey.png")
            else:
                Image.fromarray(img).save(folder / f"{split}_{c}.png")
            pixels[split, c] = img.transpose(2, 0, 1)
    d = load_dataset("cinic10", tmp_path)
    _assert_server_view("cinic10", tmp_path, d)
    (tmp_path / "cinic10" / "train" / CINIC_CLASSES[0] / "train_0.png").write_bytes(b"not a png")
    _assert_server_view("cinic10", tmp_path, d)                        # the training images are never decoded
    assert d.input_shape == (3, 32, 32) and d.num_classes == 10
    assert torch.equal(d.train_y, torch.arange(10).repeat(2)) and torch.equal(d.test_y, torch.arange(10))
    train = np.stack([pixels["train", c] for c in range(10)] + [pixels["valid", c] for c in range(10)])
    test = np.stack([pixels["test", c] for c in range(10)])
    _assert_normalised(d, "cinic10", train, test, 10)                   # PNG is lossless: exact pixels
    assert d.mean == pytest.approx((0.4789, 0.4723, 0.4305), abs=1e-4)                 # CINIC-10's README
    assert d.std == pytest.approx((0.2421, 0.2383, 0.2587), abs=1e-4)


@pytest.mark.parametrize("damage, needle", [
    (lambda f: (f / "a.png").write_bytes(b"not a png"), "cannot decode image .*a.png: .*replace it"),
    (lambda f: Image.new("RGB", (31, 32)).save(f / "a.png"), "a.png is 31x32 pixels, not 32x32; replace it"),
])
def test_an_image_that_cannot_be_used_is_refused_naming_it(tmp_path, damage, needle):
    for split in ("train", "valid", "test"):
        for name in CINIC_CLASSES:
            (tmp_path / "cinic10" / split / name).mkdir(parents=True)
            Image.new("RGB", (32, 32)).save(tmp_path / "cinic10" / split / name / "ok.png")
    damage(tmp_path / "cinic10" / "test" / "dog")
    with pytest.raises(DataError, match=needle):
        load_dataset("cinic10", tmp_path)


def test_a_split_without_class_folders_is_refused_naming_it(tmp_path):
    for split in ("train", "valid", "test"):
        (tmp_path / "cinic10" / split).mkdir(parents=True)
    with pytest.raises(DataError, match=f"{tmp_path / 'cinic10' / 'train'} is not a folder of class subfolders"):
        load_dataset("cinic10", tmp_path)


def test_cinic10_with_wrong_class_folders_is_rejected(tmp_path):
    for split in ("train", "valid", "test"):
        folder = tmp_path / "cinic10" / split / "cats"
        folder.mkdir(parents=True)
        Image.new("RGB", (32, 32)).save(folder / "a.png")
    with pytest.raises(DataError, match="class folders"):
        load_dataset("cinic10", tmp_path)


def _solid(rgbs) -> np.ndarray:
    """N x 3 x 64 x 64 uint8 images, each one flat colour."""
    return np.broadcast_to(np.array(rgbs, dtype=np.uint8)[:, :, None, None], (len(rgbs), 3, 64, 64))


def test_tiny_imagenet_val_split_is_the_test_set(tmp_path):
    base = tmp_path / "tiny-imagenet-200"
    wnids = ["n02124075", "n01443537", "n09999999"]                      # wnids.txt is not sorted
    colours = {w: (40 * k + 20, 200 - 50 * k, 90) for k, w in enumerate(wnids)}
    (base / "val" / "images").mkdir(parents=True)
    (base / "wnids.txt").write_text("\n".join(wnids) + "\n")
    for w in wnids:
        (base / "train" / w / "images").mkdir(parents=True)
        (base / "train" / w / f"{w}_boxes.txt").write_text("")
        for j in range(2):
            Image.new("RGB", (64, 64), colours[w]).save(base / "train" / w / "images" / f"{w}_{j}.JPEG")
    val = ["n09999999", "n02124075", "n02124075", "n01443537"]
    lines = []
    for j, w in enumerate(val):
        mode = "L" if j == 3 else "RGB"                                  # some Tiny-ImageNet images are greyscale
        colour = colours[w][0] if mode == "L" else colours[w]
        Image.new(mode, (64, 64), colour).save(base / "val" / "images" / f"val_{j}.JPEG")
        lines.append(f"val_{j}.JPEG\t{w}\t0\t0\t63\t63")
    (base / "val" / "val_annotations.txt").write_text("\n".join(lines) + "\n")
    d = load_dataset("tiny_imagenet", tmp_path)
    _assert_server_view("tiny_imagenet", tmp_path, d)
    order = sorted(wnids)
    assert d.num_classes == 3 and d.input_shape == (3, 64, 64) and len(d.train_x) == 6
    assert torch.equal(d.train_y, torch.tensor([0, 0, 1, 1, 2, 2]))
    assert torch.equal(d.test_y, torch.tensor([order.index(w) for w in val]))
    train_px = _solid([colours[w] for w in order for _ in range(2)])
    test_px = _solid([colours[w] if j != 3 else (colours[w][0],) * 3 for j, w in enumerate(val)])
    assert d.train_x.dtype == torch.float32
    tolerance = 3 / 255 / min(d.std)                                     # JPEG shifts a flat colour by a step or two
    assert (d.train_x - _expected(train_px, d.mean, d.std)).abs().max() < tolerance
    assert (d.test_x - _expected(test_px, d.mean, d.std)).abs().max() < tolerance
    assert d.mean == pytest.approx((0.4802, 0.4481, 0.3975)) and d.std == pytest.approx((0.2302, 0.2265, 0.2262))
    annotations = base / "val" / "val_annotations.txt"
    annotations.write_text(f"val_0.JPEG\t{val[0]}\n\nval_1.JPEG\t{val[1]}\n")          # two fields are enough
    assert load_dataset("tiny_imagenet", tmp_path).test_y.tolist() == [order.index(w) for w in val[:2]]
    for bad in ("val_1.JPEG", "val_1.JPEG\tn00000000"):                                  # no wnid, an unknown one
        annotations.write_text(f"val_0.JPEG\t{val[0]}\n\n{bad}\n")
        with pytest.raises(DataError, match=f"{annotations} line 3 is not '<file>\\\\t<wnid from wnids.txt>"):
            load_dataset("tiny_imagenet", tmp_path)
    (base / "wnids.txt").write_text("\n".join(wnids[:2]) + "\n")
    with pytest.raises(DataError, match="has 3 class folders but .*wnids.txt lists 2 different wnids"):
        load_dataset("tiny_imagenet", tmp_path)


def _leaf_file(path, users: dict):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"users": list(users), "num_samples": [len(v[0]) for v in users.values()],
                                "user_data": {u: {"x": x, "y": y} for u, (x, y) in users.items()}}))


def _line(seed: int) -> str:
    return "".join(np.random.default_rng(seed).choice(list(SHAKESPEARE_VOCAB), 80))


def test_leaf_vocabulary_has_80_distinct_symbols():
    assert len(SHAKESPEARE_VOCAB) == 80 == len(set(SHAKESPEARE_VOCAB))


@pytest.mark.parametrize("layout", ["shakespeare", "shakespeare/data"])
def test_shakespeare_leaf_json_with_users_as_groups(tmp_path, layout):
    base = tmp_path / layout
    lines = [_line(k) for k in range(7)]
    _leaf_file(base / "train" / "b.json", {"THE_FOOL": ([lines[3]], ["}"])})
    _leaf_file(base / "train" / "a.json", {"KING_LEAR": (lines[:2], ["a", "\n"]), "CORDELIA": ([lines[2]], ["Z"])})
    _leaf_file(base / "test" / "all.json", {"KING_LEAR": ([lines[4]], [" "]), "EDGAR": (lines[5:7], ["?", "0"])})
    d = load_dataset("shakespeare", tmp_path)
    _assert_server_view("shakespeare", tmp_path, d)
    assert d.num_classes == 80 and d.input_shape == (80,) and d.mean is None
    assert d.train_x.dtype == torch.int64 and d.train_y.dtype == torch.int64
    encode = lambda s: [SHAKESPEARE_VOCAB.index(ch) for ch in s]  # noqa: E731
    assert d.train_x.tolist() == [encode(s) for s in lines[:4]]         # files in name order, users in file order
    assert d.train_y.tolist() == encode("a\nZ}") and d.test_y.tolist() == encode(" ?0")
    assert d.test_x.tolist() == [encode(s) for s in lines[4:]]
    users = sorted(["THE_FOOL", "KING_LEAR", "CORDELIA", "EDGAR"])
    assert d.groups.dtype == np.int64 and d.groups.tolist() == [users.index(u) for u in
                                                                ("KING_LEAR", "KING_LEAR", "CORDELIA", "THE_FOOL")]
    test_users = _read_leaf_split(base / "test")[2]          # the test samples' owners (the loader reads them so)
    assert [users.index(u) for u in test_users] == [users.index(u) for u in ("KING_LEAR", "EDGAR", "EDGAR")]


@pytest.mark.parametrize("x,y,match", [(["a" * 79], ["b"], "80-character"), (["a" * 79 + "$"], ["b"], r"\['\$'\]"),
                                       (["a" * 80], ["é"], "é"), (["a" * 80], ["b", "c"], "as many")])
def test_shakespeare_bad_samples_name_the_file(tmp_path, x, y, match):
    _leaf_file(tmp_path / "shakespeare" / "train" / "t.json", {"U": (x, y)})
    _leaf_file(tmp_path / "shakespeare" / "test" / "t.json", {"U": (["a" * 80], ["b"])})
    with pytest.raises(DataError, match=match) as err:
        load_dataset("shakespeare", tmp_path)
    assert str(tmp_path / "shakespeare" / "train" / "t.json") in str(err.value)


@pytest.mark.parametrize("text", ["not json", '{"users": ["U"]}', '{"users": 3, "user_data": {}}'])
def test_a_leaf_file_without_users_and_their_data_is_refused_naming_it(tmp_path, text):
    _leaf_file(tmp_path / "shakespeare" / "test" / "t.json", {"U": (["a" * 80], ["b"])})
    (tmp_path / "shakespeare" / "train").mkdir()
    (tmp_path / "shakespeare" / "train" / "t.json").write_text(text)
    with pytest.raises(DataError, match=f"^cannot read LEAF file {tmp_path / 'shakespeare' / 'train' / 't.json'}: "
                                        ".*it must hold 'users' and 'user_data'"):
        load_dataset("shakespeare", tmp_path)


def test_shakespeare_is_read_from_the_first_folder_holding_both_splits_and_a_split_may_be_empty(tmp_path):
    _leaf_file(tmp_path / "shakespeare" / "train" / "t.json", {"A": (["a" * 80], ["b"])})    # no test split here
    _leaf_file(tmp_path / "shakespeare" / "data" / "train" / "t.json", {"B": (["c" * 80], ["d"])})
    _leaf_file(tmp_path / "shakespeare" / "data" / "test" / "t.json", {})                     # no users
    d = load_dataset("shakespeare", tmp_path)
    assert d.train_y.tolist() == [SHAKESPEARE_VOCAB.index("d")] and d.groups.tolist() == [0]
    assert d.test_x.shape == (0, 80) and d.test_y.shape == (0,)


def test_synthetic_is_deterministic_standardised_and_learnable_but_not_trivial():
    d = load_dataset("synthetic", DEBIAN_ROOT / "unused")
    _assert_server_view("synthetic", DEBIAN_ROOT, d)
    assert d.input_shape == (1, 8, 8) and d.num_classes == 10 and d.groups is None
    assert len(d.train_x) == 60000 and len(d.test_x) == 10000 and d.train_x.dtype == torch.float32
    assert abs(d.train_x.mean().item()) < 0.05 and abs(d.train_x.std().item() - 1) < 0.01
    assert torch.all(torch.bincount(d.train_y, minlength=10) > 5000)
    # the documented model: class means drawn first from numpy_rng(0, "synthetic"), N(0, 0.3) each, plus unit
    # noise, all scaled by 1 / sqrt(1 + 0.3^2); 6000 examples a class put each centroid within ~0.013
    means = numpy_rng(0, "synthetic").normal(0.0, 0.3, (10, 64)) / np.sqrt(1 + 0.3 ** 2)
    centroids = torch.stack([d.train_x[d.train_y == c].flatten(1).mean(0) for c in range(10)]).numpy()
    assert np.abs(centroids - means).max() < 0.07
    _assert_same(d, load_dataset("synthetic", DEBIAN_ROOT))
    centroids = torch.stack([d.train_x[d.train_y == c].flatten(1).mean(0) for c in range(10)])
    accuracy = (torch.cdist(d.test_x.flatten(1), centroids).argmin(1) == d.test_y).float().mean().item()
    assert 0.5 < accuracy < 0.95, accuracy


MISSING = {
    "mnist": (["mnist", "MNIST/raw"], "torchvision.datasets.MNIST"),
    "emnist_letters": (["emnist", "emnist/gzip", "EMNIST/raw"], "split='letters'"),
    "cifar10": (["cifar-10-batches-py"], "torchvision.datasets.CIFAR10"),
    "cifar100": (["cifar-100-python"], "torchvision.datasets.CIFAR100"),
    "cinic10": (["cinic10", "CINIC-10"], "datashare.ed.ac.uk"),
    "tiny_imagenet": (["tiny-imagenet-200"], "tiny-imagenet-200.zip"),
    "shakespeare": (["shakespeare/train", "shakespeare/data/test"], "LEAF"),
}


@pytest.mark.parametrize("name", sorted(MISSING))
def test_every_file_backed_set_names_paths_and_fix_when_missing(tmp_path, name):
    missing = tmp_path / "nowhere"
    with pytest.raises(DataError) as err:
        load_dataset(name, missing)
    folders, fix = MISSING[name]
    msg = str(err.value)
    assert all(str(missing / f) in msg for f in folders), msg
    assert fix in msg and "HPCFL_DATA" in msg


def test_a_loader_that_returns_no_dataset_is_refused_naming_it(tmp_path, monkeypatch):
    (tmp_path / "labdata.py").write_text("def load(root, train_images):\n    return {'x': []}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"data.dataset = 'labdata:load' returned dict, not an hpcfl.data.base.Data"):
        load_dataset("labdata:load", tmp_path)


def test_every_registered_set_has_a_test():
    assert set(DATASETS) == set(MISSING) | {"fashion_mnist", "digits", "synthetic"}
