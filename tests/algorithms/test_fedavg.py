"""FedAvg's hooks against hand-computed numbers, BatchNorm included."""
import torch
from torch import nn

from algorithms.helpers import StepTrainer, client, make, sums
from hpcfl.algorithms.base import ONE, WEIGHT
from hpcfl.models import load_state


def test_aggregate_is_the_sample_weighted_mean():
    model = nn.Linear(2, 1)
    algo = make("fedavg", model)
    phase = algo.plan(0)[0]
    state = algo.init_server_state(model)
    # client A: 1 sample, weights [1, 1], bias 0; client B: 3 samples, weights [5, 9], bias 4
    uplink = sums(phase.uplink["model"], *(({"weight": torch.tensor([w]), "bias": torch.tensor([b]), WEIGHT: ONE}, n)
                                          for w, b, n in (([1.0, 1.0], 0.0, 1), ([5.0, 9.0], 4.0, 3))))
    algo.aggregate(phase, 0, state, {"model": uplink})
    assert torch.allclose(state["model.weight"], torch.tensor([[4.0, 7.0]]))   # (1*1 + 3*5)/4, (1*1 + 3*9)/4
    assert torch.allclose(state["model.bias"], torch.tensor([3.0]))            # (0 + 3*4)/4


def test_no_contribution_keeps_the_model():
    model = nn.Linear(2, 1)
    algo = make("fedavg", model)
    phase, state = algo.plan(0)[0], algo.init_server_state(model)
    before = {k: v.clone() for k, v in state.items()}
    algo.aggregate(phase, 0, state, {"model": sums(phase.uplink["model"])})
    assert all(torch.equal(before[k], state[k]) for k in state)


def test_client_update_starts_from_the_downlink_and_weights_by_samples():
    model = nn.Linear(2, 1)
    algo = make("fedavg", model)
    downlink = {"model": {"weight": torch.zeros(1, 2), "bias": torch.zeros(1)}}
    contributions, metrics = algo.client_update(algo.plan(0)[0], 0, client(samples=5), downlink, model,
                                                StepTrainer(shift=1.0))
    tensors, weight = contributions["model"]
    assert weight == 5.0 and metrics["train_loss"] == 0.5
    assert torch.equal(tensors["weight"], torch.ones(1, 2)) and torch.equal(tensors[WEIGHT], ONE)


def _bn_net():
    return nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))


def test_batchnorm_weights_and_running_statistics_are_averaged():
    model = _bn_net()
    algo = make("fedavg", model)
    assert set(algo.setup.norm_names) == {"1.weight", "1.bias", "1.running_mean", "1.running_var",
                                          "1.num_batches_tracked"}
    assert "1.running_mean" not in algo.setup.parameter_names
    phase, state = algo.plan(0)[0], algo.init_server_state(model)

    def upload(mean, steps, n):
        tensors = {**{k: v.clone() for k, v in model.state_dict().items()}, WEIGHT: ONE}
        tensors["1.running_mean"], tensors["1.num_batches_tracked"] = torch.tensor(mean), torch.tensor(steps)
        return tensors, n
    algo.aggregate(phase, 0, state, {"model": sums(phase.uplink["model"], upload([1.0, 2.0], 3, 1),
                                                   upload([5.0, 6.0], 6, 3))})
    assert torch.allclose(state["model.1.running_mean"], torch.tensor([4.0, 5.0]))
    assert state["model.1.num_batches_tracked"].dtype == torch.long
    assert state["model.1.num_batches_tracked"].item() == 5            # round((3 + 18) / 4)


def test_local_batchnorm_policy_keeps_each_clients_own_layers():
    model = _bn_net()
    algo = make("fedavg", model, model={"batchnorm": "local"})
    received = {k: torch.zeros_like(v) for k, v in model.state_dict().items()}
    me = client()
    algo.client_update(algo.plan(0)[0], 0, me, {"model": received}, model, StepTrainer(target=2.0))
    assert torch.equal(me.state["bn.1.weight"], torch.full((2,), 2.0))     # kept after training
    assert "bn.0.weight" not in me.state                                   # only BatchNorm layers
    algo.start_from(model, me, received)                                   # next round: own BN, received rest
    assert torch.equal(model[1].weight.detach(), torch.full((2,), 2.0))
    assert torch.equal(model[0].weight.detach(), torch.zeros(2, 2))
    shared = make("fedavg", _bn_net())
    other = client()
    shared.client_update(shared.plan(0)[0], 0, other, {"model": received}, model, StepTrainer(target=2.0))
    assert other.state == {}                                               # "average": nothing kept


def test_load_state_copies_into_the_models_own_tensors():
    model = nn.Linear(1, 1)
    load_state(model, {"weight": torch.tensor([[3.0]], dtype=torch.float64), "bias": torch.tensor([1.0])})
    assert model.weight.dtype == torch.float32 and model.weight.item() == 3.0
