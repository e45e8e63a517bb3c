"""Shared test helpers: tiny real-data job files, a data cache of the session's own, and hpcfl's log."""
import logging
import os

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(autouse=True, scope="session")
def _data_cache(tmp_path_factory):
    """Tests never write the user's data cache (hpcfl.data.cache); subprocesses inherit the folder."""
    os.environ["HPCFL_CACHE"] = str(tmp_path_factory.mktemp("data-cache"))


@pytest.fixture
def hpcfl_log(caplog):
    """caplog holding what hpcfl's loggers say at INFO and above, whether or not a run in this process
    configured the "hpcfl" logger (hpcfl.logs.configure stops it propagating to the root, where caplog
    listens)."""
    logger = logging.getLogger("hpcfl")
    level, propagate = logger.level, logger.propagate
    logger.addHandler(caplog.handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    yield caplog
    logger.removeHandler(caplog.handler)
    logger.setLevel(level)
    logger.propagate = propagate

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
