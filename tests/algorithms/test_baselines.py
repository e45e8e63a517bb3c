"""FedAvgM, SCAFFOLD, FedNova, FedDyn, local-only and the ensemble against hand-computed numbers,
on a one-scalar model (w) so that every update rule can be read off."""
import pytest
import torch

from algorithms.helpers import Scalar, StepTrainer, client, make, sums
from hpcfl.algorithms.base import ONE, WEIGHT
from hpcfl.algorithms.fednova import STEPS, normalising_steps
from hpcfl.regularizers import Linear, Prox


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
    assert state["model.w"].item() == pytest.approx(0.5)              # v = 0.5; w = 1 - 0.5
    _aggregate(algo, state, {"model": ({**_w(0.25), WEIGHT: ONE}, 2)})
    assert state["momentum.w"].item() == pytest.approx(0.9 * 0.5 + 0.25)
    assert state["model.w"].item() == pytest.approx(0.5 - 0.7)


def test_scaffold_client_corrects_its_steps_and_updates_its_control_variate():
    algo = make("scaffold", Scalar(), train={"lr": 0.1, "clients_per_round": 1})
    me, trainer = client(), StepTrainer(target=0.8, steps=2)
    downlink = {"model": _w(1.0), "control": _w(0.5)}
    contributions, _ = algo.client_update(algo.plan(0)[0], 0, me, downlink, Scalar(), trainer)
    correction = [t for t in trainer.terms if isinstance(t, Linear)][0]
    assert correction.vector["w"].item() == pytest.approx(0.5)          # c - c_i, with c_i = 0
    # option II: c_i+ = c_i - c + (x - y) / (K lr) = 0 - 0.5 + 0.2 / 0.2 = 0.5
    assert me.state["control.w"].item() == pytest.approx(0.5)
    assert contributions["control"][0]["w"].item() == pytest.approx(0.5) and contributions["control"][1] == 1.0
    algo.client_update(algo.plan(1)[0], 1, me, downlink, Scalar(), trainer)
    assert correction.vector["w"].item() == pytest.approx(0.0, abs=1e-6)        # c - c_i now that c_i = 0.5


def test_scaffold_server_averages_control_deltas_over_all_clients():
    algo = make("scaffold", Scalar(), num_clients=4)
    state = algo.init_server_state(Scalar(1.0))
    _aggregate(algo, state, {"model": ({**_w(0.5), WEIGHT: ONE}, 1), "control": (_w(0.5), 1.0)},
               {"model": ({**_w(0.9), WEIGHT: ONE}, 3), "control": (_w(1.0), 1.0)})
    assert state["model.w"].item() == pytest.approx((0.5 + 3 * 0.9) / 4)
    assert state["control.w"].item() == pytest.approx((0.5 + 1.0) / 4)   # / N = 4, not / cohort = 2


@pytest.mark.parametrize("steps, momentum, lr_mu, expected", [
    (3, 0.0, 0.0, 3.0),
    (3, 0.5, 0.0, 1 + 1.5 + 1.75),          # counters 1, 1.5, 1.75
    (2, 0.0, 0.1, 1 + 0.9),                 # a <- 0.9 a + 1, twice
])
def test_fednova_normalising_steps(steps, momentum, lr_mu, expected):
    assert normalising_steps(steps, momentum, lr_mu) == pytest.approx(expected)


def test_fednova_client_sends_its_normalised_update():
    algo = make("fednova", Scalar(), train={"momentum": 0.5, "clients_per_round": 1})
    contributions, _ = algo.client_update(algo.plan(0)[0], 0, client(samples=3), {"model": _w(1.0)}, Scalar(),
                                          StepTrainer(target=0.6, steps=3))
    tensors, weight = contributions["model"]
    assert weight == 3.0 and tensors[STEPS].item() == pytest.approx(4.25)
    assert tensors["w"].item() == pytest.approx(0.4 / 4.25)


def test_fednova_prox_mu_enters_the_normalisation():
    algo = make("fednova", Scalar(), train={"lr": 0.1, "clients_per_round": 1},
                algorithm={"name": "fednova", "regularizers": {"prox": {"mu": 1.0}}})
    assert algo.lr_mu == pytest.approx(0.1)


