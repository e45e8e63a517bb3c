"""FedAdagrad, FedAdam and FedYogi (Reddi et al., ICLR 2021, Algorithm 2) against a float64 trajectory
written out here in numpy, over three rounds from non-zero moments, on a two-coordinate model with a
buffer; their defaults and parameter rules; and, through the launcher on digits, prox composes."""
import dataclasses

import numpy as np
import pytest
import torch
from algorithms.helpers import make, sums
from torch import nn

from hpcfl.algorithms import ALGORITHMS, algorithm_params
from hpcfl.algorithms.base import ONE, WEIGHT
from hpcfl.errors import ConfigError
from hpcfl.launch import main
from hpcfl.metrics import read_run

FEDOPT = ("fedadagrad", "fedadam", "fedyogi")


class _Pair(nn.Module):
    """Two trained coordinates w plus a buffer `stat` (as a BatchNorm running statistic)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.tensor([1.0, -0.5]))
        self.register_buffer("stat", torch.tensor(0.0))
        self.classifier = nn.Identity()

    def forward(self, x):
        return self.w.sum() * x


# three rounds, each a cohort of (w, stat, weight); coordinate 1 sees Delta^2 below and above v in turn
ROUNDS = [[([0.8, -0.2], 2.0, 1), ([0.6, -0.6], 6.0, 3)],
          [([0.9, -0.9], 1.0, 2)],
          [([1.2, -0.1], 3.0, 1), ([0.2, -0.4], 5.0, 1)]]
PARAMS = {"eta": 0.05, "beta1": 0.8, "tau": 0.01}          # none of them a default
M0, V0 = np.array([0.05, -0.02]), np.array([0.01, 1e-4])


def _by_hand(name, beta2):
    """(x, m, v) after each round, in float64, Algorithm 2's lines written out."""
    x, m, v, trajectory = np.array([1.0, -0.5]), M0.copy(), V0.copy(), []
    for cohort in ROUNDS:
        weights = np.array([c[2] for c in cohort], dtype=float)
        mean = sum(wt * np.array(w) for (w, _, _), wt in zip(cohort, weights, strict=True)) / weights.sum()
        delta = mean - x
        m = PARAMS["beta1"] * m + (1 - PARAMS["beta1"]) * delta
        if name == "fedadagrad":
            v = v + delta ** 2
        elif name == "fedadam":
            v = beta2 * v + (1 - beta2) * delta ** 2
        else:
            v = v - (1 - beta2) * delta ** 2 * np.sign(v - delta ** 2)
        x = x + PARAMS["eta"] * m / (np.sqrt(v) + PARAMS["tau"])
        trajectory.append((x.copy(), m.copy(), v.copy()))
    return trajectory


@pytest.mark.parametrize("name", FEDOPT)
def test_three_rounds_from_nonzero_moments_follow_algorithm_2(name):
    params = {**PARAMS, **({} if name == "fedadagrad" else {"beta2": 0.95})}
    algo = make(name, _Pair(), params)
    state = algo.init_server_state(_Pair())
    state["moment1"]["w"].copy_(torch.tensor(M0))
    state["moment2"]["w"].copy_(torch.tensor(V0))
    phase = algo.plan(1)[0]
    for round, (cohort, (x, m, v)) in enumerate(zip(ROUNDS, _by_hand(name, 0.95), strict=True)):
        ups = [({"w": torch.tensor(w), "stat": torch.tensor(stat), WEIGHT: ONE}, weight) for w, stat, weight in cohort]
        algo.aggregate(phase, round + 1, state, {"model": sums(phase.uplink["model"], *ups)})
        for key, expected in (("model", x), ("moment1", m), ("moment2", v)):
            # float32 state against float64: apart by float32 rounding alone
            np.testing.assert_allclose(state[key]["w"].numpy(), expected, rtol=1e-5, atol=1e-7,
                                       err_msg=f"{key} {round}")
        stats = np.array([c[1] for c in cohort]), np.array([c[2] for c in cohort], dtype=float)
        assert state["model"]["stat"].item() == pytest.approx((stats[0] * stats[1]).sum() / stats[1].sum())
    assert "stat" not in state["moment1"] and "stat" not in state["moment2"]          # buffers take the mean


