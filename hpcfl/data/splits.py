"""What is drawn around a partition, each from its own generator keyed by the split's seed (and the
client), so every rank draws the same: the class-stratified subset a CPU-sized study partitions, each
client's validation and local test samples, FedKA's shared set, and the class roles of FedKA's
Definition 1 (dominant, non-dominant, missing) that its term and the forgetting analysis read; and a
job's data as set-up splits it (`split_data`)."""
from dataclasses import dataclass

import numpy as np

from hpcfl.config import JobConfig
from hpcfl.data.base import Dataset, resolve_data_root
from hpcfl.data.datasets import load_dataset
from hpcfl.data.partition import apportion, count_matrix, is_int, is_number, partition, round_half_up
from hpcfl.errors import ConfigError, DataError
from hpcfl.seeding import numpy_rng


def class_categories(class_counts, gamma: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """FedKA Definition 1: boolean masks of a client's dominant (share >= gamma), non-dominant
    (0 < share < gamma) and missing classes; of each client's, given a clients x classes matrix."""
    counts = np.asarray(class_counts, dtype=np.float64)
    share = counts / np.maximum(counts.sum(-1, keepdims=True), 1)
    return share >= gamma, (share > 0) & (share < gamma), share == 0


def training_subset(labels: np.ndarray, size: int, seed: int) -> np.ndarray:
    """A sorted random subset of `size` training-sample indices with the training set's class mix
    (each class's count apportioned within one of exact), drawn from the "subset" generator of the
    split's seed: a CPU-sized study scales the data down without changing what the partition sees."""
    labels = np.asarray(labels)
    if not (is_int(size) and 0 < size <= len(labels)):
        raise ConfigError(f"data.train_samples = {size!r}: must be an integer in 1..{len(labels)} (the training "
                          "set's size), or 0 for all of it")
    classes, counts = np.unique(labels, return_counts=True)
    rng = numpy_rng(seed, "subset")
    picked = [rng.choice(np.flatnonzero(labels == k), n, replace=False)
              for k, n in zip(classes, apportion(size, counts), strict=True)]
    return np.sort(np.concatenate(picked)).astype(np.int64)


def client_partition(job: JobConfig, labels: np.ndarray, owners: np.ndarray | None = None) -> list[np.ndarray]:
    """Each client's samples as a run of `job` deals them, before validation samples are held out: sorted
    indices into the training set (`labels`: all its labels, in the data set's order; `owners`: the data
    set's groups, if any). With data.train_samples the scheme splits that subset. Set-up uses it, and so can
    anyone exporting hpcfl's split to another tool (docs/how-to/write-a-partition.md)."""
    labels, data = np.asarray(labels), job.data
    pool = training_subset(labels, data.train_samples, job.data_seed) if data.train_samples else np.arange(len(labels))
    parts = partition(labels[pool], data.num_clients, data.partition, data.partition_params, job.data_seed,
                      data.min_samples, None if owners is None else np.asarray(owners)[pool])
    return [pool[p] for p in parts]


def validation_split(parts: list[np.ndarray], fraction: float, seed: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(train, validation) per client: round(fraction * size) random samples held out (FedFM: 0.2).

    Each client draws from its own generator, so the split is the same on every rank; a client always keeps
    at least one training sample.
    """
    if not (is_number(fraction) and 0 <= fraction < 1):
        raise ConfigError(f"data.validation_fraction = {fraction!r}: must be a number in [0, 1), e.g. 0.2")
    train, val = [], []
    for client, part in enumerate(parts):
        n_val = max(min(round_half_up(fraction, len(part)), len(part) - 1), 0)
        shuffled = numpy_rng(seed, "validation", client).permutation(np.asarray(part, dtype=np.int64))
        train.append(np.sort(shuffled[n_val:]))
        val.append(np.sort(shuffled[:n_val]))
    return train, val


def local_test_sets(test_labels: np.ndarray, class_counts: np.ndarray, size_ratio: float,
                    seed: int) -> list[np.ndarray]:
    """Per client, sorted test-set indices whose label mix matches its training mix (personalised evaluation).

    Size round(size_ratio * train size) (FedClassAvg: 0.3), apportioned over classes by the client's
    `class_counts` row (clients x classes, as from `count_matrix`). Clients draw independently, so they may
    share test samples; within a client a sample repeats only once its class's test samples are used up.
    """
    if not (is_number(size_ratio) and size_ratio > 0):
        raise ConfigError(f"data.local_test_ratio = {size_ratio!r}: must be a number > 0, e.g. 0.3")
    test_labels = np.asarray(test_labels)
    class_counts = np.asarray(class_counts, dtype=np.int64)
    num_classes = class_counts.shape[1]
    if test_labels.size and (test_labels.min() < 0 or test_labels.max() >= num_classes):
        raise DataError(f"test labels must lie in 0..{num_classes - 1}; found {test_labels.min()}..{test_labels.max()}")
    pool = np.bincount(test_labels, minlength=num_classes)
    start = np.cumsum(pool) - pool  # where each class's block begins in a label-sorted test set
    sets = []
    for client, row in enumerate(class_counts):
        size = round_half_up(size_ratio, row.sum())
        need = apportion(size, row) if size else np.zeros(num_classes, dtype=np.int64)
        absent = np.flatnonzero((need > 0) & (pool == 0))
        if absent.size:
            raise DataError(f"client {client} trains on class {absent[0]} but the test set has no sample of it; "
                            "fix: use a test set that covers every training class")
        rng = numpy_rng(seed, "local-test", client)
        by_class = np.lexsort((rng.random(len(test_labels)), test_labels))  # grouped by class, random within
        cls = np.repeat(np.arange(num_classes), need)
        within = np.arange(size) - np.repeat(np.cumsum(need) - need, need)
        sets.append(np.sort(by_class[start[cls] + within % pool[cls]]).astype(np.int64))
    return sets


def shared_set(labels: np.ndarray, num_classes: int, seed: int, held_out: np.ndarray = ()) -> np.ndarray:
    """FedKA's minimal shared set S: one training-sample index per class (in class order), drawn from
    the training set with its own generator, so every rank and run with `seed` picks the same; never
    one of `held_out` (the clients' validation rows: every client trains on S)."""
    labels = np.asarray(labels)
    rng = numpy_rng(seed, "shared-set")
    pool = np.setdiff1d(np.arange(len(labels)), held_out)
    missing = [k for k in range(num_classes) if not (labels[pool] == k).any()]
    if missing:
        raise DataError(f"the training set has no sample of class {missing[0]} outside the validation rows, so the "
                        "shared set S cannot hold one sample per class; use a data set that covers every class")
    return np.array([rng.choice(pool[labels[pool] == k]) for k in range(num_classes)], dtype=np.int64)


@dataclass
class ClientData:
    """A job's data set split as it asks, the same on every rank."""
    data: Dataset
    parts: list                   # each client's training rows
    val_parts: list               # each client's held-out validation rows
    counts: np.ndarray            # clients x classes
    local_tests: list | None      # each client's own test rows (data.local_test_ratio)
    shared: np.ndarray | None = None    # the shared samples some terms train on (`shared_set`)

    @property
    def local_test_sizes(self) -> np.ndarray | None:
        return None if self.local_tests is None else np.array([len(t) for t in self.local_tests], dtype=np.int64)


def split_data(job: JobConfig, data_root: str | None, train_images: bool) -> ClientData:
    """`job`'s data set loaded from `data_root` (--data-root; else data.root, $HPCFL_DATA, Debian's folder;
    training images only if `train_images`) and split: the partition, each client's validation rows and
    own test rows."""
    seed = job.data_seed
    validating = job.data.validation_fraction > 0          # the server then tests on the held-out samples too
    data = load_dataset(job.data.dataset, resolve_data_root(data_root or job.data.root or None),
                        train_images=train_images or validating)
    labels = data.train_y.numpy()
    parts = client_partition(job, labels, data.groups)
    val_parts = [np.zeros(0, dtype=np.int64)] * len(parts)
    if validating:
        parts, val_parts = validation_split(parts, job.data.validation_fraction, seed)
        if not any(len(v) for v in val_parts):           # the server would validate on nothing
            raise ConfigError(f"data.validation_fraction = {job.data.validation_fraction} holds out no sample of "
                              f"any client (clients of {min(map(len, parts))}-{max(map(len, parts))} samples): "
                              "raise it, e.g. 0.2, or set it to 0")
    counts = count_matrix(labels, parts, data.num_classes)
    local_tests = (local_test_sets(data.test_y.numpy(), counts, job.data.local_test_ratio, seed)
                   if job.data.local_test_ratio > 0 else None)
    empty = [c for c, rows in enumerate(local_tests or []) if not len(rows)]
    if empty:
        raise ConfigError(f"data.local_test_ratio = {job.data.local_test_ratio} gives client(s) {empty[:5]} "
                          f"(of {counts[empty[0]].sum()} training samples) no test sample to evaluate on: raise it, "
                          "or data.min_samples")
    return ClientData(data, parts, val_parts, counts, local_tests)
