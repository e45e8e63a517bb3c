"""FedAvg's hooks against hand-computed numbers, BatchNorm included; its `init` option (round 0 from
each client's own initialisation, FedMA Appendix A) on its presets, and the default unchanged."""
from dataclasses import FrozenInstanceError

import numpy as np
import pytest
import torch
from algorithms.helpers import client, make, sums
from torch import nn

from hpcfl.algorithms.base import ONE, WEIGHT
from hpcfl.algorithms.initial import InitParams, independent_init
from hpcfl.errors import ConfigError
from hpcfl.jobs import job_from_dict
from hpcfl.launch import main
from hpcfl.metrics import read_run
from hpcfl.models import load_state
from hpcfl.seeding import torch_seed
from hpcfl.testing import StepTrainer


def test_aggregate_is_the_sample_weighted_mean():
    model = nn.Linear(2, 1)
    algo = make("fedavg", model)
    phase = algo.plan(0)[0]
    state = algo.init_server_state(model)
    # client A: 1 sample, weights [1, 1], bias 0; client B: 3 samples, weights [5, 9], bias 4
    uplink = sums(phase.uplink["model"], *(({"weight": torch.tensor([w]), "bias": torch.tensor([b]), WEIGHT: ONE}, n)
                                          for w, b, n in (([1.0, 1.0], 0.0, 1), ([5.0, 9.0], 4.0, 3))))
    algo.aggregate(phase, 0, state, {"model": uplink})
    assert torch.allclose(state["model"]["weight"], torch.tensor([[4.0, 7.0]]))   # (1*1 + 3*5)/4, (1*1 + 3*9)/4
    assert torch.allclose(state["model"]["bias"], torch.tensor([3.0]))            # (0 + 3*4)/4


def test_no_contribution_keeps_the_model():
    model = nn.Linear(2, 1)
    algo = make("fedavg", model)
    phase, state = algo.plan(0)[0], algo.init_server_state(model)
    before = {k: v.clone() for k, v in state["model"].items()}
    algo.aggregate(phase, 0, state, {"model": sums(phase.uplink["model"])})
    assert all(torch.equal(before[k], state["model"][k]) for k in state["model"])


@pytest.mark.parametrize("params", [None, {"init": "shared"}])
def test_client_update_starts_from_the_downlink_and_weights_by_samples(params):
    model = nn.Linear(2, 1)
    algo = make("fedavg", model, params)
    assert "model" in algo.plan(0)[0].downlink
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
    assert torch.allclose(state["model"]["1.running_mean"], torch.tensor([4.0, 5.0]))
    assert state["model"]["1.num_batches_tracked"].dtype == torch.long
    assert state["model"]["1.num_batches_tracked"].item() == 5            # round((3 + 18) / 4)


def test_local_batchnorm_policy_keeps_each_clients_own_layers():
    model = _bn_net()
    algo = make("fedavg", model, model={"batchnorm": "local"})
    received = {k: torch.zeros_like(v) for k, v in model.state_dict().items()}
    me = client()
    algo.client_update(algo.plan(0)[0], 0, me, {"model": received}, model, StepTrainer(target=2.0))
    assert torch.equal(me.state["bn"]["1.weight"], torch.full((2,), 2.0))     # kept after training
    assert "0.weight" not in me.state["bn"]                                  # only BatchNorm layers
    algo.start_from(model, me, received)                                   # next round: own BN, received rest
    assert torch.equal(model[1].weight.detach(), torch.full((2,), 2.0))
    assert torch.equal(model[0].weight.detach(), torch.zeros(2, 2))
    shared = make("fedavg", _bn_net())
    other = client()
    shared.client_update(shared.plan(0)[0], 0, other, {"model": received}, model, StepTrainer(target=2.0))
    assert other.state == {}                                               # "average": nothing kept


@pytest.mark.parametrize("name", ["scaffold", "feddyn", "fednova", "fedavgm", "fedadam", "fedyogi", "fedadagrad"])
def test_algorithms_measuring_from_the_received_model_refuse_local_batchnorm(name):
    with pytest.raises(ConfigError, match=f"algorithm '{name}' needs model.batchnorm = \"average\": .* starts from "
                                          "its own"):
        job_from_dict({"algorithm": {"name": name}, "model": {"batchnorm": "local"}})
    job_from_dict({"algorithm": {"name": "fedprox"}, "model": {"batchnorm": "local"}})      # prox: see below


