"""Checkpoints: what a run needs to continue exactly where it stopped, written so that a kill at any
moment leaves either the previous checkpoint or the new one, never a half of one that gets used.

Next to the result file `<run>.h5` sits `<run>.ckpt/round-<R>/` for a checkpoint taken after round
R - 1 (so R rounds are done and the run resumes at round R):
- `server.pt` (rank 0): the server state, by owner (hpcfl.algorithms.base.State);
- `shared.pt` (rank 0): the algorithm's cross-round state that every rank holds (FedMA's global widths);
- `results.h5.copy` (rank 0): the result file as it stood, R rounds committed: what a resume puts back
  where a node crash left the result file unreadable, or behind the checkpoint (its last writes had
  not reached the disk; hpcfl.runtime.resume);
- `clients-rank<r>.pt` (every rank hosting clients): its clients' kept states (Client.kept) by client id, and the
  rank's torch generator state;
- `MANIFEST.json`, written last by rank 0 once every rank has reported its files and their SHA-256,
  and the layout of the states (FORMAT).
Every file is written to a temporary name, flushed to disk and renamed; the directory is written
as `round-<R>.partial` and renamed when the manifest is in. A directory whose files do not match the
manifest is corrupt: the previous checkpoint is used, with a warning. The newest `keep` are kept.

Files hold tensors and plain containers only, saved with torch.save and loaded with
`weights_only=True` (no arbitrary pickles). The cohort schedule and every client's batches come
from generators keyed by (seed, round, client), so the round number is their whole position; the
result file's position is its `committed_rounds`, cut back to R on resume. Each rank writes its own
files, so the results folder must be one all ranks see (a cluster's shared filesystem).
"""
import hashlib
import io
import json
import os
import pickle
import re
import shutil
from pathlib import Path

import torch

from hpcfl.errors import ResultsError

MANIFEST = "MANIFEST.json"
RESULTS = "results.h5.copy"        # not *.h5: the analysis and `hpcfl status` would count it as a run
FORMAT = 2          # 2: states by owner ({owner: {name: tensor}}); 1 (no "format"): under string prefixes


def checkpoint_root(result_path: Path) -> Path:
    return Path(result_path).with_suffix(".ckpt")


def _write(path: Path, obj) -> str:
    """torch.save `obj` to `path` atomically; returns the SHA-256 of what was written."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return _write_bytes(path, buffer.getvalue())


def _write_bytes(path: Path, data: bytes) -> str:
    """`data` to `path`: written to a temporary name, flushed to disk, renamed; returns its SHA-256."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return hashlib.sha256(data).hexdigest()


def save(root: Path, rounds_done: int, transport, server_state: dict | None, shared: dict,
         clients: dict[int, dict], keep: int, result_file: Path | None = None) -> None:
    """Collective: every rank writes its part, rank 0 (with a copy of the flushed `result_file`) seals
    the checkpoint and prunes old ones."""
    partial = root / f"round-{rounds_done:06d}.partial"
    partial.mkdir(parents=True, exist_ok=True)
    mine = {}
    if transport.is_server:
        mine["server.pt"] = _write(partial / "server.pt", {owner: {k: v.detach().cpu() for k, v in tensors.items()}
                                                           for owner, tensors in server_state.items()})
        mine["shared.pt"] = _write(partial / "shared.pt", shared)
        if result_file is not None:
            mine[RESULTS] = _write_bytes(partial / RESULTS, Path(result_file).read_bytes())
    if transport.size == 1 or not transport.is_server:        # the ranks hosting clients
        name = f"clients-rank{transport.rank}.pt"
        mine[name] = _write(partial / name, {"clients": {int(c): s for c, s in clients.items()},
                                             "rng": torch.get_rng_state()})
    files = {name: digest for part in transport.share(mine) for name, digest in part.items()}
    if not transport.is_server:
        return
    _write_bytes(partial / MANIFEST, json.dumps({"rounds_done": rounds_done, "world_size": transport.size,
                                                 "format": FORMAT, "files": files}).encode())
    final = root / f"round-{rounds_done:06d}"
    if final.exists():                    # an earlier attempt at the same round (a rerun): replace it
        shutil.rmtree(final)
    os.replace(partial, final)
    _prune(root, rounds_done, keep)


def _sealed(root: Path) -> list[tuple[int, Path]]:
    """The checkpoint folders `round-<R>` under `root` as (R, folder), oldest first; anything else
    there (a `.partial` folder, a user's `round-000010.bak`) is not one."""
    found = ((re.fullmatch(r"round-(\d+)", d.name), d) for d in root.glob("round-*"))
    return sorted((int(name[1]), d) for name, d in found if name)


def _prune(root: Path, rounds_done: int, keep: int) -> None:
    """Keep the newest `keep` checkpoints up to `rounds_done`. One further on (a damaged one this run
    resumed before) and a `.partial` one (left by a rank killed while writing) are stale: removed too."""
    sealed = _sealed(root)
    kept = [d for rounds, d in sealed if rounds <= rounds_done]
    newer = [d for rounds, d in sealed if rounds > rounds_done]
    for old in kept[:-keep] + newer + list(root.glob("round-*.partial")):
        shutil.rmtree(old, ignore_errors=True)


def _valid(directory: Path) -> str | None:
    """None if the checkpoint's files are all there and match the manifest, else what is wrong."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
        for name, digest in manifest["files"].items():
            if hashlib.sha256((directory / name).read_bytes()).hexdigest() != digest:
                return f"{name} does not match its checksum"
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:    # any damage
        return f"unreadable ({err})"
    return None


def latest(root: Path, warn) -> tuple[int, Path] | None:
    """The newest intact checkpoint as (rounds done, folder); a damaged newer one is skipped with `warn`."""
    for rounds, directory in reversed(_sealed(root)):
        if not directory.is_dir():
            continue
        problem = _valid(directory)
        if problem is None:
            return rounds, directory
        warn(f"checkpoint {directory} is damaged ({problem}); using the one before it")
    return None


def load(path: Path, name: str):
    """A checkpoint file's tensors; anything but tensors and plain containers is refused, never run."""
    try:
        return torch.load(path / name, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as err:
        raise ResultsError(f"checkpoint file {path / name} holds more than tensors and is not loaded ({err}); "
                           "move the checkpoint folder away to start the run again") from None


def load_clients(directory: Path, files, hosted, rank: int | None = None) -> tuple[dict[int, dict],
                                                                                 dict[int, torch.Tensor]]:
    """The states of the clients `hosted` here and each writer's RNG state, from the clients' files of
    the manifest's `files` (a file it does not list, left by an earlier attempt, is never read): rank
    `rank`'s file first when given (the same topology places the same clients), the others while a
    hosted client is missing (run.placement changed)."""
    states, rngs = {}, {}
    names = sorted(name for name in files if name.startswith("clients-rank"))
    own = f"clients-rank{rank}.pt"
    if own in names:
        names = [own, *(name for name in names if name != own)]
    for name in names:
        if rngs and set(hosted) <= states.keys():
            break
        part = load(directory, name)
        rngs[int(name.removeprefix("clients-rank").removesuffix(".pt"))] = part["rng"]
        states.update({c: s for c, s in part["clients"].items() if c in hosted})
    return states, rngs
