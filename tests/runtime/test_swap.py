"""FedCME's classifier swap across ranks, and FedCME runs that must not deadlock: an odd cohort, and a
worker that hosts no sampled client. Under a real launcher:

    mpirun -np 3 python -m pytest --with-mpi -m mpi tests/runtime/test_swap.py
"""
import pytest
import torch
from algorithms.helpers import client, make
from algorithms.test_fedcme import Two
from runtime.test_equivalence import _execute, _job

from hpcfl.runtime.worker import Worker
from hpcfl.testing import assert_same_metrics, run_metrics

pytestmark = pytest.mark.mpi


def test_partners_on_different_ranks_swap_exactly_their_classifiers():
    from mpi4py import MPI

    from hpcfl.transport.mpi import MpiTransport

    comm = MPI.COMM_WORLD
    workers = list(range(1, comm.size)) or [0]
    client_rank = {c: workers[c % len(workers)] for c in range(6)}      # pairs (0, 1), (2, 5): across ranks
    algo = make("fedcme", Two(), num_clients=6, train={"clients_per_round": 6, "local_epochs": 2})
    sources = {0: 1, 1: 0, 2: 5, 5: 2, 3: 4, 4: 3}
    mine = {c: client(c) for c, r in client_rank.items() if r == comm.rank}
    for c, me in mine.items():
        me.state = {"half": {n: torch.full_like(t, float(c)) for n, t in Two().state_dict().items()}}
    worker = Worker(algo, mine, {"": Two()}, None, "cpu", 2, 10)
    worker.exchange(algo.plan(0)[1], 0, sorted(mine), MpiTransport(client_rank, comm), sources)
    for c, me in mine.items():
        assert torch.equal(me.state["half"]["classifier.bias"], torch.full((2,), float(sources[c])))
        assert torch.equal(me.state["half"]["body.bias"], torch.full((2,), float(c)))
    comm.Barrier()


@pytest.mark.parametrize("per_round", [3, 1])       # an odd cohort; a cohort of one leaves a worker idle
def test_fedcme_with_odd_cohorts_matches_one_process(per_round, tmp_path):
    from mpi4py import MPI

    from hpcfl.transport import LocalTransport
    from hpcfl.transport.mpi import MpiTransport

    comm = MPI.COMM_WORLD
    root = comm.bcast(str(tmp_path), root=0)
    cohort = [f"train.clients_per_round={per_round}"]
    _execute(_job("fedcme", root, "ranks", *cohort), MpiTransport({}, comm))
    try:                                   # the other ranks wait at the barrier even if rank 0's checks fail
        if comm.Get_rank() == 0:
            _execute(_job("fedcme", root, "one", *cohort), LocalTransport({}))
            assert_same_metrics(run_metrics(tmp_path / "eq" / "one.h5"), run_metrics(tmp_path / "eq" / "ranks.h5"))
    finally:
        comm.Barrier()