def test_fednova_takes_no_init_since_it_measures_from_the_shared_model():
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['init'\] in \[algorithm.params\]; valid: none"):
        job_from_dict({"algorithm": {"name": "fednova", "params": {"init": "independent"}}})


def test_with_local_batchnorm_the_proximal_term_pulls_towards_the_clients_own_layers():
    """FedProx's reference is the model the client started from: the received one, with its own BN."""
    model = _bn_net()
    algo = make("fedprox", model, {"mu": 1.0}, model={"batchnorm": "local"})
    received = {k: torch.zeros_like(v) for k, v in model.state_dict().items()}
    me = client()
    me.state["bn"] = {k: torch.full_like(v, 2.0) if v.is_floating_point() else v for k, v in received.items()
                      if k.startswith("1.")}
    algo.client_update(algo.plan(1)[0], 1, me, {"model": received}, model, StepTrainer(target=2.0))
    prox = algo.terms[0]
    assert torch.equal(prox.reference["1.weight"], torch.full((2,), 2.0))      # its own, as it started
    assert torch.equal(prox.reference["0.weight"], torch.zeros(2, 2))         # the received rest


def test_load_state_copies_into_the_models_own_tensors():
    model = nn.Linear(1, 1)
    load_state(model, {"weight": torch.tensor([[3.0]], dtype=torch.float64), "bias": torch.tensor([1.0])})
    assert model.weight.dtype == torch.float32 and model.weight.item() == 3.0


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 2))


def test_independent_init_starts_round_0_from_the_clients_own_model_and_later_rounds_from_the_global_one():
    """FedProx with init = "independent": round 0 sends no model and each client starts from (and its
    proximal term refers to) its own initialisation; round 1 starts from the global model, for a client
    sampled for the first time too."""
    net = _mlp()
    algo = make("fedprox", net, {"mu": 0.3, "init": "independent"}, run={"seed": 5})
    first, later = algo.plan(0)[0], algo.plan(1)[0]
    assert "model" not in first.downlink and first.uplink == later.uplink and "model" in later.downlink
    assert algo.terms[0].params.mu == 0.3
    own = {cid: independent_init(net, 5, cid) for cid in (0, 1)}
    update, _ = algo.client_update(first, 0, client(0), {}, net, StepTrainer(shift=1.0))
    tensors = update["model"][0]
    reference = algo.terms[0].reference
    assert all(torch.equal(reference[k], own[0][k]) for k in reference)
    assert all(torch.equal(tensors[k], own[0][k] + 1.0) for k in own[0])
    global_model = {k: torch.full_like(v, 0.5) for k, v in own[0].items()}
    update, _ = algo.client_update(later, 1, client(1), {"model": global_model}, net, StepTrainer(shift=1.0))
    tensors = update["model"][0]
    assert all(torch.equal(algo.terms[0].reference[k], global_model[k]) for k in reference)
    assert all(torch.equal(tensors[k], torch.full_like(own[1][k], 1.5)) for k in own[1])


class _Scale(nn.Module):
    """A layer with a parameter and no reset_parameters."""
    def __init__(self):
        super().__init__()
        self.gain = nn.Parameter(torch.full((2,), 3.0))

    def forward(self, x):
        return x * self.gain


