"""Paired comparisons: does arm A beat the baseline B, by how much, and can these runs tell?

Runs are paired when they differ only in the compared arm: the same values of every other key that
varies within an arm (a grid key; a key fixed within each arm, such as algorithm.name across
run.arm's arms, describes the arm) and the same seeds (run.seed and the split's data.seed). Pairing
removes what the seed does to both arms alike (the split, the initialisation, the cohorts), which for
FL on non-IID splits is often larger than the effect under study. Per group and arm the table gives
the paired differences' mean, std and number n, a 95 % interval for the mean, and a verdict: `better`
or `worse` when the interval excludes no-effect, `inconclusive` when it contains it (or n < 2); the
interval's half-width is the effect these runs would resolve half the time (4 times in 5 takes about
(t_.975 + t_.80) / t_.975 of it: 1.25 at 3 seeds, 1.34 at 5). The interval is a
t-interval over the seeds, widened by the test set's own sampling error where the runs recorded
their per-example correctness (hpcfl.analysis.noise), which no number of seeds averages away.

The statistic of each run is one of hpcfl.analysis.tables.STATISTICS: the final evaluated value, the
mean of the last k, the value at the best-validation round or at a given rule's round
(tables.chosen_rounds), or the rounds to reach a target; for
rounds the per-pair figure is the speed-up (baseline rounds / arm rounds, no-effect 1), for the others
the difference arm - baseline (no-effect 0). Lower is better for metrics whose name ends in "loss".
"""
import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from hpcfl.analysis.noise import BITS, example_parts, test_variance
from hpcfl.analysis.results import Results, completed, shown, varying_keys
from hpcfl.analysis.tables import chosen_rounds, selection_rule, statistic

PAIR_KEYS = ("run.seed", "data.seed")
LEGEND = {False: "effect: mean ± sample std (ddof 1) over the pairs of seeds of arm - baseline; ci95: the 95 % "
                 "interval of the mean, over seeds and, where test_se is given, the test set's examples",
          True: "effect: mean ± sample std (ddof 1) over the pairs of seeds of the speed-up (baseline rounds / arm "
                "rounds); ci95: the 95 % t-interval of the mean over seeds"}       # by stat == "rounds"


def _split_seed(runs: pd.DataFrame) -> pd.Series:
    """The seed each run split its data with: data.seed, or run.seed where data.seed is -1 (or absent:
    files written before data.seed existed split with run.seed)."""
    if "data.seed" not in runs:
        return runs["run.seed"]
    own = runs["data.seed"].fillna(-1).astype(int)
    return own.where(own != -1, runs["run.seed"])


def interval(effects: np.ndarray, terms: list[tuple[float, int]] = (),
             confidence: float = 0.95) -> tuple[float, float, float, float]:
    """(mean, std, low, high) of the mean of paired effects: Student's t-interval over the seeds, widened
    by the independent `terms` ((variance, degrees of freedom): the test set's, hpcfl.analysis.noise)
    to a t-interval on s^2 / n + their variances with Welch-Satterthwaite's degrees of freedom. Never
    narrower than the seeds' own: with few seeds and a well-known test term Welch-Satterthwaite's degrees
    of freedom grow faster than the variance, which would make more noise read as more certainty. NaN
    bounds for n < 2 (the seeds' variance unknown). `std` is the effects' sample std over seeds."""
    n = len(effects)
    mean = float(np.mean(effects)) if n else np.nan
    if n < 2:
        return mean, np.nan, np.nan, np.nan
    std = float(np.std(effects, ddof=1))
    quantile = 0.5 + confidence / 2
    half = float(scipy_stats.t.ppf(quantile, n - 1)) * std / np.sqrt(n)
    parts = [(std ** 2 / n, n - 1), *terms]
    variance, spread = sum(v for v, _ in parts), sum(v ** 2 / df for v, df in parts)
    if terms and spread > 0:
        half = max(half, float(scipy_stats.t.ppf(quantile, variance ** 2 / spread)) * np.sqrt(variance))
    return mean, std, mean - half, mean + half


