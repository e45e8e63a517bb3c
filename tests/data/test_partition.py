"""Client partitions: disjoint cover, exact class constraints, seed-determinism (also across processes),
skew controlled by the params, config/data guards, and the per-client validation and local test splits."""
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hpcfl.data.partition import SCHEMES, count_matrix, local_test_sets, partition, validation_split
from hpcfl.errors import ConfigError, DataError

# Balanced labels like Fashion-MNIST's training set, in a fixed shuffled order.
LABELS = np.random.default_rng(1).permutation(np.repeat(np.arange(10), 6000))


def _max_class_fraction(parts) -> float:
    m = count_matrix(LABELS, parts, 10)
    return float((m.max(axis=1) / m.sum(axis=1)).mean())


@pytest.mark.parametrize("scheme,params", [("iid", {}), ("dirichlet", {"beta": 0.5}), ("dirichlet", {"beta": 0.1})])
@pytest.mark.parametrize("num_clients", [1, 7, 100])
def test_disjoint_cover_sorted_int64(scheme, params, num_clients):
    parts = partition(LABELS, num_clients, scheme, params, seed=3)
    assert len(parts) == num_clients
    assert all(p.dtype == np.int64 and np.all(np.diff(p) > 0) for p in parts)  # sorted, no repeats
    assert sum(len(p) for p in parts) == len(LABELS)
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(len(LABELS)))
    assert min(len(p) for p in parts) >= 10


@pytest.mark.parametrize("scheme,params", [("iid", {}), ("dirichlet", {"beta": 0.5})])
def test_same_seed_same_partition_other_seed_differs(scheme, params):
    a = partition(LABELS, 20, scheme, params, seed=5)
    b = partition(LABELS, 20, scheme, params, seed=5)
    c = partition(LABELS, 20, scheme, params, seed=6)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def test_iid_is_near_uniform():
    parts = partition(LABELS, 50, "iid", {}, seed=0)
    assert max(len(p) for p in parts) - min(len(p) for p in parts) <= 1
    assert _max_class_fraction(parts) < 0.2  # 1,200 samples per client: each class near 10%


def test_small_beta_is_more_skewed_than_large_beta():
    skewed = _max_class_fraction(partition(LABELS, 50, "dirichlet", {"beta": 0.1}, seed=0))
    mild = _max_class_fraction(partition(LABELS, 50, "dirichlet", {"beta": 100}, seed=0))
    assert skewed > 0.45 and mild < 0.15, (skewed, mild)


def test_impossible_client_count_raises_data_error():
    with pytest.raises(DataError, match="fewer clients"):
        partition(LABELS[:500], 1000, "iid", {}, seed=0)


def test_dirichlet_gives_up_after_redraws_with_the_fix():
    # Feasible on paper (exactly 10 each) but no skewed draw ever gives all 200 clients 10 samples.
    with pytest.raises(DataError, match="beta") as err:
        partition(LABELS[:2000], 200, "dirichlet", {"beta": 0.05}, seed=0, min_samples=10)
    assert "data.min_samples" in str(err.value)


def test_min_samples_guard_applies_to_every_registered_scheme(monkeypatch):
    def lopsided(labels, num_clients, rng):  # a future scheme that starves its last client
        return np.array_split(np.arange(len(labels)), [len(labels) - 3])

    monkeypatch.setitem(SCHEMES, "lopsided", lopsided)
    with pytest.raises(DataError, match=r"client 1 only 3 samples.*data\.min_samples=10"):
        partition(LABELS, 2, "lopsided", {}, seed=0)


