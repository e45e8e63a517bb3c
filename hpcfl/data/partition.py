"""Which training samples each federated client holds.

A partition depends only on (labels, num_clients, scheme, params, seed), never on the MPI rank or the
process count, so every rank computes the same split without any communication.
"""
import inspect
from typing import Callable

import numpy as np

from hpcfl.errors import ConfigError, DataError
from hpcfl.seeding import numpy_rng

_MAX_ATTEMPTS = 1000


def iid(labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """A random permutation cut into near-equal parts (sizes differ by at most one)."""
    return np.array_split(rng.permutation(len(labels)), num_clients)


def _dirichlet_counts(class_sizes: np.ndarray, num_clients: int, beta: float,
                      rng: np.random.Generator) -> np.ndarray | None:
    """One draw of per-class client counts (classes x clients), or None when a draw degenerates.

    NIID-Bench's balancing: a client already holding >= N / num_clients samples gets no more of later classes.
    """
    cap = class_sizes.sum() / num_clients
    held = np.zeros(num_clients, dtype=np.int64)
    counts = np.empty((len(class_sizes), num_clients), dtype=np.int64)
    for k, n_k in enumerate(class_sizes):
        p = rng.dirichlet(np.full(num_clients, beta)) * (held < cap)
        total = p.sum()
        if total == 0:  # every open client drew an underflowed zero proportion
            return None
        cuts = (np.cumsum(p / total) * n_k).astype(np.int64)[:-1]
        counts[k] = np.diff(cuts, prepend=0, append=n_k)
        held += counts[k]
    return counts


def dirichlet(labels: np.ndarray, num_clients: int, rng: np.random.Generator, min_samples: int,
              *, beta: float) -> list[np.ndarray]:
    """Per class, client shares ~ Dir(beta) (NIID-Bench / FedMA); redrawn until every client has min_samples."""
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not beta > 0:
        raise ConfigError(f"data.partition_params.beta = {beta!r}: must be a number > 0 "
                          "(small, e.g. 0.1, is very skewed; large, e.g. 100, is near iid)")
    classes, class_sizes = np.unique(labels, return_counts=True)
    for _ in range(_MAX_ATTEMPTS):
        counts = _dirichlet_counts(class_sizes, num_clients, beta, rng)
        if counts is not None and counts.sum(axis=0).min() >= min_samples:
            break
    else:
        raise DataError(
            f"dirichlet partition with beta={beta} over {num_clients} clients and {len(labels)} samples left some "
            f"client below data.min_samples={min_samples} in all {_MAX_ATTEMPTS} draws; "
            "fix: use fewer clients, a larger data.partition_params.beta, or a lower data.min_samples")
    owner = np.empty(len(labels), dtype=np.int64)
    for c, row in zip(classes, counts):
        owner[rng.permutation(np.flatnonzero(labels == c))] = np.repeat(np.arange(num_clients), row)
    order = np.argsort(owner, kind="stable")
    return np.split(order, np.cumsum(counts.sum(axis=0))[:-1])


SCHEMES: dict[str, Callable[..., list[np.ndarray]]] = {
    "iid": iid,
    "dirichlet": dirichlet,
}


def _scheme_kwargs(scheme: str, fn: Callable, params: dict) -> dict:
    """`params` checked against the scheme's keyword-only arguments (its user-facing settings)."""
    sig = inspect.signature(fn).parameters
    valid = [n for n, p in sig.items() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    for key in params:
        if key not in valid:
            raise ConfigError(f"data.partition_params.{key} is not a setting of partition {scheme!r}; "
                              f"valid: {', '.join(valid) or '(none)'}")
    for key in valid:
        if key not in params and sig[key].default is inspect.Parameter.empty:
            raise ConfigError(f"data.partition_params.{key} is required by partition {scheme!r}")
    return dict(params)


def check_params(scheme: str, params: dict) -> dict:
    """The scheme's keyword arguments from `params`, or a ConfigError naming the bad key."""
    if scheme not in SCHEMES:
        raise ConfigError(f"data.partition = {scheme!r} is not a known scheme; valid: {', '.join(sorted(SCHEMES))}")
    return _scheme_kwargs(scheme, SCHEMES[scheme], params)


def partition(labels: np.ndarray, num_clients: int, scheme: str, params: dict, seed: int,
              min_samples: int = 10) -> list[np.ndarray]:
    """Per client, a sorted int64 array of training-sample indices; every client holds >= min_samples."""
    kwargs = check_params(scheme, params)
    fn = SCHEMES[scheme]
    labels = np.asarray(labels)
    if num_clients < 1:
        raise ConfigError(f"num_clients = {num_clients}: must be >= 1")
    if num_clients * min_samples > len(labels):
        raise DataError(f"{num_clients} clients x data.min_samples={min_samples} needs "
                        f"{num_clients * min_samples} samples but the training set has {len(labels)}; "
                        "fix: use fewer clients or a lower data.min_samples")
    if "min_samples" in inspect.signature(fn).parameters:  # schemes that can redraw take the guard themselves
        kwargs["min_samples"] = min_samples
    parts = fn(labels, num_clients, numpy_rng(seed, "partition"), **kwargs)
    for client, part in enumerate(parts):
        if len(part) < min_samples:
            raise DataError(f"partition {scheme!r} gave client {client} only {len(part)} samples, below "
                            f"data.min_samples={min_samples}; fix: use fewer clients, other "
                            "data.partition_params, or a lower data.min_samples")
    return [np.sort(part).astype(np.int64) for part in parts]


def count_matrix(labels: np.ndarray, parts: list[np.ndarray], num_classes: int) -> np.ndarray:
    """clients x classes int64 sample counts: how skewed each client's label distribution is."""
    labels = np.asarray(labels)
    sizes = [len(p) for p in parts]
    rows = np.repeat(np.arange(len(parts)), sizes)
    cols = labels[np.concatenate(parts).astype(np.int64)] if parts else np.empty(0, dtype=np.int64)
    if cols.size and (cols.min() < 0 or cols.max() >= num_classes):
        raise DataError(f"labels must lie in 0..{num_classes - 1}; found {cols.min()}..{cols.max()}")
    flat = np.bincount(rows * num_classes + cols, minlength=len(parts) * num_classes)
    return flat.reshape(len(parts), num_classes).astype(np.int64)
