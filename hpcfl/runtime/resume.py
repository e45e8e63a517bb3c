"""Checkpoints in the round loop, and resuming from them (hpcfl.runtime.checkpoint has the files).

- `resume_point` (rank 0, first thing in set-up): a complete result file means there is nothing to
  do; an unfinished one of the same configuration resumes from its newest intact checkpoint;
- `restore` (every rank): its part of that checkpoint into the built job;
- `control` (every rank, after each round): whether to checkpoint and whether to stop, the same
  decision on every rank; a USR1/TERM/INT on any rank (STOP) stops them all after the same round;
- `write_checkpoint` (every rank): its part of a checkpoint.
"""
import json
import logging
import os
import shutil
import time
from pathlib import Path

import numpy as np
import torch

from hpcfl.config import NON_RESULT_KEYS, current_names, flatten
from hpcfl.errors import HpcflError, ResultsError
from hpcfl.jobs import Resolved
from hpcfl.metrics import read_run
from hpcfl.runtime.checkpoint import FORMAT, MANIFEST, RESULTS, checkpoint_root, latest, load, load_clients, save
from hpcfl.runtime.lock import claim

LOG = logging.getLogger(__name__)


class RunCompleted(HpcflError):
    """The run's result file is already complete: nothing to do (e.g. a re-submitted sweep)."""


class Flag:
    """A stop request: set by the launcher's USR1/TERM/INT handler (checkpoint after this round and
    stop), read by `control`. A plain attribute, not a threading.Event, whose lock a second signal
    arriving inside the first one's handler would wait on forever."""

    def __init__(self):
        self._set = False

    def set(self) -> None:
        self._set = True

    def clear(self) -> None:
        self._set = False

    def is_set(self) -> bool:
        return self._set


STOP = Flag()


def resume_point(job: Resolved, ranks: int | None = None) -> tuple[bool, int, Path | None]:
    """Rank 0, before anything is built: (result file exists, rounds done, checkpoint folder). A
    result path that a symbolic link leads out of the results root is refused; the path is claimed
    for this run (hpcfl.runtime.lock: one writer per result file); a complete run raises
    RunCompleted; an unfinished one with the same configuration, and as many `ranks` as wrote it,
    resumes from its newest intact checkpoint (or from round 0 without one)."""
    config, path = job.config, job.config.result_path
    root, target = Path(config.run.results_root).resolve(), path.resolve()
    if not target.is_relative_to(root):
        raise ResultsError(f"result file {path} resolves to {target}, outside run.results_root {root} (a symbolic "
                           "link?); results stay under the results root: remove the link or choose another run.study")
    claim(path)
    checkpoints = checkpoint_root(path)
    if not path.exists():
        if checkpoints.exists():            # a new run's checkpoints would mix with them
            raise ResultsError(f"checkpoint folder {checkpoints} is left from an earlier run whose result file "
                               f"{path.name} is gone; move the folder away or delete it to start this run")
        return False, 0, None
    found = latest(checkpoints, LOG.warning)
    try:
        run = read_run(path)
    except ResultsError as err:             # names what is wrong with it; resuming adds the way out
        run = _put_back(path, found, str(err), f"; to start the run again, move it and {checkpoints.name} away")
    existing = run.attrs
    differ = mismatch(existing.get("config", {}), config)
    if differ:
        also = f" and its checkpoints ({checkpoints.name})" if checkpoints.exists() else ""
        raise ResultsError(f"result file {path} exists from a run with another configuration; choose another "
                           f"run.name, or delete or move the old file{also} ({differ})")
    if existing.get("status") == "completed":
        raise RunCompleted(f"{path} is already complete; nothing to do (delete it to run again)")
    recorded = run.arrays.get("rank/compute_s")
    if ranks is not None and recorded is not None and recorded.ndim == 2 and recorded.shape[1] != ranks:
        raise ResultsError(f"{path} was written by {recorded.shape[1]} rank(s) and this run has {ranks}: its per-rank "
                           f"figures (rank/...) keep one column per rank, so resume it on {recorded.shape[1]} "
                           "rank(s)")
    if found and found[0] > run.rounds:     # refused here, on every rank, not as the file is reopened
        _put_back(path, found, f"{path} holds {run.rounds} rounds but its checkpoint is after round {found[0]}",
                  "; the result file is older than the checkpoint: move one of them away")
    return True, (found[0] if found else 0), (found[1] if found else None)


def _put_back(path: Path, found: tuple[int, Path] | None, problem: str, way_out: str):
    """The result file as the checkpoint `found` copied it (checkpoint.RESULTS), put in `path`'s place
    where `path` is unreadable or behind the checkpoint (`problem`): the mark of a node that crashed
    before the file's last writes reached the disk. The file is kept beside it (`<name>.damaged`); a
    checkpoint without a copy (written by an earlier hpcfl) leaves the ResultsError."""
    copy = found[1] / RESULTS if found else None
    if copy is None or not copy.is_file():
        raise ResultsError(problem + way_out)
    aside, n = path.with_name(path.name + ".damaged"), 1
    while aside.exists():                   # an earlier crash's is kept too
        n += 1
        aside = path.with_name(f"{path.name}.damaged-{n}")
    os.replace(path, aside)
    shutil.copyfile(copy, path)
    LOG.warning(f"{problem}: put back the result file of checkpoint {found[1].name} ({path.name} is kept as "
                f"{aside.name})")
    return read_run(path)