@pytest.mark.parametrize("params,key", [
    ({"beta": 0.5, "alpha": 1}, "data.partition_params.alpha"),
    ({"beta": 0}, "data.partition_params.beta"),
    ({"beta": -1.0}, "data.partition_params.beta"),
    ({"beta": "0.5"}, "data.partition_params.beta"),
    ({}, "data.partition_params.beta"),
])
def test_bad_dirichlet_params_name_the_key(params, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        partition(LABELS, 10, "dirichlet", params, seed=0)


def test_iid_rejects_any_param_and_unknown_scheme_lists_valid():
    with pytest.raises(ConfigError, match=r"data\.partition_params\.beta"):
        partition(LABELS, 10, "iid", {"beta": 1.0}, seed=0)
    with pytest.raises(ConfigError, match=r"data\.partition") as err:
        partition(LABELS, 10, "shards", {}, seed=0)
    assert all(name in str(err.value) for name in SCHEMES)


def test_count_matrix_hand_example():
    labels = np.array([0, 1, 2, 1, 0, 2, 2])
    parts = [np.array([0, 1, 3]), np.array([2, 5, 6]), np.array([4])]
    expected = np.array([[1, 2, 0, 0],
                         [0, 0, 3, 0],
                         [1, 0, 0, 0]])
    got = count_matrix(labels, parts, num_classes=4)
    assert got.dtype == np.int64 and np.array_equal(got, expected)


# The new schemes with settings that fit LABELS (and DOMINANT_LABELS for "dominant") at 20 clients.
NEW_SCHEMES = [
    ("dirichlet_equal", {"beta": 0.5}),
    ("classes_per_client", {"k": 2}),
    ("missing", {"x": 3}),
    ("quantity_skew", {"beta": 1.0}),
    ("quantity_skew", {"sigma": 1.0}),
    ("dominant", {"n_dominant": 23, "n_other": 3}),
]
# FedFM's CIFAR-10 NIID-2 split scaled down 100x: 10 classes x 50, client i gets 23 of class i and 3 of the rest.
DOMINANT_LABELS = np.random.default_rng(2).permutation(np.repeat(np.arange(10), 50))


def _labels_for(scheme):
    return DOMINANT_LABELS if scheme == "dominant" else LABELS


def _clients_for(scheme):
    return 10 if scheme == "dominant" else 20


def _disjoint_sorted(parts):
    flat = np.concatenate(parts)
    return all(p.dtype == np.int64 and np.all(np.diff(p) > 0) for p in parts) and len(np.unique(flat)) == len(flat)


@pytest.mark.parametrize("scheme,params", [s for s in NEW_SCHEMES if s[0] != "dirichlet_equal"])
def test_covering_schemes_are_disjoint_covers(scheme, params):
    labels = _labels_for(scheme)
    parts = partition(labels, _clients_for(scheme), scheme, params, seed=3)
    assert len(parts) == _clients_for(scheme) and _disjoint_sorted(parts)
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(len(labels)))


@pytest.mark.parametrize("scheme,params", NEW_SCHEMES)
def test_new_schemes_same_seed_same_partition_other_seed_differs(scheme, params):
    labels, n = _labels_for(scheme), _clients_for(scheme)
    a = partition(labels, n, scheme, params, seed=5)
    b = partition(labels, n, scheme, params, seed=5)
    c = partition(labels, n, scheme, params, seed=6)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


