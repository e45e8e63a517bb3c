"""Decoded data sets cached per source files, so that only the first run pays for decompressing
Fashion-MNIST or decoding 180,000 PNGs, and every later run (and every rank) reads plain arrays.

Where: $HPCFL_CACHE (a folder; `off` switches the cache off), else $XDG_CACHE_HOME/hpcfl, else
~/.cache/hpcfl. An entry holds a loader's decoded uint8 pixels and labels (normalising is left to
the loader: the entry stays a quarter of the float32 size). Its name carries a fingerprint of the
source files (resolved path, size and modification time of each) and of the decoders' version
(DECODING), so a changed, replaced or moved source, or a changed decoder, is decoded again and never
read stale; the entries of the same set from the same folder that
it replaces are removed. An entry is written to a private temporary file and renamed into place,
so concurrent ranks and array tasks each write a whole file, the last rename wins, and a reader
never sees half of one. A damaged entry (the zip checksums catch it) is decoded again.

Where the cache folder is on a filesystem of this node (ext4, xfs, tmpfs, ...: LOCAL_FILESYSTEMS), a
reader maps the training pixels from the entry instead of copying them into its memory: the ranks of
a node then share one page-cache copy (3 processes reading a 372 MiB entry: proportional set size
388 MiB each when read, 141 MiB mapped; bench/cache_memory.py). That is safe there because an entry
is never changed in place: a rewrite or removal gives the name to a new file or unlinks the old one,
and a run keeps the file it mapped. On a network filesystem (NFS, Lustre, GPFS, ...), another node's
rewrite or removal can invalidate the pages under a running reader, whose next page fault is a
SIGBUS; there, and wherever the filesystem is not known, entries are read into memory as before.
"""
import contextlib
import hashlib
import logging
import os
import uuid
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np

from hpcfl.errors import DataError

Arrays = dict[str, np.ndarray | None]
# Part of every entry's fingerprint: raise it when a loader decodes differently (a transpose, a label
# offset, a check an entry must pass), so that entries an earlier hpcfl wrote are decoded again.
DECODING = 1
# filesystems whose files only this node changes: an entry there may be mapped (see the module docstring)
LOCAL_FILESYSTEMS = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "zfs", "f2fs", "overlay"})


def cache_folder() -> Path | None:
    """The cache folder, or None when HPCFL_CACHE=off."""
    setting = os.environ.get("HPCFL_CACHE", "")
    if setting.lower() == "off":
        return None
    if setting:
        return Path(setting).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hpcfl"


def entry_path(folder: Path, name: str, sources: list[Path | str]) -> Path:
    """<name>-<where>-<fingerprint>.npz: `where` hashes the sources' folders (an entry to replace
    shares it), the fingerprint their paths, sizes, modification and change times, and DECODING (a copy
    that keeps the original's size and mtime, as `cp -p` or `rsync -a` make, still has a new ctime)."""
    sources = [Path(p) for p in sources]        # one resolve a folder, one stat a file: CINIC-10's 270,000
    folders = {parent: parent.resolve() for parent in {p.parent for p in sources}}   # files lie in 20 folders
    resolved = sorted(folders[p.parent] / p.name for p in sources)
    where = hashlib.sha256("\n".join(sorted({str(p.parent) for p in resolved})).encode()).hexdigest()[:8]
    stats = "\n".join([f"decoding {DECODING}", *(f"{p}\t{s.st_size}\t{s.st_mtime_ns}\t{s.st_ctime_ns}"
                                                   for p, s in ((p, _stat(p)) for p in resolved))])
    return folder / f"{name}-{where}-{hashlib.sha256(stats.encode()).hexdigest()[:16]}.npz"


def _stat(path: Path) -> os.stat_result:
    try:
        return path.stat()
    except OSError as err:                      # a file a listing names that is gone, or a dangling link
        raise DataError(f"cannot read {path} ({err.strerror}); restore it or re-extract the archive") from err


