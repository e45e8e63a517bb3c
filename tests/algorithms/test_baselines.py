"""FedAvgM, SCAFFOLD, FedNova, FedDyn, local-only, the ensemble and FedFM-Lite against hand-computed
numbers, on a one-scalar model (w) so that every update rule can be read off; their configuration rules."""
import dataclasses

import numpy as np
import pytest
import torch
from algorithms.helpers import Scalar, client, make, sums
from torch import nn

from hpcfl.algorithms.anchored import wrap
from hpcfl.algorithms.anchors import ANCHORS
from hpcfl.algorithms.base import ONE, WEIGHT, Client
from hpcfl.algorithms.fednova import STEPS, normalising_steps
from hpcfl.errors import ConfigError
from hpcfl.jobs import job_from_dict
from hpcfl.terms import Linear, Prox
from hpcfl.testing import StepTrainer


def _w(value):
    return {"w": torch.tensor(value)}


def _aggregate(algo, state, *contributions, round=0):
    phase = algo.plan(round)[0]
    algo.aggregate(phase, round, state, {name: sums(phase.uplink[name], *(c[name] for c in contributions))
                                         for name in phase.uplink})


def test_fedavgm_applies_server_momentum_to_the_pseudo_gradient():
    algo = make("fedavgm", Scalar(1.0), {"server_lr": 1.0, "server_momentum": 0.9})
    state = algo.init_server_state(Scalar(1.0))
    _aggregate(algo, state, {"model": ({**_w(0.5), WEIGHT: ONE}, 2)})
    assert state["model"]["w"].item() == pytest.approx(0.5)              # v = 0.5; w = 1 - 0.5
    _aggregate(algo, state, {"model": ({**_w(0.25), WEIGHT: ONE}, 2)})
    assert state["momentum"]["w"].item() == pytest.approx(0.9 * 0.5 + 0.25)
    assert state["model"]["w"].item() == pytest.approx(0.5 - 0.7)


class _WithStatistic(Scalar):
    """w plus a buffer `stat` (as a BatchNorm running statistic): buffers take the plain weighted mean."""

    def __init__(self, value=1.0):
        super().__init__(value)
        self.register_buffer("stat", torch.tensor(0.0))


def _up(w, stat, weight):
    return {"model": ({"w": torch.tensor(w), "stat": torch.tensor(stat), WEIGHT: ONE}, weight)}


def test_fedavgm_default_server_rule_over_three_rounds():
    algo = make("fedavgm", _WithStatistic())
    assert algo.server_lr == pytest.approx(0.1)                           # eta = 1 - beta, beta = 0.9
    state = algo.init_server_state(_WithStatistic(1.0))
    _aggregate(algo, state, _up(0.4, 2.0, 1), _up(0.6, 6.0, 3))            # mean w 0.55, stat 5
    assert state["momentum"]["w"].item() == pytest.approx(0.45)               # d = 1 - 0.55
    assert state["model"]["w"].item() == pytest.approx(1 - 0.1 * 0.45)        # 0.955
    assert state["model"]["stat"].item() == pytest.approx(5.0)
    _aggregate(algo, state, _up(0.855, 1.0, 2), round=1)                   # d = 0.1
    assert state["momentum"]["w"].item() == pytest.approx(0.9 * 0.45 + 0.1)   # 0.505
    assert state["model"]["w"].item() == pytest.approx(0.955 - 0.0505)        # 0.9045
    _aggregate(algo, state, _up(0.9045, 3.0, 1), round=2)                  # d = 0: the momentum alone moves w
    assert state["momentum"]["w"].item() == pytest.approx(0.9 * 0.505)
    assert state["model"]["w"].item() == pytest.approx(0.9045 - 0.1 * 0.4545)
    assert state["model"]["stat"].item() == pytest.approx(3.0)                # no momentum on buffers


@pytest.mark.parametrize("server_lr, step", [(0.0, 0.2), (1.0, 2.0)])
def test_fedavgm_effective_server_step_is_lr_over_one_minus_beta(server_lr, step):
    algo = make("fedavgm", Scalar(1.0), {"server_lr": server_lr, "server_momentum": 0.9})
    state = algo.init_server_state(Scalar(1.0))
    state["momentum"]["w"].fill_(0.2 / (1 - 0.9))          # the velocity a steady pseudo-gradient d = 0.2 builds up
    _aggregate(algo, state, {"model": ({**_w(0.8), WEIGHT: ONE}, 1)})      # d = 0.2 again
    assert state["model"]["w"].item() == pytest.approx(1.0 - step)       # eta / (1 - beta) * d: FedAvg's by default


