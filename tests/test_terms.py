"""The local loss terms against hand-computed numbers on tiny tensors; MOON's projection head as
built with the model; each term's configuration rules."""
import dataclasses
import math

import numpy as np
import pytest
import torch
from torch import nn

from hpcfl.algorithms import ALGORITHMS, algorithm_params
from hpcfl.algorithms.anchored import matching_term, wrap
from hpcfl.algorithms.anchors import ANCHORS
from hpcfl.algorithms.base import ONE, WEIGHT, Client, Setup
from hpcfl.config import TrainConfig
from hpcfl.errors import ConfigError, HpcflError
from hpcfl.jobs import job_from_dict, resolve
from hpcfl.runtime.build import build_models
from hpcfl.terms import (
    TERMS,
    ContrastiveGuiding,
    FeatureMatching,
    L2Matching,
    Linear,
    Moon,
    NotTrueDistillation,
    ProjectedClassifier,
    Prox,
    RestrictedSoftmax,
    SupCon,
    Term,
    build_terms,
    check_term,
)
from hpcfl.training import LocalTrainer


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


def _set(model, values):
    with torch.no_grad():
        for name, value in values.items():
            model.get_parameter(name).copy_(torch.tensor(value))
    return model


# TinyNet's parameters and a non-zero reference, every entry different: the differences are
# body [[0.5, 0], [2, -1]] (squares sum 5.25), classifier.weight [[1, 0], [0, -2], [0, 2]] (9),
# classifier.bias [0.5, 0, -2] (4.25).
PROX_MODEL = {"body.weight": [[1.0, 2.0], [3.0, 4.0]], "classifier.weight": [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]],
              "classifier.bias": [1.0, 2.0, -1.0]}
PROX_REFERENCE = {"body.weight": [[0.5, 2.0], [1.0, 5.0]], "classifier.weight": [[0.0, 0.0], [0.0, 3.0], [1.0, -1.0]],
                  "classifier.bias": [0.5, 2.0, 1.0]}


def test_prox_defaults_are_fedproxs():
    assert Prox.Params() == Prox.Params(mu=0.01, scope="model", reduction="sum")


@pytest.mark.parametrize("scope, reduction, total", [
    ("model", "sum", 5.25 + 9 + 4.25),
    ("model", "mean", 5.25 / 4 + 9 / 6 + 4.25 / 3),           # per tensor (FedClassAvg's MSELoss)
    ("classifier", "sum", 9 + 4.25),                          # the head only (FedClassAvg eq. 5)
    ("classifier", "mean", 9 / 6 + 4.25 / 3),
])
def test_prox_against_a_non_zero_reference_by_scope_and_reduction(scope, reduction, total):
    model = _set(TinyNet(), PROX_MODEL)
    term = Prox(Prox.Params(mu=0.4, scope=scope, reduction=reduction))
    term.start(model, _client(), 3, {"model": _state(_set(TinyNet(), PROX_REFERENCE))})
    loss = term.loss(model, None, None, None, None)
    assert loss.item() == pytest.approx(0.2 * total)
    loss.backward()
    for name, p in model.named_parameters():
        if scope == "classifier" and name == "body.weight":
            assert p.grad is None
            continue
        size = p.numel() if reduction == "mean" else 1
        expected = 0.4 * (torch.tensor(PROX_MODEL[name]) - torch.tensor(PROX_REFERENCE[name])) / size
        assert torch.allclose(p.grad, expected), name


