"""Helpers for tests that run the launcher as a user would."""
import contextlib
import os
import subprocess
import sys
from pathlib import Path

MPIRUN = str(Path(sys.executable).with_name("mpirun"))


FAULT_LAUNCHER = [str(Path(__file__).with_name("fault_launch.py"))]


def launch(*args, ranks: int = 0, cwd=None, timeout: float = 240, launcher=("-m", "hpcfl.launch"), env=None):
    """Run the launcher (under `mpirun -np ranks` if ranks) with `env` added to the environment; a
    hang fails the test via the timeout."""
    cmd = [sys.executable, *launcher, *map(str, args)]
    if ranks:
        cmd = [MPIRUN, "-np", str(ranks), *cmd]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


TIMINGS = ("rank/", "round/time_s", "round/phase_s/", "round/eval_s", "round/match_s/", "round/imbalance_s")


def run_metrics(path) -> dict:
    """A result file's arrays but timings and where clients trained (client/rank): what neither the
    topology nor an interruption may change."""
    from hpcfl.metrics import read_run

    return {k: v for k, v in read_run(path).arrays.items() if not k.startswith(TIMINGS) and k != "client/rank"}


def assert_same_metrics(one: dict, other: dict, exact: bool = False) -> None:
    """Same keys and values: bit for bit (`exact`, a resumed run) or to float tolerance (other ranks)."""
    import numpy as np

    assert sorted(one) == sorted(other)
    for key in one:
        if exact:
            np.testing.assert_array_equal(one[key], other[key], err_msg=key)
        else:
            np.testing.assert_allclose(one[key], other[key], rtol=1e-5, atol=1e-6, equal_nan=True, err_msg=key)


# A short digits job that checkpoints every 2 rounds: the resume and SLURM tests interrupt it.
CHECKPOINTED_JOB = """
[run]
study = "{study}"
rounds = 6
checkpoint_every = 2
[data]
dataset = "digits"
num_clients = 6
partition = "dirichlet"
partition_params = {{ beta = 0.5 }}
local_test_ratio = 0.3
[model]
name = "fmnist_cnn"
[train]
clients_per_round = 4
batch_size = 16
lr = 0.05
momentum = 0.5
"""


@contextlib.contextmanager
def nan_inputs(client):
    """The client trains on NaN inputs inside the block (a CPU client's uint8 pixels included)."""
    import torch

    kept = client.x, client.normalization
    client.x, client.normalization = torch.full_like(client.inputs(), float("nan")), None
    try:
        yield
    finally:
        client.x, client.normalization = kept