def test_scaffold_client_corrects_its_steps_and_updates_its_control_variate():
    algo = make("scaffold", Scalar(), train={"lr": 0.1, "clients_per_round": 1})
    me, trainer = client(), StepTrainer(target=0.8, steps=2)
    downlink = {"model": _w(1.0), "control": _w(0.5)}
    contributions, _ = algo.client_update(algo.plan(0)[0], 0, me, downlink, Scalar(), trainer)
    correction = [t for t in trainer.terms if isinstance(t, Linear)][0]
    assert correction.vector["w"].item() == pytest.approx(0.5)          # c - c_i, with c_i = 0
    # option II: c_i+ = c_i - c + (x - y) / (K lr) = 0 - 0.5 + 0.2 / 0.2 = 0.5
    assert me.state["control"]["w"].item() == pytest.approx(0.5)
    assert contributions["control"][0]["w"].item() == pytest.approx(0.5) and contributions["control"][1] == 1.0
    algo.client_update(algo.plan(1)[0], 1, me, downlink, Scalar(), trainer)
    assert correction.vector["w"].item() == pytest.approx(0.0, abs=1e-6)        # c - c_i now that c_i = 0.5


def test_scaffold_server_averages_control_deltas_over_all_clients():
    algo = make("scaffold", Scalar(), num_clients=4)
    state = algo.init_server_state(Scalar(1.0))
    _aggregate(algo, state, {"model": ({**_w(0.5), WEIGHT: ONE}, 1), "control": (_w(0.5), 1.0)},
               {"model": ({**_w(0.9), WEIGHT: ONE}, 3), "control": (_w(1.0), 1.0)})
    assert state["model"]["w"].item() == pytest.approx((0.5 + 3 * 0.9) / 4)
    assert state["control"]["w"].item() == pytest.approx((0.5 + 1.0) / 4)   # / N = 4, not / cohort = 2


@pytest.mark.parametrize("steps, momentum, lr_mu, expected", [
    (3, 0.0, 0.0, 3.0),
    (3, 0.5, 0.0, 1 + 1.5 + 1.75),          # counters 1, 1.5, 1.75
    (2, 0.0, 0.1, 1 + 0.9),                 # a <- 0.9 a + 1, twice
    (2, 0.5, 0.1, 1 + 1.4),                 # buffers 1, 0.5 + 1 - 0.1 x 1 (the authors' code: 4.06)
])
def test_fednova_normalising_steps(steps, momentum, lr_mu, expected):
    assert normalising_steps(steps, momentum, lr_mu) == pytest.approx(expected)


@pytest.mark.parametrize("steps, momentum, lr, mu", [(100, 0.9, 0.01, 0.01), (20, 0.5, 0.05, 0.1), (7, 0.0, 0.1, 1.0),
                                                     (30, 0.9, 0.1, 0.0)])
def test_normalising_steps_is_how_far_torch_sgd_moves_under_a_unit_gradient(steps, momentum, lr, mu):
    x = torch.zeros((), dtype=torch.float64)
    y = x.clone().requires_grad_()
    sgd = torch.optim.SGD([y], lr=lr, momentum=momentum)
    for _ in range(steps):                                   # the loss y + prox's mu / 2 (y - x)^2
        sgd.zero_grad()
        (y + mu / 2 * (y - x) ** 2).backward()
        sgd.step()
    assert normalising_steps(steps, momentum, lr * mu) == pytest.approx(float((x - y).detach()) / lr, rel=1e-9)


def test_fednova_client_sends_its_normalised_update():
    algo = make("fednova", Scalar(), train={"momentum": 0.5, "clients_per_round": 1})
    contributions, _ = algo.client_update(algo.plan(0)[0], 0, client(samples=3), {"model": _w(1.0)}, Scalar(-7.0),
                                          StepTrainer(shift=-0.4, steps=3))      # from the received 1.0 to 0.6
    tensors, weight = contributions["model"]
    assert weight == 3.0 and tensors[STEPS].item() == pytest.approx(4.25)
    assert tensors["w"].item() == pytest.approx(0.4 / 4.25)