def test_prox_in_the_local_trainer_with_momentum_and_weight_decay():
    """Features 0 and balanced labels with equal biases: the task loss has zero gradient, so two SGD steps
    (lr 0.2, momentum 0.9, weight decay 0.1) move each parameter by prox's pull alone, by hand:
    g_t = mu (w_t - r) + wd w_t, w_1 = w_0 - lr g_0, w_2 = w_1 - lr (m g_0 + g_1)."""
    start = {**PROX_MODEL, "classifier.bias": [0.5, 0.5, 0.5]}
    reference = {**PROX_REFERENCE, "classifier.bias": [-1.0, -1.0, -1.0]}
    model = _set(TinyNet(), start)
    me = Client(0, torch.zeros(3, 2), torch.tensor([0, 1, 2]), np.array([1, 1, 1]))
    term = Prox(Prox.Params(mu=0.5))
    term.start(model, me, 0, {"model": _state(_set(TinyNet(), reference))})
    trainer = LocalTrainer(TrainConfig(lr=0.2, momentum=0.9, weight_decay=0.1, batch_size=3, local_epochs=2), seed=0)
    out = trainer.train(model, me, 0, [term])
    mu, lr, momentum, decay = 0.5, 0.2, 0.9, 0.1
    prox_losses = [0.0, 0.0]                                       # mu / 2 ||w_t - r||^2 at each step
    for name, p in model.named_parameters():
        w0, r = torch.tensor(start[name], dtype=torch.float64), torch.tensor(reference[name], dtype=torch.float64)
        g0 = mu * (w0 - r) + decay * w0
        w1 = w0 - lr * g0
        g1 = mu * (w1 - r) + decay * w1
        assert torch.allclose(p.detach().double(), w1 - lr * (momentum * g0 + g1), atol=1e-6), name
        prox_losses = [loss + 0.25 * ((w - r) ** 2).sum().item() for loss, w in zip(prox_losses, (w0, w1), strict=True)]
    # the reported loss: the mean over both steps of cross-entropy (uniform: log 3) plus the prox term
    assert out == {"train_loss": pytest.approx(math.log(3) + sum(prox_losses) / 2, rel=1e-5), "steps": 2.0}


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
    term.start(model, client, 0, {"model": reference})  # first participation: no previous model, no term
    first = term.loss(model, x, None, model.features(x), None)
    first.backward()
    assert first.item() == 0.0 and model.body.weight.grad.abs().sum() == 0        # not log 2, nor its rounding
    model.zero_grad()
    client.term_state = {"moon": _state(model, **{"body.weight": -torch.eye(2)})}
    term.start(model, client, 1, {"model": reference})  # previous representation = -z: cos = -1
    # -log(e^{1/T} / (e^{1/T} + e^{-1/T})) with T = 0.5
    assert term.loss(model, x, None, model.features(x), None).item() == pytest.approx(math.log(1 + math.exp(-4)))
    with torch.no_grad():
        model.body.weight.mul_(3.0)
    term.finish(model, client)
    assert torch.equal(client.term_state["moon"]["body.weight"], 3 * torch.eye(2)) and not client.state


def test_moon_carries_the_clients_previous_model_across_rounds():
    """Round 3 starts from an earlier participation's model (body R, a quarter turn: z_prev is orthogonal
    to z); finish() keeps the round's trained model (body -I), which round 5 contrasts against."""
    quarter = torch.tensor([[0.0, -1.0], [1.0, 0.0]])
    model, term = TinyNet(), Moon(Moon.Params(mu=0.5, temperature=0.5, projection=0))
    glob = _state(model, **{"body.weight": torch.eye(2)})
    client = _client()
    other = torch.tensor([7.0])                          # the algorithm's and another term's state stay
    client.state = {"c": other}
    client.term_state = {"other": {"c": other}, "moon": _state(model, **{"body.weight": quarter})}
    x = torch.tensor([[1.0, 2.0], [-3.0, 0.5]])
    model.load_state_dict(glob)
    term.start(model, client, 3, {"model": glob})
    # cos(z, z_glob) = 1, cos(z, z_prev) = 0: mu * (log(e^{1/T} + e^0) - 1/T)
    assert term.loss(model, x, None, model.features(x), None).item() == pytest.approx(0.5 * math.log(1 + math.exp(-2)))
    with torch.no_grad():
        model.body.weight.copy_(-torch.eye(2))                        # what local training left
    term.finish(model, client)
    assert torch.equal(client.term_state["moon"]["body.weight"], -torch.eye(2))
    assert client.state == {"c": other} and client.term_state["other"] == {"c": other}
    model.load_state_dict(glob)
    term.start(model, client, 5, {"model": glob})
    # cos(z, z_prev) = -1 now: mu * log(1 + e^{-2/T}), neither the stale previous model's value nor log 2
    assert term.loss(model, x, None, model.features(x), None).item() == pytest.approx(0.5 * math.log(1 + math.exp(-4)))


