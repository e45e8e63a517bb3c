"""The local loss terms against hand-computed numbers on tiny tensors; MOON's projection head as
built with the model; each term's configuration rules."""
import math

import numpy as np
import pytest
import torch
from torch import nn

from hpcfl.algorithms import ALGORITHMS, algorithm_params
from hpcfl.algorithms.base import ONE, WEIGHT, Client, Setup
from hpcfl.config import job_from_dict
from hpcfl.errors import ConfigError
from hpcfl.regularizers import (REGULARIZERS, Linear, Moon, NotTrueDistillation, ProjectedClassifier, Prox,
                                RestrictedSoftmax, build_regularizers)
from hpcfl.runtime.job import build_models


class TinyNet(nn.Module):
    """features = W_f x (2 -> 2, no bias); classifier 2 -> 3."""

    def __init__(self):
        super().__init__()
        self.body = nn.Linear(2, 2, bias=False)
        self.classifier = nn.Linear(2, 3)

    def features(self, x):
        return self.body(x)

    def forward(self, x):
        return self.classifier(self.features(x))


def _state(model, **changes):
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state.update(changes)
    return state


def _client(counts=(1, 1, 1)):
    return Client(0, torch.zeros(3, 2), torch.zeros(3, dtype=torch.long), np.array(counts))


def test_prox_is_half_mu_times_the_squared_distance_and_its_gradient():
    model = nn.Linear(2, 1)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 2.0]]))
        model.bias.copy_(torch.tensor([0.5]))
    term = Prox(Prox.Params(mu=0.5))
    term.start(model, _client(), 0, {"model": {"weight": torch.zeros(1, 2), "bias": torch.zeros(1)}})
    loss = term.loss(model, None, None, None, None)
    assert loss.item() == pytest.approx(0.25 * (1 + 4 + 0.25))
    loss.backward()
    assert torch.allclose(model.weight.grad, torch.tensor([[0.5, 1.0]]))   # mu (w - w_ref)


def test_linear_term_adds_its_vector_to_the_gradient():
    model = nn.Linear(2, 1)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 2.0]]))
        model.bias.copy_(torch.tensor([1.5]))
    term = Linear()
    term.vector = {"weight": torch.tensor([[1.0, -1.0]]), "bias": torch.tensor([2.0])}
    loss = term.loss(model, None, None, None, None)
    assert loss.item() == pytest.approx(1 - 2 + 3)
    loss.backward()
    assert torch.equal(model.weight.grad, term.vector["weight"]) and torch.equal(model.bias.grad, term.vector["bias"])


def test_moon_without_projection_contrasts_the_features():
    model = TinyNet()
    with torch.no_grad():
        model.body.weight.copy_(torch.eye(2))
    term, client = Moon(Moon.Params(mu=1.0, temperature=0.5, projection=0)), _client()
    x = torch.tensor([[1.0, 2.0], [-3.0, 0.5]])
    reference = _state(model)                       # global representation = this model's: cos = 1
    term.start(model, client, 0, {"model": reference})  # first participation: previous = global
    assert term.loss(model, x, None, model.features(x), None).item() == pytest.approx(math.log(2))
    client.state = {f"moon.previous.{k}": v for k, v in _state(model, **{"body.weight": -torch.eye(2)}).items()}
    term.start(model, client, 1, {"model": reference})  # previous representation = -z: cos = -1
    # -log(e^{1/T} / (e^{1/T} + e^{-1/T})) with T = 0.5
    assert term.loss(model, x, None, model.features(x), None).item() == pytest.approx(math.log(1 + math.exp(-4)))
    with torch.no_grad():
        model.body.weight.mul_(3.0)
    term.finish(model, client)
    assert torch.equal(client.state["moon.previous.body.weight"], 3 * torch.eye(2))