def test_a_fednova_client_with_no_step_sends_no_change_and_no_steps():
    algo = make("fednova", Scalar(), train={"momentum": 0.5, "clients_per_round": 1})
    contributions, _ = algo.client_update(algo.plan(0)[0], 0, client(samples=1), {"model": _w(1.0)}, Scalar(-7.0),
                                          StepTrainer(shift=0.0, steps=0))       # a = 0 (it was 0 / 0 = NaN)
    tensors, _ = contributions["model"]
    assert tensors[STEPS].item() == 0.0 and tensors["w"].item() == 0.0


def test_fednova_prox_mu_enters_the_normalisation():
    """Two steps under a prox pull of lr mu = 0.1: a <- (1 - 0.1) a + 1 twice, 1.9 steps, not 2."""
    algo = make("fednova", Scalar(), train={"lr": 0.1, "clients_per_round": 1},
                algorithm={"name": "fednova", "terms": {"prox": {"mu": 1.0}}})
    assert algo.lr_mu == pytest.approx(0.1)
    contributions, _ = algo.client_update(algo.plan(0)[0], 0, client(samples=1), {"model": _w(1.0)}, Scalar(-7.0),
                                          StepTrainer(shift=-0.2, steps=2))
    tensors, _ = contributions["model"]
    assert tensors[STEPS].item() == pytest.approx(1.9)


@pytest.mark.parametrize("algorithm, allowed", [("scaffold", False), ("fednova", False), ("feddyn", True)])
def test_step_counting_algorithms_refuse_adam(algorithm, allowed):
    raw = {"algorithm": {"name": algorithm}, "train": {"optimizer": "adam"}}
    if allowed:
        job_from_dict(raw)
    else:
        with pytest.raises(ConfigError, match=f"'{algorithm}' needs train.optimizer = \"sgd\""):
            job_from_dict(raw)


@pytest.mark.parametrize("algorithm", ["fednova", "scaffold"])
@pytest.mark.parametrize("prox", [{"scope": "classifier"}, {"reduction": "mean"}])
def test_a_step_count_with_prox_needs_one_mu_on_every_parameter(algorithm, prox):
    raw = {"algorithm": {"name": algorithm, "terms": {"prox": prox}}, "data": {"num_clients": 2},
           "train": {"clients_per_round": 2}}
    with pytest.raises(ConfigError, match='algorithm.terms.prox scope = "model" and reduction = "sum"'):
        job_from_dict(raw)
    job_from_dict({**raw, "algorithm": {"name": algorithm, "terms": {"prox": {"mu": 0.1}}}})


@pytest.mark.parametrize("algorithm", ["fednova", "scaffold"])
def test_a_step_count_needs_sgd(algorithm):
    with pytest.raises(ConfigError, match=f"algorithm '{algorithm}' needs train.optimizer = \"sgd\""):
        job_from_dict({"algorithm": {"name": algorithm}, "train": {"optimizer": "adam"}})


def test_fednova_server_rescales_by_the_effective_steps():
    algo = make("fednova", Scalar())
    state = algo.init_server_state(Scalar(1.0))
    # p = 1/4, 3/4; a = 2, 4; d = 0.4/2 = 0.2 and 0.4/4 = 0.1
    _aggregate(algo, state, {"model": ({"w": torch.tensor(0.2), STEPS: ONE * 2, WEIGHT: ONE}, 1)},
               {"model": ({"w": torch.tensor(0.1), STEPS: ONE * 4, WEIGHT: ONE}, 3)})
    tau_eff, d = 0.25 * 2 + 0.75 * 4, 0.25 * 0.2 + 0.75 * 0.1
    assert state["model"]["w"].item() == pytest.approx(1.0 - tau_eff * d)     # 0.5625, where FedAvg gives 0.6


def test_feddyn_client_uses_and_updates_its_gradient_state():
    algo = make("feddyn", Scalar(), {"alpha": 0.1})
    me, trainer = client(), StepTrainer(shift=-0.5)
    contributions, _ = algo.client_update(algo.plan(0)[0], 0, me, {"model": _w(1.0)}, Scalar(-7.0), trainer)
    linear = [t for t in trainer.terms if isinstance(t, Linear)][0]
    prox = [t for t in trainer.terms if isinstance(t, Prox)][0]
    assert linear.vector["w"].item() == 0.0 and prox.params.mu == 0.1
    assert me.state["grad"]["w"].item() == pytest.approx(-0.1 * (0.5 - 1.0))    # g - alpha (w_k - w)
    assert contributions["model"][1] == 1.0                                   # uniform average
    algo.client_update(algo.plan(1)[0], 1, me, {"model": _w(1.0)}, Scalar(), trainer)
    assert linear.vector["w"].item() == pytest.approx(-0.05)                  # -g