def _test_terms(results: Results, figure: tuple, index, arm_paths, base_paths) -> list[tuple[float, int]] | None:
    """The test set's variance terms of these pairs' mean effect (hpcfl.analysis.noise), each run's
    example parts read at the rounds its figure (stat, metric, last, select) reads; None when a run
    recorded no bits."""
    stat, metric, last, select = figure
    pairs = []
    for (_, split), *paths in zip(index, arm_paths, base_paths, strict=True):
        parts = [example_parts(results.series[p], metric, chosen_rounds(results.series[p], stat, metric, last, select))
                 for p in paths]
        if any(part is None for part in parts):
            return None
        pairs.append((split, *parts))
    return test_variance(metric, pairs)


def verdict(low: float, high: float, null: float, higher_is_better: bool) -> str:
    if not np.isfinite(low) or low <= null <= high:           # the bounds are both finite or both NaN
        return "inconclusive"
    return "better" if (low > null) == higher_is_better else "worse"


def _over(call: str, used: int, pairs: int) -> str:
    """A decisive verdict says when it is over fewer than all its pairs: where it is read, not only in n."""
    return call if call == "inconclusive" or used == pairs else f"{call} (over {used} of {pairs} pairs)"


def _test_noise(results: Results, figure: tuple, pairs, mine: pd.DataFrame, base: pd.DataFrame) -> tuple[tuple, dict]:
    """The test set's terms of the interval for `pairs` (`_test_terms`), and the `test_se` column: none
    for the rounds statistic or a metric without per-example bits; "not recorded" when a run lacks them."""
    stat, metric = figure[:2]
    if stat == "rounds" or metric not in BITS:
        return (), {}
    if not len(pairs):
        return (), {"test_se": np.nan}
    found = _test_terms(results, figure, pairs, mine.loc[pairs, "path"], base.loc[pairs, "path"])
    return found or (), {"test_se": "not recorded" if found is None else float(np.sqrt(sum(v for v, _ in found)))}


def _counts(mine_done, base_done, kept: np.ndarray, unfinished: bool, stat: str) -> dict:
    """n, the pairs with an effect, and beside it what it leaves out: the pairs an unfinished run
    spoils (when any run is unfinished) and, for the rounds statistic, the completed pairs in which a
    run never reached the target."""
    done = mine_done.to_numpy() & base_done.to_numpy()
    return {"n": int(kept.sum()), **({"unfinished": int((~done).sum())} if unfinished else {}),
            **({"not_reached": int((done & ~kept).sum())} if stat == "rounds" else {})}


def _baseline_of(base_runs: pd.DataFrame, group: dict) -> pd.DataFrame:
    """The baseline's runs of a group: those with its value of every group key they have. A key they
    lack (a parameter of the other arms' algorithm only, such as FedProx's mu against FedAvg) leaves the
    baseline the same in each of its groups."""
    match = np.ones(len(base_runs), dtype=bool)
    for key, value in group.items():
        if base_runs[key].notna().any():
            match &= (base_runs[key].map(shown) == shown(value)).to_numpy()
    return base_runs[match]


def _refuse_twins(runs: pd.DataFrame) -> None:
    twins = runs[runs.duplicated(["#arm", *PAIR_KEYS], keep=False)]
    if len(twins):
        raise ValueError(f"runs {sorted(twins['path'])} share every compared key and seed, so none can be paired; "
                         "name the key that tells them apart with --by, or analyse them apart")