def _moon_net(bias, sign=1.0):
    """TinyNet (features = x) under a 2 -> 2 projection head: z = sign * (W relu(h) + bias), W = [[1, 2], [3, 4]]."""
    model = TinyNet()
    Moon.adapt(model, Moon.Params(projection=2), seed=0)
    with torch.no_grad():
        model.body.weight.copy_(torch.eye(2))
        first, second = model.classifier.head[0], model.classifier.head[2]
        first.weight.copy_(torch.eye(2))
        first.bias.zero_()
        second.weight.copy_(sign * torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
        second.bias.copy_(sign * torch.tensor(bias))
    return model


def test_moon_contrasts_the_projected_representation():
    model, client = _moon_net([0.0, 1.0]), _client()
    term = Moon(Moon.Params(mu=0.5, temperature=0.5, projection=2))
    client.state = {f"moon.previous.{k}": v for k, v in _state(_moon_net([0.0, 1.0], sign=-1.0)).items()}
    term.start(model, client, 1, {"model": _state(_moon_net([1.0, -4.0]))})
    x = torch.tensor([[1.0, -2.0]])              # h = x; relu(h) = [1, 0]
    # z = [1, 3] + [0, 1] = [1, 4]; z_glob = [1, 3] + [1, -4] = [2, -1]; z_prev = -z. The features of all
    # three models are equal (h), so without the head the loss would be log 2.
    positive, negative = (2 - 4) / (math.sqrt(17) * math.sqrt(5)) / 0.5, -1 / 0.5
    loss = term.loss(model, x, None, model.features(x), None)
    assert loss.item() == pytest.approx(0.5 * (math.log(math.exp(positive) + math.exp(negative)) - positive), rel=1e-6)
    loss.backward()
    assert model.classifier.head[2].weight.grad.abs().sum() > 0          # the head is trained by the term
    assert model.classifier.out.weight.grad is None                       # the class layer reads z, not the term


def _job(algorithm="moon", params=None, regularizers=(), **sections):
    return job_from_dict({"algorithm": {"name": algorithm, "params": params or {}, "regularizers": list(regularizers)},
                          "data": {"num_clients": 2}, "train": {"clients_per_round": 2}, **sections})


def test_moon_head_is_built_after_the_base_model_and_is_part_of_the_state():
    plain = build_models(_job("fedavg"), (1, 8, 8), 10, "cpu")["fmnist_cnn"].state_dict()
    moon = build_models(_job(), (1, 8, 8), 10, "cpu")["fmnist_cnn"]
    state = moon.state_dict()
    head = {k: tuple(v.shape) for k, v in state.items() if k.startswith("classifier.")}
    assert head == {"classifier.head.0.weight": (128, 128), "classifier.head.0.bias": (128,),
                    "classifier.head.2.weight": (256, 128), "classifier.head.2.bias": (256,),
                    "classifier.out.weight": (10, 256), "classifier.out.bias": (10,)}
    for name, value in plain.items():             # the base model is initialised as for every other algorithm
        if not name.startswith("classifier."):
            assert torch.equal(state[name], value), name
    again = build_models(_job(), (1, 8, 8), 10, "cpu")["fmnist_cnn"].state_dict()
    assert all(torch.equal(again[k], v) for k, v in state.items())        # the same on every rank
    other = build_models(_job(run={"seed": 1}), (1, 8, 8), 10, "cpu")["fmnist_cnn"].state_dict()
    assert not torch.equal(other["classifier.head.0.weight"], state["classifier.head.0.weight"])
    composed = build_models(_job("fedprox", regularizers=["moon"]), (1, 8, 8), 10, "cpu")["fmnist_cnn"].state_dict()
    assert all(torch.equal(composed[k], v) for k, v in state.items())     # the term on any algorithm: the same head
    assert isinstance(moon.classifier, ProjectedClassifier) and moon(torch.zeros(3, 1, 8, 8)).shape == (3, 10)


def test_moon_without_projection_builds_fedavgs_model():
    plain = build_models(_job("fedavg"), (1, 8, 8), 10, "cpu")["fmnist_cnn"].state_dict()
    moon = build_models(_job(params={"projection": 0}), (1, 8, 8), 10, "cpu")["fmnist_cnn"].state_dict()
    assert list(moon) == list(plain) and all(torch.equal(moon[k], v) for k, v in plain.items())


def test_moon_head_is_averaged_with_the_model():
    job = _job()
    model = build_models(job, (1, 8, 8), 10, "cpu")["fmnist_cnn"]
    setup = Setup.of(job, model, np.ones((2, 10), dtype=np.int64))
    assert setup.feature_dim == 128                           # anchors and features stay the base model's
    algo = ALGORITHMS["moon"](algorithm_params("moon", {}), setup)
    state = algo.init_server_state(model)
    phase = algo.plan(0)[0]
    sums = torch.zeros(phase.uplink["model"].numel, dtype=torch.float64)
    for value, weight in ((1.0, 1.0), (4.0, 3.0)):
        phase.uplink["model"].add_into(sums, {**{k: torch.full_like(v, value) for k, v in model.state_dict().items()},
                                              WEIGHT: ONE}, weight)
    algo.aggregate(phase, 0, state, {"model": phase.uplink["model"].unpack(sums)})
    for name in ("classifier.head.0.weight", "classifier.head.2.bias", "classifier.out.weight"):
        assert torch.allclose(state[f"model.{name}"], torch.full_like(state[f"model.{name}"], (1 + 4 * 3) / 4))


def test_moon_needs_a_linear_classifier_for_its_head():
    class Headless(TinyNet):
        def __init__(self):
            super().__init__()
            self.classifier = nn.Identity()
    with pytest.raises(ConfigError, match="projection = 256.*set projection = 0"):
        Moon.adapt(Headless(), Moon.Params(), seed=0)


def _fedrs_case(bias):
    """TinyNet with features = x, W = [[1, 0], [0, 1], [1, 1]], b = [1, 2, -1]; client counts (4, 0, 2):
    s = 0.5 + 0.5 n / max n = [1, 0.5, 0.75]."""
    model = TinyNet()
    with torch.no_grad():
        model.body.weight.copy_(torch.eye(2))
        model.classifier.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]))
        model.classifier.bias.copy_(torch.tensor([1.0, 2.0, -1.0]))
    term = RestrictedSoftmax(RestrictedSoftmax.Params(alpha=0.5, bias=bias))
    term.start(model, _client(counts=(4, 0, 2)), 0, {})
    return model, term


