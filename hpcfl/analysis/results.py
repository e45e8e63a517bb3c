"""Result files -> pandas. A folder of runs may mix finished, running, interrupted and crashed ones:
every readable file contributes its committed rounds and its status, and a file that cannot be read
is reported by name instead of stopping the analysis."""
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from hpcfl.config import NON_RESULT_KEYS, current_names, flatten
from hpcfl.errors import ResultsError
from hpcfl.metrics import read_run

MISSING = "(missing)"        # a group's value of a config key that its runs' configs lack (tables and figures)


def shown(value) -> str:
    """A config value as tables and figures show a group's: MISSING where the runs' configs lack the key
    (pandas gives NaN; a list-valued key stays a list)."""
    return MISSING if value is None or (isinstance(value, float) and np.isnan(value)) else str(value)


SEED_KEYS = ("run.seed", "data.seed", "run.name")        # what differs between the seeds of one setting


@dataclass
class Results:
    runs: pd.DataFrame            # one row per readable file: path, status, rounds, config keys ("algorithm.name", ...)
    series: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)   # path -> metric -> per-round values
    problems: list[str] = field(default_factory=list)                        # files not read, and why

    @property
    def incomplete(self) -> pd.DataFrame:
        return self.runs[~completed(self.runs)]


def completed(runs: pd.DataFrame) -> pd.Series:
    """Which runs ran every round; the others (diverged, interrupted, running) enter no figure."""
    return runs["status"] == "completed"


def find_files(paths) -> list[Path]:
    """The .h5 files named, and those under the folders named, sorted; a file named twice (a folder and
    a file in it, overlapping folders, a link) counts once, where first named: a twin would weigh its run
    twice in a group's mean, and pair with itself."""
    found = {}
    for path in map(Path, paths):
        for file in sorted(path.rglob("*.h5")) if path.is_dir() else [path]:
            found.setdefault(file.resolve(), file)
    return list(found.values())


def ran_with(attrs: dict) -> dict:
    """A run's job as the analysis groups and pairs it: what the job wrote (root attribute `config`),
    each parameter table replaced by its form resolved with the defaults (root attribute `resolved`,
    hpcfl.jobs.Resolved.tables), so that a run that left a default out and one that wrote it agree.
    Files from before `resolved` give what they wrote."""
    config = dict(current_names(attrs.get("config", {}), warn=False))
    for section, tables in attrs.get("resolved", {}).items():
        config[section] = {**config.get(section, {}), **tables}
    return config


def load(paths, metrics=("round/test_acc",), prefixes=()) -> Results:
    """Read the files (and folders) `paths`, keeping each run's datasets named in `metrics`
    ("round/test_acc", "final/feature_nmi", ...) and those whose names start with `prefixes`."""
    prefixes = tuple(prefixes)
    rows, series, problems = [], {}, []
    for path in find_files(paths):
        try:
            run = read_run(path)              # all of it, as `hpcfl status` does: a damaged file is refused by both
        except ResultsError as err:
            problems.append(str(err))
            continue
        ran = {k: str(v) if isinstance(v, list | dict) else v for k, v in flatten(ran_with(run.attrs)).items()}
        rows.append({"path": str(path), "status": run.attrs.get("status", "running"), "rounds": run.rounds, **ran})
        series[str(path)] = {name: np.atleast_1d(np.asarray(value, dtype=float)) for name, value in run.arrays.items()
                             if name in metrics or (prefixes and name.startswith(prefixes))}
    return Results(pd.DataFrame(rows), series, problems)


def bytes_exchanged(metrics: dict[str, np.ndarray]) -> np.ndarray:
    """Cumulative bytes sent and received up to each round, every payload and direction."""
    parts = [v for k, v in metrics.items()
             if k.startswith(("round/bytes_up/", "round/bytes_down/", "round/bytes_exchange/"))]
    return np.cumsum(np.nansum(parts, axis=0)) if parts else np.zeros(0)


