"""Figures from loaded results (matplotlib, no display needed): accuracy against rounds or against
bytes exchanged with a band of ± one std over each group's runs (FedMA Fig. 2, FedFM-Lite Fig. 7), and
a run's partition as a client x class heat map (FedKA Fig. 7, FedClassAvg Figs. 2-3).

Figures are made with matplotlib's object-oriented API (`Figure`, whose `savefig` picks the canvas for
the file's format), never through pyplot: importing this module leaves a notebook's backend and its
open figures alone."""
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from hpcfl.analysis.results import PER_ROUND, Results, bytes_exchanged, completed, shown
from hpcfl.analysis.tables import round_means

# what a recorded metric's name means, for an axis; any other key is shown as its own words
WORDS = {"test_acc": "test accuracy", "test_loss": "test loss", "train_loss": "training loss",
         "val_acc": "validation accuracy", "val_loss": "validation loss",
         "personal_acc_mean": "personalised accuracy (mean over clients)", "local_test_acc": "local test accuracy"}


def axis_label(metric: str) -> str:
    """'round/test_acc' -> 'test accuracy'; a client/... metric is its cohort's mean that round."""
    family, _, name = metric.partition("/")
    words = WORDS.get(name, name.replace("_", " ").replace("/", " "))
    return f"{words} (cohort mean)" if family == "client" else words


def group_label(key) -> str:
    """A group's values as the legend shows them; a key that some runs' configs lack is MISSING, as in
    the tables (the grouping keeps those runs: dropna=False)."""
    return ", ".join(map(shown, key if isinstance(key, tuple) else (key,)))


def save(fig: Figure, out: Path) -> Path:
    """`fig` written to `out` in the format its suffix names, its folder made if need be; a ValueError
    names a suffix matplotlib cannot write."""
    out = Path(out)
    if out.suffix[1:].lower() not in fig.canvas.get_supported_filetypes():
        raise ValueError(f"{out}: matplotlib writes no figure as {out.suffix or 'a file without a suffix'!r}; "
                         "name it .png, .svg or .pdf")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    return out


def curves(results: Results, by: list[str], out: Path, metric: str = "round/test_acc", x: str = "round") -> Path:
    """`curve_figure` saved to `out` (`save`)."""
    return save(curve_figure(results, by, metric, x), out)


def curve_figure(results: Results, by: list[str], metric: str = "round/test_acc", x: str = "round") -> Figure:
    """One line per group of `by` keys: the mean of `metric` over its completed runs (as in the tables:
    one still running would cut its group's line short) against the round (1-based) or the cumulative
    MB exchanged (x = "bytes": up, down and client to client, bytes_exchanged), with a band of ± one
    population std over the group's runs, to the shortest run's length; rounds without a value are
    skipped. Raises ValueError, naming what is missing, when there is nothing to draw (no completed run
    recorded `metric`, or the bytes for x = "bytes"), and when `metric` is not recorded per round (final/...,
    a fixed array): a line against rounds would invent rounds for it."""
    if not metric.startswith(PER_ROUND):
        raise ValueError(f"{metric} is not recorded per round, so it has no curve: --metric of curves takes a "
                         "round/... or client/... array (a final/... figure, written once after the last round, "
                         "is per group in `hpcfl analyze table --metric final/...`)")
    fig = Figure(figsize=(6, 4.4))
    ax = fig.add_subplot()
    done = results.runs[completed(results.runs)]
    for key, group in done.groupby(by, sort=True, dropna=False) if by else [("all", done)]:
        runs = [results.series[p] for p in group["path"] if metric in results.series[p]]
        if x == "bytes":
            runs = [r for r in runs if bytes_exchanged(r).size]
        if not runs:
            continue
        length = min(len(r[metric]) for r in runs)
        values = np.stack([round_means(r, metric)[:length] for r in runs])
        if x == "bytes":
            xs = np.mean([bytes_exchanged(r)[:length] for r in runs], axis=0) / 1e6
        else:
            xs = np.arange(1, length + 1)
        shown = np.isfinite(values).all(axis=0)
        if not shown.any():
            continue
        mean, std = values[:, shown].mean(0), values[:, shown].std(0)
        ax.plot(xs[shown], mean, label=f"{group_label(key)} ({len(runs)} run{'s' * (len(runs) > 1)})")
        ax.fill_between(xs[shown], mean - std, mean + std, alpha=0.2)
    if not ax.lines:
        wanted = f"{metric} with the bytes exchanged (round/bytes_*)" if x == "bytes" else metric
        raise ValueError(f"nothing to draw: none of the {len(done)} completed runs (of {len(results.runs)}) "
                         f"recorded {wanted} in a round; --metric takes a round/... or client/... array of the "
                         "result files")
    ax.set_xlabel("MB exchanged (every payload and direction, cumulative)" if x == "bytes" else "round")
    if x == "round":
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(axis_label(metric))
    ax.set_title(f"{metric}: line = mean over each group's runs, band = ± 1 std (ddof 0)", fontsize="small")
    ax.legend(fontsize="small", title=", ".join(by) if by else None, title_fontsize="small")
    fig.tight_layout()
    return fig


def partition_heatmap(counts: np.ndarray, out: Path, title: str = "") -> Path:
    """`heatmap_figure` saved to `out` (`save`)."""
    return save(heatmap_figure(counts, title), out)


def heatmap_figure(counts: np.ndarray, title: str = "") -> Figure:
    """Samples per client (rows) and class (columns)."""
    fig = Figure(figsize=(max(4, counts.shape[1] * 0.4 + 2), max(3, counts.shape[0] * 0.25 + 1)))
    ax = fig.add_subplot()
    image = ax.imshow(counts, aspect="auto", cmap="viridis")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(MaxNLocator(integer=True))
    fig.colorbar(image, ax=ax, label="samples")
    ax.set_xlabel("class")
    ax.set_ylabel("client")
    ax.set_title(title)
    fig.tight_layout()
    return fig
