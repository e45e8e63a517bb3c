"""BBP-MAP on hand-made neurons: permuted copies are matched back, the match-or-new threshold is the
one the cost implies, the matched value is the posterior mean, and the width cap holds."""
import math

import numpy as np
import pytest

from hpcfl.algorithms.bbp_map import Prior, match_neurons

NO_BIAS = np.zeros(1, dtype=bool)


def _rng():
    return np.random.default_rng(0)


def test_a_permuted_copy_is_matched_back_to_the_original_neurons():
    neurons = np.random.default_rng(1).normal(size=(12, 31))       # |w|^2 ~ 31: clearly worth matching
    bias = np.zeros(31, dtype=bool)
    bias[-1] = True
    perm = np.random.default_rng(2).permutation(12)
    means, (first, second) = match_neurons([neurons, neurons[perm]], bias, Prior(), _rng())
    assert means.shape == (12, 31)
    np.testing.assert_array_equal(first, np.arange(12))              # the first client seeds the global order
    np.testing.assert_array_equal(second, perm)                      # its neuron l is the original perm[l]
    prior_mean = np.where(bias, 0.1, 0.0)                            # sigma = sigma0 = 1: (mu0 + w + w) / 3
    np.testing.assert_allclose(means, (prior_mean + 2 * neurons) / 3, rtol=1e-12)


def test_with_a_tight_sigma_the_matched_layer_is_the_original():
    neurons = np.random.default_rng(3).normal(size=(8, 20))
    perm = np.random.default_rng(4).permutation(8)
    means, _ = match_neurons([neurons[perm], neurons], np.zeros(20, dtype=bool), Prior(sigma=1e-6), _rng())
    np.testing.assert_allclose(means[np.argsort(perm)], neurons, atol=1e-5)


@pytest.mark.parametrize("norm_sq, matched", [(7.3, False), (7.8, True)])
def test_two_equal_neurons_match_exactly_when_the_gain_beats_a_new_neuron(norm_sq, matched):
    # J = 2, one neuron w each: joining gains 4|w|^2/3 - |w|^2/2 + log(1/1), a new neuron |w|^2/2 + 2 log(7/2);
    # they match iff |w|^2 / 3 > 2 log 3.5, i.e. |w|^2 > 7.52
    assert (norm_sq / 3 > 2 * math.log(3.5)) == matched
    w = np.array([[math.sqrt(norm_sq)]])
    means, assignment = match_neurons([w, w], NO_BIAS, Prior(), _rng())
    assert means.shape[0] == (1 if matched else 2)
    assert (assignment[0][0] == assignment[1][0]) == matched


def test_small_unrelated_neurons_grow_the_layer_until_the_cap():
    # tiny neurons gain ~nothing by joining; the k-th new one gains 2 log(7/2) - 2 log k > 0 for k <= 3
    rng = np.random.default_rng(5)
    clients = [rng.normal(scale=0.01, size=(6, 4)) for _ in range(2)]
    means, assignment = match_neurons(clients, np.zeros(4, dtype=bool), Prior(), _rng())
    assert means.shape[0] == 9
    assert all(sorted(set(a.tolist())) == sorted(a.tolist()) for a in assignment)     # injective
    capped, _ = match_neurons(clients, np.zeros(4, dtype=bool), Prior(max_width=6), _rng())
    assert capped.shape[0] == 7                     # at the cap a client may still add one neuron


@pytest.mark.parametrize("sweeps", [0, 1, 5])
def test_a_client_wider_than_the_cap_has_every_neuron_placed(sweeps):
    """One client of 5 neurons, max_width 3: its rematch (a sweep) starts from an empty layer and is
    offered 5 new neurons, not max(3 - 0, 1) = 3 that would leave two unplaced."""
    w = np.random.default_rng(0).normal(size=(5, 4))
    means, (assignment,) = match_neurons([w], np.zeros(4, dtype=bool), Prior(max_width=3, sweeps=sweeps), _rng())
    assert sorted(assignment.tolist()) == [0, 1, 2, 3, 4] and means.shape == (5, 4)
    np.testing.assert_allclose(means[assignment], w / (1 + 1))        # one client and the prior at 0, equal variances


def _gains(w: float, sigma: float, sigma0: float, mu0: float, gamma: float) -> tuple[float, float]:
    """The module docstring's gains, written out for J = 2 clients each holding one bias neuron (w): the
    second joining the first's global neuron, or opening the first new one."""
    a, a0 = 1 / sigma, 1 / sigma0                  # sigma, sigma0 are variances: a = 1/sigma^2 in the docstring
    s = mu0 * a0 + w * a                           # the first client's global neuron, prior included
    join = (w * a + s) ** 2 / (a0 + a + a) - s ** 2 / (a0 + a) + math.log(1 / (2 - 1))
    new = (w * a + mu0 * a0) ** 2 / (a0 + a) - mu0 ** 2 * a0 - 2 * math.log(1) + 2 * math.log(gamma / 2)
    return join, new


@pytest.mark.parametrize("side, matched", [(0.97, False), (1.03, True)])
def test_with_a_bias_prior_and_unequal_variances_a_neuron_joins_where_the_cost_says(side, matched):
    """sigma != sigma0 and a non-zero prior mean on a bias entry: every term of both gains counts."""
    prior = Prior(sigma=0.5, sigma0=2.0, bias_mean=1.5, gamma=7.0)
    lo, hi = 0.0, 50.0                             # the threshold where joining starts to pay, by bisection
    for _ in range(100):
        mid = (lo + hi) / 2
        join, new = _gains(mid, prior.sigma, prior.sigma0, prior.bias_mean, prior.gamma)
        lo, hi = (lo, mid) if join > new else (mid, hi)
    w = np.array([[side * hi]])
    means, assignment = match_neurons([w, w], np.ones(1, dtype=bool), prior, _rng())
    assert (assignment[0][0] == assignment[1][0]) == matched and means.shape[0] == (1 if matched else 2)
    if matched:                                    # posterior mean: (mu0/sigma0 + 2 w/sigma) / (1/sigma0 + 2/sigma)
        np.testing.assert_allclose(means[0, 0], (1.5 / 2.0 + 2 * w[0, 0] / 0.5) / (1 / 2.0 + 2 / 0.5), rtol=1e-12)


def test_the_widest_client_seeds_the_global_layer():
    narrow, wide = np.random.default_rng(6).normal(size=(2, 5)) * 3, np.random.default_rng(7).normal(size=(4, 5)) * 3
    _, (a_narrow, a_wide) = match_neurons([narrow, wide], np.zeros(5, dtype=bool), Prior(sweeps=0), _rng())
    np.testing.assert_array_equal(a_wide, np.arange(4))        # listed second, matched first: its order is global


@pytest.mark.parametrize("setting", [{"sigma": 0.0}, {"sigma0": 0.0}, {"gamma": 0.0}, {"sweeps": -1},
                                     {"max_width": 0}, {"popularity_cap": 0}])
def test_every_prior_setting_is_checked_at_its_boundary(setting):
    with pytest.raises(ValueError, match="must be"):
        Prior(**setting)
    key, bad = next(iter(setting.items()))
    Prior(**{key: bad + (1e-9 if isinstance(bad, float) else 1)})     # the first allowed value is accepted


def test_the_prior_defaults_are_the_authors():
    assert Prior() == Prior(sigma=1.0, sigma0=1.0, gamma=7.0, sweeps=5, max_width=700, popularity_cap=10,
                            bias_mean=0.1)
