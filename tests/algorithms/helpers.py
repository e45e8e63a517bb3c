"""Tiny models and set-ups for hand-computed algorithm tests (the stand-in trainer: hpcfl.testing)."""
import numpy as np
import torch
from torch import nn

from hpcfl.algorithms import ALGORITHMS, algorithm_params
from hpcfl.algorithms.base import Client, Setup
from hpcfl.jobs import job_from_dict


class Scalar(nn.Module):
    """One trained scalar w (features = x, classifier = w * x): update rules read off directly."""

    def __init__(self, value=1.0):
        super().__init__()
        self.w = nn.Parameter(torch.tensor(value))
        self.classifier = nn.Identity()

    def features(self, x):
        return self.w * x

    def forward(self, x):
        return self.features(x)


def make(name, net, params=None, num_clients=4, classes=2, **sections):
    """The algorithm `name` for the model `net` in a job with `sections` (e.g. train={"lr": 0.1})."""
    job = job_from_dict({"algorithm": {"name": name, "params": params or {}},
                         "data": {"num_clients": num_clients, "local_test_ratio": 0.3},
                         "train": {"clients_per_round": 1}, **sections})
    counts = np.ones((num_clients, classes), dtype=np.int64)
    return ALGORITHMS[name](algorithm_params(name, params or {}), Setup.of(job, net, counts, test_size=2))


def client(cid=0, samples=1):
    return Client(cid, torch.zeros(samples, 1), torch.zeros(samples, dtype=torch.long), np.array([samples, 0]))


def sums(layout, *contributions):
    """The reduced uplink of `(tensors, weight)` contributions, as the runtime would build it."""
    total = torch.zeros(layout.numel, dtype=torch.float64)
    for tensors, weight in contributions:
        layout.add_into(total, tensors, weight)
    return layout.unpack(total)