def test_fednova_server_rescales_by_the_effective_steps():
    algo = make("fednova", Scalar())
    state = algo.init_server_state(Scalar(1.0))
    # p = 1/4, 3/4; a = 2, 4; d = 0.4/2 = 0.2 and 0.4/4 = 0.1
    _aggregate(algo, state, {"model": ({"w": torch.tensor(0.2), STEPS: ONE * 2, WEIGHT: ONE}, 1)},
               {"model": ({"w": torch.tensor(0.1), STEPS: ONE * 4, WEIGHT: ONE}, 3)})
    tau_eff, d = 0.25 * 2 + 0.75 * 4, 0.25 * 0.2 + 0.75 * 0.1
    assert state["model.w"].item() == pytest.approx(1.0 - tau_eff * d)     # 0.5625, where FedAvg gives 0.6


def test_feddyn_client_uses_and_updates_its_gradient_state():
    algo = make("feddyn", Scalar(), {"alpha": 0.1})
    me, trainer = client(), StepTrainer(target=0.5)
    contributions, _ = algo.client_update(algo.plan(0)[0], 0, me, {"model": _w(1.0)}, Scalar(), trainer)
    linear = [t for t in trainer.terms if isinstance(t, Linear)][0]
    prox = [t for t in trainer.terms if isinstance(t, Prox)][0]
    assert linear.vector["w"].item() == 0.0 and prox.params.mu == 0.1
    assert me.state["grad.w"].item() == pytest.approx(-0.1 * (0.5 - 1.0))    # g - alpha (w_k - w)
    assert contributions["model"][1] == 1.0                                   # uniform average
    algo.client_update(algo.plan(1)[0], 1, me, {"model": _w(1.0)}, Scalar(), trainer)
    assert linear.vector["w"].item() == pytest.approx(-0.05)                  # -g


def test_feddyn_server_corrects_the_mean_by_h():
    algo = make("feddyn", Scalar(), {"alpha": 0.1}, num_clients=4)
    state = algo.init_server_state(Scalar(1.0))
    _aggregate(algo, state, {"model": ({**_w(0.5), WEIGHT: ONE}, 1.0)}, {"model": ({**_w(0.7), WEIGHT: ONE}, 1.0)})
    h = -0.1 / 4 * (0.5 - 1.0 + 0.7 - 1.0)
    assert state["h.w"].item() == pytest.approx(h)
    assert state["model.w"].item() == pytest.approx(0.6 - h / 0.1)


def test_local_only_clients_continue_from_their_own_model():
    algo = make("local_only", Scalar())
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
    assert model.w.item() == 3.0 and me.state["model.w"].item() == 3.0
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
    assert list(result["class_acc"]) == [0.5, 0.0]


def test_fedfm_lite_sends_models_every_a_rounds_and_anchors_every_round():
    algo = make("fedfm_lite", Scalar(), {"model_every": 3, "start_round": 2}, run={"rounds": 8})
    plans = [algo.plan(r)[0] for r in range(8)]
    assert [("model" in p.downlink) for p in plans] == [True, False, False, True, False, False, True, False]
    assert [("model" in p.uplink) for p in plans] == [False, False, True, False, False, True, False, True]
    assert [("anchors" in p.uplink) for p in plans] == [False, True, True, True, True, True, True, True]
    assert algo.phases(4) == algo.plan(4)                 # no separate anchor phase: one handshake


def test_fedfm_opens_each_round_from_its_start_with_the_anchor_phase():
    algo = make("fedfm", Scalar(), {"start_round": 2})
    assert [p.name for p in algo.phases(1)] == ["train"]
    anchor, train = algo.phases(2)
    assert anchor.name == "anchors" and set(anchor.downlink) == {"model", "anchors"} and set(anchor.uplink) == {"anchors"}
    assert set(train.downlink) == {"anchors"}               # the model went out once, with the anchor phase
    assert set(train.uplink) == {"model"}
