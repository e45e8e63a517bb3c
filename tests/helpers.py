"""Helpers for tests that run the launcher as a user would, and for data files in their real formats."""
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


def idx_bytes(array) -> bytes:
    """`array` (uint8) as an IDX file holds it: magic, dimension count, big-endian sizes, the bytes."""
    import numpy as np
    return b"\x00\x00\x08" + bytes([array.ndim]) + np.array(array.shape, dtype=">u4").tobytes() + array.tobytes()