def test_independent_init_draws_each_layer_anew_per_client_and_keeps_a_layer_it_cannot_draw():
    """Every module holding parameters draws them with its own reset_parameters from the (seed, "init",
    client) generator, BatchNorm's statistics included; a layer without one keeps the model's values."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2), _Scale())
    net[1].running_mean.fill_(5.0)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    own = {cid: independent_init(net, 7, cid) for cid in (0, 1)}
    assert all(torch.equal(v, before[k]) for k, v in net.state_dict().items())        # the model is left unchanged
    assert all(torch.equal(v, independent_init(net, 7, 0)[k]) for k, v in own[0].items())      # reproducible
    assert not torch.equal(own[0]["0.weight"], own[1]["0.weight"])
    assert not torch.equal(own[0]["0.weight"], before["0.weight"])
    torch.manual_seed(torch_seed(7, "init", 1))
    expected = nn.Linear(2, 2)                      # a fresh layer's first draw is reset_parameters' draw
    assert torch.equal(own[1]["0.weight"], expected.weight) and torch.equal(own[1]["0.bias"], expected.bias)
    assert torch.equal(own[0]["1.running_mean"], torch.zeros(2))
    assert torch.equal(own[0]["2.gain"], torch.full((2,), 3.0)) and own[0]["2.gain"].device.type == "cpu"


def test_init_params_are_frozen():
    with pytest.raises(FrozenInstanceError):
        InitParams().init = "independent"


@pytest.mark.parametrize("name, params, message", [
    *((name, {"init": "random"}, r"\[algorithm.params\]: init = 'random'; choose 'shared'")
      for name in ("fedavg", "fedprox", "moon", "ensemble", "local_only", "fedma")),
    ("fedprox", {"init": "independent", "scope": "head"}, "scope = 'head'"),          # the term's own checks too
    ("fedka", {"init": "shared", "classes": "some"}, "classes = 'some'")])
def test_init_must_be_shared_or_independent(name, params, message):
    with pytest.raises(ConfigError, match=message):
        job_from_dict({"algorithm": {"name": name, "params": params},
                       "data": {"num_clients": 2, "local_test_ratio": 0.3}, "train": {"clients_per_round": 2}})


def test_shared_init_runs_as_before_and_independent_sends_no_model_in_round_0(tiny_job, tmp_path):
    """Through the launcher on digits: init = "shared" gives the default run number for number; with
    "independent" round 0 moves no model down and its clients start elsewhere. (Its round-0 average of
    independently initialised models is near chance: what FedMA's matching is for.)"""
    def run(name, *sets):
        args = [str(tiny_job("fedprox", rounds=2)), "--results-root", str(tmp_path), "--set", f"run.name='{name}'"]
        assert main([*args, *(a for s in sets for a in ("--set", s))]) == 0
        return read_run(tmp_path / "test" / f"{name}.h5").arrays
    default, shared = run("default"), run("shared", "algorithm.params.init='shared'")
    independent = run("independent", "algorithm.params.init='independent'")
    for key in ("client/train_loss", "round/test_acc", "round/bytes_down/model"):
        np.testing.assert_array_equal(default[key], shared[key])
    assert default["round/bytes_down/model"][0] > 0 and not independent["round/bytes_down/model"][0] > 0
    assert independent["round/bytes_down/model"][1] == default["round/bytes_down/model"][1]
    first = [np.nan_to_num(arrays["client/train_loss"][0]) for arrays in (independent, default)]
    assert not np.allclose(*first)
    assert np.isfinite(independent["round/test_acc"]).all()


def test_which_algorithms_may_move_clients_and_train_them_together():
    """The docs list them (run.placement): clients of these keep no state between rounds (placement 'auto' deals
    them per round), and these train their clients as one batched computation."""
    from hpcfl.algorithms import ALGORITHMS

    assert {n for n, cls in ALGORITHMS.items() if cls.traits.stateless} == {
        "fedavg", "fedavgm", "fedadagrad", "fedadam", "fedyogi", "fedprox", "fednova", "fedrs", "fedntd", "fedfm",
        "fedka"}
    assert {n for n, cls in ALGORITHMS.items() if cls.traits.batched} == set(ALGORITHMS) - {"fedma"}


def test_a_presets_own_term_comes_first_and_is_seeded_by_the_run():
    from hpcfl.algorithms import ALGORITHMS, algorithm_params
    from hpcfl.algorithms.base import Setup

    job = job_from_dict({"run": {"seed": 7}, "algorithm": {"name": "fedrs", "terms": ["prox"]}})
    fedrs = ALGORITHMS["fedrs"](algorithm_params("fedrs", {}),
                                Setup.of(job, nn.Linear(2, 2), np.ones((20, 2), dtype=np.int64)))
    assert [t.name for t in fedrs.terms] == ["fedrs", "prox"]
    assert [t.seed for t in fedrs.terms] == [7, 7]
