"""Rank 0's writer of one HDF5 result file per run, one row per round.

Why this scheme keeps the file readable by plain `h5py.File(path, "r")` both while the run
is going and after the writer was SIGKILLed between rounds:

- The writer opens with `locking=False`. HDF5's file lock would otherwise make every reader
  in another process fail with "unable to lock file" for as long as the run is open.
- The file uses HDF5's default (earliest) format, never SWMR or `libver="latest"`: those
  mark the superblock "open for write", so readers are refused while the run is open and
  the file needs `h5clear` after a crash.
- Each round is flushed (data and metadata reach the file, and the file is a consistent
  HDF5 file at that moment); only then is the root attribute `committed_rounds` raised and
  flushed again. Without the per-round flush a killed writer leaves an unopenable file.
  A reader trusts rows < `committed_rounds`, so a kill during a round costs only that round.

Chunks hold about `CHUNK_BYTES` of rows, so a flush rewrites a few small chunks per key
rather than the growing series; without compression a rewritten chunk stays in place, so
the file does not grow by rewriting. A reader that opens exactly during a flush may see an
inconsistent file; it should retry.
"""
from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import h5py
import numpy as np

from hpcfl.errors import ResultsError

SCHEMA_VERSION = 1
CHUNK_BYTES = 64 * 1024
MAX_CHUNK_ROWS = 1024
ROUND_AXIS = "round"  # value of a dataset's "axis0" attribute when its first axis is the round
JSON_ATTRS = "json_attrs"  # root attribute: JSON list of the attributes stored as JSON text
RESERVED_ATTRS = ("schema_version", "created", "committed_rounds", JSON_ATTRS)


def _as_round_value(key: str, value) -> np.ndarray:
    """Scalars become float64; arrays keep their family: float -> float64, int/bool -> int64, except
    uint8 arrays, which stay uint8 (packed bits: a test example's correctness costs one bit a round)."""
    array = np.asarray(value)
    if array.dtype.kind not in "fiub":
        raise ResultsError(f"round value {key!r} must be a number or a numeric array, got dtype {array.dtype}")
    if array.dtype == np.uint8 and array.ndim:
        return array
    return array.astype(np.float64 if array.ndim == 0 or array.dtype.kind == "f" else np.int64)

