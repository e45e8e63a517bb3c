"""Which training samples each federated client holds.

A partition depends only on (labels, num_clients, scheme, params, seed), never on the MPI rank or the
process count, so every rank computes the same split without any communication. What is drawn around
a partition (the subset it partitions, validation and local test samples, FedKA's shared set) is in
hpcfl.data.splits.

A scheme, built-in or a plug-in named `data.partition = "package.module:function"` (hpcfl.plugins), is
a function

    scheme(labels, num_clients, rng, [min_samples], [owners], *, <settings>) -> list of index arrays

- `labels`: the training labels it splits (an int array: all of the training set, or the class-stratified
  subset of data.train_samples); `rng`: a numpy Generator drawn from (data.seed, "partition"), the only
  randomness it may use, so that every rank computes the same split;
- `min_samples` (if it takes it): data.min_samples, for schemes that redraw until every client has that
  many; `owners` (if it takes it): each sample's natural owner, from data sets that have them;
- its keyword-only settings are `data.partition_params`, checked against the signature when the job is
  validated: a setting annotated `int` must be an integer, one annotated `str` a string, any other a
  finite number; a setting without a default is required;
- it returns one array per client of indices into `labels`, no sample on two clients (samples on no
  client are left out), each client with at least data.min_samples; `partition` checks all of this.
"""
import inspect
from decimal import ROUND_HALF_UP, Decimal

import numpy as np

from hpcfl.errors import ConfigError, DataError
from hpcfl.plugins import Registry
from hpcfl.seeding import numpy_rng

_MAX_ATTEMPTS = 1000
FILL_STEPS = 50         # dirichlet_equal's turns: a class runs out within 2 % of every client's filling


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


def is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def is_number(value) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


def _require(key: str, value, ok: bool, rule: str) -> None:
    """A ConfigError naming `data.partition_params.<key>` when a scheme setting breaks its rule."""
    if not ok:
        raise ConfigError(f"data.partition_params.{key} = {value!r}: {rule}")


def round_half_up(share: float, n: int) -> int:
    """share x n rounded half up (Python's round() rounds halves to even; 2.5 goes to 3 here, as a
    reader expects), with `share` taken as the decimal it was written as: 0.35 x 90 = 31.5 gives 32,
    where the float product, 31.499999999999996, would give 31."""
    return int((Decimal(repr(float(share))) * int(n)).to_integral_value(rounding=ROUND_HALF_UP))


def apportion(total: int, weights: np.ndarray) -> np.ndarray:
    """Integers summing to `total` in proportion to `weights` (largest remainder: each within 1 of exact)."""
    exact = total * weights / weights.sum()
    counts = np.floor(exact).astype(np.int64)
    counts[np.argsort(counts - exact, kind="stable")[:total - counts.sum()]] += 1
    return counts