def compare(results: Results, baseline: dict, stat: str = "final", metric: str = "round/test_acc",
            last: int = 10, target: float | None = None, by: list[str] | None = None,
            select: tuple[str, str] | None = None) -> tuple[pd.DataFrame, list[str]]:
    """Per group of `by` keys (default: every other key that varies) and arm, the paired effect of the
    arm over `baseline` ({key: value}, one key). Returns the table and the runs that found no partner.
    A pair in which either run did not complete (diverged, interrupted, running) gives no effect; when
    there is such a pair, a column `unfinished` counts them beside n. With stat "rounds", a completed
    pair in which a run never reached the target has no speed-up either: `not_reached` counts them
    (the speed-up is over the pairs that both reached it, which flatters an arm that often fails). A
    `better` or `worse` over fewer than all its pairs says so: "better (over 3 of 4 pairs)".
    For a metric with per-example bits (hpcfl.analysis.noise.BITS) and a statistic other than rounds,
    a column `test_se` gives the test set's standard error of the mean effect, which the interval
    includes, or `not recorded` where a run of the pairs has no bits (files written before them): then
    the interval is the seeds' alone."""
    if len(baseline) != 1:
        raise ValueError(f"--baseline names one KEY=VALUE, got {baseline}")
    (key, reference), = baseline.items()
    runs = results.runs
    if key not in runs:
        raise ValueError(f"--baseline key {key!r} is not a config key of these runs")
    runs = runs.assign(**{"data.seed": _split_seed(runs), "#arm": runs[key].map(shown), "#done": completed(runs),
                          "#value": [statistic(results.series[p], stat, metric, last, target, select)
                                     for p in runs["path"]]})
    runs.loc[~runs["#done"], "#value"] = np.nan       # a truncated series has no final figure
    if not (runs["#arm"] == str(reference)).any():
        raise ValueError(f"no run has {key} = {reference}; values: {sorted(runs['#arm'].unique())}")
    arm_of = runs.groupby("#arm")
    varying = [k for k in varying_keys(results.runs) if k != key]
    groups = [k for k in by or [k for k in varying           # a key fixed within every arm describes the arm
                                if not (arm_of[k].agg(lambda v: v.astype(str).nunique(dropna=False)) == 1).all()]
              if k != key]
    base_runs, arms = runs[runs["#arm"] == str(reference)], runs[runs["#arm"] != str(reference)]
    higher_is_better = not metric.endswith("loss")          # an accuracy, or a speed-up
    null = 1.0 if stat == "rounds" else 0.0
    rows, unpaired, partnered = [], [], set()
    unfinished = not runs["#done"].all()
    for values, group in (arms.groupby(groups, dropna=False) if groups else [((), arms)]):     # keys as tuples
        base_group = _baseline_of(base_runs, dict(zip(groups, values, strict=True)))
        _refuse_twins(pd.concat([group, base_group]))
        base = base_group.set_index(list(PAIR_KEYS))
        for arm, runs_of_arm in group.groupby("#arm"):
            mine = runs_of_arm.set_index(list(PAIR_KEYS))
            shared = mine.index.intersection(base.index)
            partnered |= set(base.loc[shared, "path"])
            unpaired += [p for i, p in zip(mine.index, mine["path"], strict=True) if i not in shared]
            a, b = mine.loc[shared, "#value"].to_numpy(float), base.loc[shared, "#value"].to_numpy(float)
            effects = b / a if stat == "rounds" else a - b
            kept = np.isfinite(effects)
            terms, noise = _test_noise(results, (stat, metric, last, select), shared[kept], mine, base)
            mean, std, low, high = interval(effects[kept], terms)
            rows.append({**dict(zip(groups, values, strict=True)), key: arm,
                         **_counts(mine.loc[shared, "#done"], base.loc[shared, "#done"], kept, unfinished, stat),
                         "effect_mean": mean, "effect_std": std, **noise, "ci95_low": low, "ci95_high": high,
                         "verdict": _over(verdict(low, high, null, higher_is_better), int(kept.sum()), len(shared))})
    unpaired += [p for p in base_runs["path"] if p not in partnered]
    table = pd.DataFrame(rows)
    table.attrs["legend"] = LEGEND[stat == "rounds"] + (f"; {selection_rule(select)}" if stat == "selected" else "")
    # keys set per arm beyond its algorithm: the effect is of the arm with them, not of the algorithm alone
    table.attrs["also_differ"] = [k for k in varying if k not in groups and not k.startswith(("algorithm.", "run.arm"))]
    return table, sorted(unpaired)
