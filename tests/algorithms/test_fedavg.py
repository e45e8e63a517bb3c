"""FedAvg's hooks against hand-computed numbers."""
import numpy as np
import torch
from torch import nn

from hpcfl.algorithms.base import ONE, WEIGHT, Client, Setup
from hpcfl.algorithms.fedavg import FedAvg
from hpcfl.config import JobConfig
from hpcfl.payload import Layout


def _fedavg(model):
    setup = Setup(JobConfig(), Layout.of(model.state_dict()), num_clients=3, num_classes=2,
                  class_counts=np.ones((3, 2), dtype=np.int64))
    return FedAvg(FedAvg.Params(), setup)


def test_aggregate_is_the_sample_weighted_mean():
    model = nn.Linear(2, 1)
    algo = _fedavg(model)
    phase = algo.plan(0)[0]
    state = algo.init_server_state(model)
    layout = phase.uplink["model"]
    total = torch.zeros(layout.numel, dtype=torch.float64)
    # client A: 1 sample, weights [1, 1], bias 0; client B: 3 samples, weights [5, 9], bias 4
    for w, b, n in (([1.0, 1.0], 0.0, 1), ([5.0, 9.0], 4.0, 3)):
        layout.add_into(total, {"weight": torch.tensor([w]), "bias": torch.tensor([b]), WEIGHT: ONE}, n)
    algo.aggregate(phase, 0, state, {"model": layout.unpack(total)})
    assert torch.allclose(state["model.weight"], torch.tensor([[4.0, 7.0]]))   # (1*1 + 3*5)/4, (1*1 + 3*9)/4
    assert torch.allclose(state["model.bias"], torch.tensor([3.0]))            # (0 + 3*4)/4


def test_no_contribution_keeps_the_model():
    model = nn.Linear(2, 1)
    algo = _fedavg(model)
    phase, state = algo.plan(0)[0], algo.init_server_state(model)
    before = {k: v.clone() for k, v in state.items()}
    algo.aggregate(phase, 0, state, {"model": phase.uplink["model"].unpack(
        torch.zeros(phase.uplink["model"].numel, dtype=torch.float64))})
    assert all(torch.equal(before[k], state[k]) for k in state)


class _Trainer:
    """Stands in for LocalTrainer: moves every parameter by +1 so the uplink is predictable."""

    def train(self, model, client, round):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
        return {"train_loss": 0.5}


def test_client_update_starts_from_the_downlink_and_weights_by_samples():
    model = nn.Linear(2, 1)
    algo = _fedavg(model)
    phase = algo.plan(0)[0]
    downlink = {"model": {"weight": torch.zeros(1, 2), "bias": torch.zeros(1)}}
    client = Client(0, torch.zeros(5, 2), torch.zeros(5, dtype=torch.long), np.array([5, 0]))
    contributions, metrics = algo.client_update(phase, 0, client, downlink, model, _Trainer())
    tensors, weight = contributions["model"]
    assert weight == 5.0 and metrics == {"train_loss": 0.5}
    assert torch.equal(tensors["weight"], torch.ones(1, 2)) and torch.equal(tensors[WEIGHT], ONE)
