"""hpcfl's built-in partition schemes against flwr-datasets' partitioners, measured on the same labels: the
evidence behind the comparison in docs/how-to/write-a-partition.md.

The two tools draw from different generators, so the same seed gives different splits; what can agree is the
distribution of splits. For each pair (hpcfl's scheme, flwr-datasets' partitioner) and client count, both split
Fashion-MNIST's training labels (a synthetic 60,000-label set of 10 balanced classes where the data is not
installed) once per seed, and each split is summarised by the statistics that describe its skew: the coefficient
of variation of client sizes, the mean label entropy of a client, the mean number of classes on a client, the
mean total-variation distance between a client's label distribution and the training set's, and the fraction of
the samples placed on some client. The table gives each statistic's mean ± std over seeds for both tools and the
difference with its 95 % Welch interval: "equivalent within ±X" when the interval holds 0 (X its larger end),
"differs" when it does not.

It also checks the docs page's two recipes end to end: a flwr-datasets split (a row-number column carried
through `load_partition`) read into hpcfl through `labfl.partition:from_file` gives the same client index sets,
and hpcfl's split carried to flwr-datasets as a client column (`NaturalIdPartitioner`) gives hpcfl's back.

    pip install flwr-datasets   # not an hpcfl dependency: in a separate environment that also has hpcfl
    python bench/partitions_flwr.py [--seeds 30] [--clients 10,20] [--out DIR]
    python bench/partitions_flwr.py --smoke       # 20 seeds, 10 clients: checks that it runs (CI, with flwr-datasets)

Offline: the partitioners get a `datasets.Dataset` built from local labels; nothing is downloaded.
"""
import argparse
import math
import statistics
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

from hpcfl.data.base import resolve_data_root
from hpcfl.data.datasets import load_dataset
from hpcfl.data.partition import count_matrix, partition
from hpcfl.errors import DataError

try:
    import flwr_datasets
    from datasets import Dataset
    from flwr_datasets.partitioner import (
        DirichletPartitioner,
        IidPartitioner,
        NaturalIdPartitioner,
        PathologicalPartitioner,
    )
except ImportError as error:
    sys.exit(f"bench/partitions_flwr.py needs flwr-datasets, which hpcfl does not depend on ({error}); "
             "fix: `pip install flwr-datasets` into an environment that has hpcfl")

REPOSITORY = Path(__file__).resolve().parents[1]
MIN_SAMPLES = 10  # hpcfl's data.min_samples default, and DirichletPartitioner's min_partition_size default

# (name, hpcfl scheme and settings, flwr-datasets partitioner for (num_clients, seed)); flwr's IidPartitioner
# takes contiguous shards and has no seed, so it gets the data set shuffled as FederatedDataset(shuffle=True) does
PAIRS = [("`iid` / `IidPartitioner` on `Dataset.shuffle(seed)`", "iid", {}, "shuffle",
          lambda n, seed: IidPartitioner(num_partitions=n))]
for _beta in (0.1, 0.5):
    for _balancing in (True, False):
        PAIRS.append((f"`dirichlet` β={_beta} / `DirichletPartitioner(alpha={_beta}, self_balancing={_balancing})`",
                      "dirichlet", {"beta": _beta}, None,
                      lambda n, seed, b=_beta, s=_balancing: DirichletPartitioner(
                          num_partitions=n, partition_by="label", alpha=b, self_balancing=s,
                          min_partition_size=MIN_SAMPLES, seed=seed)))
for _mode in ("random", "deterministic"):
    PAIRS.append((f"`classes_per_client` k=2 / `PathologicalPartitioner(2, class_assignment_mode=\"{_mode}\")`",
                  "classes_per_client", {"k": 2}, None,
                  lambda n, seed, m=_mode: PathologicalPartitioner(
                      num_partitions=n, partition_by="label", num_classes_per_partition=2,
                      class_assignment_mode=m, seed=seed)))

STATISTICS = ["CV of client sizes", "label entropy (bits)", "classes per client", "TV to global", "samples used"]