def cached(name: str, sources: list[Path | str], decode: Callable[[bool], Arrays], train_images: bool) -> Arrays:
    """`decode(train_images)`'s arrays (train_x, train_y, test_x, test_y; train_x None when not
    `train_images`), from the cache when it holds an entry for these sources. A miss decodes; a
    decode of everything (train_images) is stored for the next run."""
    folder = cache_folder()
    if folder is None:
        return decode(train_images)
    path = entry_path(folder, name, sources)
    try:
        return read_entry(path, train_images, mapped=node_local(folder))
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError):
        pass                                   # no entry yet, or a damaged one: decode again
    arrays = decode(train_images)
    if train_images:
        _store(path, arrays)
    return arrays


def node_local(folder: Path, table: Path = Path("/proc/self/mounts")) -> bool:
    """Whether `folder` lies on a filesystem in LOCAL_FILESYSTEMS, by Linux's mount `table` (the
    longest mount point above it); False where that table cannot be read."""
    try:
        mounts = table.read_text().splitlines()
    except OSError:
        return False
    where, found = str(Path(folder).resolve()), ("", "")
    for line in mounts:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")                  # the table writes a space as \040
        if (where == point or where.startswith(point.rstrip("/") + "/")) and len(point) >= len(found[0]):
            found = (point, fields[2])
    return found[1] in LOCAL_FILESYSTEMS


def read_entry(path: Path, train_images: bool, mapped: bool) -> Arrays:
    """An entry's arrays (train_x None unless `train_images`); `mapped`: train_x mapped from the file,
    read-only, the small arrays copied out."""
    maps = mapped and train_images
    with np.load(path, allow_pickle=False) as entry:
        arrays = {key: entry[key] if train_images or key != "train_x" else None
                  for key in entry.files if not (maps and key == "train_x")}
    return {**arrays, "train_x": _map_member(path, "train_x.npy")} if maps else arrays


def _map_member(path: Path, name: str) -> np.memmap:
    """The array a zip member (stored, as np.savez writes it) holds, mapped where it lies in the file,
    its zip checksum verified as np.load would, an object array refused."""
    with zipfile.ZipFile(path) as archive, open(path, "rb") as file:
        info = archive.getinfo(name)                        # KeyError if absent
        if info.compress_type != zipfile.ZIP_STORED:
            raise ValueError(f"{name} is compressed")
        file.seek(info.header_offset)
        local = file.read(30)                               # the member's local header: names and extras follow
        if local[:4] != b"PK\x03\x04":
            raise zipfile.BadZipFile(name)
        start = info.header_offset + 30 + sum(int.from_bytes(local[i:i + 2], "little") for i in (26, 28))
        file.seek(start)
        version = np.lib.format.read_magic(file)
        if version not in ((1, 0), (2, 0)):
            raise ValueError(f"{name}: .npy version {version}")
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read_header(file)
        if dtype.hasobject:
            raise ValueError(f"{name} holds objects")
        offset = file.tell()
        file.seek(start)
        header = file.read(offset - start)
    array = np.memmap(path, dtype, "r", offset, shape, "F" if fortran else "C")       # ValueError if short
    if info.file_size != len(header) + array.nbytes or zlib.crc32(array, zlib.crc32(header)) != info.CRC:
        raise ValueError(f"{name} is damaged")
    return array


def _store(path: Path, arrays: Arrays) -> None:
    staged = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(staged, "wb") as file:
            np.savez(file, **arrays)
        os.replace(staged, path)
        for older in path.parent.glob(path.name.rsplit("-", 1)[0] + "-*.npz"):
            if older != path:
                older.unlink(missing_ok=True)
    except OSError as err:
        with contextlib.suppress(OSError):
            staged.unlink()
        logging.getLogger(__name__).warning(f"the data cache could not be written ({err}); runs decode the data "
                                            "each time. Fix: point HPCFL_CACHE at a writable folder, or set "
                                            "HPCFL_CACHE=off")