def test_feddyn_refuses_a_non_positive_alpha():
    with pytest.raises(ConfigError, match="alpha = 0"):
        job_from_dict({"algorithm": {"name": "feddyn", "params": {"alpha": 0.0}}})


def test_feddyn_server_corrects_the_mean_by_h():
    algo = make("feddyn", Scalar(), {"alpha": 0.1}, num_clients=4)
    state = algo.init_server_state(Scalar(1.0))
    _aggregate(algo, state, {"model": ({**_w(0.5), WEIGHT: ONE}, 1.0)}, {"model": ({**_w(0.7), WEIGHT: ONE}, 1.0)})
    h = -0.1 / 4 * (0.5 - 1.0 + 0.7 - 1.0)
    assert state["h"]["w"].item() == pytest.approx(h)
    assert state["model"]["w"].item() == pytest.approx(0.6 - h / 0.1)


def test_local_only_clients_continue_from_their_own_model():
    """Under init = 'shared' (the default, each client its own initialisation: test_fedclassavg.py)."""
    algo = make("local_only", Scalar(), {"init": "shared"})
    me, other = client(0), client(1)
    for c in (me, other):
        assert algo.init_client_state(c, Scalar(1.0)) == {}
    phase, model = algo.plan(0)[0], Scalar(-7.0)       # whatever the worker's model holds
    assert phase.uplink == {} and phase.downlink == {}
    algo.client_update(phase, 0, me, {}, model, StepTrainer(shift=1.0))
    assert model.w.item() == 2.0                        # from the initial 1.0
    algo.client_update(phase, 1, other, {}, model, StepTrainer(shift=1.0))
    assert model.w.item() == 2.0                        # the other client starts from the initial model too
    algo.client_update(phase, 2, me, {}, model, StepTrainer(shift=1.0))
    assert model.w.item() == 3.0 and me.state["model"]["w"].item() == 3.0
    assert algo.evaluate(algo.init_server_state(model), model, None, None, 10) is None


def test_ensemble_averages_client_probabilities():
    algo = make("ensemble", Scalar(), num_clients=2, train={"clients_per_round": 2})
    state = algo.init_server_state(Scalar())
    phase = algo.plan(0)[0]
    assert phase.uplink["probs"].shapes[0] == (2, 2)                     # test_size x classes
    a, b = torch.tensor([[0.9, 0.1], [0.6, 0.4]]), torch.tensor([[0.3, 0.7], [0.0, 1.0]])
    _aggregate(algo, state, {"probs": ({"probs": a, WEIGHT: ONE}, 1.0)}, {"probs": ({"probs": b, WEIGHT: ONE}, 1.0)})
    result = algo.evaluate(state, None, None, torch.tensor([0, 0]), 10)
    assert result["acc"] == 0.5                                          # mean [0.6, 0.4] right, [0.3, 0.7] wrong
    assert result["loss"] == pytest.approx(-(torch.tensor(0.6).log() + torch.tensor(0.3).log()).item() / 2)
    np.testing.assert_array_equal(result["class_acc"], [0.5, np.nan])             # no example of class 1


def test_fedfm_lite_sends_models_every_a_rounds_and_anchors_every_round():
    algo = make("fedfm_lite", Scalar(), {"model_every": 3, "start_round": 2}, run={"rounds": 8},
                train={"clients_per_round": 4})
    plans = [algo.plan(r)[0] for r in range(8)]
    assert [("model" in p.downlink) for p in plans] == [True, False, False, True, False, False, True, False]
    assert [("model" in p.uplink) for p in plans] == [False, False, True, False, False, True, False, True]
    assert [("anchors" in p.uplink) for p in plans] == [False, True, True, True, True, True, True, True]
    assert wrap(algo) is algo                             # no separate anchor phase: one handshake


def test_fedfm_opens_each_round_from_its_start_with_the_anchor_phase():
    algo = wrap(make("fedfm", Scalar(), {"start_round": 2}))
    assert [p.name for p in algo.plan(1)] == ["train"]
    anchor, train = algo.plan(2)
    assert anchor.name == "anchors" and set(anchor.downlink) == {"model"}     # eq. 9's anchors need none yet
    assert set(anchor.uplink) == {"anchors"}
    assert set(train.downlink) == {"anchors"}               # the model went out once, with the anchor phase
    assert set(train.uplink) == {"model"}