@pytest.mark.parametrize("num_clients", [7, 20])
def test_dirichlet_equal_gives_equal_sizes_and_beta_controls_skew(num_clients):
    parts = partition(LABELS, num_clients, "dirichlet_equal", {"beta": 0.1}, seed=0)
    assert _disjoint_sorted(parts)
    assert [len(p) for p in parts] == [len(LABELS) // num_clients] * num_clients
    skewed = _max_class_fraction(parts)
    mild = _max_class_fraction(partition(LABELS, num_clients, "dirichlet_equal", {"beta": 100}, seed=0))
    assert skewed > 0.45 and mild < 0.15, (skewed, mild)


def test_dirichlet_equal_size_takes_a_subset_of_equal_clients():
    parts = partition(LABELS, 7, "dirichlet_equal", {"beta": 0.5, "size": 40}, seed=0)
    assert [len(p) for p in parts] == [40] * 7 and _disjoint_sorted(parts)
    with pytest.raises(ConfigError, match="partition_params.size"):
        partition(LABELS, 7, "dirichlet_equal", {"beta": 0.5, "size": 10_000}, seed=0)


def test_dirichlet_equal_exhausts_classes_and_still_fills_every_client():
    # 3 classes of very different sizes: the big client shares would overrun the small classes.
    labels = np.repeat([0, 1, 2], [900, 60, 40])
    parts = partition(labels, 9, "dirichlet_equal", {"beta": 0.3}, seed=1)
    assert [len(p) for p in parts] == [111] * 9 and _disjoint_sorted(parts)


@pytest.mark.parametrize("num_clients,k", [(20, 2), (7, 3), (3, 2), (10, 10)])
def test_classes_per_client_holds_exactly_k_classes_split_evenly(num_clients, k):
    m = count_matrix(LABELS, partition(LABELS, num_clients, "classes_per_client", {"k": k}, seed=1), 10)
    assert np.all((m > 0).sum(axis=1) == k)
    holders = (m > 0).sum(axis=0)
    assert holders.max() - holders.min() <= 1  # classes used as evenly as possible
    if num_clients * k >= 10:
        assert holders.min() >= 1 and m.sum() == len(LABELS)
    for col in m.T:  # each class split evenly among the clients holding it
        shares = col[col > 0]
        assert shares.size == 0 or shares.max() - shares.min() <= 1


def test_classes_per_client_gives_varied_class_sets():
    # Reshuffling the class order every cycle: 20 clients x 2 classes are not 5 pairs repeated 4 times.
    m = count_matrix(LABELS, partition(LABELS, 20, "classes_per_client", {"k": 2}, seed=0), 10)
    assert len({tuple(np.flatnonzero(row)) for row in m}) > 5


def test_dominant_counts_are_exact():
    m = count_matrix(DOMINANT_LABELS, partition(DOMINANT_LABELS, 10, "dominant",
                                                {"n_dominant": 23, "n_other": 3}, seed=0), 10)
    assert np.array_equal(m, np.full((10, 10), 3) + 20 * np.eye(10, dtype=np.int64))


def test_dominant_with_several_dominant_classes_and_more_clients_than_classes():
    params = {"n_dominant": 40, "n_other": 5, "dominant_classes": 2}
    m = count_matrix(LABELS, partition(LABELS, 12, "dominant", params, seed=0), 10)
    expected = np.full((12, 10), 5)
    for i in range(12):
        expected[i, [(2 * i) % 10, (2 * i + 1) % 10]] = 40
    assert np.array_equal(m, expected)


def test_dominant_raises_naming_the_class_that_runs_out():
    labels = DOMINANT_LABELS[DOMINANT_LABELS != 4]
    labels = np.concatenate([labels, np.full(30, 4)])  # class 4 has 30 samples, needs 23 + 9 x 3 = 50
    with pytest.raises(DataError, match=r"class 4\b.*n_dominant.*n_other"):
        partition(labels, 10, "dominant", {"n_dominant": 23, "n_other": 3}, seed=0, min_samples=1)


@pytest.mark.parametrize("num_clients,x", [(10, 1), (20, 3), (7, 5), (10, 7), (5, 0)])
def test_missing_lacks_exactly_x_classes(num_clients, x):
    parts = partition(LABELS, num_clients, "missing", {"x": x}, seed=2)
    m = count_matrix(LABELS, parts, 10)
    assert np.all((m == 0).sum(axis=1) == x)
    missed_by = (m == 0).sum(axis=0)
    assert missed_by.max() - missed_by.min() <= 1  # missing classes spread evenly over the classes
    assert m.sum() == len(LABELS)
    for col in m.T:
        shares = col[col > 0]
        assert shares.max() - shares.min() <= 1


def test_quantity_skew_sizes_vary_labels_stay_iid():
    parts = partition(LABELS, 20, "quantity_skew", {"beta": 0.5}, seed=0, min_samples=50)
    sizes = np.array([len(p) for p in parts])
    assert sizes.min() >= 50 and sizes.max() > 4 * sizes.min()
    m = count_matrix(LABELS, parts, 10)
    big = m[sizes >= 1000]  # enough samples for the class mix to be near 10% each
    assert np.all(np.abs(big / big.sum(axis=1, keepdims=True) - 0.1) < 0.05)


def test_quantity_skew_sigma_zero_is_equal_sizes():
    sizes = [len(p) for p in partition(LABELS, 7, "quantity_skew", {"sigma": 0}, seed=0)]
    assert max(sizes) - min(sizes) <= 1


def test_quantity_skew_gives_up_after_redraws_with_the_fix():
    with pytest.raises(DataError, match=r"data\.partition_params\.sigma.*data\.min_samples"):
        partition(LABELS[:2000], 100, "quantity_skew", {"sigma": 3.0}, seed=0, min_samples=20)


@pytest.mark.parametrize("scheme,params,key", [
    ("classes_per_client", {"k": 0}, "k"),
    ("classes_per_client", {"k": 11}, "k"),
    ("classes_per_client", {"k": 2.0}, "k"),
    ("classes_per_client", {}, "k"),
    ("missing", {"x": 10}, "x"),
    ("missing", {"x": -1}, "x"),
    ("dominant", {"n_dominant": 23}, "n_other"),
    ("dominant", {"n_dominant": -1, "n_other": 3}, "n_dominant"),
    ("dominant", {"n_dominant": 23, "n_other": 3, "dominant_classes": 11}, "dominant_classes"),
    ("dirichlet_equal", {"beta": 0}, "beta"),
    ("quantity_skew", {}, "sigma"),
    ("quantity_skew", {"beta": 1.0, "sigma": 1.0}, "beta"),
    ("quantity_skew", {"beta": True}, "beta"),
    ("quantity_skew", {"sigma": -0.5}, "sigma"),
])
def test_bad_new_scheme_params_name_the_key(scheme, params, key):
    with pytest.raises(ConfigError, match=rf"data\.partition_params\.{key}\b"):
        partition(DOMINANT_LABELS, 10, scheme, params, seed=0, min_samples=1)


def test_more_holders_than_samples_of_a_class_is_a_data_error():
    labels = np.concatenate([np.zeros(100, dtype=np.int64), np.ones(3, dtype=np.int64)])
    with pytest.raises(DataError, match=r"class 1 has 3 samples.*data\.partition_params\.k"):
        partition(labels, 8, "classes_per_client", {"k": 2}, seed=0, min_samples=1)


@pytest.mark.parametrize("fraction", [0.0, 0.2, 0.5])
def test_validation_split_fractions_and_disjointness(fraction):
    parts = partition(LABELS, 20, "quantity_skew", {"beta": 0.5}, seed=0)
    train, val = validation_split(parts, fraction, seed=0)
    for part, t, v in zip(parts, train, val):
        assert len(v) == int(np.floor(fraction * len(part) + 0.5))
        assert np.array_equal(np.sort(np.concatenate([t, v])), part) and not np.intersect1d(t, v).size
        assert t.dtype == v.dtype == np.int64
    again = validation_split(parts, fraction, seed=0)
    assert all(np.array_equal(a, b) for a, b in zip(val, again[1]))
    if fraction:
        assert not all(np.array_equal(a, b) for a, b in zip(val, validation_split(parts, fraction, seed=1)[1]))


def test_validation_split_keeps_one_training_sample_and_checks_fraction():
    train, val = validation_split([np.array([4]), np.array([1, 7])], 0.9, seed=0)
    assert [len(t) for t in train] == [1, 1] and [len(v) for v in val] == [0, 1]
    for bad in (1.0, -0.1, "0.2"):
        with pytest.raises(ConfigError, match="fraction"):
            validation_split([np.arange(10)], bad, seed=0)


TEST_LABELS = np.random.default_rng(4).permutation(np.repeat(np.arange(10), 1000))


def test_local_test_sets_match_each_clients_train_mix_and_size():
    counts = count_matrix(LABELS, partition(LABELS, 20, "dirichlet", {"beta": 0.3}, seed=0), 10)
    sets = local_test_sets(TEST_LABELS, counts, 0.3, seed=0)
    got = count_matrix(TEST_LABELS, sets, 10)
    for row, s, g in zip(counts, sets, got):
        size = int(np.floor(0.3 * row.sum() + 0.5))
        assert len(s) == size and s.dtype == np.int64
        assert np.all(np.abs(g - size * row / row.sum()) < 1)  # the train mix, up to rounding
        need_repeat = g > 1000  # a sample repeats within a client only once its class is used up
        assert len(np.unique(s)) == len(s) - (g[need_repeat] - 1000).sum()
    assert all(np.array_equal(a, b) for a, b in zip(sets, local_test_sets(TEST_LABELS, counts, 0.3, seed=0)))
    assert not all(np.array_equal(a, b) for a, b in zip(sets, local_test_sets(TEST_LABELS, counts, 0.3, seed=1)))


def test_local_test_sets_reuse_samples_only_when_a_class_runs_out():
    counts = np.array([[40, 0, 10], [0, 0, 0]])
    sets = local_test_sets(np.array([0, 0, 0, 2, 2, 2, 2, 2, 1]), counts, 1.0, seed=0)
    assert len(sets[1]) == 0
    used = np.bincount(sets[0], minlength=9)
    assert len(sets[0]) == 50 and np.all(used[:3] >= 13) and np.all(used[:3] <= 14)  # 40 over 3 samples
    assert np.all(used[3:8] == 2) and used[8] == 0
    with pytest.raises(DataError, match="class 1"):
        local_test_sets(np.array([0, 2]), np.array([[1, 1, 1]]), 1.0, seed=0)


def _digests() -> dict:
    """sha256 of every new scheme's partition and of the evaluation splits built on one of them."""
    out = {}
    for scheme, params in NEW_SCHEMES:
        parts = partition(_labels_for(scheme), _clients_for(scheme), scheme, params, seed=11)
        out[f"{scheme}{params}"] = hashlib.sha256(b"".join(p.tobytes() for p in parts)).hexdigest()
    counts = count_matrix(DOMINANT_LABELS, parts, 10)  # the last scheme is "dominant"
    train, val = validation_split(parts, 0.2, seed=11)
    tests = local_test_sets(TEST_LABELS, counts, 0.3, seed=11)
    out["eval"] = hashlib.sha256(b"".join(p.tobytes() for p in train + val + tests)).hexdigest()
    return out


def test_partition_is_identical_in_another_process():
    """Topology independence: a fresh interpreter (other hash seed, one thread) computes the same split."""
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); "
            "from test_partition import _digests; print(json.dumps(_digests()))")
    env = {**os.environ, "PYTHONHASHSEED": "123", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent)], env=env,
                          capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(done.stdout.splitlines()[-1]) == _digests()


def test_natural_clients_are_whole_owners_drawn_among_the_large_enough():
    owners = np.repeat([4, 7, 9, 11, 12], [30, 5, 40, 12, 25])        # owner 7 holds only 5 samples
    labels = np.zeros(len(owners), dtype=np.int64)
    parts = partition(labels, 3, "natural", {"min_owner_samples": 12}, seed=0, min_samples=1, owners=owners)
    held = [set(owners[p].tolist()) for p in parts]
    assert all(len(h) == 1 for h in held)                               # one owner per client...
    assert {next(iter(h)) for h in held} <= {4, 9, 11, 12}             # ...never the small one
    for part in parts:
        assert len(part) == np.count_nonzero(owners == owners[part[0]])  # ...with all its samples
    with pytest.raises(DataError, match="min_owner_samples"):
        partition(labels, 4, "natural", {"min_owner_samples": 26}, seed=0, min_samples=1, owners=owners)
    with pytest.raises(ConfigError, match="shakespeare"):
        partition(labels, 2, "natural", {}, seed=0, min_samples=1)
