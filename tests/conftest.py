"""Shared test helpers: tiny real-data job files, and a data cache of the session's own."""
import os

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(autouse=True, scope="session")
def _data_cache(tmp_path_factory):
    """Tests never write the user's data cache (hpcfl.data.cache); subprocesses inherit the folder."""
    os.environ["HPCFL_CACHE"] = str(tmp_path_factory.mktemp("data-cache"))

TINY_JOB = """
[run]
study = "test"
seed = {seed}
rounds = {rounds}

[data]
dataset = "digits"
num_clients = 6
partition = "dirichlet"
partition_params = {{ beta = 0.5 }}

[model]
name = "fmnist_cnn"

[train]
clients_per_round = 4
local_epochs = 1
batch_size = 16
lr = 0.1

[algorithm]
name = "{algorithm}"
"""


@pytest.fixture
def tiny_job(tmp_path):
    """Writes a small real-data job (sklearn digits) and returns its path."""
    def write(algorithm="fedavg", rounds=3, seed=0, extra=""):
        path = tmp_path / f"{algorithm}-{seed}.toml"
        path.write_text(TINY_JOB.format(algorithm=algorithm, rounds=rounds, seed=seed) + extra)
        return path
    return write
