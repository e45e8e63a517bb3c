"""Reads a result file back with plain h5py, trusting only committed rounds.

Safe to call while the run is still writing or after it crashed: rows at or beyond the
root attribute `committed_rounds` may be half written and are left out.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np

from hpcfl.errors import ResultsError
from hpcfl.metrics.recorder import JSON_ATTRS, ROUND_AXIS, SCHEMA_VERSION


@dataclass(frozen=True)
class RunData:
    """One run: root attributes, number of committed rounds, and every array by its HDF5 path."""

    attrs: dict
    rounds: int
    arrays: dict[str, np.ndarray] = field(default_factory=dict)


def read_run(path, keys=None) -> RunData:
    """Load a result file (only the arrays named in `keys`, if given); any file that is not a valid
    hpcfl result raises ResultsError."""
    path = Path(path)
    try:
        with h5py.File(path, "r", locking=False) as file:
            return _read(path, file, None if keys is None else set(keys))
    except FileNotFoundError:
        raise ResultsError(f"result file {path} does not exist") from None
    except (OSError, KeyError, ValueError, RuntimeError) as err:      # h5py: RuntimeError for a damaged header
        raise ResultsError(
            f"result file {path} cannot be read as HDF5 ({err}); it is not an hpcfl result, is truncated, "
            "or was read during a flush (then read it again)"
        ) from None


def _read(path: Path, file: h5py.File, keys: set | None) -> RunData:
    if "schema_version" not in file.attrs:
        raise ResultsError(f"{path} has no schema_version attribute; it was not written by hpcfl")
    version = int(file.attrs["schema_version"])
    if version > SCHEMA_VERSION:
        raise ResultsError(
            f"{path} has schema_version {version} but this hpcfl reads up to {SCHEMA_VERSION}; "
            "install a newer hpcfl to read it"
        )
    rounds = int(file.attrs["committed_rounds"])
    json_names = set(json.loads(file.attrs.get(JSON_ATTRS, "[]")))
    attrs = {}
    for name, value in file.attrs.items():
        if name == JSON_ATTRS:
            continue
        attrs[name] = json.loads(value) if name in json_names else _plain(value)
    arrays = {}

    def collect(name: str, item) -> None:
        if not isinstance(item, h5py.Dataset):
            return
        if item.attrs.get("axis0") != ROUND_AXIS:
            arrays[name] = item[()]
        elif len(item) < rounds:                        # a file whose last flush was cut short
            raise ResultsError(f"{path}: {name} holds {len(item)} rounds but the file says {rounds} are "
                               "committed: it is damaged; resume the run from its checkpoint, or run it again")
        else:
            arrays[name] = item[:rounds]

    if keys is None:
        file.visititems(collect)
    else:
        for name in keys:
            if name in file:
                collect(name, file[name])
    return RunData(attrs=attrs, rounds=rounds, arrays=arrays)


def _plain(value):
    """numpy scalars to Python scalars, so attrs compare and serialise like the dict written."""
    return value.item() if isinstance(value, np.generic) else value

