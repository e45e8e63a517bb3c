"""The most important property: one process and N ranks give the same metrics, for every algorithm,
with per-client state, partial participation and personalised evaluation. Runs under a real launcher
(any world size; rank 0 also runs the one-process version and compares):

    mpirun -np 3 python -m pytest --with-mpi -m mpi tests/runtime/test_equivalence.py

The same job on `run.device = 'cuda'` against the CPU, every algorithm, one process each, runs where
torch sees a GPU (skipped on CI): `python -m pytest tests/runtime/test_equivalence.py -m "not mpi"`.
"""
import numpy as np
import pytest
import torch

from hpcfl.algorithms import ALGORITHMS
from hpcfl.config import apply_overrides
from hpcfl.jobs import job_from_dict, resolve
from hpcfl.metrics import read_run
from hpcfl.runtime.build import setup
from hpcfl.runtime.loop import run
from hpcfl.testing import assert_same_metrics, run_metrics
from hpcfl.transport import LocalTransport

PARAMS = {"fedfm": {"start_round": 1, "weight": 1.0},                  # feature matching within 3 rounds
          "fedfm_lite": {"start_round": 1, "weight": 1.0, "model_every": 2},
          "fedprox": {"init": "independent"},                 # FedMA's baseline (local_only: its default)
          "local_only": {"init": "shared"},                   # the start fedclassavg and fedproto do not take
          "fedclassavg": {"warmup_epochs": 1, "supcon_weight": 0.5}, "fedrs": {"bias": "drop"}}
HETEROGENEOUS = {"local_only", "fedclassavg", "fedproto"}      # clients of two architectures side by side


def _job(algorithm: str, root: str, name: str, *overrides: str):
    everyone = algorithm in ("ensemble", "fedma", "fedfm_lite")
    raw = {
        "run": {"study": "eq", "name": name, "rounds": 3, "results_root": root},
        "data": {"dataset": "digits", "num_clients": 6, "partition": "dirichlet", "partition_params": {"beta": 0.5},
                 "seed": 3,                                                  # a split apart from run.seed
                 "validation_fraction": 0.2, "local_test_ratio": 0.3},
        "train": {"clients_per_round": 6 if everyone else 4, "batch_size": 16, "lr": 0.05, "momentum": 0.5,
                  "local_epochs": 2 if algorithm == "fedcme" else 1},      # FedCME swaps after epoch 1
        "model": {"architectures": ["fmnist_cnn_narrow", "fmnist_cnn"] if algorithm in HETEROGENEOUS else [],
                  "params": {"preactivation": algorithm == "fedclassavg"}},       # the authors' features
        "algorithm": {"name": algorithm, "params": PARAMS.get(algorithm, {})},
        "eval": {"every": 2, "forgetting": algorithm == "fedka"}}
    return job_from_dict(apply_overrides(raw, list(overrides)))


def _execute(config, transport):
    job = setup(resolve(config), transport, None)
    run(job)
    if job.recorder:
        job.recorder.close()
    transport.close()
    return job