def training_labels() -> tuple[np.ndarray, str]:
    """Fashion-MNIST's training labels in hpcfl's order, or a stand-in of the same shape where it is not installed."""
    try:
        return load_dataset("fashion_mnist", resolve_data_root(None), train_images=False).train_y.numpy(), \
            "Fashion-MNIST training labels (60,000, 10 classes of 6,000)"
    except DataError:
        labels = np.random.default_rng(0).permutation(np.repeat(np.arange(10), 6000))
        return labels, "synthetic labels (Fashion-MNIST is not installed): 60,000, 10 classes of 6,000, shuffled"


def describe(labels: np.ndarray, parts: list[np.ndarray]) -> list[float]:
    """The STATISTICS of one split (clients' index arrays into `labels`)."""
    num_classes = int(labels.max()) + 1
    counts = count_matrix(labels, parts, num_classes)
    sizes = counts.sum(axis=1)
    share = counts / sizes[:, None]
    logs = np.log2(np.where(share > 0, share, 1))
    overall = np.bincount(labels, minlength=num_classes) / len(labels)
    return [sizes.std() / sizes.mean(), float(-(share * logs).sum(axis=1).mean()),
            float((counts > 0).sum(axis=1).mean()), float(0.5 * np.abs(share - overall).sum(axis=1).mean()),
            sizes.sum() / len(labels)]


def flwr_split(partitioner, rows: Dataset, num_clients: int) -> list[np.ndarray]:
    """Each partition's rows, read back through the public interface (`load_partition` and the row column)."""
    partitioner.dataset = rows
    with warnings.catch_warnings():  # DirichletPartitioner warns on each redraw for min_partition_size
        warnings.simplefilter("ignore")
        return [partitioner.load_partition(c).with_format("arrow")["row"].to_numpy() for c in range(num_clients)]


def t975(df: float) -> float:
    """Student's t 97.5 % quantile (Abramowitz & Stegun 26.7.5, within 1e-5 for the df >= 19 of >= 20 seeds)."""
    z = statistics.NormalDist().inv_cdf(0.975)
    return (z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)
            + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * df ** 3)
            + (79 * z ** 9 + 776 * z ** 7 + 1482 * z ** 5 - 1920 * z ** 3 - 945 * z) / (92160 * df ** 4))


def compare(ours: np.ndarray, theirs: np.ndarray) -> tuple[float, float, float, str]:
    """Difference of means (hpcfl - flwr), its 95 % Welch interval, and the verdict."""
    diff = ours.mean() - theirs.mean()
    va, vb = ours.var(ddof=1) / len(ours), theirs.var(ddof=1) / len(theirs)
    se = math.sqrt(va + vb)
    if se == 0:
        low = high = diff
    else:
        df = (va + vb) ** 2 / (va ** 2 / (len(ours) - 1) + vb ** 2 / (len(theirs) - 1))
        low, high = diff - t975(df) * se, diff + t975(df) * se
    verdict = f"equivalent within ±{max(abs(low), abs(high)):.3g}" if low <= 0 <= high else "differs"
    return diff, low, high, verdict


def measure(labels: np.ndarray, clients: list[int], seeds: int) -> list[str]:
    """The Markdown table rows, one per (pair, client count, statistic)."""
    rows = Dataset.from_dict({"label": labels, "row": np.arange(len(labels))}).with_format("arrow")
    table, ours_cache = [], {}
    for name, scheme, params, prepare, make in PAIRS:
        for n in clients:
            key = (scheme, tuple(params.items()), n)
            if key not in ours_cache:  # one hpcfl scheme faces several flwr-datasets settings
                ours_cache[key] = np.array([describe(labels, partition(labels, n, scheme, params, seed, MIN_SAMPLES))
                                            for seed in range(seeds)])
            theirs = np.array([describe(labels, flwr_split(make(n, seed), rows.shuffle(seed=seed)
                                                           if prepare == "shuffle" else rows, n))
                               for seed in range(seeds)])
            for s, stat in enumerate(STATISTICS):
                a, b = ours_cache[key][:, s], theirs[:, s]
                diff, low, high, verdict = compare(a, b)
                table.append(f"| {name} | {n} | {stat} | {a.mean():.4f} ± {a.std(ddof=1):.4f} | "
                             f"{b.mean():.4f} ± {b.std(ddof=1):.4f} | {diff:+.4f} [{low:+.4f}, {high:+.4f}] | "
                             f"{verdict} |")
            print(f"  {name}, {n} clients: done", file=sys.stderr)
    return table