@pytest.mark.parametrize("weighting, first_down", [("samples", {"model"}), ("uniform", {"model", "anchors"})])
def test_fedfm_lite_sends_anchors_down_where_they_are_used(weighting, first_down):
    algo = make("fedfm_lite", Scalar(), {"start_round": 2, "anchor_weighting": weighting}, run={"rounds": 4})
    assert [(set(algo.plan(r)[0].downlink), set(algo.plan(r)[0].uplink)) for r in range(4)] == [
        ({"model"}, {"model"}), (first_down, {"model", "anchors"}),              # round 1 sends the first anchors
        ({"model", "anchors"}, {"model", "anchors"}), ({"model", "anchors"}, {"model", "anchors"})]


def test_fedfm_lite_sends_the_model_every_round_by_default_with_any_participation():
    algo = make("fedfm_lite", Scalar(), {}, run={"rounds": 3})              # 1 client of 4 per round
    assert all("model" in algo.plan(r)[0].downlink and "model" in algo.plan(r)[0].uplink for r in range(3))


@pytest.mark.parametrize("params, terms, message", [
    ({"model_every": 0}, {}, "model_every = 0 must be >= 1"),
    ({"anchor_weighting": "mean"}, {}, "anchor_weighting"),                 # the term's own rules
    ({}, {"fm_cg": {}}, "already includes the 'fm_cg' term"),               # FedAvg's rules
])
def test_fedfm_lite_parameter_rules(params, terms, message):
    with pytest.raises(ConfigError, match=message):
        job_from_dict({"algorithm": {"name": "fedfm_lite", "params": params, "terms": terms}})


def test_fedfm_lite_with_models_every_a_rounds_needs_every_client_every_round():
    raw = {"algorithm": {"name": "fedfm_lite", "params": {"model_every": 2}}, "data": {"num_clients": 4},
           "train": {"clients_per_round": 3}}
    with pytest.raises(ConfigError, match="model_every = 2 .* train.clients_per_round = data.num_clients = 4"):
        job_from_dict(raw)
    job_from_dict({**raw, "train": {"clients_per_round": 4}})
    job_from_dict({**raw, "algorithm": {"name": "fedfm_lite", "params": {"model_every": 1}}})


def test_fedfm_lite_upload_round_averages_what_every_client_trained_since_the_model_round():
    """a = 2, every client every round: round 0 receives the model, round 1 continues each client's
    own model and uploads it; the server's model is the mean of all of them."""
    algo = make("fedfm_lite", Scalar(), {"model_every": 2}, run={"rounds": 4}, train={"clients_per_round": 4})
    state = algo.init_server_state(Scalar(1.0))
    clients = [client(k, samples=k + 1) for k in range(4)]
    for round in (0, 1):
        phase = algo.plan(round)[0]
        downlink = algo.downlink(phase, round, state)
        algo.receive(phase, round, downlink)
        ups = [algo.client_update(phase, round, c, downlink, Scalar(-7.0), StepTrainer(shift=c.id))[0]
               for c in clients]              # each on a model holding junk: it starts from the right one
        assert ("model" in ups[0]) == (round == 1)
        algo.aggregate(phase, round, state, {name: sums(phase.uplink[name], *(u[name] for u in ups))
                                             for name in phase.uplink})
        assert state["model"]["w"].item() == (1.0 if round == 0 else pytest.approx(1.0 + 2 * (0 + 2 + 6 + 12) / 10))
        assert all(bool(c.state) == (round == 0) for c in clients)       # a local model is kept until it is sent


class Featured(nn.Module):
    """features = w * x (1-d), classifier 1 -> 2: anchors that move with training."""

    def __init__(self, value=1.0):
        super().__init__()
        self.w = nn.Parameter(torch.tensor(value))
        self.classifier = nn.Linear(1, 2, bias=False)

    def features(self, x):
        return self.w * x

    def forward(self, x):
        return self.classifier(self.features(x))


