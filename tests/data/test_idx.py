"""IDX files on their own (the sets' loaders end to end: tests/data/test_datasets.py): each way a file
can be damaged gets its own message naming the file, and each way a set's four files can disagree is
refused naming the pair."""
import dataclasses
import gzip

import numpy as np
import pytest
from helpers import idx_bytes

from hpcfl.data.idx import FASHION_MNIST, MNIST, load_idx_set, read_idx
from hpcfl.errors import DataError

MAGIC = b"\x00\x00\x08"


@pytest.mark.parametrize("raw, needle", [
    (MAGIC, "is not an unsigned-byte IDX file (bad magic number)"),                   # 3 bytes: no dimension count
    (b"\x00\x00\x0d\x01\x00\x00\x00\x01\x00", "bad magic number"),                      # 0x0d: float32
    (MAGIC + b"\x02\x00\x00\x00\x05", "is truncated inside its header"),               # 2 dims, 1 given
    (MAGIC + b"\x00", "holds 0 data bytes but its header () needs 1"),                  # a scalar without its byte
    (idx_bytes(np.zeros((2, 3), np.uint8))[:-1], "holds 5 data bytes but its header (2, 3) needs 6"),
])
def test_a_damaged_idx_file_is_refused_naming_it(tmp_path, raw, needle):
    path = tmp_path / "x-idx2-ubyte"
    path.write_bytes(raw)
    with pytest.raises(DataError, match=f"^{path}.*replace it with an intact copy$") as err:
        read_idx(path)
    assert needle in str(err.value)


def test_an_unreadable_or_undecompressable_file_is_refused_with_its_cause(tmp_path):
    for path, write in ((tmp_path / "x-idx1-ubyte.gz", lambda p: p.write_bytes(b"not gzip")),
                        (tmp_path / "folder-idx1-ubyte", lambda p: p.mkdir())):
        write(path)
        with pytest.raises(DataError, match=f"^cannot read IDX file {path}: .*; replace it with an intact copy$") \
                as err:
            read_idx(path)
        assert err.value.__cause__ is not None


def test_the_smallest_idx_arrays_read_back(tmp_path):
    for array in (np.zeros(0, np.uint8), np.array(7, np.uint8), np.arange(24, dtype=np.uint8).reshape(2, 3, 4)):
        path = tmp_path / "a-idx-ubyte"
        path.write_bytes(idx_bytes(array))
        np.testing.assert_array_equal(read_idx(path), array)
        assert read_idx(path).shape == array.shape


def test_a_gzipped_idx_file_reads_back(tmp_path):
    data = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    path = tmp_path / "tiny-idx3-ubyte.gz"
    path.write_bytes(gzip.compress(idx_bytes(data)))
    assert np.array_equal(read_idx(path), data)


def _pair(n):
    """n blank 28 x 28 images labelled 0, 1, ..."""
    return np.zeros((n, 28, 28), np.uint8), np.arange(n, dtype=np.uint8)


def _write_set(root, train=None, test=None):
    """An MNIST set under root/mnist: 4 training and 2 test examples unless given."""
    train, test = train or _pair(4), test or _pair(2)
    folder = root / "mnist"
    folder.mkdir(parents=True, exist_ok=True)
    for prefix, (images, labels) in (("train", train), ("t10k", test)):
        (folder / f"{prefix}-images-idx3-ubyte").write_bytes(idx_bytes(images))
        (folder / f"{prefix}-labels-idx1-ubyte").write_bytes(idx_bytes(labels))
    return folder


@pytest.mark.parametrize("part, images, labels", [
    ("train", np.zeros((4, 27, 28), np.uint8), np.arange(4, dtype=np.uint8)),        # not 28 x 28
    ("train", np.zeros((4, 28, 28), np.uint8), np.arange(3, dtype=np.uint8)),        # one label short
    ("train", np.zeros((4, 28, 28, 1), np.uint8), np.arange(4, dtype=np.uint8)),     # a fourth dimension
    ("t10k", np.zeros((2, 28, 28), np.uint8), np.zeros((2, 1), np.uint8)),           # labels not a vector
    ("t10k", np.zeros((2, 28, 28), np.uint8), np.array([0, 10], np.uint8)),          # label 10 of classes 0..9
])
def test_images_and_labels_that_do_not_pair_are_refused_naming_both_files(tmp_path, part, images, labels):
    pair = {"train": _pair(4), "t10k": _pair(2)}
    pair[part] = (images, labels)
    folder = _write_set(tmp_path, pair["train"], pair["t10k"])
    with pytest.raises(DataError, match=f"^{folder / part}-images-idx3-ubyte \\(.*\\) and {folder / part}-labels-"
                                        r"idx1-ubyte \(.*\) are not a matching MNIST pair of 28x28 images and "
                                        r"labels 0\.\.9; replace them"):
        load_idx_set(MNIST, tmp_path)


def test_a_set_loads_its_training_images_unless_told_not_to_and_mnist_style_images_stay_upright(tmp_path):
    image = np.zeros((28, 28), np.uint8)
    image[0, 5] = 255                                          # row 0, column 5: not on the diagonal
    train = (np.stack([image] * 4), np.arange(4, dtype=np.uint8))
    folder = _write_set(tmp_path, train)
    (folder.parent / "fashion-mnist").symlink_to(folder)
    for spec in (MNIST, FASHION_MNIST):
        data = load_idx_set(spec, tmp_path)
        assert len(data.train_x) == 4 and data.train_x[0, 0, 0, 5] > data.train_x[0, 0, 5, 0]
        assert len(load_idx_set(spec, tmp_path, train_images=False).train_x) == 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        MNIST.num_classes = 26


def test_a_flat_root_answers_only_for_the_set_its_files_hold(tmp_path):
    folder = _write_set(tmp_path, test=(np.full((2, 28, 28), 33, np.uint8), np.arange(2, dtype=np.uint8)))
    for path in folder.iterdir():                              # MNIST's files in the root itself, mean pixel 0.129
        path.rename(tmp_path / path.name)
    assert len(load_idx_set(MNIST, tmp_path).test_x) == 2
    with pytest.raises(DataError, match=rf"^{tmp_path} holds MNIST's files, not Fashion-MNIST's \(their test images' "
                                        r"mean pixel is 0\.129; MNIST's is 0\.131, Fashion-MNIST's 0\.286\): put each "
                                        rf"set in its own folder \({tmp_path / 'fashion-mnist'}\)"):
        load_idx_set(FASHION_MNIST, tmp_path)
    for path in tmp_path.glob("t10k-images*"):                 # Fashion-MNIST's brightness: the other way round
        path.write_bytes(idx_bytes(np.full((2, 28, 28), 74, np.uint8)))
    assert len(load_idx_set(FASHION_MNIST, tmp_path).test_x) == 2
    with pytest.raises(DataError, match=r"holds Fashion-MNIST's files, not MNIST's \(their test images' mean pixel "
                                        r"is 0\.290;"):
        load_idx_set(MNIST, tmp_path)