def test_moon_and_supcon_defaults_are_the_papers():
    assert Moon.Params() == Moon.Params(mu=1.0, temperature=0.5, projection=256)
    assert SupCon.Params() == SupCon.Params(weight=1.0, temperature=0.07, base_temperature=0.07, normalize=True)


def test_moon_head_is_drawn_from_its_own_seed_and_leaves_torchs_generator_alone():
    heads = []
    for global_seed in (1, 2):
        torch.manual_seed(global_seed)
        model = TinyNet()
        Moon.adapt(model, Moon.Params(projection=3), seed=4)
        after = torch.rand(1)
        torch.manual_seed(global_seed)
        TinyNet()
        assert torch.equal(torch.rand(1), after)                        # as if no head had been drawn
        heads.append(model.classifier.state_dict())
    assert {k: tuple(v.shape) for k, v in heads[0].items()} == {
        "head.0.weight": (2, 2), "head.0.bias": (2,), "head.2.weight": (3, 2), "head.2.bias": (3,),
        "out.weight": (3, 3), "out.bias": (3,)}
    assert all(torch.equal(heads[0][k], heads[1][k]) for k in heads[0])     # whatever torch's state was
    other = TinyNet()
    Moon.adapt(other, Moon.Params(projection=3), seed=5)
    assert not torch.equal(other.classifier.head[0].weight, heads[0]["head.0.weight"])


def test_moon_with_a_projection_refuses_a_model_without_the_head():
    term = Moon(Moon.Params(projection=2))
    with pytest.raises(HpcflError, match="moon: the model has no projection head.*or set projection = 0"):
        term.start(TinyNet(), _client(), 0, {"model": _state(TinyNet())})


def _supcon_by_hand(views, labels, temperature, base, weight, normalize):
    """Khosla et al. eq. (2) written out over the 2N anchors, in plain Python."""
    z, label = [v[0] for v in views] + [v[1] for v in views], labels + labels
    if normalize:
        z = [[a / math.sqrt(sum(b * b for b in v)) for a in v] for v in z]
    total = 0.0
    for i in range(len(z)):
        s = [sum(a * b for a, b in zip(z[i], z[j], strict=True)) / temperature for j in range(len(z))]
        log_denominator = math.log(sum(math.exp(s[j]) for j in range(len(z)) if j != i))
        positives = [j for j in range(len(z)) if j != i and label[j] == label[i]]
        total -= sum(s[j] - log_denominator for j in positives) / len(positives)
    return weight * temperature / base * total / len(z)


def test_supcon_on_one_sample_per_class_in_closed_form():
    # z = [e1, e2, e1, e2]: each anchor's one positive at similarity 1, two negatives at 0
    features = torch.tensor([[[2.0, 0.0, 0.0], [3.0, 0.0, 0.0]], [[0.0, 0.5, 0.0], [0.0, 4.0, 0.0]]])
    term = SupCon(SupCon.Params(weight=0.3, temperature=0.5, base_temperature=0.25))
    loss = term.loss(None, None, torch.tensor([0, 1]), features, None)
    assert loss.item() == pytest.approx(0.3 * 2 * (math.log(math.exp(2) + 2) - 2), rel=1e-6)