@pytest.mark.parametrize("name, eta, beta1", [("fedadagrad", 0.01, 0.0), ("fedadam", 0.01, 0.9),
                                              ("fedyogi", 0.01, 0.9)])
def test_defaults_and_the_moments_start(name, eta, beta1):
    params = algorithm_params(name, {})
    assert (params.eta, params.beta1, params.tau) == (eta, beta1, 1e-3)
    assert getattr(params, "beta2", 0.99) == 0.99 and hasattr(params, "beta2") == (name != "fedadagrad")
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.eta = 1.0
    state = make(name, _Pair()).init_server_state(_Pair())
    assert state["moment1"]["w"].tolist() == [0.0, 0.0]
    assert state["moment2"]["w"].tolist() == pytest.approx([1e-6, 1e-6])             # v_{-1} = tau^2


@pytest.mark.parametrize("name, bad, message", [
    ("fedadam", {"eta": 0.0}, "eta = 0.0 must be > 0"),
    ("fedyogi", {"beta1": 1.0}, "beta1 = 1.0 must be in [0, 1)"),
    ("fedadam", {"beta2": -0.1}, "beta2 = -0.1 must be in [0, 1)"),
    ("fedyogi", {"beta2": 1.0}, "beta2 = 1.0 must be in [0, 1)"),
    ("fedadam", {"beta2": 1.5}, "beta2 = 1.5 must be in [0, 1)"),
    ("fedadagrad", {"tau": 0.0}, "tau = 0.0 must be > 0"),
    ("fedadagrad", {"beta2": 0.9}, "beta2"),                   # Adagrad has no second-moment decay
])
def test_bad_parameters_are_refused_naming_them(name, bad, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace(")", r"\)")):
        algorithm_params(name, bad)


def test_the_bounds_themselves_are_accepted_where_the_range_is_closed():
    assert algorithm_params("fedadam", {"beta2": 0.0}).beta2 == 0.0
    assert algorithm_params("fedyogi", {"beta1": 0.0, "beta2": 0.0}).beta1 == 0.0


def test_yogi_leaves_a_second_moment_that_equals_the_squared_change():
    """Reddi et al. Alg. 2: v - (1 - beta2) Delta^2 sign(v - Delta^2), with sign(0) = 0."""
    yogi = make("fedyogi", nn.Linear(1, 1), {"beta2": 0.9})
    v = yogi.second_moment(torch.tensor([4.0, 1.0, 9.0]), torch.tensor([4.0, 9.0, 1.0]))
    assert v.tolist() == pytest.approx([4.0, 1.0 + 0.1 * 9.0, 9.0 - 0.1 * 1.0])


def test_they_keep_no_client_state_and_train_clients_together():
    for name in FEDOPT:
        assert ALGORITHMS[name].traits.stateless and ALGORITHMS[name].traits.batched


def _run(job, root, *sets):
    assert main([str(job), "--results-root", str(root), "--set", "run.name='run'",
                 *(a for s in sets for a in ("--set", s))]) == 0
    return read_run(root / "test" / "run.h5").arrays


def test_a_local_term_composes_as_with_fedavg(tiny_job, tmp_path):
    """FedAdam with FedProx's term: the term acts on the clients, the server's rule is unchanged."""
    with_prox = _run(tiny_job("fedadam", rounds=2, extra="terms = { prox = { mu = 0.5 } }\n"), tmp_path / "prox")
    alone = _run(tiny_job("fedadam", rounds=2), tmp_path / "alone")
    assert not np.array_equal(with_prox["client/train_loss"], alone["client/train_loss"])
    assert np.isfinite(with_prox["round/test_acc"]).all()
