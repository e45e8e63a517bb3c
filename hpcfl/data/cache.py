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
"""
import contextlib
import hashlib
import logging
import os
import uuid
import zipfile
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
        with np.load(path, allow_pickle=False) as entry:
            return {key: entry[key] if train_images or key != "train_x" else None for key in entry.files}
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError):
        pass                                   # no entry yet, or a damaged one: decode again
    arrays = decode(train_images)
    if train_images:
        _store(path, arrays)
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