def same_split(path: Path, counts: np.ndarray) -> None:
    """Refuse to resume a file whose clients held other samples than this run's split gives them (an
    hpcfl that splits differently, or other data files): its rounds and the new ones would not be one run."""
    recorded = read_run(path, keys=["partition"]).arrays.get("partition")
    if recorded is not None and not np.array_equal(recorded, counts):
        raise ResultsError(f"{path} was written with another split of the data (its clients' class counts, "
                           "`partition`, differ from this run's: an hpcfl that splits differently, or changed data "
                           "files); resume it with the hpcfl that wrote it (its provenance names the commit), or move "
                           f"it and {checkpoint_root(path).name} away to start again")


def mismatch(recorded: dict, config) -> str:
    """How the configuration a result file records differs from the job `config` where a resumed run may
    not differ (the keys, both values); "" when the run may go on (or is the same)."""
    return _differences(_resumable(current_names(recorded, warn=False)), _resumable(json.loads(config.to_json())))


def _differences(old: dict, new: dict, shown: int = 3) -> str:
    """The keys whose values differ, as `key: old in the file, new here` (the first `shown`, then how many
    more)."""
    old, new = flatten(old), flatten(new)
    keys = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
    text = "; ".join(f"{k}: {json.dumps(old.get(k))} in the file, {json.dumps(new.get(k))} here" for k in keys[:shown])
    return text + (f"; and {len(keys) - shown} more" if len(keys) > shown else "")


def _resumable(config: dict) -> dict:
    """A configuration without the keys that may change between a run and its resumption."""
    free = {*NON_RESULT_KEYS, "train.on_nonfinite"}       # what to do about a NaN may change too
    return {section: {k: v for k, v in values.items() if f"{section}.{k}" not in free} if isinstance(values, dict)
            else values for section, values in config.items()}


def restore(job, directory: Path, rounds: int) -> None:
    """Every rank takes its part of the checkpoint in `directory` (taken after `rounds` rounds)."""
    manifest = json.loads((directory / MANIFEST).read_text())
    written = manifest.get("format", 1)        # 1: no "format", states under string prefixes
    if written != FORMAT:
        raise ResultsError(f"checkpoint {directory} keeps its states in format {written}, as "
                           f"earlier hpcfl did (0.1, and 0.2.0 before states had owners); this hpcfl reads format "
                           f"{FORMAT}: resume it with the hpcfl that wrote it (the result file's provenance names "
                           "its commit), or move the checkpoint folder away to start the run again")
    job.algorithm.load_carried_state(load(directory, "shared.pt"))
    if job.server:
        job.server.state = {owner: {k: v.to(job.server.device) for k, v in tensors.items()}
                            for owner, tensors in load(directory, "server.pt").items()}
    if job.worker:
        same = manifest["world_size"] == job.transport.size
        states, rngs = load_clients(directory, manifest["files"], set(job.worker.clients),
                                    job.transport.rank if same else None)
        missing = sorted(set(job.worker.clients) - set(states))
        if missing:
            raise ResultsError(f"checkpoint {directory} has no state for clients {missing}: it belongs to another run")
        for cid, kept in states.items():
            job.worker.clients[cid].keep(kept)
        if same:
            torch.set_rng_state(rngs[job.transport.rank])
    job.start_round = rounds
    LOG.info(f"resuming after round {rounds} from {directory}")


def control(job, round: int, fault: bool = False) -> tuple[bool, bool, bool]:
    """Collective, after each round: (checkpoint now, stop now, stop for a training fault), the same
    decision on every rank. A signal on any rank stops every rank after the same round; checkpoints
    also come every run.checkpoint_every rounds (not after the last); `fault` (the server's) stops
    every rank without a checkpoint."""
    transport, cfg = job.transport, job.config.run
    signalled = transport.reduce_sum("control", np.array([float(STOP.is_set())]))
    decision = None
    if transport.is_server:
        done = round + 1
        stop = bool(signalled[0] > 0) and done < cfg.rounds
        periodic = cfg.checkpoint_every > 0 and done % cfg.checkpoint_every == 0 and done < cfg.rounds
        decision = np.array([(stop or periodic) and not fault, stop, fault], dtype=np.int64)
    decision = transport.broadcast("control", decision)
    return bool(decision[0]), bool(decision[1]), bool(decision[2])


def write_checkpoint(job, rounds: int) -> None:
    start = time.perf_counter()
    clients = {cid: client.kept() for cid, client in job.worker.clients.items()} if job.worker else {}
    save(checkpoint_root(job.config.result_path), rounds, job.transport, job.server.state if job.server else None,
         job.algorithm.carried_state(), clients, job.config.run.checkpoint_keep,
         job.config.result_path if job.recorder else None)
    LOG.info(f"checkpoint after round {rounds} written in {time.perf_counter() - start:.2f} s")
