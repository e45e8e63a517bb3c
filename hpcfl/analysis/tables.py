"""The papers' tables from loaded results, grouped by any config keys and aggregated over seeds:
final accuracy, its mean over the last k evaluations and its value at the best-validation round
(FedFM Tables II-III, FedCME Table II; any recorded metric, e.g. the final feature NMI of FedFM
Table IV), rounds to reach a target with the speed-up over a baseline (FedKA
Table 2), personalised accuracy across clients (FedClassAvg Table 2), the forgetting degree per
class (FedKA eq. 1), and where the time and bytes went; rendered as Markdown, CSV or LaTeX."""
import warnings

import numpy as np
import pandas as pd

from hpcfl.analysis.results import MISSING, PER_ROUND, Results, completed, shown
from hpcfl.data.splits import class_categories

SELECTION = ("round/val_acc", "max")   # what picks a run's round: the global model on the clients' held-out data
# the recorded metrics computed from test examples (hpcfl.runtime.loop, .report, .forgetting and the server's
# feature_quality): the global test set's, the clients' local test sets' and the personalised accuracy over them
TEST_METRICS = frozenset({
    "round/test_acc", "round/test_loss", "class/test_acc", "example/test_correct", "class/start_acc",
    "client/test_acc", "client/local_test_acc", "client/local_test_loss", "example/local_test_correct",
    "round/personal_acc_mean", "round/personal_acc_std", "client_class/test_acc", "client_class/forgetting",
    "final/feature_nmi", "final/feature_silhouette"})
ROLES = ("dominant", "non-dominant", "missing")        # FedKA Definition 1



def round_means(series: dict[str, np.ndarray], metric: str) -> np.ndarray | None:
    """A per-round metric as recorded; a round x client one (client/...) as its mean over the clients
    that have a value that round, the cohort (NaN in a round where none has). None if not recorded."""
    values = series.get(metric)
    if values is None or values.ndim == 1:
        return values
    present = np.isfinite(values)
    counts = present.sum(axis=1)
    return np.where(counts > 0, np.where(present, values, 0.0).sum(axis=1) / np.maximum(counts, 1), np.nan)


def _selected(evaluated: np.ndarray, key: np.ndarray | None, direction: str) -> np.ndarray:
    """The (first) evaluated round at which `key` is highest ("max") or lowest ("min"), among the rounds
    that have it; none without it."""
    if key is None:
        return evaluated[:0]
    both = evaluated[evaluated < len(key)]
    both = both[np.isfinite(key[both])]
    if not len(both):
        return both
    pick = np.argmax(key[both]) if direction == "max" else np.argmin(key[both])
    return both[pick:pick + 1]


STATISTICS = ("final", "last", "best_val", "selected", "rounds")


def on_test_data(metric: str) -> bool:
    """Whether `metric` is computed from test examples: one of TEST_METRICS, or any name with "test" in it
    (a plug-in's metric too)."""
    return metric in TEST_METRICS or "test" in metric


def selection_rule(select: tuple[str, str]) -> str:
    """The `selected` figure's rule in words, for a table's legend; a rule on a metric of test data
    (on_test_data) says that it selects on test data (what some papers' code does; never hpcfl's default)."""
    on, direction = select
    warning = ": a selection on test data, optimistic" if on_test_data(on) else ""
    return f"selected: at the round of the {direction} of {on}{warning}"


def chosen_rounds(series: dict[str, np.ndarray], stat: str, metric: str, last: int = 10,
                  select: tuple[str, str] | None = None) -> np.ndarray:
    """The rounds whose values of `metric` a run's figure averages (one round, or the last k): the last
    evaluated round ("final"), the last `last` evaluated ("last": less noisy than one round), the round
    of highest round/val_acc ("best_val": selecting on the test accuracy itself would flatter every
    method) or the round `select` = (metric, "min" | "max") picks ("selected"; a client/... metric by its
    cohort mean). The figure's per-example parts (hpcfl.analysis.noise) are read at the same rounds."""
    values = round_means(series, metric)
    evaluated = np.flatnonzero(np.isfinite(values))
    if stat == "final":
        return evaluated[-1:]
    if stat == "last":
        return evaluated[-last:]
    if stat in ("best_val", "selected"):
        on, direction = SELECTION if stat == "best_val" else select
        key = round_means(series, on)
        return _selected(evaluated, key, direction)
    raise ValueError(f"statistic {stat!r}: choose one of {list(STATISTICS)}")


def _first_reaching(values: np.ndarray, target: float) -> float:
    """The 1-based round whose value first reaches `target`, NaN if none does."""
    hits = np.flatnonzero(np.nan_to_num(values, nan=-np.inf) >= target)
    return float(hits[0] + 1) if len(hits) else np.nan


