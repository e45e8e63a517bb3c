"""Client partitions: disjoint cover, seed-determinism, skew controlled by beta, and config/data guards."""
import numpy as np
import pytest

from hpcfl.data.partition import SCHEMES, count_matrix, partition
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