def _compare_with_one_process(algorithm: str, tmp_path, *overrides: str) -> list[str]:
    """Run the job on all ranks, then (rank 0) in one process and compare; returns on rank 0 the dtypes
    the clients of all ranks held their inputs in."""
    from mpi4py import MPI

    from hpcfl.transport.mpi import MpiTransport

    comm = MPI.COMM_WORLD
    root = comm.bcast(str(tmp_path), root=0)
    job = _execute(_job(algorithm, root, "ranks", *overrides), MpiTransport({}, comm))
    hosted = job.worker.clients.values() if job.worker else []
    dtypes = comm.gather([str(c.x.dtype) for c in hosted], root=0)
    try:                                   # the other ranks wait at the barrier even if rank 0's checks fail
        if comm.Get_rank() == 0:
            _execute(_job(algorithm, root, "one", *overrides), LocalTransport({}))
            one, ranks = run_metrics(tmp_path / "eq" / "one.h5"), run_metrics(tmp_path / "eq" / "ranks.h5")
            assert "client/local_test_acc" in one and "client/val_acc" in one
            assert_same_metrics(one, ranks)
            state = read_run(tmp_path / "eq" / "ranks.h5").arrays["rank/client_state_bytes"]
            assert (state[:, 0] == 0).all() or comm.Get_size() == 1           # the server hosts no client
            return sorted({dtype for rank in dtypes for dtype in rank})
    finally:
        comm.Barrier()


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_one_process_and_all_ranks_give_the_same_metrics(algorithm, tmp_path):
    _compare_with_one_process(algorithm, tmp_path)


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", sorted(n for n, cls in ALGORITHMS.items() if cls.traits.batched))
def test_clients_trained_together_give_the_one_process_metrics_on_all_ranks(algorithm, tmp_path):
    """train.batched_clients: each worker trains its share of the cohort as groups, whose members and
    sizes depend on the number of ranks; the metrics must not."""
    _compare_with_one_process(algorithm, tmp_path, "train.batched_clients=3")


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ["fedavg", "scaffold", "fedcme", "moon"])
def test_bf16_training_gives_the_one_process_metrics_on_all_ranks(algorithm, tmp_path):
    """train.precision = "bf16": each client's update is computed alike on every rank (its forward pass
    under autocast), so the metrics must not depend on the ranks."""
    _compare_with_one_process(algorithm, tmp_path, "train.precision='bf16'")


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ["fedavg", "fedcme", "fedclassavg", "fedfm", "fedfm_lite", "fedka", "fedproto"])
def test_clients_holding_uint8_pixels_give_the_same_metrics_on_all_ranks(algorithm, tmp_path):
    """An image set's CPU clients hold uint8 pixels and normalise each batch (Client.inputs); the
    trainer and every algorithm that reads inputs itself (FedCME's evaluation, FedClassAvg's two views,
    the anchors of FedFM, FedFM-Lite and FedProto, FedKA's knowledge anchor) must give the one-process
    metrics on all ranks."""
    from mpi4py import MPI

    dtypes = _compare_with_one_process(algorithm, tmp_path, "data.dataset='fashion_mnist'", "data.train_samples=360")
    assert dtypes == ["torch.uint8"] if MPI.COMM_WORLD.Get_rank() == 0 else dtypes is None


@pytest.mark.mpi
@pytest.mark.parametrize("placement", ["per_round", "fixed"])
def test_clients_train_where_the_placement_puts_them(placement, tmp_path):
    """Per round: each round's cohort dealt by size (deal_cohort over batches per epoch); fixed: a client
    trains on one rank all run. Either way the metrics are the one-process run's."""
    import numpy as np
    from mpi4py import MPI

    from hpcfl.runtime.placement import deal_cohort
    from hpcfl.transport import LocalTransport
    from hpcfl.transport.mpi import MpiTransport

    comm = MPI.COMM_WORLD
    root = comm.bcast(str(tmp_path), root=0)
    sets = [f"run.placement='{placement}'", "data.num_clients=9", "train.clients_per_round=5"]
    _execute(_job("fedprox", root, "ranks", *sets), MpiTransport({}, comm))
    try:
        if comm.Get_rank() == 0:
            _execute(_job("fedprox", root, "one", *sets), LocalTransport({}))
            assert_same_metrics(run_metrics(tmp_path / "eq" / "one.h5"), run_metrics(tmp_path / "eq" / "ranks.h5"))
            arrays = read_run(tmp_path / "eq" / "ranks.h5").arrays
            trained_on = arrays["client/rank"]
            workers = list(range(1, comm.size)) or [0]
            cost = np.ceil(arrays["partition"].sum(1) / 16)
            for row in trained_on:
                cohort = np.flatnonzero(np.isfinite(row)).tolist()
                assert len(cohort) == 5 and set(row[cohort]) <= set(workers)
                if placement == "per_round":
                    assert {c: int(row[c]) for c in cohort} == deal_cohort(cohort, cost, workers)
            if placement == "fixed":
                for client in trained_on.T:
                    assert len(set(client[np.isfinite(client)])) <= 1          # never moves
    finally:
        comm.Barrier()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")
@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_every_algorithm_trains_on_the_gpu_as_on_the_cpu(algorithm, tmp_path):
    for device in ("cpu", "cuda"):
        _execute(_job(algorithm, str(tmp_path), device, f"run.device='{device}'"), LocalTransport({}))
    cpu, gpu = run_metrics(tmp_path / "eq" / "cpu.h5"), run_metrics(tmp_path / "eq" / "cuda.h5")
    assert set(gpu) == set(cpu) and all(gpu[k].shape == cpu[k].shape for k in cpu)        # every round recorded
    evaluated = np.isfinite(cpu["round/val_acc"])
    assert evaluated.any() and (np.isfinite(gpu["round/val_acc"]) == evaluated).all()
    first_cpu, first_gpu = cpu["round/train_loss"][0], gpu["round/train_loss"][0]
    assert abs(first_gpu - first_cpu) <= 0.05 * first_cpu        # one round apart by rounding (TF32) only