@pytest.mark.parametrize("bias, expected", [
    ("scale", [1 * (2 + 1), 0.5 * (2 + 2), 0.75 * (4 - 1)]),        # s (w^T h + b)
    ("drop", [1 * 2, 0.5 * 2, 0.75 * 4]),                          # s w^T h, as the authors' code
    ("keep", [1 * 2 + 1, 0.5 * 2 + 2, 0.75 * 4 - 1]),              # s w^T h + b
])
def test_fedrs_restricts_the_logits_with_or_without_the_bias(bias, expected):
    model, term = _fedrs_case(bias)
    h = torch.tensor([[2.0, 2.0]])                                  # w^T h = [2, 2, 4]
    logits = term.logits(model(h))
    assert torch.allclose(logits, torch.tensor([expected]))
    torch.nn.functional.cross_entropy(logits, torch.tensor([0])).backward()
    p = torch.softmax(torch.tensor(expected), 0) - torch.tensor([1.0, 0.0, 0.0])     # d CE / d logits
    bias_grad = {"scale": p * torch.tensor([1.0, 0.5, 0.75]), "drop": torch.zeros(3), "keep": p}[bias]
    assert torch.allclose(model.classifier.bias.grad, bias_grad, atol=1e-7)


def test_ntd_defaults_are_the_papers():
    assert NotTrueDistillation.Params() == NotTrueDistillation.Params(beta=1.0, tau=1.0)


@pytest.mark.parametrize("beta, tau", [(1.0, 1.0), (2.0, 2.0)])
def test_ntd_distils_only_the_not_true_classes(beta, tau):
    model = TinyNet()
    reference = _state(model, **{"classifier.weight": torch.zeros(3, 2), "classifier.bias": torch.tensor([5.0, 1.0, 1.0])})
    term = NotTrueDistillation(NotTrueDistillation.Params(beta=beta, tau=tau))
    term.start(model, _client(), 0, {"model": reference})
    local = torch.tensor([[1.0, 2.0, 3.0]])          # true class 0 is dropped: not-true logits [2, 3]
    loss = term.loss(model, torch.zeros(1, 2), torch.tensor([0]), None, local)
    # teacher's not-true softmax is [1/2, 1/2]; -log softmax([2, 3] / tau) = [1/tau + s, s], s = log(1 + e^{-1/tau})
    s = math.log(1 + math.exp(-1 / tau))
    kl = math.log(0.5) + 0.5 * (1 / tau + 2 * s)
    assert loss.item() == pytest.approx(beta * kl, rel=1e-5)        # no tau^2, as the authors' NTD_Loss


def test_ntd_at_the_defaults_on_a_batch_of_two():
    model = TinyNet()
    reference = _state(model, **{"classifier.weight": torch.zeros(3, 2),
                                 "classifier.bias": torch.tensor([0.0, 1.0, 2.0])})
    term = NotTrueDistillation(NotTrueDistillation.Params())
    term.start(model, _client(), 0, {"model": reference})
    local = torch.tensor([[0.0, 0.0, 0.0], [3.0, 1.0, 1.0]])
    loss = term.loss(model, torch.zeros(2, 2), torch.tensor([2, 0]), None, local)
    # sample 1 (true 2): teacher [0, 1] -> q = [1, e] / (1 + e), local [0, 0] -> [1/2, 1/2]
    # sample 2 (true 0): teacher [1, 2] -> q = the same, local [1, 1] -> [1/2, 1/2]; KL = sum q log(2 q)
    q = [1 / (1 + math.e), math.e / (1 + math.e)]
    kl = sum(v * math.log(2 * v) for v in q)
    assert loss.item() == pytest.approx((kl + kl) / 2, rel=1e-6)