class Recorder:
    """Appends rounds to one result file; the only process that writes it is rank 0."""

    def __init__(self, file: h5py.File):
        self._file = file
        self._series: dict[str, h5py.Dataset] = {}
        self._rounds = 0

    @classmethod
    def create(cls, path: Path, attrs: dict, arrays: dict | None = None) -> Recorder:
        """Create a new result file with root attributes `attrs` and fixed datasets `arrays` (name ->
        array, `write_array`); an existing file is never overwritten."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            file = h5py.File(path, "x", locking=False)  # "x": refused if it exists, even made by a racing creator
        except FileExistsError:
            raise ResultsError(f"result file {path} already exists; choose another run.name, or delete or move "
                               "the old file") from None
        recorder = cls(file)
        file.attrs["schema_version"] = SCHEMA_VERSION
        file.attrs["created"] = datetime.now(UTC).isoformat(timespec="seconds")
        file.attrs["committed_rounds"] = np.int64(0)
        file.attrs[JSON_ATTRS] = "[]"
        try:
            for name, value in attrs.items():
                recorder._put_attr(name, value)
            for name, array in (arrays or {}).items():
                recorder.write_array(name, array)
        except ResultsError:
            file.close()
            path.unlink()  # a bad attribute or array must not leave a file that blocks the corrected retry
            raise
        file.flush()
        return recorder

    @classmethod
    def reopen(cls, path: Path, rounds: int) -> Recorder:
        """Open a run's file to continue it after `rounds` rounds: later rows are dropped, and the
        figures written after the last round (`final/`: a run can die after writing them, before it is
        marked complete); the resumed run writes them again, identically."""
        file = h5py.File(path, "r+", locking=False)
        recorder = cls(file)
        committed = int(file.attrs["committed_rounds"])
        if rounds > committed:
            file.close()
            raise ResultsError(f"{path} holds {committed} rounds but its checkpoint is after round {rounds}; "
                               "the result file is older than the checkpoint: move one of them away")
        def collect(key, item):               # returns None: visititems stops at any other value
            if isinstance(item, h5py.Dataset) and item.attrs.get("axis0") == ROUND_AXIS:
                recorder._series[key] = item

        file.visititems(collect)
        try:
            file.attrs.modify("committed_rounds", np.int64(rounds))
            file.flush()        # the count first: a kill from here on leaves rows beyond it, never a count beyond them
            for dataset in recorder._series.values():
                dataset.resize(rounds, axis=0)
            if "final" in file:
                del file["final"]
            file.flush()
        except BaseException:
            file.close()
            raise
        recorder._rounds = rounds
        return recorder

    def _put_attr(self, name: str, value) -> None:
        if name in RESERVED_ATTRS:
            raise ResultsError(f"attribute name {name!r} is reserved by hpcfl; pick another name")
        json_names = set(json.loads(self._file.attrs[JSON_ATTRS]))
        if isinstance(value, (dict, list, tuple)):
            try:
                value = json.dumps(value)
            except (TypeError, ValueError) as err:
                raise ResultsError(f"attribute {name!r} cannot be stored as JSON: {err}") from None
            json_names.add(name)
        elif isinstance(value, (str, bool, int, float, np.bool_, np.integer, np.floating)):
            json_names.discard(name)
        else:
            raise ResultsError(
                f"attribute {name!r} has type {type(value).__name__}; use str, int, float, bool, dict or list"
            )
        self._file.attrs[name] = value
        self._file.attrs[JSON_ATTRS] = json.dumps(sorted(json_names))

    def _check_open(self) -> None:
        if not self._file:
            raise ResultsError("the result file was already closed; create a new Recorder")

    def set_attr(self, name: str, value) -> None:
        """Set a root attribute (e.g. the final status) and flush it."""
        self._check_open()
        self._put_attr(name, value)
        self._file.flush()

    def write_array(self, name: str, array: np.ndarray) -> None:
        """Store a fixed dataset (e.g. the partition) once and flush it."""
        self._check_open()
        if name in self._file:
            raise ResultsError(f"{name!r} already exists in {self._file.filename}; each array is written once")
        try:
            self._file.create_dataset(name, data=np.asarray(array))
        except (TypeError, ValueError) as err:
            raise ResultsError(f"cannot store array {name!r}: {err}") from None
        self._file.flush()

    def append_round(self, round: int, values: dict) -> None:
        """Write row `round` of every key, flush, then commit it via `committed_rounds`."""
        self._check_open()
        if round != self._rounds:
            raise ResultsError(f"rounds must be appended in order 0, 1, 2, ...: expected {self._rounds}, got {round}")
        rows = {key: _as_round_value(key, value) for key, value in values.items()}
        for key, row in rows.items():  # check everything before writing anything
            known = self._series.get(key)
            if known is not None and (known.shape[1:] != row.shape or known.dtype != row.dtype):
                raise ResultsError(
                    f"round value {key!r} changed from shape {known.shape[1:]} {known.dtype} "
                    f"to {row.shape} {row.dtype}; a key keeps its shape and dtype for the whole run"
                )
            if known is None and key in self._file:
                raise ResultsError(f"round value {key!r} clashes with an existing entry of the result file")
        for dataset in self._series.values():
            dataset.resize(round + 1, axis=0)  # rows a key misses read as its fill value
        for key, row in rows.items():
            if key not in self._series:
                self._series[key] = self._create_series(key, row, round + 1)
            self._series[key][round] = row
        self._file.flush()                      # the rows reach the file before they are committed
        self._file.attrs.modify("committed_rounds", np.int64(round + 1))
        self._file.flush()
        self._rounds = round + 1

    def _create_series(self, key: str, row: np.ndarray, rows: int) -> h5py.Dataset:
        chunk_rows = int(np.clip(CHUNK_BYTES // max(row.nbytes, 1), 1, MAX_CHUNK_ROWS))
        try:
            dataset = self._file.create_dataset(
                key,
                shape=(rows, *row.shape),
                maxshape=(None, *row.shape),
                chunks=(chunk_rows, *row.shape),
                dtype=row.dtype,
                fillvalue=np.nan if row.dtype.kind == "f" else 0,  # backfills rounds before the key existed
            )
        except (TypeError, ValueError) as err:
            raise ResultsError(f"cannot create round value {key!r}: {err}") from None
        dataset.attrs["axis0"] = ROUND_AXIS
        return dataset

    def close(self) -> None:
        """Close the file; calling it again does nothing."""
        if self._file:
            self._file.close()

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


COMPRESS_FROM = 4096      # bytes; on the studies' files this made them 3.2x smaller than compressing every array


def compact(path) -> bool:
    """Rewrite a completed result file with every array at its exact length, contiguous, and
    gzip-compressed from COMPRESS_FROM bytes (a short run's series no longer fill whole append chunks;
    a small array is smaller uncompressed than its chunk index), for committing a study's results. The
    same attributes, arrays and reader; a running or interrupted run's file is left alone, as it may be
    resumed. Returns whether the file was rewritten (not when it is compact already)."""
    path = Path(path)
    with h5py.File(path, "r", locking=False) as source:
        appendable = [d for d in _datasets(source) if d.chunks and not d.compression]
        if source.attrs.get("status") != "completed" or not appendable:
            return False
        staged = path.with_name(path.name + ".compact")
        with h5py.File(staged, "w", locking=False) as target:
            for name, value in source.attrs.items():
                target.attrs[name] = value
            rounds = int(source.attrs["committed_rounds"])
            for dataset in _datasets(source):
                data = dataset[:rounds] if dataset.attrs.get("axis0") == ROUND_AXIS else dataset[()]
                packed = {"compression": "gzip", "shuffle": True} if data.nbytes >= COMPRESS_FROM else {}
                copy = target.create_dataset(dataset.name, data=data, **packed)
                for name, value in dataset.attrs.items():
                    copy.attrs[name] = value
    staged.replace(path)
    return True


def _datasets(file: h5py.File) -> list[h5py.Dataset]:
    found = []
    file.visititems(lambda name, item: found.append(item) if isinstance(item, h5py.Dataset) else None)
    return found
