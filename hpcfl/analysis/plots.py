"""Figures from loaded results (matplotlib, no display needed): accuracy against rounds or against
bytes exchanged with a band of ± one std over seeds (FedMA Fig. 2, FedFM-Lite Fig. 7), and a run's
partition as a client x class heat map (FedKA Fig. 7, FedClassAvg Figs. 2-3)."""
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from hpcfl.analysis.results import Results, bytes_exchanged  # noqa: E402


def curves(results: Results, by: list[str], out: Path, metric: str = "round/test_acc", x: str = "round") -> Path:
    """One line per group of `by` keys: the mean of `metric` over its runs against the round (1-based)
    or the cumulative MB exchanged (x = "bytes"), with a ± std band; rounds without a value are skipped."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, group in results.runs.groupby(by, sort=True) if by else [("all", results.runs)]:
        runs = [results.series[p] for p in group["path"] if metric in results.series[p]]
        if not runs:
            continue
        length = min(len(r[metric]) for r in runs)
        values = np.stack([r[metric][:length] for r in runs])
        if x == "bytes":
            xs = np.mean([bytes_exchanged(r)[:length] for r in runs], axis=0) / 1e6
        else:
            xs = np.arange(1, length + 1)
        shown = np.isfinite(values).all(axis=0)
        mean, std = values[:, shown].mean(0), values[:, shown].std(0)
        label = ", ".join(map(str, key)) if isinstance(key, tuple) else str(key)
        ax.plot(xs[shown], mean, label=label)
        ax.fill_between(xs[shown], mean - std, mean + std, alpha=0.2)
    ax.set_xlabel("MB exchanged" if x == "bytes" else "round")
    ax.set_ylabel(metric)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return Path(out)


def partition_heatmap(counts: np.ndarray, out: Path, title: str = "") -> Path:
    """Samples per client (rows) and class (columns)."""
    fig, ax = plt.subplots(figsize=(max(4, counts.shape[1] * 0.4 + 2), max(3, counts.shape[0] * 0.25 + 1)))
    image = ax.imshow(counts, aspect="auto", cmap="viridis")
    fig.colorbar(image, ax=ax, label="samples")
    ax.set_xlabel("class")
    ax.set_ylabel("client")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return Path(out)