@pytest.mark.parametrize("normalize, temperature, base", [(True, 0.5, 0.25), (False, 10.0, 0.07)])
def test_supcon_matches_the_definition_with_several_positives(normalize, temperature, base):
    views = [[[1.0, 2.0, 0.0], [0.5, 1.0, -1.0]], [[-1.0, 0.0, 2.0], [0.0, 1.0, 1.0]],
             [[2.0, 1.0, 1.0], [1.0, -2.0, 0.5]]]
    labels = [0, 1, 0]                                  # sample 0's views: 3 positives each; sample 1's: 1
    term = SupCon(SupCon.Params(weight=0.7, temperature=temperature, base_temperature=base, normalize=normalize))
    features = torch.tensor(views, requires_grad=True)
    loss = term.loss(None, None, torch.tensor(labels), features, None)
    assert loss.item() == pytest.approx(_supcon_by_hand(views, labels, temperature, base, 0.7, normalize), rel=1e-5)
    loss.backward()
    assert features.grad.abs().sum() > 0


def test_feature_matching_defaults_are_fedfms():
    for cls in (ContrastiveGuiding, L2Matching):
        assert cls.Params() == cls.Params(weight=50.0, tau=0.1, start_round=20, anchor_weighting="samples")


# features z (unnormalised) [3, 4] -> [0.6, 0.8] and [0, -2] -> [0, -1]; anchors [2, 0], [0, 5], [1, 1] ->
# e1, e2, [1, 1] / sqrt 2; labels [1, 0]
MATCH_Z, MATCH_Y = torch.tensor([[3.0, 4.0], [0.0, -2.0]]), torch.tensor([1, 0])
MATCH_ANCHORS = {"anchors": {"anchors": torch.tensor([[2.0, 0.0], [0.0, 5.0], [1.0, 1.0]]), "known": torch.ones(3)}}


def test_contrastive_guiding_is_cross_entropy_over_anchor_similarities_from_the_start_round():
    term = ContrastiveGuiding(ContrastiveGuiding.Params(weight=2.0, tau=0.5, start_round=4))
    term.start(None, _client(), 3, {})                             # before T_s: off, and no anchors needed
    assert term.loss(None, None, MATCH_Y, MATCH_Z, None) is None
    term.start(None, _client(), 4, MATCH_ANCHORS)
    r = 1 / math.sqrt(2)
    rows = [([0.6, 0.8, 1.4 * r], 1), ([0.0, -1.0, -r], 0)]      # cosine similarities and the label
    ce = [math.log(sum(math.exp(s / 0.5) for s in sim)) - sim[label] / 0.5 for sim, label in rows]
    assert term.loss(None, None, MATCH_Y, MATCH_Z, None).item() == pytest.approx(2.0 * sum(ce) / 2, rel=1e-6)


def test_a_feature_matching_term_opens_its_rounds_with_fedfms_anchor_phase():
    job = job_from_dict({"algorithm": {"name": "fedavg", "terms": {"fm_l2": {"start_round": 1}}},
                         "data": {"num_clients": 2}, "train": {"clients_per_round": 2}})
    setup = Setup.of(job, TinyNet(), np.ones((2, 3), dtype=np.int64))
    algo = ALGORITHMS["fedavg"](algorithm_params("fedavg", {}), setup)
    assert isinstance(matching_term(algo), L2Matching)
    wrapped = wrap(algo)
    assert [p.name for p in wrapped.plan(0)] == [p.name for p in algo.plan(0)]        # before T_s: none
    assert [p.name for p in wrapped.plan(1)] == [ANCHORS, *(p.name for p in algo.plan(1))]
    plain = ALGORITHMS["fedavg"](algorithm_params("fedavg", {}), Setup.of(job_from_dict({}), TinyNet(),
                                                                          np.ones((20, 3), dtype=np.int64)))
    assert wrap(plain) is plain and wrapped.inner is algo and wrapped.setup is algo.setup     # the rest delegates


def test_l2_matching_is_the_mean_squared_distance_to_the_class_anchor():
    term = L2Matching(L2Matching.Params(weight=3.0, start_round=0))
    term.start(None, _client(), 0, MATCH_ANCHORS)
    # [0.6, 0.8] - e2 = [0.6, -0.2]: 0.4; [0, -1] - e1: 2; the mean over 2 samples x 2 dimensions
    assert term.loss(None, None, MATCH_Y, MATCH_Z, None).item() == pytest.approx(3.0 * 2.4 / 4)