def test_fedfm_lite_clients_send_anchors_of_the_model_they_just_trained():
    """Eq. 8 after local training: w goes 1 -> 2 and 1 -> 3; class 0 = mean(2*1, 3*3), class 1 = 2*2."""
    algo = make("fedfm_lite", Featured(), {"model_every": 2, "start_round": 1}, num_clients=2,
                run={"rounds": 4}, train={"clients_per_round": 2})
    state = algo.init_server_state(Featured())
    phase = algo.plan(0)[0]
    downlink = algo.downlink(phase, 0, state)
    algo.receive(phase, 0, downlink)
    clients = [Client(0, torch.tensor([[1.0], [2.0]]), torch.tensor([0, 1]), np.array([1, 1])),
               Client(1, torch.tensor([[3.0]]), torch.tensor([0]), np.array([1, 0]))]
    ups = [algo.client_update(phase, 0, c, downlink, Featured(-7.0), StepTrainer(shift=c.id + 1.0))[0]
           for c in clients]
    assert set(ups[0]) == {ANCHORS}
    algo.aggregate(phase, 0, state, {ANCHORS: sums(phase.uplink[ANCHORS], *(u[ANCHORS] for u in ups))})
    anchors = state[ANCHORS]
    assert anchors["anchors"][:, 0].tolist() == pytest.approx([(2.0 + 9.0) / 2, 4.0])
    assert anchors["known"].tolist() == [1.0, 1.0]


def test_fedavgm_parameter_boundaries():
    from hpcfl.algorithms import algorithm_params

    params = algorithm_params("fedavgm", {"server_momentum": 0.0, "server_lr": 0.0})
    assert params.server_momentum == 0.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.server_lr = 1.0
    for bad, message in (({"server_momentum": -0.1}, "server_momentum = -0.1"),
                         ({"server_momentum": 1.0}, "server_momentum = 1.0"),
                         ({"server_lr": -0.01}, "server_lr = -0.01")):
        with pytest.raises(ConfigError, match=message):
            algorithm_params("fedavgm", bad)


def test_feddyn_default_alpha_is_the_documented_one_and_params_are_frozen():
    from hpcfl.algorithms import algorithm_params

    params = algorithm_params("feddyn", {})
    assert params.alpha == 0.01                     # the documented default
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.alpha = 0.1


class _Affine(Scalar):
    """Two-class logits (w * x, 0): a trained w moves the vote a known way."""

    def forward(self, x):
        return torch.cat([self.w * x, torch.zeros_like(x)], dim=1)


def test_ensemble_clients_vote_with_their_trained_model_on_evaluation_rounds_only():
    algo = make("ensemble", _Affine(), num_clients=2, train={"clients_per_round": 2}, eval={"every": 2},
                run={"rounds": 4})
    assert algo.traits.client_test and not algo.traits.global_model
    assert [bool(p.uplink) for r in range(4) for p in algo.plan(r)] == [False, True, False, True]
    state = algo.init_server_state(_Affine())
    assert torch.equal(state["ensemble"]["probs"], torch.full((2, 2), 0.5))              # no vote yet: uniform
    me = client(0)
    me.test_set = torch.tensor([[1.0], [-1.0]]), torch.tensor([0, 0])
    model = _Affine()
    me.state = algo.init_client_state(me, _Affine(1.0))
    quiet, _ = algo.client_update(algo.plan(0)[0], 0, me, {}, model, StepTrainer(target=2.0))
    assert quiet == {}                                                       # not an evaluation round
    (vote, weight), = algo.client_update(algo.plan(1)[0], 1, me, {}, model, StepTrainer(shift=1.0))[0].values()
    p = torch.sigmoid(torch.tensor(3.0)).item()                              # w = 2 + 1: logits (3x, 0)
    assert weight == 1.0 and vote["#weight"].item() == 1.0
    torch.testing.assert_close(vote["probs"], torch.tensor([[p, 1 - p], [1 - p, p]]))
    me.test_set = torch.tensor([[1.0], [2.0], [-1.0]]), torch.tensor([0, 0, 0])
    metrics = algo.client_update(algo.plan(3)[0], 3, me, {}, model, StepTrainer(shift=1.0))[1]
    assert metrics["test_acc"] == pytest.approx(2 / 3)                       # right on x = 1, 2; wrong on x = -1


def test_ensemble_needs_every_client_every_round():
    with pytest.raises(ConfigError, match="train.clients_per_round = data.num_clients"):
        job_from_dict({"algorithm": {"name": "ensemble"}, "data": {"num_clients": 4, "local_test_ratio": 0.3},
                       "train": {"clients_per_round": 3}})
    with pytest.raises(ConfigError, match="no global model to compute FedFM's anchors"):    # Personal's rules too
        job_from_dict({"algorithm": {"name": "ensemble", "terms": ["fm_cg"]}, "data": {"num_clients": 4},
                       "train": {"clients_per_round": 4}})