def _deal(labels: np.ndarray, counts: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    """Per client, `counts[class, client]` samples of each class, drawn without replacement.

    Each class's samples are shuffled and dealt out in client order; samples left over belong to no client.
    """
    class_sizes = np.unique(labels, return_counts=True)[1]
    by_class = np.split(np.argsort(labels, kind="stable"), np.cumsum(class_sizes)[:-1])
    owner = np.full(len(labels), -1, dtype=np.int64)
    # strict=False: with no labels at all, np.split gives one empty piece and counts has no rows
    for members, row in zip(by_class, counts, strict=False):
        owner[rng.permutation(members)[:row.sum()]] = np.repeat(np.arange(counts.shape[1]), row)
    order = np.argsort(owner, kind="stable")[np.count_nonzero(owner < 0):]
    return np.split(order, np.cumsum(counts.sum(axis=0))[:-1])


def dirichlet(labels: np.ndarray, num_clients: int, rng: np.random.Generator, min_samples: int,
              *, beta: float) -> list[np.ndarray]:
    """Per class, client shares ~ Dir(beta), and a client already holding the average share gets no more
    (NIID-Bench / FedMA); redrawn until every client has min_samples. In flwr-datasets this is
    `DirichletPartitioner(self_balancing=True)`, not its default (`self_balancing=False`: no cap)."""
    class_sizes = np.unique(labels, return_counts=True)[1]
    degenerate = 0
    for _ in range(_MAX_ATTEMPTS):
        counts = _dirichlet_counts(class_sizes, num_clients, beta, rng)
        degenerate += counts is None
        if counts is not None and counts.sum(axis=0).min() >= min_samples:
            break
    else:
        if degenerate > _MAX_ATTEMPTS // 2:
            raise DataError(f"dirichlet partition with beta={beta} over {num_clients} clients: in {degenerate} of "
                            f"{_MAX_ATTEMPTS} draws every open client's share of a class was 0 in floating point; "
                            "fix: a larger data.partition_params.beta (e.g. 0.01 or more)")
        raise DataError(
            f"dirichlet partition with beta={beta} over {num_clients} clients and {len(labels)} samples left some "
            f"client below data.min_samples={min_samples} in all {_MAX_ATTEMPTS} draws; "
            "fix: use fewer clients, a larger data.partition_params.beta, or a lower data.min_samples")
    return _deal(labels, counts, rng)


def dirichlet_equal(labels: np.ndarray, num_clients: int, rng: np.random.Generator,
                    *, beta: float, size: int = 0) -> list[np.ndarray]:
    """Label skew without quantity skew (FedClassAvg): every client gets `size` samples (default
    floor(N / num_clients); a smaller size leaves the rest of the data set unused, for small studies).

    Each client draws class proportions q ~ Dir(beta) (Hsu et al. 2019) and its samples' classes ~ q,
    renormalised over the classes not yet used up. The clients fill in FILL_STEPS turns, each client
    in a fresh random order taking its next share, so a class runs out for all clients alike: filled
    one after another, the last clients would get the leftovers of a few classes (with size = 0, a top
    class share of 0.58 against 0.37 for the first ones at beta = 0.5, 20 clients). Our choice: the
    authors' code has only the NIID-Bench split (`dirichlet`), whose client sizes differ.
    """
    _require("size", size, size * num_clients <= len(labels),
             f"must be an integer with size x num_clients <= {len(labels)} samples (0: all of them, split equally)")
    left = np.unique(labels, return_counts=True)[1]
    counts = np.zeros((len(left), num_clients), dtype=np.int64)
    shares = rng.dirichlet(np.full(len(left), beta), size=num_clients)
    need = np.full(num_clients, size or len(labels) // num_clients)
    turn = max(1, -(-int(need.max(initial=0)) // FILL_STEPS))
    while need.any():       # every take is at least one sample: the classes left hold what is needed
        for client in rng.permutation(np.flatnonzero(need)):
            open_share = shares[client] * (left > 0)
            p = open_share if open_share.sum() > 0 else left.astype(float)
            take = np.minimum(rng.multinomial(min(turn, need[client]), p / p.sum()), left)
            counts[:, client] += take
            left -= take
            need[client] -= take.sum()
    return _deal(labels, counts, rng)


def _class_sets(num_classes: int, num_clients: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """clients x k distinct class indices, dealt round-robin from a class order reshuffled every cycle.

    Every class is dealt once per cycle, so use counts differ by at most one and every class is used when
    num_clients * k >= num_classes. A client whose k slots straddle two cycles gets the new cycle's
    classes it already holds moved to that cycle's end, which keeps its classes distinct (k <= num_classes).
    """
    cycles = []
    for start in range(0, num_clients * k, num_classes):
        order = rng.permutation(num_classes)
        held = np.concatenate(cycles)[start - start % k:] if start % k else order[:0]
        clash = np.isin(order, held)
        cycles.append(np.concatenate([order[~clash], order[clash]]))
    slots = np.concatenate(cycles) if cycles else np.empty(0, dtype=np.int64)
    return slots[:num_clients * k].reshape(num_clients, k)


def _split_among_holders(labels: np.ndarray, held: np.ndarray, key: str, rng: np.random.Generator) -> list[np.ndarray]:
    """Each class's samples split evenly (sizes within one) among the clients holding it (`held`: classes x clients)."""
    classes, class_sizes = np.unique(labels, return_counts=True)
    holders = held.sum(axis=1)
    short = np.flatnonzero(class_sizes < holders)
    if short.size:
        c = short[0]
        raise DataError(f"class {classes[c]} has {class_sizes[c]} samples but data.partition_params.{key} puts it "
                        f"on {holders[c]} clients, so some would get none of it; fix: use fewer clients or "
                        f"another data.partition_params.{key}")
    per = np.maximum(holders, 1)[:, None]
    rank = np.cumsum(held, axis=1) - 1  # a client's place among the class's holders
    counts = held * (class_sizes[:, None] // per + (rank < class_sizes[:, None] % per))
    return _deal(labels, counts, rng)


def classes_per_client(labels: np.ndarray, num_clients: int, rng: np.random.Generator,
                       *, k: int) -> list[np.ndarray]:
    """FedClassAvg's "skewed" split (k = 2): every client holds exactly k distinct classes, each class split
    evenly among the clients holding it. Clients are then the same size only where every class has as
    many holders (k x clients a multiple of the classes: 20 clients of CIFAR-10); on EMNIST letters (26
    classes, 40 places) sizes differ up to 2x, where the paper says they are equal."""
    num_classes = len(np.unique(labels))
    _require("k", k, k <= num_classes,
             f"must be an integer from 1 to the number of classes in the training set ({num_classes})")
    sets = _class_sets(num_classes, num_clients, k, rng)
    held = np.zeros((num_classes, num_clients), dtype=bool)
    held[sets, np.arange(num_clients)[:, None]] = True
    return _split_among_holders(labels, held, "k", rng)


def dominant(labels: np.ndarray, num_clients: int, rng: np.random.Generator,
             *, n_dominant: int, n_other: int, dominant_classes: int = 1) -> list[np.ndarray]:
    """FedFM NIID-2: the same size for every client, skewed towards its dominant classes.

    Client i gets n_dominant samples of each class (i * dominant_classes + j) mod C, j < dominant_classes,
    and n_other of every other class (FedFM's CIFAR-10 split: 10 clients, 2,300 and 300).
    """
    classes, class_sizes = np.unique(labels, return_counts=True)
    num_classes = len(classes)
    _require("dominant_classes", dominant_classes, dominant_classes <= num_classes,
             f"must be an integer from 1 to the number of classes in the training set ({num_classes})")
    clients = np.arange(num_clients)[:, None]
    is_dominant = np.zeros((num_classes, num_clients), dtype=bool)
    is_dominant[(clients * dominant_classes + np.arange(dominant_classes)) % num_classes, clients] = True
    counts = np.where(is_dominant, n_dominant, n_other).astype(np.int64)
    need = counts.sum(axis=1, dtype=object)  # exact: settings up to 2**63 - 1 would wrap an int64 sum
    short = np.flatnonzero(need > class_sizes)
    if short.size:
        c = short[0]
        dominated = is_dominant[c].sum()
        raise DataError(f"dominant partition needs {need[c]} samples of class {classes[c]} "
                        f"(data.partition_params.n_dominant={n_dominant} for each of the {dominated} clients it "
                        f"dominates, data.partition_params.n_other={n_other} for each of the other "
                        f"{num_clients - dominated}) but the training set has {class_sizes[c]}; fix: lower "
                        "n_dominant or n_other, or use fewer clients")
    return _deal(labels, counts, rng)


def missing(labels: np.ndarray, num_clients: int, rng: np.random.Generator, *, x: int) -> list[np.ndarray]:
    """FedFM NIID-3 "missing x": every client lacks exactly x classes.

    Each class is missed by as many clients as the others (within one); its samples are split evenly among
    the clients that hold it.
    """
    num_classes = len(np.unique(labels))
    _require("x", x, x < num_classes,
             f"must be an integer from 0 to {num_classes - 1}: each client must keep at least one of the "
             f"{num_classes} classes in the training set")
    held = np.ones((num_classes, num_clients), dtype=bool)
    held[_class_sets(num_classes, num_clients, x, rng), np.arange(num_clients)[:, None]] = False
    return _split_among_holders(labels, held, "x", rng)


def quantity_skew(labels: np.ndarray, num_clients: int, rng: np.random.Generator, min_samples: int,
                  *, beta: float | None = None, sigma: float | None = None) -> list[np.ndarray]:
    """IID labels, unequal sizes: client shares ~ Dir(beta), or ~ log-normal(0, sigma) normalised.

    Redrawn until every client has min_samples.
    """
    for _ in range(_MAX_ATTEMPTS):
        if beta is not None:
            share = rng.dirichlet(np.full(num_clients, beta))
        else:  # log-normal weights, scaled by the largest so exp() cannot overflow
            z = rng.standard_normal(num_clients)
            share = np.exp(sigma * (z - z.max()))
        sizes = apportion(len(labels), share)
        if sizes.min() >= min_samples:
            break
    else:
        key = "beta" if beta is not None else "sigma"
        raise DataError(
            f"quantity_skew partition over {num_clients} clients and {len(labels)} samples left some client "
            f"below data.min_samples={min_samples} in all {_MAX_ATTEMPTS} draws; fix: use fewer clients, "
            f"a {'larger' if key == 'beta' else 'smaller'} data.partition_params.{key}, or a lower data.min_samples")
    return np.split(rng.permutation(len(labels)), np.cumsum(sizes)[:-1])


def natural(labels: np.ndarray, num_clients: int, rng: np.random.Generator, min_samples: int, owners: np.ndarray,
            *, min_owner_samples: int = 0) -> list[np.ndarray]:
    """Each client is one natural owner of the data (a LEAF Shakespeare role), drawn among those with at
    least max(min_owner_samples, min_samples) training samples (FedMA: 66 roles with >= 10k samples each,
    counted before its own train/test split)."""
    ids, sizes = np.unique(owners, return_counts=True)
    least = max(min_owner_samples, min_samples)
    eligible = ids[sizes >= least]
    if len(eligible) < num_clients:
        raise DataError(f"partition 'natural' needs {num_clients} owners with >= {least} samples but the data has "
                        f"{len(eligible)}; fix: use fewer clients or a lower data.partition_params.min_owner_samples")
    chosen = np.sort(rng.choice(eligible, num_clients, replace=False))
    return [np.flatnonzero(owners == owner) for owner in chosen]


def check_scheme(found) -> str | None:
    """A plug-in partition must be a function scheme(labels, num_clients, rng, [min_samples], [owners], *,
    settings): what `partition` hands every scheme (see the module's docstring)."""
    try:
        params = inspect.signature(found).parameters.values() if callable(found) else None
    except (TypeError, ValueError):
        params = None
    if params is None:
        return f"{found!r} is not a partition scheme (a function)"
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) < 3 or not set(positional[3:]) <= {"min_samples", "owners"}:
        return (f"{getattr(found, '__qualname__', found)}{inspect.signature(found)} is not a partition scheme: it "
                "takes (labels, num_clients, rng), optionally min_samples and owners, then its keyword-only "
                "settings (hpcfl.data.partition)")
    return None


# data.partition: these, or a plug-in's "package.module:function" (hpcfl.plugins)
PARTITIONS = Registry("data.partition", check_scheme, {
    "iid": iid,
    "dirichlet": dirichlet,
    "dirichlet_equal": dirichlet_equal,
    "classes_per_client": classes_per_client,
    "dominant": dominant,
    "missing": missing,
    "quantity_skew": quantity_skew,
    "natural": natural,
})
# a setting annotated int or str must be one (the annotation, or its name under `from __future__ import annotations`)
_SETTING_TYPES = {"int": ("an integer", lambda v: is_int(v) and -2 ** 63 <= v < 2 ** 63),
                  "str": ("a string", lambda v: isinstance(v, str))}
_NUMBER = ("a finite number", lambda v: is_number(v) and bool(np.isfinite(v)))

# The built-in schemes' rules that need no data, checked with the job (check_params), so that a sweep is
# refused before it is queued; each scheme checks the bounds that depend on the data (k at most the
# number of classes, ...) itself.
def _above(bound, hint: str = ""):
    return lambda v: v > bound, f"must be > {bound}{hint}"


def _from(bound, hint: str = ""):
    return lambda v: v >= bound, f"must be >= {bound}{hint}"


_SKEW = " (small, e.g. 0.1, is very skewed; large, e.g. 100, is near iid)"
_PER_CLASS = " (samples per class per client)"
_RULES = {
    "dirichlet": {"beta": _above(0, _SKEW)},
    "dirichlet_equal": {"beta": _above(0, _SKEW), "size": _from(0, " (0: all of the data set, split equally)")},
    "classes_per_client": {"k": _from(1)},
    "dominant": {"n_dominant": _from(0, _PER_CLASS), "n_other": _from(0, _PER_CLASS), "dominant_classes": _from(1)},
    "missing": {"x": _from(0)},
    "quantity_skew": {"beta": _above(0, " (small, e.g. 0.5, gives very unequal sizes; large near-equal)"),
                      "sigma": _from(0, " (0 gives equal sizes; larger, e.g. 1, more unequal)")},
    "natural": {"min_owner_samples": _from(0)},
}


def check_params(scheme: str, params: dict) -> dict:
    """The scheme's keyword-only settings, `params` with the defaults of those it leaves out, or a
    ConfigError naming the bad key; types are checked here, with the job file (an int or str annotation
    asks for one, any other a finite number), and so are a built-in scheme's ranges that need no data
    (`_RULES`); those that depend on the data, the scheme checks."""
    sig = inspect.signature(PARTITIONS[scheme]).parameters
    valid = [n for n, p in sig.items() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    for key, value in params.items():
        if key not in valid:
            raise ConfigError(f"data.partition_params.{key} is not a setting of partition {scheme!r}; "
                              f"valid: {', '.join(valid) or '(none)'}")
        annotation = sig[key].annotation
        what, ok = _SETTING_TYPES.get(getattr(annotation, "__name__", annotation), _NUMBER)  # int or "int"
        _require(key, value, ok(value), f"must be {what}")
    for key in valid:
        if key not in params and sig[key].default is inspect.Parameter.empty:
            raise ConfigError(f"data.partition_params.{key} is required by partition {scheme!r}")
    settings = {key: params.get(key, sig[key].default) for key in valid}
    for key, (ok, rule) in _RULES.get(scheme, {}).items():
        if settings[key] is not None:
            _require(key, settings[key], ok(settings[key]), rule)
    if scheme == "quantity_skew" and (settings["beta"] is None) == (settings["sigma"] is None):
        raise ConfigError("quantity_skew needs exactly one of data.partition_params.beta (Dirichlet client "
                          "shares) or data.partition_params.sigma (log-normal client sizes)")
    return settings


def partition(labels: np.ndarray, num_clients: int, scheme: str, params: dict, seed: int,
              min_samples: int = 10, owners: np.ndarray | None = None) -> list[np.ndarray]:
    """Per client, a sorted int64 array of training-sample indices; every client holds >= min_samples.
    `owners`: each sample's natural owner, for the 'natural' scheme."""
    kwargs = check_params(scheme, params)
    fn = PARTITIONS[scheme]
    if "owners" in inspect.signature(fn).parameters:
        if owners is None:
            raise ConfigError(f"data.partition = {scheme!r} needs a data set whose samples have owners "
                              "(shakespeare: its speaking roles); pick another partition")
        kwargs["owners"] = np.asarray(owners)
    labels = np.asarray(labels)
    if num_clients < 1:
        raise ConfigError(f"num_clients = {num_clients}: must be >= 1")
    if num_clients * min_samples > len(labels):
        raise DataError(f"{num_clients} clients x data.min_samples={min_samples} needs "
                        f"{num_clients * min_samples} samples but the training set has {len(labels)}; "
                        "fix: use fewer clients or a lower data.min_samples")
    if "min_samples" in inspect.signature(fn).parameters:  # schemes that can redraw take the guard themselves
        kwargs["min_samples"] = min_samples
    parts = [np.asarray(part) for part in fn(labels, num_clients, numpy_rng(seed, "partition"), **kwargs)]
    _check_parts(scheme, parts, num_clients, len(labels))
    for client, part in enumerate(parts):
        if len(part) < min_samples:
            raise DataError(f"partition {scheme!r} gave client {client} only {len(part)} samples, below "
                            f"data.min_samples={min_samples}; fix: use fewer clients, other "
                            "data.partition_params, or a lower data.min_samples")
    return [np.sort(part).astype(np.int64) for part in parts]


def _check_parts(scheme: str, parts: list[np.ndarray], num_clients: int, num_samples: int) -> None:
    """What every scheme promises (a plug-in's mistakes stop here, not as a wrong run): one integer index
    array per client, each index a training sample's, no sample on two clients."""
    problem = None
    if len(parts) != num_clients:
        problem = f"{len(parts)} index arrays for {num_clients} clients"
    elif any(part.ndim != 1 or not (part.size == 0 or np.issubdtype(part.dtype, np.integer)) for part in parts):
        problem = "an index array that is not one-dimensional integers"
    else:
        held = np.concatenate([part.astype(np.int64) for part in parts])     # num_clients >= 1: some part
        if held.size and (held.min() < 0 or held.max() >= num_samples):
            problem = f"an index outside 0..{num_samples - 1}"
        elif held.size != np.unique(held).size:
            problem = "a sample on two clients (or twice on one)"
    if problem:
        raise DataError(f"data.partition = {scheme!r} returned {problem}; a scheme returns, per client, the "
                        "indices of its training samples, each sample on at most one client")


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