def test_a_class_without_an_anchor_yet_is_no_competitor_and_its_samples_add_nothing():
    anchors = {"anchors": {**MATCH_ANCHORS["anchors"], "known": torch.tensor([1.0, 0.0, 1.0])}}   # class 1: none
    cg, l2 = ContrastiveGuiding(ContrastiveGuiding.Params(weight=2.0, tau=0.5, start_round=0)), \
        L2Matching(L2Matching.Params(weight=3.0, start_round=0))
    for term in (cg, l2):
        term.start(None, _client(), 0, anchors)
    r = 1 / math.sqrt(2)                                 # sample 1 (class 0): cosines 0 and -r to anchors 0, 2
    ce = math.log(math.exp(0.0) + math.exp(-r / 0.5))
    assert cg.loss(None, None, MATCH_Y, MATCH_Z, None).item() == pytest.approx(2.0 * ce / 2, rel=1e-6)
    assert l2.loss(None, None, MATCH_Y, MATCH_Z, None).item() == pytest.approx(3.0 * (2 / 2) / 2)   # sample 1 alone


def test_supcon_gets_two_augmented_views_from_the_trainer():
    class Recording(SupCon):
        def loss(self, model, x, y, features, logits):
            shapes.append(tuple(features.shape))
            return super().loss(model, x, y, features, logits)

    shapes = []
    model = nn.Sequential()
    model.features, model.classifier = nn.Sequential(nn.Flatten(), nn.Linear(16, 3)), nn.Linear(3, 2)
    me = Client(0, torch.randn(4, 1, 4, 4, generator=torch.Generator().manual_seed(0)), torch.tensor([0, 1, 0, 1]),
                np.array([2, 2]))
    trainer = LocalTrainer(TrainConfig(lr=0.1, batch_size=4), seed=0, normalization=((0.5,), (0.25,)))
    trainer.train(model, me, 0, [Recording(SupCon.Params())])
    assert shapes == [(4, 2, 3)]                                  # N x 2 views x d


@pytest.mark.parametrize("cls", sorted(TERMS.values(), key=lambda c: c.name))
def test_term_params_are_frozen(cls):
    params = cls.Params()
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(params, dataclasses.fields(params)[0].name, None)


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
    client.term_state = {"moon": _state(_moon_net([0.0, 1.0], sign=-1.0))}
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