def round_trips(labels: np.ndarray) -> list[str]:
    """The docs page's recipes, checked: each direction must give exactly the same client index sets."""
    sys.path.insert(0, str(REPOSITORY / "tests" / "plugins"))  # labfl, the docs page's plug-in package
    rows = Dataset.from_dict({"label": labels, "row": np.arange(len(labels))}).with_format("arrow")
    found = []
    with tempfile.TemporaryDirectory() as folder:
        for n in (10, 20):
            theirs = flwr_split(DirichletPartitioner(num_partitions=n, partition_by="label", alpha=0.5, seed=42),
                                rows, n)
            path = Path(folder) / f"flwr-{n}.npz"
            np.savez(path, **{f"client_{c}": part for c, part in enumerate(theirs)})
            read = partition(labels, n, "labfl.partition:from_file", {"path": str(path)}, seed=0)
            same = all(np.array_equal(np.sort(t), r) for t, r in zip(theirs, read, strict=True))
            found.append(f"flwr-datasets → hpcfl (`DirichletPartitioner(alpha=0.5)`, {n} clients, through "
                         f"`labfl.partition:from_file`): {'the same index sets' if same else 'DIFFERENT'}")

            ours = partition(labels, n, "dirichlet", {"beta": 0.5}, seed=0)
            owner = np.full(len(labels), -1)
            for c, part in enumerate(ours):
                owner[part] = c
            carried = rows.add_column("client", owner.tolist()).select(np.flatnonzero(owner >= 0))
            back = flwr_split(NaturalIdPartitioner(partition_by="client"), carried, n)
            same = all(np.array_equal(np.sort(b), o) for b, o in zip(back, ours, strict=True))
            found.append(f"hpcfl → flwr-datasets (`dirichlet` β=0.5, {n} clients, as a client column through "
                         f"`NaturalIdPartitioner`): {'the same index sets' if same else 'DIFFERENT'}")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=30, help="splits per tool, pair and client count (>= 20)")
    parser.add_argument("--clients", default="10,20", help="comma-separated client counts")
    parser.add_argument("--out", type=Path, help="also write the report to OUT/partitions_flwr.md")
    parser.add_argument("--smoke", action="store_true", help="20 seeds, 10 clients: checks that the bench runs")
    args = parser.parse_args()
    if args.smoke:
        args.seeds, args.clients = 20, "10"
    if args.seeds < 20:
        parser.error("--seeds must be >= 20: the interval's t quantile is only accurate from 19 degrees of freedom")
    labels, source = training_labels()
    table = measure(labels, [int(n) for n in args.clients.split(",")], args.seeds)
    checks = round_trips(labels)
    report = "\n".join([
        f"Labels: {source}. flwr-datasets {flwr_datasets.__version__}, {args.seeds} seeds (0..{args.seeds - 1}) "
        f"per tool, data.min_samples = min_partition_size = {MIN_SAMPLES}.", "",
        "| hpcfl / flwr-datasets | clients | statistic | hpcfl mean ± std | flwr-datasets mean ± std | "
        "hpcfl − flwr [95 % Welch] | verdict |",
        "|---|---|---|---|---|---|---|", *table, "", "Round trips:", "", *(f"- {c}" for c in checks), ""])
    print(report)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "partitions_flwr.md").write_text(report)
    if any("DIFFERENT" in c for c in checks):
        sys.exit("a round trip did not give the same split")


if __name__ == "__main__":
    main()
