"""The local loss terms against hand-computed numbers on tiny tensors."""
import math

import numpy as np
import pytest
import torch
from torch import nn

from hpcfl.algorithms.base import Client
from hpcfl.config import job_from_dict
from hpcfl.errors import ConfigError
from hpcfl.regularizers import (REGULARIZERS, Linear, Moon, NotTrueDistillation, Prox, RestrictedSoftmax,
                                build_regularizers)


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


def test_moon_contrasts_the_global_and_the_previous_representation():
    model = TinyNet()
    with torch.no_grad():
        model.body.weight.copy_(torch.eye(2))
    term, client = Moon(Moon.Params(mu=1.0, temperature=0.5)), _client()
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


def test_fedrs_scales_logits_by_the_class_presence():
    term = RestrictedSoftmax(RestrictedSoftmax.Params(alpha=0.5))
    term.start(TinyNet(), _client(counts=(4, 0, 2)), 0, {})
    # s_c = 0.5 + 0.5 n_c / max n = [1, 0.5, 0.75]
    assert torch.allclose(term.logits(torch.tensor([[2.0, 2.0, 2.0]])), torch.tensor([[2.0, 1.0, 1.5]]))


@pytest.mark.parametrize("tau", [1.0, 2.0])
def test_ntd_distils_only_the_not_true_classes(tau):
    model = TinyNet()
    reference = _state(model, **{"classifier.weight": torch.zeros(3, 2), "classifier.bias": torch.tensor([5.0, 1.0, 1.0])})
    term = NotTrueDistillation(NotTrueDistillation.Params(beta=2.0, tau=tau))
    term.start(model, _client(), 0, {"model": reference})
    local = torch.tensor([[1.0, 2.0, 3.0]])          # true class 0 is dropped: not-true logits [2, 3]
    loss = term.loss(model, torch.zeros(1, 2), torch.tensor([0]), None, local)
    # teacher's not-true softmax is [1/2, 1/2]; -log softmax([2, 3] / tau) = [1/tau + s, s], s = log(1 + e^{-1/tau})
    s = math.log(1 + math.exp(-1 / tau))
    kl = math.log(0.5) + 0.5 * (1 / tau + 2 * s)
    assert loss.item() == pytest.approx(2.0 * tau ** 2 * kl, rel=1e-5)


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
    ({"name": "fedprox", "regularizers": ["prox"]}, "already includes the 'prox' term"),
    ({"name": "feddyn", "params": {"alpha": 0.0}}, "alpha = 0.0 must be > 0"),
    ({"name": "scaffold", "params": {"server_lr": "1"}}, "algorithm.params.server_lr must be of type float"),
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