def _job(algorithm="moon", params=None, terms=(), **sections):
    return job_from_dict({"algorithm": {"name": algorithm, "params": params or {}, "terms": list(terms)},
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
    composed = build_models(_job("fedprox", terms=["moon"]), (1, 8, 8), 10, "cpu")["fmnist_cnn"].state_dict()
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
        assert torch.allclose(state["model"][name], torch.full_like(state["model"][name], (1 + 4 * 3) / 4))


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


def test_fedrs_drop_leaves_the_bias_without_gradient_under_bf16_autocast():
    """The bias's two paths (through the Linear and the subtraction) must cancel exactly: summed in
    different precisions they left Adam a gradient of ~1e-4 to turn into full steps."""
    model, term = _fedrs_case("drop")
    h = torch.randn(64, 2, generator=torch.Generator().manual_seed(0))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        raw = model(h)
        logits = term.logits(raw)
    torch.nn.functional.cross_entropy(logits.float(), torch.arange(64) % 3).backward()
    assert raw.dtype == torch.bfloat16 and model.classifier.weight.grad.abs().sum() > 0
    assert torch.equal(model.classifier.bias.grad, torch.zeros(3))


@pytest.mark.parametrize("alpha, counts, scale", [
    (0.0, (1, 0, 1), [1.0, 0.0, 1.0]),              # most frequent class seen once; alpha = 0 is allowed
    (1.0, (4, 0, 2), [1.0, 1.0, 1.0]),              # alpha = 1: the plain softmax
    (0.25, (0, 0, 0), [0.25, 0.25, 0.25]),          # a client without data: alpha everywhere, no 0 / 0
])
def test_fedrs_class_scale_at_the_edges(alpha, counts, scale):
    term = RestrictedSoftmax(RestrictedSoftmax.Params(alpha=alpha))
    term.start(TinyNet(), _client(counts=counts), 0, {})
    assert torch.allclose(term.scale, torch.tensor(scale))


def test_fedrs_and_ntd_defaults_are_the_papers():
    assert RestrictedSoftmax.Params() == RestrictedSoftmax.Params(alpha=0.5, bias="scale")
    assert NotTrueDistillation.Params() == NotTrueDistillation.Params(beta=1.0, tau=1.0)
    NotTrueDistillation.Params(beta=0.0)                    # beta = 0 switches the term off; allowed


@pytest.mark.parametrize("beta, tau", [(1.0, 1.0), (2.0, 2.0)])
def test_ntd_distils_only_the_not_true_classes(beta, tau):
    model = TinyNet()
    reference = _state(model, **{"classifier.weight": torch.zeros(3, 2),
                                 "classifier.bias": torch.tensor([5.0, 1.0, 1.0])})
    term = NotTrueDistillation(NotTrueDistillation.Params(beta=beta, tau=tau))
    term.start(model, _client(), 0, {"model": reference})
    local = torch.tensor([[1.0, 2.0, 3.0]])          # true class 0 is dropped: not-true logits [2, 3]
    loss = term.loss(model, torch.zeros(1, 2), torch.tensor([0]), None, local)
    # teacher's not-true softmax is [1/2, 1/2]; -log softmax([2, 3] / tau) = [1/tau + s, s], s = log(1 + e^{-1/tau})
    s = math.log(1 + math.exp(-1 / tau))
    kl = math.log(0.5) + 0.5 * (1 / tau + 2 * s)
    assert loss.item() == pytest.approx(beta * kl, rel=1e-5)        # no tau^2, as the authors' NTD_Loss


def test_ntd_softens_the_teachers_not_true_logits_by_tau_too():
    model = TinyNet()
    reference = _state(model, **{"classifier.weight": torch.zeros(3, 2),
                                 "classifier.bias": torch.tensor([5.0, 1.0, 3.0])})
    term = NotTrueDistillation(NotTrueDistillation.Params(beta=0.5, tau=2.0))
    term.start(model, _client(), 0, {"model": reference})
    loss = term.loss(model, torch.zeros(1, 2), torch.tensor([0]), None, torch.tensor([[1.0, 2.0, 3.0]]))
    # not-true logits: teacher [1, 3] -> q = softmax([0.5, 1.5]), local [2, 3] -> p = softmax([1, 1.5])
    q2, p2 = 1 / (1 + math.exp(-1.0)), 1 / (1 + math.exp(-0.5))
    kl = (1 - q2) * math.log((1 - q2) / (1 - p2)) + q2 * math.log(q2 / p2)
    assert loss.item() == pytest.approx(0.5 * kl, rel=1e-5)


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


def test_terms_are_configured_by_list_or_table():
    listed = job_from_dict({"algorithm": {"terms": ["prox", "moon"]}})
    assert listed.algorithm.terms == {"prox": {}, "moon": {}}
    terms = build_terms(resolve(listed).terms, seed=7)
    assert [t.name for t in terms] == ["prox", "moon"] and terms[0].params.mu == Prox.Params().mu
    table = job_from_dict({"algorithm": {"terms": {"prox": {"mu": 0.1}, "ntd": {"beta": 0.3}}}})
    terms = build_terms(resolve(table).terms, seed=7)
    assert [(t.name, t.params) for t in terms] == [("prox", Prox.Params(mu=0.1)),
                                                   ("ntd", NotTrueDistillation.Params(beta=0.3))]
    assert {t.seed for t in terms} == {7}
    assert set(TERMS) == {"prox", "moon", "fedrs", "ntd", "fm_cg", "fm_l2", "supcon", "ka"}


@pytest.mark.parametrize("algorithm, message", [
    ({"terms": ["proximal"]}, "'proximal' is unknown"),
    ({"terms": {"prox": {"nu": 1}}}, "unknown key(s) ['nu'] in [algorithm.terms.prox]"),
    ({"terms": {"moon": {"mu": "big"}}}, "algorithm.terms.moon.mu must be of type float"),
    ({"terms": {"moon": {"temperature": 0.0}}}, "[algorithm.terms.moon]: temperature = 0.0 must be > 0"),
    ({"terms": {"supcon": {"temperature": -0.07}}}, "[algorithm.terms.supcon]: temperature = -0.07 and base"),
    ({"terms": {"supcon": {"base_temperature": 0.0}}}, "base_temperature = 0.0 must be > 0"),
    ({"name": "fedclassavg", "params": {"temperature": 0.0}}, "[algorithm.params]: temperature = 0.0 and"),
    ({"terms": {"moon": {"projection": -1}}}, "[algorithm.terms.moon]: projection = -1 must be >= 0"),
    ({"name": "moon", "params": {"projection": -2}}, "[algorithm.params]: projection = -2 must be >= 0"),
    ({"terms": {"prox": {"scope": "head"}}}, "[algorithm.terms.prox]: scope = 'head'; choose 'model'"),
    ({"terms": {"prox": {"reduction": "max"}}}, "[algorithm.terms.prox]: reduction = 'max'; choose"),
    ({"terms": {"fm_cg": {"anchor_weighting": "x"}}}, "[algorithm.terms.fm_cg]: anchor_weighting = 'x'"),
    ({"terms": {"fm_l2": {"anchor_weighting": "all"}}}, "[algorithm.terms.fm_l2]: anchor_weighting = "),
    ({"terms": {"ntd": {"tau": 0.0}}}, "[algorithm.terms.ntd]: tau = 0.0 must be > 0"),
    ({"name": "fedntd", "params": {"beta": -1.0}}, "[algorithm.params]: tau = 1.0 must be > 0 and beta = -1.0 >= 0"),
    ({"terms": {"fedrs": {"alpha": 1.5}}}, "[algorithm.terms.fedrs]: alpha = 1.5 must be in [0, 1]"),
    ({"name": "fedrs", "params": {"bias": "none"}}, "[algorithm.params]: bias = 'none'; choose 'scale', 'drop'"),
    ({"terms": {"ka": {"reduction": "median"}}}, "[algorithm.terms.ka]: reduction = 'median'; choose"),
    ({"name": "fedka", "params": {"weight": -0.1}}, "[algorithm.params]: weight = -0.1 must be >= 0"),
    ({"name": "fedka", "params": {"size": 0}}, "[algorithm.params]: size = 0 must be >= 1"),
    ({"name": "fedka", "params": {"gamma": 1.5}}, "gamma = 1.5 in [0, 1]"),
    ({"terms": {"ka": {"gamma": -0.1}}}, "[algorithm.terms.ka]: size = 10 must be >= 1 and gamma = -0.1"),
    ({"terms": {"fedrs": {"alpha": -0.1}}}, "[algorithm.terms.fedrs]: alpha = -0.1 must be in [0, 1]"),
    ({"terms": {"ntd": {"tau": -1.0}}}, "[algorithm.terms.ntd]: tau = -1.0 must be > 0"),
    ({"name": "fedka", "params": {"classes": "dominant"}}, "[algorithm.params]: classes = 'dominant'; choose"),
    ({"name": "fedprox", "terms": ["prox"]}, "already includes the 'prox' term"),
    ({"name": "feddyn", "params": {"alpha": 0.0}}, "alpha = 0.0 must be > 0"),
    ({"name": "scaffold", "params": {"server_lr": "1"}}, "algorithm.params.server_lr must be of type float"),
    ({"name": "fedavgm", "params": {"server_momentum": 1.0}}, "server_momentum = 1.0 must be in [0, 1)"),
    ({"name": "fedavgm", "params": {"server_lr": -0.5}}, "[algorithm.params]: server_lr = -0.5 must be >= 0"),
])
def test_bad_term_config_is_named(algorithm, message):
    with pytest.raises(ConfigError) as err:
        job_from_dict({"algorithm": algorithm})
    assert message in str(err.value)


@pytest.mark.parametrize("job, message", [
    ({"algorithm": {"name": "scaffold"}, "train": {"optimizer": "adam"}}, "'scaffold' needs train.optimizer = \"sgd\""),
    ({"algorithm": {"name": "fednova"}, "train": {"optimizer": "adam"}}, "'fednova' needs train.optimizer"),
    ({"algorithm": {"name": "local_only"}}, "set data.local_test_ratio (e.g. 0.3)"),
    ({"algorithm": {"terms": ["fm_cg", "fm_l2"]}}, "algorithm.terms has ['fm_cg', 'fm_l2']: use one"),
    ({"algorithm": {"terms": ["prox", "moon"]}, "run": {"placement": "per_round"}},
     "run.placement = 'per_round' deals each round's clients to any worker"),      # MOON keeps the previous model
    ({"algorithm": {"name": "ensemble"}, "data": {"num_clients": 8}, "train": {"clients_per_round": 4}},
     "train.clients_per_round = data.num_clients (8)"),
    ({"algorithm": {"name": "ensemble", "terms": ["fm_cg"]}, "data": {"num_clients": 8},
      "train": {"clients_per_round": 8}}, "no global model to compute FedFM's anchors with"),
])
def test_algorithm_rules_on_the_whole_job_are_named(job, message):
    with pytest.raises(ConfigError) as err:
        job_from_dict(job)
    assert message in str(err.value)


def test_every_built_in_term_trains_its_clients_together():
    """All of them run under vmap (tests/training/test_batched.py checks the numbers of a job with each):
    none falls back to one client at a time, which gives the same numbers, slower."""
    assert [name for name, term in TERMS.items() if not term.batchable] == []


def test_a_term_that_declares_nothing_asks_for_nothing():
    """The contract's defaults, which a plug-in term inherits: no anchors, no shared set, no client state
    (its clients may move), not run under vmap (its clients train one at a time), one view."""
    assert (Term.needs_anchors, Term.needs_shared, Term.keeps_state, Term.batchable, Term.views) == (
        False, False, False, False, 1)
    import hpcfl

    assert hpcfl.Regularizer is Term                       # its name in 0.1, for one release


def test_a_frozen_copy_runs_without_gradients_in_evaluation_mode_and_is_made_once():
    from hpcfl.terms.base import Frozen

    model, frozen = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2)).train(), Frozen()
    assert frozen.net is None                              # no copy before a client loads one
    state = {k: torch.full_like(v, 2.0) for k, v in model.state_dict().items()}
    frozen.load(model, state)
    net = frozen.net
    assert net is not model and not net.training and not any(p.requires_grad for p in net.parameters())
    assert all(torch.equal(v, state[k]) for k, v in net.state_dict().items()) and model[0].weight.requires_grad
    frozen.load(model, model.state_dict())
    assert frozen.net is net and torch.equal(net[0].weight, model[0].weight)
    wide = nn.Sequential(nn.Linear(2, 4), nn.BatchNorm1d(4))          # a client of another architecture
    frozen.load(wide, wide.state_dict())
    assert frozen.net is not net and frozen.net[0].weight.shape == (4, 2)
    frozen.load(model, state)
    assert frozen.net is net and torch.equal(net[0].weight, state["0.weight"])     # each copy made once


def test_a_term_that_asks_for_anchors_needs_the_settings_the_anchor_phase_reads():
    class Bare(Term):
        name, needs_anchors = "bare", True

    class Matched(FeatureMatching):
        name = "matched"

    assert "Bare sets needs_anchors but its Params has no anchor_weighting or start_round" in check_term(Bare)
    assert check_term(Matched) is None and check_term(Prox) is None
    assert "a loss term" in check_term(int)