def test_regularizers_are_configured_by_list_or_table():
    listed = job_from_dict({"algorithm": {"regularizers": ["prox", "moon"]}})
    assert listed.algorithm.regularizers == {"prox": {}, "moon": {}}
    terms = build_regularizers(listed.algorithm.regularizers)
    assert [t.name for t in terms] == ["prox", "moon"] and terms[0].params.mu == Prox.Params().mu
    table = job_from_dict({"algorithm": {"regularizers": {"prox": {"mu": 0.1}, "ntd": {"beta": 0.3}}}})
    terms = build_regularizers(table.algorithm.regularizers)
    assert [(t.name, t.params) for t in terms] == [("prox", Prox.Params(mu=0.1)),
                                                   ("ntd", NotTrueDistillation.Params(beta=0.3))]
    assert set(REGULARIZERS) == {"prox", "moon", "fedrs", "ntd", "fm_cg", "fm_l2", "supcon", "ka"}


@pytest.mark.parametrize("algorithm, message", [
    ({"regularizers": ["proximal"]}, "'proximal' is unknown"),
    ({"regularizers": {"prox": {"nu": 1}}}, "unknown key(s) ['nu'] in [algorithm.regularizers.prox]"),
    ({"regularizers": {"moon": {"mu": "big"}}}, "algorithm.regularizers.moon.mu must be of type float"),
    ({"regularizers": {"moon": {"temperature": 0.0}}}, "[algorithm.regularizers.moon]: temperature = 0.0 must be > 0"),
    ({"regularizers": {"moon": {"projection": -1}}}, "[algorithm.regularizers.moon]: projection = -1 must be >= 0"),
    ({"name": "moon", "params": {"projection": -2}}, "[algorithm.params]: projection = -2 must be >= 0"),
    ({"regularizers": {"ntd": {"tau": 0.0}}}, "[algorithm.regularizers.ntd]: tau = 0.0 must be > 0"),
    ({"name": "fedntd", "params": {"beta": -1.0}}, "[algorithm.params]: tau = 1.0 must be > 0 and beta = -1.0 >= 0"),
    ({"regularizers": {"fedrs": {"alpha": 1.5}}}, "[algorithm.regularizers.fedrs]: alpha = 1.5 must be in [0, 1]"),
    ({"name": "fedrs", "params": {"bias": "none"}}, "[algorithm.params]: bias = 'none'; choose 'scale', 'drop'"),
    ({"regularizers": {"ka": {"reduction": "median"}}}, "[algorithm.regularizers.ka]: reduction = 'median'; choose"),
    ({"name": "fedka", "params": {"weight": -0.1}}, "[algorithm.params]: weight = -0.1 must be >= 0"),
    ({"name": "fedka", "params": {"size": 0}}, "[algorithm.params]: size = 0 must be >= 1"),
    ({"name": "fedka", "params": {"gamma": 1.5}}, "gamma = 1.5 in [0, 1]"),
    ({"name": "fedka", "params": {"classes": "dominant"}}, "[algorithm.params]: classes = 'dominant'; choose"),
    ({"name": "fedprox", "regularizers": ["prox"]}, "already includes the 'prox' term"),
    ({"name": "feddyn", "params": {"alpha": 0.0}}, "alpha = 0.0 must be > 0"),
    ({"name": "scaffold", "params": {"server_lr": "1"}}, "algorithm.params.server_lr must be of type float"),
    ({"name": "fedavgm", "params": {"server_momentum": 1.0}}, "server_momentum = 1.0 must be in [0, 1)"),
    ({"name": "fedavgm", "params": {"server_lr": -0.5}}, "[algorithm.params]: server_lr = -0.5 must be >= 0"),
])
def test_bad_regularizer_config_is_named(algorithm, message):
    with pytest.raises(ConfigError) as err:
        job_from_dict({"algorithm": algorithm})
    assert message in str(err.value)


@pytest.mark.parametrize("job, message", [
    ({"algorithm": {"name": "scaffold"}, "train": {"optimizer": "adam"}}, "'scaffold' needs train.optimizer = \"sgd\""),
    ({"algorithm": {"name": "fednova"}, "train": {"optimizer": "adam"}}, "'fednova' needs train.optimizer"),
    ({"algorithm": {"name": "local_only"}}, "set data.local_test_ratio (e.g. 0.3)"),
    ({"algorithm": {"name": "ensemble"}, "data": {"num_clients": 8}, "train": {"clients_per_round": 4}}, "train.clients_per_round = data.num_clients (8)"),
    ({"algorithm": {"name": "ensemble", "regularizers": ["fm_cg"]}, "data": {"num_clients": 8},
      "train": {"clients_per_round": 8}}, "no global model to compute FedFM's anchors with"),
])
def test_algorithm_rules_on_the_whole_job_are_named(job, message):
    with pytest.raises(ConfigError) as err:
        job_from_dict(job)
    assert message in str(err.value)
