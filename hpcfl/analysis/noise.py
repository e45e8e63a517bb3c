"""The test set's share of a paired effect's uncertainty.

Every seed and both arms are scored on the same test examples: one sample, whose sampling error is
common to all the seeds and does not shrink with more of them. The spread of the paired effects over
seeds (hpcfl.analysis.paired's t-interval) measures what training's randomness does and cannot see
it; when the seeds happen to agree, that interval claims a precision no finite test set has.

The method is a variance decomposition rather than a paired bootstrap over seeds and examples: it is
exact and deterministic (hand-checkable; no resampling noise in a README's table), costs one pass over
the bits, and with no per-example bits it reduces to the t-interval itself. A run's figure is a sum
over test examples of each one's part: its recorded correctness (example/test_correct or
example/local_test_correct) averaged over the rounds the statistic reads (tables.chosen_rounds),
weighted as the metric weighs it, 1/N on the test set and 1/(cohort's clients x n_c) on client c's
local test set (round/personal_acc_mean is a mean of per-client accuracies, not a pooled one). For
each example i, D_i = the mean over pairs of (a_i - b_i), so the mean effect is sum_i D_i; taking the
examples as a random sample, stratified by client for the local test sets, its test-set variance is

    v_test = sum over strata c of n_c * Var_{i in c}(D_i)     (ddof 1; Var_i(d_i) / N on the test set)

Pairs of another split (data.seed) hold other local test examples: each split gives its own D and
v_test, and the splits' add, weighted by (its pairs / all pairs)^2. The interval then uses
v = s^2 / n + v_test with Welch-Satterthwaite's degrees of freedom (paired.interval). Both choices
err on the wide side: D_i's spread also holds the seeds' disagreement example by example (examples
one seed gets right and another wrong), which s^2 holds already where those flips are independent;
that share is not small (in the precision study's 5 seeds it is about all of v_test; simulated,
intervals cover 97-99 % rather than 95 %), and splits drawn apart from one test set put part of
their test noise into s^2 too. Subtracting the per-example variance over pairs / m would remove the
first, but with few seeds its estimate often drops below 0 and the interval collapses to the seeds'
alone exactly where they agree by chance, the case the test term is for: we keep the wide side.
"""
import numpy as np

# metric -> (its per-example correctness, the fixed array of its examples' count or counts per client)
BITS = {"round/test_acc": ("example/test_correct", "example/test_size"),
        "round/personal_acc_mean": ("example/local_test_correct", "example/local_test_sizes")}
NEEDS = (*(name for pair in BITS.values() for name in pair), "client/local_test_acc")   # what load() must keep


def example_parts(series: dict[str, np.ndarray], metric: str, rounds: np.ndarray):
    """(parts, strata): each test example's part in the run's figure over `rounds` (the parts sum to
    the figure) and its stratum (0 on the test set; the client on the local test sets). None when the
    run recorded no bits for `metric` (files written before them), or the figure read no round."""
    correct, size = BITS.get(metric, (None, None))
    if correct not in series or not len(rounds):
        return None
    sizes = series[size].astype(int)
    bits = np.unpackbits(series[correct][rounds].astype(np.uint8), axis=1, count=int(sizes.sum()))
    strata = np.repeat(np.arange(len(sizes)), sizes)
    if metric == "round/test_acc":
        return bits.mean(axis=0) / sizes.sum(), strata
    cohort = np.isfinite(series["client/local_test_acc"][rounds])                 # rounds x clients
    weight = cohort / (cohort.sum(axis=1, keepdims=True) * np.maximum(sizes, 1))   # 1 / (clients x n_c)
    return (bits * weight[:, strata]).mean(axis=0), strata


def test_variance(metric: str, pairs: list[tuple[object, tuple, tuple]]) -> list[tuple[float, int]]:
    """The test set's variance of the mean effect as independent (variance, degrees of freedom) terms,
    one per split and stratum; `pairs` holds (split, arm's example_parts, baseline's example_parts).
    The test set is the same examples whatever the split; a client's local test set is not."""
    splits: dict[object, list] = {}
    for split, (a, strata), (b, _) in pairs:
        splits.setdefault(None if metric == "round/test_acc" else split, []).append((a - b, strata))
    terms = []
    for members in splits.values():
        diff, strata = np.mean([d for d, _ in members], axis=0), members[0][1]
        share = len(members) / len(pairs)
        for stratum in np.unique(strata):
            d = diff[strata == stratum]
            if len(d) > 1:
                terms.append((share ** 2 * len(d) * float(np.var(d, ddof=1)), len(d) - 1))
    return terms
