"""Where clients train and which device a rank uses.

Fixed placement: clients are assigned to workers once, deterministically, so their state never
moves: equal client counts per worker (+-1), and within that, data sizes balanced greedily (largest
client first to the least-loaded worker). Balanced over all clients, a worker's share of one
round's random cohort still varies, and the others wait for the busiest. Clients that keep no state
can move, so for them every round's cohort is dealt afresh (`deal_cohort`, longest processing time
first: within Graham's 4/3 of the best split). Devices: the node-local rank picks the GPU
(`local_rank % n_gpus`, honouring CUDA_VISIBLE_DEVICES through torch); CPU ranks get a fixed number
of intra-op threads, because oversubscribed torch threads run small models many times slower (10x
measured on 2 vCPUs).
"""
import logging
from dataclasses import dataclass

import numpy as np
import torch

from hpcfl.config import JobConfig
from hpcfl.errors import ConfigError

LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class Placement:
    """Where a job's work runs, decided once at set-up, the same on every rank but for `device`."""
    device: torch.device            # this rank's
    memory_format: torch.memory_format      # how its convolution weights lie (run.memory_format)
    workers: list[int]              # the ranks that train clients
    # client -> the worker that holds its state (and, when fixed, trains it)
    homes: dict[int, int]
    # clients dealt each round: each one's batches per epoch; None: fixed
    cost: np.ndarray | None
    idle: list[int]                 # workers that never train a client

    def hosts(self, cohort: list[int]) -> dict[int, int]:
        """Sampled client -> the rank that trains it this round."""
        return ({c: self.homes[c] for c in cohort} if self.cost is None
                else deal_cohort(cohort, self.cost, self.workers))


def place(config: JobConfig, size: int, local_rank: int, sizes: np.ndarray,
          moving: bool) -> Placement:
    """The placement of a job on `size` ranks, for the rank that is `local_rank` on its node, given
    each client's training samples; `moving`: each round's cohort is dealt afresh."""
    device = pick_device(config.run.device, local_rank)
    workers = worker_ranks(size)
    homes = assign_clients(sizes, workers)
    cost = client_cost(sizes, config.train.batch_size) if moving else None
    return Placement(device, memory_format(config.run.memory_format, device), workers, homes, cost,
                     idle_workers(workers, homes, config.train.clients_per_round, moving))


def worker_ranks(size: int) -> list[int]:
    """The ranks that train clients: every rank but the server's, or the only one."""
    return [0] if size == 1 else list(range(1, size))


def assign_clients(sizes: np.ndarray, workers: list[int]) -> dict[int, int]:
    """client id -> worker rank; balanced counts first, then balanced data size."""
    # Every worker ends with `base` or `base + 1` clients, and exactly `extra` of them with
    # base + 1: a worker may only grow past `base` while fewer than `extra` workers have done so.
    base, extra = divmod(len(sizes), len(workers))
    load = {w: 0 for w in workers}
    count = {w: 0 for w in workers}
    out = {}
    for client in sorted(range(len(sizes)), key=lambda c: (-int(sizes[c]), c)):
        extras_used = sum(count[w] > base for w in workers)
        open_ = [w for w in workers
                 if count[w] < base or (count[w] == base and extras_used < extra)]
        worker = min(open_, key=lambda w: (load[w], w))
        out[client] = worker
        load[worker] += int(sizes[client])
        count[worker] += 1
    return out


def idle_workers(workers: list[int], homes: dict[int, int], per_round: int,
                 moving: bool) -> list[int]:
    """The workers that will never train a client: with fixed placement those that are home to none;
    with clients dealt each round, those past the cohort's size (`deal_cohort` fills the lowest
    ranks first). A launch with more ranks than that wastes them, so the server warns."""
    busy = set(workers[:per_round]) if moving else set(homes.values())
    return [w for w in workers if w not in busy]


def client_cost(sizes: np.ndarray, batch_size: int) -> np.ndarray:
    """What dealing balances: each client's batches per local epoch."""
    return np.ceil(np.asarray(sizes) / batch_size)


def deal_cohort(cohort, cost: np.ndarray, workers: list[int]) -> dict[int, int]:
    """sampled client -> worker rank for one round: the costliest client first, each to the worker
    with the least cost so far (ties: lowest rank); the same on every rank, since it reads only its
    arguments."""
    load = {w: 0.0 for w in workers}
    out = {}
    for client in sorted(cohort, key=lambda c: (-float(cost[c]), c)):
        worker = min(workers, key=lambda w: (load[w], w))
        out[client] = worker
        load[worker] += float(cost[client])
    return out


def memory_format(setting: str, device: torch.device) -> torch.memory_format:
    """run.memory_format for `device`. 'auto' is channels_last on the CPU only, where oneDNN's
    convolutions and pooling run faster on it (bench/memory_format.py); on a GPU it is
    unmeasured."""
    if setting == "channels_last" or (setting == "auto" and torch.device(device).type == "cpu"):
        return torch.channels_last
    return torch.contiguous_format


def pick_device(setting: str, local_rank: int) -> torch.device:
    """`cuda` fails fast without a GPU; `auto` falls back to the CPU with a warning."""
    n_gpus = torch.cuda.device_count()
    if setting == "cpu" or (setting == "auto" and n_gpus == 0):
        if setting == "auto":
            LOG.warning("run.device = 'auto' found no GPU: running on the CPU")
        return torch.device("cpu")
    if n_gpus == 0:
        raise ConfigError("run.device = 'cuda' but torch sees no GPU on this node; "
                          "use run.device = 'auto' or 'cpu', or check CUDA_VISIBLE_DEVICES")
    return torch.device("cuda", local_rank % n_gpus)