PER_ROUND = ("round/", "client/", "rank/", "class/", "client_class/",     # arrays with one row per round
             "example/test_correct", "example/local_test_correct")


def truncate(results: Results, rounds: int | None = None, max_bytes: float | None = None) -> Results:
    """The runs cut to their first `rounds` rounds and to the rounds whose cumulative bytes (every
    payload, both directions; needs the round/bytes_* series loaded) stay within `max_bytes`: a
    comparison at equal rounds, or at equal communication, of runs that ran for different lengths. A
    run cut short loses the figures written after its last round (final/...): NaN."""
    series, kept = {}, []
    for path, count in zip(results.runs["path"], results.runs["rounds"], strict=True):
        metrics, keep = results.series[path], int(count)
        if rounds is not None:
            keep = min(keep, rounds)
        if max_bytes is not None:
            keep = min(keep, int(np.sum(bytes_exchanged(metrics) <= max_bytes)))
        series[path] = {k: v[:keep] if k.startswith(PER_ROUND) else
                        np.full_like(v, np.nan) if k.startswith("final/") and keep < count else v
                        for k, v in metrics.items()}
        kept.append(keep)
    return Results(results.runs.assign(rounds=kept), series, results.problems)


def _positions(shape: tuple) -> list:
    """Each entry's position in an array of `shape`: an int along one axis, a tuple along more."""
    return [e[0] if len(e) == 1 else e for e in np.ndindex(shape)]


def tidy(results: Results) -> pd.DataFrame:
    """One row per run x round x metric: path, round, metric, value, and the run's config keys. A metric
    with more values per round (client/*, rank/*, class/*: round x entry; client_class/*: round x client
    x class) gives a row per entry, its position in `index` (an int, or a tuple); per-round metrics
    have index -1. Only PER_ROUND arrays have a row per round: a figure written once after the last
    round (final/*) sits at the run's last committed round, beside that round's figures, and a fixed
    array (partition, example/local_test_sizes) has no round (<NA>; `round` is a nullable Int64) and a
    row per entry; a single value (final/feature_nmi, example/test_size) has index -1."""
    frames, last = [], dict(zip(results.runs["path"], results.runs["rounds"] - 1, strict=True))
    for path, metrics in results.series.items():
        for metric, values in metrics.items():
            if metric.startswith(PER_ROUND):
                index = [-1] if values.ndim == 1 else _positions(values.shape[1:])
                rounds, index = np.repeat(np.arange(len(values)), len(index)), index * len(values)
            else:
                final = metric.startswith("final/")
                index = [-1] if values.size == 1 else _positions(values.shape)
                rounds = [last[path] if final else pd.NA] * len(index)
            frames.append(pd.DataFrame({"path": path, "round": pd.array(rounds, dtype="Int64"),
                                        "metric": metric, "index": index,
                                        "value": values.reshape(-1)}))
    long = (pd.concat(frames, ignore_index=True) if frames
            else pd.DataFrame(columns=["path", "round", "metric", "index", "value"]))
    return long.merge(results.runs, on="path", how="left")


def varying_keys(runs: pd.DataFrame) -> list[str]:
    """The config keys whose value differs between runs, seeds and the keys that cannot change a run's
    numbers (hpcfl.config.NON_RESULT_KEYS: checkpointing, timeouts, threads, ...) aside: the natural grouping."""
    keys = [c for c in runs.columns if "." in c and c not in SEED_KEYS and c not in NON_RESULT_KEYS]
    return [k for k in keys if runs[k].astype(str).nunique(dropna=False) > 1]     # missing in some runs: a value too


def mixed_keys(runs: pd.DataFrame, by: list[str]) -> list[str]:
    """The keys of varying_keys outside `by` whose value differs within a group of `by`: a table or a
    line by `by` averages over their values, which a reader should be told."""
    groups = [group for _, group in runs.groupby(by, dropna=False)] if by else [runs]
    return [k for k in varying_keys(runs) if k not in by
            and any(group[k].astype(str).nunique(dropna=False) > 1 for group in groups)]
