"""The decoded-data cache: a second load reads the entry instead of decoding, with the same tensors;
a changed source is decoded again and replaces its entry; concurrent writers leave one whole entry;
a damaged entry is rebuilt; HPCFL_CACHE=off and an unwritable folder fall back to decoding."""
import gzip
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

import hpcfl.data.cache
import hpcfl.data.idx
from hpcfl.data.cache import cache_folder, entry_path, node_local
from hpcfl.data.datasets import load_dataset
from hpcfl.errors import DataError

REPO = Path(__file__).resolve().parents[2]


def _write_mnist(root: Path, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    img = rng.integers(0, 256, (30, 28, 28), dtype=np.uint8)
    lbl = rng.integers(0, 10, 30).astype(np.uint8)
    for prefix, part in (("train", slice(0, 20)), ("t10k", slice(20, 30))):
        for kind, array in (("images-idx3", img[part]), ("labels-idx1", lbl[part])):
            raw = b"\x00\x00\x08" + bytes([array.ndim]) + np.array(array.shape, dtype=">u4").tobytes() + array.tobytes()
            path = root / "mnist" / f"{prefix}-{kind}-ubyte.gz"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(gzip.compress(raw))


def _same(one, other) -> bool:
    return all(torch.equal(getattr(one, k), getattr(other, k)) for k in ("train_x", "train_y", "test_x", "test_y"))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("HPCFL_CACHE", str(folder))
    _write_mnist(tmp_path / "data")
    return folder


def test_a_second_load_reads_the_entry_with_the_same_tensors(cache, tmp_path, monkeypatch):
    monkeypatch.setenv("HPCFL_CACHE", "off")
    decoded = load_dataset("mnist", tmp_path / "data")
    assert not cache.exists()                                      # off: nothing written
    monkeypatch.setenv("HPCFL_CACHE", str(cache))
    first = load_dataset("mnist", tmp_path / "data")
    assert len(list(cache.glob("mnist-*.npz"))) == 1
    monkeypatch.setattr(hpcfl.data.idx, "read_idx", lambda path: pytest.fail(f"decoded {path} again"))
    again, server = load_dataset("mnist", tmp_path / "data"), load_dataset("mnist", tmp_path / "data", False)
    assert _same(decoded, first) and _same(decoded, again)
    assert len(server.train_x) == 0 and torch.equal(server.test_x, decoded.test_x)


def test_a_changed_source_is_decoded_again_and_replaces_its_entry(cache, tmp_path):
    before = load_dataset("mnist", tmp_path / "data")
    entry = next(cache.glob("mnist-*.npz"))
    time.sleep(0.01)
    _write_mnist(tmp_path / "data", seed=1)                        # new files, same paths
    after = load_dataset("mnist", tmp_path / "data")
    assert not torch.equal(after.train_x, before.train_x)
    entries = list(cache.glob("mnist-*.npz"))
    assert len(entries) == 1 and entries[0] != entry               # the stale entry is gone


def test_a_copy_keeping_the_size_and_mtime_is_decoded_again_and_a_linked_root_shares_the_entry(cache, tmp_path):
    before = load_dataset("mnist", tmp_path / "data")
    stamps = {p: p.stat() for p in (tmp_path / "data" / "mnist").iterdir()}
    _write_mnist(tmp_path / "data", seed=1)                        # as `cp -p` would: same sizes, same mtimes
    for path, stat in stamps.items():
        assert path.stat().st_size == stat.st_size
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    after = load_dataset("mnist", tmp_path / "data")
    assert not torch.equal(after.train_x, before.train_x)
    (tmp_path / "linked").symlink_to(tmp_path / "data")
    entries = list(cache.glob("mnist-*.npz"))
    assert _same(load_dataset("mnist", tmp_path / "linked"), after) and list(cache.glob("mnist-*.npz")) == entries
    sources = sorted((tmp_path / "data" / "mnist").iterdir())
    assert entry_path(cache, "mnist", [str(p) for p in sources]) == entry_path(cache, "mnist", sources)   # str too


def test_a_source_file_that_is_gone_is_named_with_the_fix(cache, tmp_path):
    gone = tmp_path / "data" / "mnist" / "t10k-images-idx3-ubyte.gz"
    gone.unlink()
    gone.symlink_to(tmp_path / "nowhere")                          # a dangling link: listed, not readable
    with pytest.raises(DataError, match=f"^cannot read {gone} \\(No such file or directory\\); restore it"):
        entry_path(cache, "mnist", sorted(gone.parent.iterdir()))


def test_an_entry_an_earlier_decoder_wrote_is_decoded_again_and_replaced(cache, tmp_path, monkeypatch):
    load_dataset("mnist", tmp_path / "data")
    entry = next(cache.glob("mnist-*.npz"))
    monkeypatch.setattr(hpcfl.data.cache, "DECODING", hpcfl.data.cache.DECODING + 1)    # a loader changed
    decoded = []
    read_idx = hpcfl.data.idx.read_idx
    monkeypatch.setattr(hpcfl.data.idx, "read_idx", lambda path: decoded.append(path) or read_idx(path))
    load_dataset("mnist", tmp_path / "data")
    entries = list(cache.glob("mnist-*.npz"))
    assert decoded and len(entries) == 1 and entries[0] != entry


def test_a_damaged_entry_is_decoded_again(cache, tmp_path):
    whole = load_dataset("mnist", tmp_path / "data")
    entry = next(cache.glob("mnist-*.npz"))
    entry.write_bytes(entry.read_bytes()[:-200])                   # truncated
    assert _same(load_dataset("mnist", tmp_path / "data"), whole)
    assert _same(load_dataset("mnist", tmp_path / "data"), whole)  # and rewritten whole


def test_a_flipped_byte_in_the_pixels_is_caught_by_the_checksum(cache, tmp_path):
    whole = load_dataset("mnist", tmp_path / "data")
    entry = next(cache.glob("mnist-*.npz"))
    raw = bytearray(entry.read_bytes())
    at = raw.index(bytes(whole.train_pixels[0, 0, 0]))               # inside train_x's first image
    raw[at] ^= 0xFF
    entry.write_bytes(bytes(raw))
    assert _same(load_dataset("mnist", tmp_path / "data"), whole)     # decoded again, not read as stored


def test_on_a_node_local_filesystem_the_training_pixels_are_mapped_from_the_entry(cache, tmp_path, recwarn):
    assert node_local(cache)                                            # the tests' tmp: ext4, tmpfs, ...
    load_dataset("mnist", tmp_path / "data")                           # writes the entry
    again = load_dataset("mnist", tmp_path / "data")
    assert isinstance(again.train_pixels, np.memmap) and not again.train_pixels.flags.writeable   # shared pages
    assert again.train_y.numpy().flags.writeable and again.test_x.numpy().flags.writeable        # copies
    assert torch.equal(again.train_x, load_dataset("mnist", tmp_path / "data").train_x)
    assert not [w for w in recwarn if "writable" in str(w.message)]       # torch never saw a read-only array


def test_on_a_network_filesystem_entries_are_read_into_memory(cache, tmp_path, monkeypatch):
    """Another node may rewrite or remove an entry there, and a mapped reader's next page fault would
    be a SIGBUS."""
    table = tmp_path / "mounts"
    table.write_text(f"/dev/vda / ext4 rw 0 0\nserver:/home {tmp_path} nfs4 rw 0 0\n")
    assert not node_local(cache, table) and node_local(Path("/usr"), table)
    assert not node_local(cache, tmp_path / "no-such-table")            # unknown: not mapped
    monkeypatch.setattr(hpcfl.data.cache, "node_local", lambda folder: False)
    load_dataset("mnist", tmp_path / "data")
    again = load_dataset("mnist", tmp_path / "data")
    assert not isinstance(again.train_pixels, np.memmap) and again.train_pixels.flags.writeable


def test_concurrent_writers_leave_one_whole_entry(cache, tmp_path):
    """Four processes miss together; each writes slowly (np.savez delayed) and renames into place."""
    code = ("import time, numpy as np, hpcfl.data.cache as c; save = np.savez; "
            "c.np.savez = lambda *a, **k: (time.sleep(0.5), save(*a, **k)); "
            "from hpcfl.data.datasets import load_dataset; "
            f"print(float(load_dataset('mnist', {str(tmp_path / 'data')!r}).train_x.sum()))")
    env = {**os.environ, "PYTHONPATH": str(REPO), "HPCFL_CACHE": str(cache), "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(4)]
    sums = {float(p.communicate(timeout=120)[0]) for p in procs}
    assert all(p.returncode == 0 for p in procs) and len(sums) == 1
    assert [e.name.endswith(".npz") for e in cache.iterdir()] == [True]      # one entry, no staged files left
    assert float(load_dataset("mnist", tmp_path / "data").train_x.sum()) in sums


def test_an_unwritable_cache_warns_and_still_loads(tmp_path, monkeypatch, caplog):
    _write_mnist(tmp_path / "data")
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("HPCFL_CACHE", str(tmp_path / "a-file" / "cache"))    # cannot be made a folder
    data = load_dataset("mnist", tmp_path / "data")
    assert len(data.train_x) == 20 and "HPCFL_CACHE" in caplog.text      # a warning on logger hpcfl.data.cache


def test_the_cache_folder_follows_hpcfl_cache_then_xdg_then_home(tmp_path, monkeypatch):
    monkeypatch.delenv("HPCFL_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_folder() == tmp_path / "xdg" / "hpcfl"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_folder() == tmp_path / "home" / ".cache" / "hpcfl"
    monkeypatch.setenv("HPCFL_CACHE", str(tmp_path / "deep" / "er" / "cache"))     # made with its parents
    _write_mnist(tmp_path / "data")
    load_dataset("mnist", tmp_path / "data")
    assert len(list((tmp_path / "deep" / "er" / "cache").glob("mnist-*.npz"))) == 1


def test_each_data_root_keeps_its_own_entry(cache, tmp_path):
    _write_mnist(tmp_path / "other", seed=2)
    load_dataset("mnist", tmp_path / "data")
    load_dataset("mnist", tmp_path / "other")
    assert len(list(cache.glob("mnist-*.npz"))) == 2                  # replacing is per root, not per name


def test_an_entry_holding_pickled_objects_is_never_unpickled(cache, tmp_path):
    whole = load_dataset("mnist", tmp_path / "data")
    entry = next(cache.glob("mnist-*.npz"))
    objects = np.empty(1, dtype=object)
    objects[0] = {"not": "pixels"}
    np.savez(entry, train_x=objects, train_y=objects, test_x=objects, test_y=objects)   # a tampered entry
    assert _same(load_dataset("mnist", tmp_path / "data"), whole)      # refused, decoded again


def test_a_failed_rename_leaves_no_staged_file(cache, tmp_path, caplog):
    sources = sorted((tmp_path / "data" / "mnist").glob("*-ubyte.gz"))
    entry_path(cache, "mnist", sources).mkdir(parents=True)            # a folder where the entry would go
    assert len(load_dataset("mnist", tmp_path / "data").train_x) == 20
    assert "HPCFL_CACHE" in caplog.text
    assert [p.name for p in cache.iterdir()] == [entry_path(cache, "mnist", sources).name]   # no .tmp left


def test_the_mount_table_decides_by_the_longest_mount_point_above_the_folder(tmp_path):
    table = tmp_path / "mounts"
    table.write_text("rootfs / ext4 rw 0 0\nbroken-line\nserver:/home /home nfs rw 0 0\n"
                     "/dev/sdb /home/me/scratch xfs rw 0 0\nserver:/x /home/me/scratch\\040data nfs rw 0 0\n")
    assert node_local(Path("/home/me/scratch/cache"), table)              # xfs, under nfs's /home
    assert not node_local(Path("/home/me/cache"), table)                  # nfs
    assert not node_local(Path("/home/me/scratch data/c"), table)         # a mount point with a space: nfs
    assert node_local(Path("/home"), table) is False and node_local(Path("/tmp/x"), table)
    assert not node_local(Path("/tmp"), tmp_path / "no-such-table")


def test_a_mapped_member_that_is_compressed_damaged_of_another_version_or_of_objects_is_refused(tmp_path):
    from hpcfl.data.cache import _map_member, read_entry

    pixels = np.arange(64, dtype=np.uint8).reshape(4, 4, 4)
    stored = tmp_path / "stored.npz"
    np.savez(stored, train_x=pixels, train_y=np.arange(4))
    assert np.array_equal(_map_member(stored, "train_x.npy"), pixels)
    np.savez_compressed(tmp_path / "zipped.npz", train_x=pixels)
    with pytest.raises(ValueError, match="train_x.npy is compressed"):
        _map_member(tmp_path / "zipped.npz", "train_x.npy")
    raw = bytearray(stored.read_bytes())
    bad_header = tmp_path / "header.npz"
    bad_header.write_bytes(bytes(raw).replace(b"PK\x03\x04", b"PK\x03\x05", 1))     # the first member's local header
    with pytest.raises(zipfile.BadZipFile, match="train_x.npy"):
        _map_member(bad_header, "train_x.npy")
    version = tmp_path / "version.npz"
    version.write_bytes(bytes(raw).replace(b"\x93NUMPY\x01\x00", b"\x93NUMPY\x03\x00", 1))
    with pytest.raises(ValueError, match=r"train_x.npy: .npy version \(3, 0\)"):
        _map_member(version, "train_x.npy")
    objects = np.empty(1, dtype=object)
    objects[0] = {"not": "pixels"}
    np.savez(tmp_path / "objects.npz", train_x=objects, train_y=np.arange(1))
    with pytest.raises(ValueError, match="train_x.npy holds objects"):
        _map_member(tmp_path / "objects.npz", "train_x.npy")
    with pytest.raises(ValueError, match="allow_pickle"):                # read, not mapped: never unpickled
        read_entry(tmp_path / "objects.npz", train_images=True, mapped=False)


def test_a_three_field_line_a_remounted_point_and_a_deeper_mount_listed_first_count(tmp_path):
    table = tmp_path / "mounts"
    table.write_text("rootfs / ext4 rw 0 0\nserver:/s /scratch nfs\n/dev/sdb /data ext4 rw 0 0\n"
                     "server:/d /data nfs rw 0 0\n/dev/sdc /home/me/scratch xfs rw 0 0\n"
                     "server:/home /home nfs rw 0 0\n")
    assert not node_local(Path("/scratch/x"), table)                      # a line of exactly three fields
    assert not node_local(Path("/data/x"), table)                         # the later mount on a point wins
    assert node_local(Path("/home/me/scratch/x"), table)                  # the longest point, wherever listed


def test_any_member_of_either_npy_version_is_mapped_where_it_lies(tmp_path):
    from hpcfl.data.cache import _map_member

    labels, pixels = np.arange(5, dtype=np.int64), np.arange(64, dtype=np.uint8).reshape(4, 4, 4)
    path = tmp_path / "v2.npz"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        for name, array, version in (("y.npy", labels, (1, 0)), ("train_x.npy", pixels, (2, 0))):    # names unlike
            with archive.open(name, "w") as member:
                np.lib.format.write_array(member, array, version=version)
    assert np.array_equal(_map_member(path, "train_x.npy"), pixels)          # the second member, version 2.0
    assert np.array_equal(_map_member(path, "y.npy"), labels)