def statistic(series: dict[str, np.ndarray], stat: str, metric: str, last: int = 10,
              target: float | None = None, select: tuple[str, str] | None = None) -> float:
    """One run's figure for `metric` (a client/... metric by its cohort mean): its mean over chosen_rounds,
    or the rounds to reach `target` (NaN if never); NaN where the metric, or the selection's, was not
    recorded. A figure written once after the last round (final/...) is its run's "final" figure and
    has no round to select: NaN for the other statistics."""
    if stat == "selected" and select is None:
        raise ValueError("the selected statistic needs the round's rule (--select-on METRIC [--select min|max])")
    if stat == "rounds" and metric.endswith("loss"):
        raise ValueError(f"rounds to a target count rounds until {metric} >= the target, which a falling loss "
                         "never means; use an accuracy")
    if stat == "rounds" and target is None:
        raise ValueError("the rounds statistic needs a target (--target)")
    if metric not in series or (not metric.startswith(PER_ROUND) and stat != "final"):
        return np.nan
    if stat == "rounds":
        return _first_reaching(round_means(series, metric), target)
    rounds = chosen_rounds(series, stat, metric, last, select)
    return float(round_means(series, metric)[rounds].mean()) if len(rounds) else np.nan


def _per_run_stat(results: Results, stat: str, metric: str, **options) -> pd.Series:
    return results.runs["path"].map(lambda p: statistic(results.series[p], stat, metric, **options))


def summary(results: Results, by: list[str], metric: str = "round/test_acc", last: int = 10,
            select: tuple[str, str] | None = None) -> pd.DataFrame:
    """Per group of `by` keys: runs, then the final `metric`, its mean over the last `last` evaluated
    rounds (all of them in a run that evaluated fewer) and (runs with data.validation_fraction > 0) its
    value at the best-validation round, each as mean and std (ddof 0; none for one run, whose 0 would
    read as agreement) over the group's completed runs; with `select` (chosen_rounds), its value at
    that rule's round too. No column selects on the test accuracy unless `select` asks. When a run did
    not complete (diverged, interrupted, still running) a column `unfinished` counts them per group:
    their truncated series enter no figure, and leaving them out silently would flatter. A figure that
    some completed runs lack (best_val without validation) gets its count beside it (`best_val_n`)."""
    stats = {"final": "final", f"last{last}": "last", "best_val": "best_val",
             **({"selected": "selected"} if select else {})}
    runs, unfinished = _finished_only(results.runs.assign(**{
        name: _per_run_stat(results, stat, metric, last=last, select=select) for name, stat in stats.items()}),
        list(stats))
    for name in (f"last{last}", "best_val"):        # no validation, or a figure written once (final/...)
        if not runs[name].notna().any():
            del stats[name]
    table = _grouped(runs, by).agg(runs=("path", "size"), **unfinished,
                                   **{f"{name}_{fn}": (name, agg) for name in stats
                                      for fn, agg in (("mean", "mean"), ("std", _spread), ("n", "count"))})
    done = table["runs"] - table.get("unfinished", 0)
    lacking = [name for name in stats if (table[f"{name}_n"] != done).any()]
    table = table.drop(columns=[f"{name}_n" for name in stats if name not in lacking])
    counted = "; _n: the runs behind a figure that some completed runs lack" if lacking else ""
    rule = f"; {selection_rule(select)}" if select else ""
    table = table.reset_index()
    table.attrs["legend"] = (f"{metric}: mean ± population std (ddof 0) over each group's completed runs"
                             f"{counted}{rule}")
    return table


def _spread(values: pd.Series) -> float:
    """The population std (ddof 0) of a group's figures; NaN for fewer than two, where 0 would read as
    runs that agree."""
    return values.std(ddof=0) if values.count() > 1 else np.nan


def _finished_only(runs: pd.DataFrame, columns: list[str]) -> tuple[pd.DataFrame, dict]:
    """`runs` with their figures in `columns` blanked where a run did not complete (diverged,
    interrupted, still running: a truncated series has no final figure, and one still running has not
    yet reached a target), and, when there is such a run, the aggregation that counts them per group
    (`unfinished`): leaving them out silently would flatter."""
    done = completed(runs)
    runs = runs.assign(unfinished=(~done).astype(int))
    runs.loc[~done, columns] = np.nan
    return runs, ({} if done.all() else {"unfinished": ("unfinished", "sum")})


