"""BBP-MAP: matched averaging of one layer's neurons across clients (FedMA, section 2.1, eq. 2-3, with
the Beta-Bernoulli process cost of PFNM, Yurochkin et al. 2019, as the authors' code computes it;
DESIGN.md section 7).

A global neuron i keeps the precision-weighted sum of the client neurons matched to it plus the
prior's, s_i = mu0/sigma0^2 + sum w/sigma^2, its precision p_i = 1/sigma0^2 + c_i/sigma^2 and its
popularity c_i (sigma^2, sigma0^2 are variances; mu0 is 0, or `bias_mean` on bias columns). Client j's
neuron w joins existing neuron i at gain

    |w/sigma^2 + s_i|^2 / (p_i + 1/sigma^2) - |s_i|^2 / p_i + log(c / (J - c)),   c = min(c_i, cap),

or becomes the k-th new neuron at gain

    |w/sigma^2 + mu0/sigma0^2|^2 / (1/sigma0^2 + 1/sigma^2) - |mu0|^2 / sigma0^2 - 2 log k + 2 log(gamma / J),

and scipy's linear_sum_assignment picks the assignment of maximal total gain (eq. 3; at most
max(max_width - L, 1) new neurons are offered, as in the authors' code, so a layer at max_width still
grows by one a client, and a sweep's rematch may add one more; ours: never fewer than the client's
neurons that no existing one can take, so each gets a column). Clients are matched one at a time against all the
others: first in order of decreasing width (the widest seeds the global layer), then `sweeps` passes in
random order, each removing the client and matching it again. The matched layer is the posterior mean
s_i / p_i: the prior counts as one more neuron at mu0.
"""
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Prior:
    sigma: float = 1.0          # variance of client neurons around their global neuron
    sigma0: float = 1.0         # prior variance of global neurons
    gamma: float = 7.0          # Indian buffet process mass: larger, more new global neurons
    sweeps: int = 5             # random-order passes after the first
    max_width: int = 700        # past this width each (re)match offers one new neuron, not max_width - L
    popularity_cap: int = 10    # c in log(c / (J - c)) is capped here
    bias_mean: float = 0.1      # prior mean of bias entries (weights: 0)

    def __post_init__(self):
        if self.sigma <= 0 or self.sigma0 <= 0 or self.gamma <= 0:
            raise ValueError(f"sigma, sigma0 and gamma must be > 0 (got {self.sigma}, {self.sigma0}, {self.gamma})")
        if self.sweeps < 0 or self.max_width < 1 or self.popularity_cap < 1:
            raise ValueError("sweeps must be >= 0, max_width and popularity_cap >= 1")


@dataclass
class _Global:
    sums: np.ndarray          # L x D precision-weighted sums, prior included
    counts: np.ndarray        # L popularity


def match_neurons(neurons: list[np.ndarray], bias: np.ndarray, prior: Prior,
                  rng: np.random.Generator) -> tuple[np.ndarray, list[np.ndarray]]:
    """Match the clients' neurons (J arrays of L_j x D) into one global layer; returns the global
    neurons (L x D posterior means) and each client's assignment (L_j global indices, injective)."""
    J = len(neurons)
    precision, precision0 = 1.0 / prior.sigma, 1.0 / prior.sigma0
    prior_sum = np.where(bias, prior.bias_mean, 0.0) * precision0
    scaled = [np.asarray(w, dtype=np.float64) * precision for w in neurons]
    order = sorted(range(J), key=lambda j: -scaled[j].shape[0])
    first = order[0]
    layer = _Global(prior_sum + scaled[first], np.ones(scaled[first].shape[0]))
    assignment: list[np.ndarray] = [np.zeros(0, dtype=np.int64)] * J
    assignment[first] = np.arange(scaled[first].shape[0])
    for j in order[1:]:
        assignment[j] = _add(layer, scaled[j], prior_sum, precision, precision0, prior, J)
    for _ in range(prior.sweeps):
        for j in rng.permutation(J):
            _remove(layer, scaled[j], assignment, int(j))
            assignment[j] = _add(layer, scaled[j], prior_sum, precision, precision0, prior, J)
    means = layer.sums / (precision0 + layer.counts * precision)[:, None]
    return means, assignment


def _add(layer: _Global, w: np.ndarray, prior_sum, precision, precision0, prior: Prior, J: int) -> np.ndarray:
    """Match one client's scaled neurons `w` into the global layer (growing it); returns its assignment."""
    from scipy.optimize import linear_sum_assignment  # here: scipy.optimize costs every run 0.3 s of start-up

    L = layer.sums.shape[0]
    p = precision0 + layer.counts * precision
    own, sums_sq = (w * w).sum(1), (layer.sums * layer.sums).sum(1)
    c = np.minimum(layer.counts, prior.popularity_cap)          # c <= J - 1: the client itself is out
    joined = (own[:, None] + 2.0 * (w @ layer.sums.T) + sums_sq[None, :]) / (p + precision)[None, :]
    gain_match = joined - (sums_sq / p)[None, :] + np.log(c / (J - c))[None, :]
    offered = min(w.shape[0], max(prior.max_width - L, w.shape[0] - L, 1))   # every neuron gets a column
    alone = ((w + prior_sum) ** 2).sum(1) / (precision0 + precision) - (prior_sum ** 2).sum() / precision0
    gain_new = alone[:, None] - 2.0 * np.log(np.arange(1, offered + 1))[None, :] + 2.0 * np.log(prior.gamma / J)
    rows, cols = linear_sum_assignment(np.hstack([gain_match, gain_new]), maximize=True)
    out = np.empty(w.shape[0], dtype=np.int64)
    existing = cols < L
    out[rows[existing]] = cols[existing]
    layer.sums[cols[existing]] += w[rows[existing]]
    layer.counts[cols[existing]] += 1
    fresh = rows[~existing][np.argsort(cols[~existing])]           # new neurons in column order
    out[fresh] = L + np.arange(len(fresh))
    layer.sums = np.vstack([layer.sums, prior_sum + w[fresh]])
    layer.counts = np.concatenate([layer.counts, np.ones(len(fresh))])
    return out


def _remove(layer: _Global, w: np.ndarray, assignment: list[np.ndarray], j: int) -> None:
    """Take client j out of the global layer; neurons only it held disappear and the others renumber."""
    mine = assignment[j]
    layer.sums[mine] -= w
    layer.counts[mine] -= 1
    keep = layer.counts > 0
    renumber = np.cumsum(keep) - 1
    layer.sums, layer.counts = layer.sums[keep], layer.counts[keep]
    for k in range(len(assignment)):
        if k != j:
            assignment[k] = renumber[assignment[k]]
