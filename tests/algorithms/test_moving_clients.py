"""Which jobs may deal their clients to any worker each round (run.placement): only those whose
clients keep nothing between rounds; the others are refused 'per_round' before anything runs, and a
worker catches an algorithm that claims to be stateless but keeps client state."""
import numpy as np
import pytest
from algorithms.helpers import Scalar, client, make

from hpcfl.algorithms import ALGORITHMS
from hpcfl.errors import ConfigError, HpcflError
from hpcfl.jobs import job_from_dict
from hpcfl.runtime.report import CLIENT_METRICS
from hpcfl.runtime.worker import Worker
from hpcfl.testing import StepTrainer

MOVING = {"fedavg", "fedavgm", "fedadagrad", "fedadam", "fedyogi", "fedprox", "fednova", "fedrs", "fedntd", "fedfm",
          "fedka"}
HETEROGENEOUS = {"local_only", "fedclassavg", "fedproto", "ensemble"}


def job(name, placement="auto", **sections):
    architectures = ["fmnist_cnn_narrow", "fmnist_cnn"] if name in HETEROGENEOUS else []
    return job_from_dict({"algorithm": {"name": name, **sections.pop("algorithm", {})},
                          "run": {"placement": placement},
                          "model": {"architectures": architectures, **sections.pop("model", {})},
                          "data": {"num_clients": 4, "local_test_ratio": 0.3},
                          "train": {"clients_per_round": 4}, **sections})


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_only_algorithms_whose_clients_keep_nothing_move(name):
    config = job(name)
    assert ALGORITHMS[name].moves_clients(config) == (name in MOVING)
    if name in MOVING:
        job(name, "per_round")
    else:
        with pytest.raises(ConfigError, match="run.placement = 'per_round'.*'auto' or 'fixed'"):
            job(name, "per_round")


def test_a_term_or_batchnorm_that_keeps_client_state_pins_the_clients():
    assert not ALGORITHMS["fedavg"].moves_clients(job("fedavg", algorithm={"terms": ["moon"]}))
    assert ALGORITHMS["fedavg"].moves_clients(job("fedavg", algorithm={"terms": ["prox"]}))
    assert not ALGORITHMS["fedavg"].moves_clients(job("fedavg", "fixed"))      # the user pins them
    with pytest.raises(ConfigError, match="model.batchnorm"):
        job("fedavg", "per_round", model={"batchnorm": "local"})


@pytest.mark.parametrize("owner", ["mine", "a term"])
def test_a_worker_refuses_client_state_from_an_algorithm_that_claims_none(owner):
    algo = make("fedavg", Scalar())
    phase = algo.plan(0)[0]
    update = algo.client_update

    def keeping(phase, round, me, downlink, model, trainer):      # what a stateful algorithm or term does
        kept = (me.state if owner == "a term" else me.term_state).setdefault(owner, {})
        kept["kept"] = model.w.detach().clone()
        return update(phase, round, me, downlink, model, trainer)

    algo.client_update = keeping
    worker = Worker(algo, {0: client(0)}, {"": Scalar()}, StepTrainer(shift=1.0), "cpu", 2, 10, moving=True)
    rows = np.zeros((4, len(CLIENT_METRICS)))
    with pytest.raises(HpcflError, match=f"client 0 kept \\['{owner}: kept'\\]"):
        worker.run_phase(phase, 0, [0], {"model": algo.global_state(algo.init_server_state(Scalar()))}, rows,
                         CLIENT_METRICS)
    worker.moving = False                                      # pinned clients may keep what they like
    worker.run_phase(phase, 0, [0], {"model": algo.global_state(algo.init_server_state(Scalar()))}, rows,
                     CLIENT_METRICS)
    assert rows[0, CLIENT_METRICS.index("train_loss")] == 0.5