def rounds_to_target(results: Results, target: float, by: list[str], baseline: dict | None = None,
                     metric: str = "round/test_acc") -> pd.DataFrame:
    """Per group: runs, how many of the completed ones reached `target`, their mean rounds to it, and
    the speed-up when `baseline` ({key: value}, keys among `by`) names the reference: each group's is
    over the baseline group that shares its other keys (fedprox at beta 0.1 over fedavg at beta 0.1)."""
    runs, unfinished = _finished_only(
        results.runs.assign(to_target=_per_run_stat(results, "rounds", metric, target=target)), ["to_target"])
    table = _grouped(runs, by).agg(runs=("path", "size"), **unfinished, reached=("to_target", "count"),
                                   rounds_mean=("to_target", "mean")).reset_index()
    if baseline:
        outside = [k for k in baseline if k not in by]
        if outside:
            raise ValueError(f"--baseline key {outside[0]!r} is not a grouping key {by}: add it to --by (a key "
                             "with one value in every run is not grouped by default)")
        chosen = np.logical_and.reduce([table[k].astype(str) == str(v) for k, v in baseline.items()])
        if not chosen.any():
            raise ValueError(f"no group matches the baseline {baseline}; groups: {table[by].to_dict('records')}")
        # a key the baseline lacks (a parameter of the other groups' algorithm only, as FedProx's mu against
        # FedAvg): its groups all take the one baseline
        others = [k for k in by if k not in baseline and table.loc[chosen, k].notna().any()]
        reference = table.loc[chosen, [*others, "rounds_mean"]].rename(columns={"rounds_mean": "reference"})
        matched = (table[others].merge(reference, on=others, how="left")["reference"] if others
                   else reference["reference"].iloc[0])
        table["speedup"] = np.asarray(matched, dtype=float) / table["rounds_mean"]
    return table


def _grouped(runs: pd.DataFrame, by: list[str]):
    return runs.groupby(by, dropna=False) if by else runs.assign(all="all").groupby("all")    # sorted by key


def personalised(results: Results, by: list[str]) -> pd.DataFrame:
    """Per group: the final mean personalised accuracy over the cohort's clients and its std across
    clients, each averaged over the group's completed runs (`unfinished` counts the others)."""
    stats = {name: _per_run_stat(results, "final", f"round/personal_acc_{stat}")
             for name, stat in (("personal_mean", "mean"), ("std_across_clients", "std"))}
    runs, unfinished = _finished_only(results.runs.assign(**stats), list(stats))
    return _grouped(runs, by).agg(runs=("path", "size"), **unfinished, personal_mean=("personal_mean", "mean"),
                                  std_across_clients=("std_across_clients", "mean")).reset_index()


def _nanmean(values, axis=None):
    """np.nanmean, NaN without a warning where no value is a number (a class role no client has, a
    class no sampled client was measured on)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(values, axis=axis)


def _nanmedian(values):
    """np.nanmedian of all values, NaN without a warning where none is a number."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmedian(values)


def forgetting(results: Results, by: list[str], gamma: float | None = None) -> pd.DataFrame:
    """Per group: FedKA's forgetting degree (eq. 1) per class, averaged over rounds and sampled clients,
    then over the group's runs (runs made with eval.forgetting); and per class role of Definition 1
    (observation 1): over each client's dominant (training share >= gamma, default 1/classes),
    non-dominant and missing classes, read from the run's partition, as the mean and the median of the
    role's (round, client, class) values. Eq. 1 is unbounded below (a class the starting model scored 0
    on and the trained one 0.3 gives -300), so a few such values can carry a mean; the median cannot.
    A run that did not complete is left out and counted (`unfinished`), as in `summary`."""
    runs = results.runs.assign(done=completed(results.runs))
    rows, any_unfinished = [], not runs["done"].all()
    for key, group in _grouped(runs, by):
        per_class, per_role, unfinished = [], [], 0
        for path, done in zip(group["path"], group["done"], strict=True):
            series = results.series[path]
            if "client_class/forgetting" not in series:
                continue
            if not done:
                unfinished += 1
                continue
            degree = series["client_class/forgetting"]                         # rounds x clients x classes
            per_class.append(_nanmean(degree, axis=(0, 1)))
            counts = series.get("partition")
            if counts is not None:
                masks = class_categories(counts, gamma or 1.0 / counts.shape[1])
                per_role.append([average(degree[:, m]) for average in (_nanmean, _nanmedian) for m in masks])
        if per_class or unfinished:
            roles = _nanmean(per_role, axis=0) if per_role else [np.nan] * 6
            # strict=False: with no `by`, _grouped keys the one group "all", which names no column
            rows.append({**dict(zip(by, key if isinstance(key, tuple) else (key,), strict=False)),
                         "runs": len(per_class),
                         **({"unfinished": unfinished} if any_unfinished else {}),
                         **{f"class {c}": v for c, v in enumerate(np.mean(per_class, axis=0) if per_class else [])},
                         "all classes": float(_nanmean(per_class)) if per_class else np.nan,
                         **dict(zip(ROLES + tuple(f"{role} median" for role in ROLES), roles, strict=True))})
    return pd.DataFrame(rows)


