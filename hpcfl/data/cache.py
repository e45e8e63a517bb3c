"""Decoded data sets cached per source files, so that only the first run pays for decompressing
Fashion-MNIST or decoding 180,000 PNGs, and every later run (and every rank) reads plain arrays.

Where: $HPCFL_CACHE (a folder; `off` switches the cache off), else $XDG_CACHE_HOME/hpcfl, else
~/.cache/hpcfl. An entry holds a loader's decoded uint8 pixels and labels (normalising is left to
the loader: the entry stays a quarter of the float32 size). Its name carries a fingerprint of the
source files (resolved path, size and modification time of each), so a changed, replaced or moved
source is decoded again and never read stale; the entries of the same set from the same folder that
it replaces are removed. An entry is written to a private temporary file and renamed into place,
so concurrent ranks and array tasks each write a whole file, the last rename wins, and a reader
never sees half of one. A damaged entry (the zip checksums catch it) is decoded again.

A reader maps the training pixels from the entry instead of reading them into memory: a new run
skips faulting in a copy, and the ranks on one node share the pages. Replacing or removing an
entry while a run maps it is safe: the run keeps the file it opened.
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

Arrays = dict[str, np.ndarray | None]


def cache_folder() -> Path | None:
    """The cache folder, or None when HPCFL_CACHE=off."""
    setting = os.environ.get("HPCFL_CACHE", "")
    if setting.lower() == "off":
        return None
    if setting:
        return Path(setting).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hpcfl"


def entry_path(folder: Path, name: str, sources: list[Path]) -> Path:
    """<name>-<where>-<fingerprint>.npz: `where` hashes the sources' folders (an entry to replace
    shares it), the fingerprint their paths, sizes and modification times."""
    resolved = sorted(Path(p).resolve() for p in sources)
    where = hashlib.sha256("\n".join(sorted({str(p.parent) for p in resolved})).encode()).hexdigest()[:8]
    stats = "\n".join(f"{p}\t{p.stat().st_size}\t{p.stat().st_mtime_ns}" for p in resolved)
    return folder / f"{name}-{where}-{hashlib.sha256(stats.encode()).hexdigest()[:16]}.npz"


def cached(name: str, sources: list[Path], decode: Callable[[bool], Arrays], train_images: bool) -> Arrays:
    """`decode(train_images)`'s arrays (train_x, train_y, test_x, test_y; train_x None when not
    `train_images`), from the cache when it holds an entry for these sources. A miss decodes; a
    decode of everything (train_images) is stored for the next run."""
    folder = cache_folder()
    if folder is None:
        return decode(train_images)
    path = entry_path(folder, name, sources)
    try:
        return _read(path, train_images)
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError):
        pass                                   # no entry yet, or a damaged one: decode again
    arrays = decode(train_images)
    if train_images:
        _store(path, arrays)
    return arrays


def _read(path: Path, train_images: bool) -> Arrays:
    """An entry's arrays. The training pixels are mapped from the file where np.savez stored them (no
    copy to fault in, and the ranks of a node share the pages); the small arrays are copied out. Each
    member's zip checksum is verified first, as np.load would, and object arrays are refused."""
    arrays = {}
    with zipfile.ZipFile(path) as archive, open(path, "rb") as file:
        for info in archive.infolist():
            key = info.filename.removesuffix(".npy")
            if key == "train_x" and not train_images:
                arrays[key] = None
                continue
            if info.compress_type != zipfile.ZIP_STORED:
                raise ValueError(f"{info.filename} is compressed")
            file.seek(info.header_offset)
            local = file.read(30)                           # the member's local header: names and extras follow
            if local[:4] != b"PK\x03\x04":
                raise zipfile.BadZipFile(info.filename)
            start = info.header_offset + 30 + sum(int.from_bytes(local[i:i + 2], "little") for i in (26, 28))
            file.seek(start)
            version = np.lib.format.read_magic(file)
            if version not in ((1, 0), (2, 0)):
                raise ValueError(f"{info.filename}: .npy version {version}")
            fmt = np.lib.format
            shape, fortran, dtype = (fmt.read_array_header_1_0 if version == (1, 0) else
                                     fmt.read_array_header_2_0)(file)
            if dtype.hasobject:
                raise ValueError(f"{info.filename} holds objects")
            offset = file.tell()
            file.seek(start)
            header = file.read(offset - start)
            array = np.memmap(path, dtype, "r", offset, shape, "F" if fortran else "C")   # ValueError if short
            if info.file_size != len(header) + array.nbytes or zlib.crc32(array, zlib.crc32(header)) != info.CRC:
                raise ValueError(f"{info.filename} is damaged")
            arrays[key] = array if key == "train_x" else np.array(array)
    return arrays


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