def _time_and_bytes_of(metrics: dict[str, np.ndarray]) -> dict[str, float]:
    """One run's seconds per round in each phase, compute and wait seconds summed over ranks (means over
    its committed rounds), and MB of each payload (sums)."""
    row = {f"{k.removeprefix('round/phase_s/')} s": np.nanmean(v) for k, v in metrics.items()
           if k.startswith("round/phase_s/")}
    for name in ("compute_s", "wait_s"):
        if f"rank/{name}" in metrics:
            row[f"{name} (all ranks)"] = np.nanmean(metrics[f"rank/{name}"].sum(axis=1))
    row.update({f"{k.removeprefix('round/bytes_')} MB": np.nansum(v) / 1e6 for k, v in metrics.items()
                if k.startswith("round/bytes_")})
    return row


def time_and_bytes(results: Results, by: list[str]) -> pd.DataFrame:
    """Per group, means over runs: seconds per round in each phase, compute and wait seconds summed over
    ranks (every run's committed rounds: a round costs the same whether the run went on), and MB per
    run of each payload (up, down, client to client) over the completed runs only, since a run stopped
    early sent less; `unfinished` counts the others, as in `summary`."""
    figures = pd.DataFrame([_time_and_bytes_of(results.series[p]) for p in results.runs["path"]],
                           index=results.runs.index)
    runs, unfinished = _finished_only(results.runs.join(figures), [c for c in figures if c.endswith(" MB")])
    return _grouped(runs, by).agg(runs=("path", "size"), **unfinished,
                                  **{c: (c, "mean") for c in figures}).reset_index()


def _cell(value, config_key: bool) -> str:
    """One value as text: a number to 4 decimals, a config key's (train.lr) too where that is exact, else
    in full, so that groups of 1e-05 and 4e-05 stay apart; a config key's that some runs lack is
    (missing), not nan."""
    if config_key and shown(value) == MISSING:
        return MISSING
    if not isinstance(value, float):
        return str(value)
    fixed = f"{value:.4f}"
    return str(value) if config_key and float(fixed) != value else fixed


def _cells(table: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """Column names and text cells, "mean ± std" pairs merged (the mean alone where it has no spread:
    one run)."""
    columns, cells = [], []
    for name in table.columns:
        if name.endswith("_std") and name[:-4] + "_mean" in table.columns:
            continue
        if name.endswith("_mean") and name[:-5] + "_std" in table.columns:
            std = table[name[:-5] + "_std"]
            cells.append([f"{m:.4f}" if np.isnan(s) and not np.isnan(m) else f"{m:.4f} ± {s:.4f}"  # one run
                          for m, s in zip(table[name], std, strict=True)])
            columns.append(name[:-5])
        else:
            cells.append([_cell(v, config_key="." in name) for v in table[name]])
            columns.append(name)
    return columns, [list(row) for row in zip(*cells, strict=True)]


# text -> LaTeX, one character at a time (so that no replacement's backslash or brace is escaped again)
LATEX = str.maketrans({"\\": r"\textbackslash{}", "{": r"\{", "}": r"\}", "%": r"\%", "&": r"\&", "#": r"\#",
                       "$": r"\$", "^": r"\textasciicircum{}", "~": r"\textasciitilde{}", "_": r"\_", "±": r"$\pm$"})


def render(table: pd.DataFrame, fmt: str = "md") -> str:
    """The table as Markdown ("md"), CSV (raw numbers) or LaTeX (a tabular). The table's legend
    (attrs["legend"]: what its "±" means) follows a Markdown table after a blank line, a LaTeX one as
    a comment; CSV names its columns _mean and _std."""
    if fmt == "csv":
        return table.to_csv(index=False)
    columns, rows = _cells(table)
    legend = table.attrs.get("legend")
    if fmt == "md":
        lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        lines += ["| " + " | ".join(r) + " |" for r in rows] + (["", legend] if legend else [])
        return "\n".join(lines) + "\n"
    if fmt == "latex":
        lines = [r"\begin{tabular}{" + "l" * len(columns) + "}", r"\hline",
                 " & ".join(c.translate(LATEX) for c in columns) + r" \\", r"\hline"]
        lines += [" & ".join(c.translate(LATEX) for c in r) + r" \\" for r in rows]
        return "\n".join(lines + [r"\hline", r"\end{tabular}"] + ([f"% {legend}"] if legend else [])) + "\n"
    raise ValueError(f"format {fmt!r}: choose md, csv or latex")
