"""Client partitions: disjoint cover, exact class constraints, seed-determinism (also across processes),
skew controlled by the params, config/data guards, and the per-client validation and local test splits."""
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hpcfl.data.partition import PARTITIONS, check_params, count_matrix, partition
from hpcfl.data.splits import local_test_sets, shared_set, training_subset, validation_split
from hpcfl.errors import ConfigError, DataError
from hpcfl.jobs import job_from_dict

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
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_iid_is_near_uniform():
    parts = partition(LABELS, 50, "iid", {}, seed=0)
    assert max(len(p) for p in parts) - min(len(p) for p in parts) <= 1
    assert _max_class_fraction(parts) < 0.2  # 1,200 samples per client: each class near 10%


def test_small_beta_is_more_skewed_than_large_beta():
    skewed = _max_class_fraction(partition(LABELS, 50, "dirichlet", {"beta": 0.1}, seed=0))
    mild = _max_class_fraction(partition(LABELS, 50, "dirichlet", {"beta": 100}, seed=0))
    assert skewed > 0.35 and mild < 0.15, (skewed, mild)  # 7 clients of 8571 samples: 6000 at most of a class


def test_impossible_client_count_raises_data_error():
    # Refused before any scheme runs; exactly enough (50 x 10 = 500) is accepted.
    with pytest.raises(DataError, match=r"1000 clients x data\.min_samples=10 needs 10000 samples.*fewer clients"):
        partition(LABELS[:500], 1000, "iid", {}, seed=0)
    with pytest.raises(DataError, match=r"51 clients x data\.min_samples=10 needs 510 samples"):
        partition(LABELS[:500], 51, "iid", {}, seed=0)
    assert [len(p) for p in partition(LABELS[:500], 50, "iid", {}, seed=0)] == [10] * 50
    with pytest.raises(ConfigError, match="num_clients = 0"):
        partition(LABELS[:500], 0, "iid", {}, seed=0)


def test_dirichlet_gives_up_after_redraws_with_the_fix():
    # Feasible on paper (exactly 10 each) but no skewed draw ever gives all 200 clients 10 samples.
    with pytest.raises(DataError, match="beta=0.05 .* in all 1000 draws") as err:
        partition(LABELS[:2000], 200, "dirichlet", {"beta": 0.05}, seed=0, min_samples=10)
    assert "data.min_samples" in str(err.value)
    with pytest.raises(DataError, match=r"beta=0.0001 over 20 clients: in \d+ of 1000 draws every open client's "
                                        r"share of a class was 0 in floating point; fix: a larger data"):
        partition(np.repeat(np.arange(10), 500), 20, "dirichlet", {"beta": 1e-4}, seed=0, min_samples=10)


def lopsided(labels, num_clients, rng):
    """A plug-in scheme that starves its last client."""
    return np.array_split(np.arange(len(labels)), [len(labels) - 3])


def test_min_samples_guard_applies_to_every_scheme_plug_ins_included():
    with pytest.raises(DataError, match=r"client 1 only 3 samples.*data\.min_samples=10"):
        partition(LABELS, 2, f"{__name__}:lopsided", {}, seed=0)


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
    assert all(name in str(err.value) for name in PARTITIONS)


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
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


@pytest.mark.parametrize("num_clients", [7, 20])
def test_dirichlet_equal_gives_equal_sizes_and_beta_controls_skew(num_clients):
    parts = partition(LABELS, num_clients, "dirichlet_equal", {"beta": 0.1}, seed=0)
    assert _disjoint_sorted(parts)
    assert [len(p) for p in parts] == [len(LABELS) // num_clients] * num_clients
    skewed = _max_class_fraction(parts)
    mild = _max_class_fraction(partition(LABELS, num_clients, "dirichlet_equal", {"beta": 100}, seed=0))
    assert skewed > 0.35 and mild < 0.15, (skewed, mild)  # 7 clients of 8571 samples: 6000 at most of a class


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


def test_dirichlet_equal_skews_the_last_clients_no_more_than_the_first_when_it_uses_all_the_data():
    """size = 0 uses every sample, so classes run out while clients fill: they must run out for all
    clients alike, not leave the last ones the leftovers of a few classes (filled one after another:
    top class share 0.58 for the last five of 20 against 0.37 for the first five)."""
    first, last = [], []
    for seed in range(8):
        m = count_matrix(LABELS, partition(LABELS, 20, "dirichlet_equal", {"beta": 0.5}, seed=seed), 10)
        top = m.max(axis=1) / m.sum(axis=1)
        first.extend(top[:5])
        last.extend(top[-5:])
    assert abs(np.mean(last) - np.mean(first)) < 0.06, (np.mean(first), np.mean(last))
    assert 0.25 < np.mean(first) < 0.45            # still Dir(0.5)'s skew (its top share alone: 0.38)


@pytest.mark.parametrize("num_clients,k", [(20, 2), (7, 3), (3, 2), (10, 10)])
def test_classes_per_client_holds_exactly_k_classes_split_evenly(num_clients, k):
    m = count_matrix(LABELS, partition(LABELS, num_clients, "classes_per_client", {"k": k}, seed=1), 10)
    assert np.all((m > 0).sum(axis=1) == k)
    holders = (m > 0).sum(axis=0)
    assert holders.max() - holders.min() <= 1  # classes used as evenly as possible
    if num_clients * k >= 10:
        assert holders.min() >= 1 and m.sum() == len(LABELS)
    assert np.all(m.sum(axis=0)[holders > 0] == 6000)  # a held class is dealt in full, even to a lone holder
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


@pytest.mark.parametrize("num_clients,x", [(10, 1), (20, 3), (7, 5), (10, 7), (5, 0), (5, 8)])
def test_missing_lacks_exactly_x_classes(num_clients, x):
    parts = partition(LABELS, num_clients, "missing", {"x": x}, seed=2)
    m = count_matrix(LABELS, parts, 10)
    assert np.all((m == 0).sum(axis=1) == x)
    assert np.all(m.sum(axis=0) == 6000)  # (5, 8): each class on exactly one client, which gets all of it
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
    # Exactly min_samples each is enough: the first draw is kept, and no client is refused.
    assert [len(p) for p in partition(LABELS[:700], 7, "quantity_skew", {"sigma": 0}, seed=0, min_samples=100)] \
        == [100] * 7


def test_quantity_skew_huge_sigma_does_not_overflow():
    # exp(1000 z) overflows; scaled by the largest z (client 0's, 2.32, in the first draw at seed 0), client 0
    # gets everything, with no NaN size and no redraw.
    parts = partition(LABELS[:300], 5, "quantity_skew", {"sigma": 1000.0}, seed=0, min_samples=0)
    assert [len(p) for p in parts] == [300, 0, 0, 0, 0]


def test_quantity_skew_gives_up_after_redraws_with_the_fix():
    with pytest.raises(DataError, match=r"in all 1000 draws.*data\.partition_params\.sigma.*data\.min_samples"):
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
    for part, t, v in zip(parts, train, val, strict=True):
        assert len(v) == int(np.floor(fraction * len(part) + 0.5))
        assert np.array_equal(np.sort(np.concatenate([t, v])), part) and not np.intersect1d(t, v).size
        assert t.dtype == v.dtype == np.int64
    again = validation_split(parts, fraction, seed=0)
    assert all(np.array_equal(a, b) for a, b in zip(val, again[1], strict=True))
    if fraction:
        assert not all(np.array_equal(a, b)
                       for a, b in zip(val, validation_split(parts, fraction, seed=1)[1], strict=True))


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
    for row, s, g in zip(counts, sets, got, strict=True):
        size = int(np.floor(0.3 * row.sum() + 0.5))
        assert len(s) == size and s.dtype == np.int64
        assert np.all(np.abs(g - size * row / row.sum()) < 1)  # the train mix, up to rounding
        need_repeat = g > 1000  # a sample repeats within a client only once its class is used up
        assert len(np.unique(s)) == len(s) - (g[need_repeat] - 1000).sum()
    assert all(np.array_equal(a, b)
               for a, b in zip(sets, local_test_sets(TEST_LABELS, counts, 0.3, seed=0), strict=True))
    assert not all(np.array_equal(a, b)
                   for a, b in zip(sets, local_test_sets(TEST_LABELS, counts, 0.3, seed=1), strict=True))


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
    # Owner 11 holds exactly 12 samples, so 4 owners are eligible: 4 clients take each of them once.
    parts = partition(labels, 4, "natural", {"min_owner_samples": 12}, seed=0, min_samples=1, owners=owners)
    assert [owners[p[0]] for p in parts] == [4, 9, 11, 12] and [len(p) for p in parts] == [30, 40, 12, 25]
    with pytest.raises(DataError, match="needs 5 owners with >= 12 samples but the data has 4"):
        partition(labels, 5, "natural", {"min_owner_samples": 12}, seed=0, min_samples=1, owners=owners)
    with pytest.raises(DataError, match="min_owner_samples"):
        partition(labels, 4, "natural", {"min_owner_samples": 26}, seed=0, min_samples=1, owners=owners)
    with pytest.raises(ConfigError, match="shakespeare"):
        partition(labels, 2, "natural", {}, seed=0, min_samples=1)


def test_natural_never_picks_an_owner_twice():
    owners = np.repeat(np.arange(8), 3)
    parts = partition(np.zeros(24, dtype=np.int64), 8, "natural", {}, seed=0, min_samples=1, owners=owners)
    assert sorted(int(owners[p[0]]) for p in parts) == list(range(8))
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(24))


# ---- Every validation rule, both sides of each boundary (DOMINANT_LABELS: 10 classes x 50, 500 samples). ----

@pytest.mark.parametrize("scheme,params,num_clients,key", [
    ("dirichlet", {"beta": 0}, 10, "beta"),
    ("dirichlet", {"beta": float("inf")}, 10, "beta"),
    ("dirichlet", {"beta": float("nan")}, 10, "beta"),
    ("dirichlet", {"beta": True}, 10, "beta"),
    ("dirichlet_equal", {"beta": 0}, 10, "beta"),
    ("dirichlet_equal", {"beta": 0.5, "size": -1}, 10, "size"),
    ("dirichlet_equal", {"beta": 0.5, "size": 51}, 10, "size"),       # 510 > 500 samples
    ("dirichlet_equal", {"beta": 0.5, "size": 5.0}, 10, "size"),
    ("dirichlet_equal", {"size": 5}, 10, "beta"),
    ("classes_per_client", {"k": 0}, 10, "k"),
    ("classes_per_client", {"k": 11}, 10, "k"),
    ("classes_per_client", {"k": True}, 10, "k"),
    ("dominant", {"n_dominant": -1, "n_other": 1}, 10, "n_dominant"),
    ("dominant", {"n_dominant": 1, "n_other": -1}, 10, "n_other"),
    ("dominant", {"n_dominant": 1, "n_other": 1, "dominant_classes": 0}, 10, "dominant_classes"),
    ("dominant", {"n_dominant": 1, "n_other": 1, "dominant_classes": 11}, 10, "dominant_classes"),
    ("dominant", {"n_dominant": 2 ** 63, "n_other": 1}, 10, "n_dominant"),
    ("dominant", {"n_dominant": 1, "n_other": -2 ** 63 - 1}, 10, "n_other"),
    ("missing", {"x": -1}, 10, "x"),
    ("missing", {"x": 10}, 10, "x"),
    ("quantity_skew", {"beta": 0}, 10, "beta"),
    ("quantity_skew", {"sigma": -1e-9}, 10, "sigma"),
    ("quantity_skew", {"sigma": float("inf")}, 10, "sigma"),
    ("quantity_skew", {}, 10, "beta"),
    ("quantity_skew", {"beta": 1.0, "sigma": 0.0}, 10, "sigma"),
    ("iid", {"k": 2}, 10, "k"),
])
def test_each_partition_rule_refuses_naming_the_key(scheme, params, num_clients, key):
    with pytest.raises(ConfigError, match=rf"data\.partition_params\.{key}\b"):
        partition(DOMINANT_LABELS, num_clients, scheme, params, seed=0, min_samples=1)


def test_natural_min_owner_samples_rule():
    owners = np.repeat(np.arange(4), 5)
    with pytest.raises(ConfigError, match=r"data\.partition_params\.min_owner_samples = -1"):
        partition(np.zeros(20), 2, "natural", {"min_owner_samples": -1}, seed=0, min_samples=1, owners=owners)
    assert len(partition(np.zeros(20), 2, "natural", {"min_owner_samples": 0}, seed=0, min_samples=1,
                         owners=owners)) == 2


@pytest.mark.parametrize("scheme,params,num_clients", [
    ("dirichlet", {"beta": 1e-9}, 1),                  # any beta > 0; one client takes everything
    ("dirichlet_equal", {"beta": 1e-9}, 10),           # one-hot shares: classes run out, the rest fills up
    ("dirichlet_equal", {"beta": 0.5, "size": 0}, 10),
    ("dirichlet_equal", {"beta": 0.5, "size": 50}, 10),   # 50 x 10 == 500 samples
    ("classes_per_client", {"k": 1}, 10),
    ("classes_per_client", {"k": 10}, 10),
    ("dominant", {"n_dominant": 0, "n_other": 1}, 10),
    ("dominant", {"n_dominant": 5, "n_other": 0}, 10),
    ("dominant", {"n_dominant": 5, "n_other": 0, "dominant_classes": 10}, 10),   # 10 x 5 == 50 per class
    ("missing", {"x": 0}, 10),
    ("missing", {"x": 9}, 10),
    ("quantity_skew", {"beta": 1e-9}, 1),
    ("quantity_skew", {"sigma": 0}, 10),
])
def test_each_partition_rule_accepts_its_boundary(scheme, params, num_clients):
    parts = partition(DOMINANT_LABELS, num_clients, scheme, params, seed=0, min_samples=1)
    assert len(parts) == num_clients and _disjoint_sorted(parts)
    m = count_matrix(DOMINANT_LABELS, parts, 10)
    if scheme == "dirichlet_equal":
        assert [len(p) for p in parts] == [50] * 10
    if scheme == "classes_per_client":
        assert np.all((m > 0).sum(axis=1) == params["k"]) and m.sum() == 500
    if scheme == "missing":
        assert np.all((m == 0).sum(axis=1) == params["x"]) and m.sum() == 500
    if scheme == "dominant":
        d = params.get("dominant_classes", 1)
        assert np.all(m.sum(axis=1) == d * params["n_dominant"] + (10 - d) * params["n_other"])


@pytest.mark.parametrize("scheme, params, message", [
    ("dirichlet", {"beta": 0}, "beta = 0: must be > 0 (small, e.g. 0.1"),
    ("dirichlet_equal", {"beta": 0.5, "size": -3}, "size = -3: must be >= 0"),
    ("classes_per_client", {"k": 0}, "k = 0: must be >= 1"),
    ("dominant", {"n_dominant": -1, "n_other": 1}, "n_dominant = -1: must be >= 0"),
    ("dominant", {"n_dominant": 1, "n_other": 1, "dominant_classes": 0}, "dominant_classes = 0: must be >= 1"),
    ("missing", {"x": -1}, "x = -1: must be >= 0"),
    ("quantity_skew", {}, "exactly one of data.partition_params.beta"),
    ("quantity_skew", {"beta": 1.0, "sigma": 1.0}, "exactly one of"),
    ("quantity_skew", {"sigma": -0.5}, "sigma = -0.5: must be >= 0"),
    ("natural", {"min_owner_samples": -1}, "min_owner_samples = -1: must be >= 0")])
def test_settings_out_of_range_are_refused_with_the_job_before_any_data(scheme, params, message):
    """`hpcfl check` and a sweep's --submit see them, not each array task after its wait."""
    with pytest.raises(ConfigError, match=re.escape(message)):
        job_from_dict({"data": {"partition": scheme, "partition_params": params}})


def test_check_params_integer_settings_fit_int64():
    ok = check_params("dominant", {"n_dominant": 2 ** 63 - 1, "n_other": 0})
    assert ok == {"n_dominant": 2 ** 63 - 1, "n_other": 0, "dominant_classes": 1}     # with the default
    with pytest.raises(ConfigError, match=r"data\.partition_params\.n_other = -9223372036854775808: must be >= 0"):
        check_params("dominant", {"n_dominant": 1, "n_other": -2 ** 63})
    for value in (2 ** 63, -2 ** 63 - 1, 2.0, True):
        with pytest.raises(ConfigError, match=r"data\.partition_params\.n_other .*must be an integer"):
            check_params("dominant", {"n_dominant": 1, "n_other": value})


def test_dominant_huge_settings_are_a_data_error_not_an_overflow():
    # 2**63 - 1 + 9 x 1 samples of class 0 would wrap an int64 sum to a negative number.
    with pytest.raises(DataError, match=r"needs 9223372036854775816 samples of class 0"):
        partition(DOMINANT_LABELS, 10, "dominant", {"n_dominant": 2 ** 63 - 1, "n_other": 1}, seed=0)


def test_held_by_as_many_clients_as_samples_is_enough():
    # Class 1 has 3 samples: 3 holders get one each, a 4th holder is refused.
    labels = np.concatenate([np.zeros(100, dtype=np.int64), np.ones(3, dtype=np.int64)])
    m = count_matrix(labels, partition(labels, 3, "classes_per_client", {"k": 2}, seed=0, min_samples=1), 2)
    assert np.array_equal(m[:, 1], [1, 1, 1]) and m.sum() == 103
    with pytest.raises(DataError, match=r"class 1 has 3 samples but data\.partition_params\.k puts it on 4"):
        partition(labels, 4, "classes_per_client", {"k": 2}, seed=0, min_samples=1)


def test_class_sets_stay_distinct_when_a_client_straddles_cycles():
    # 6 classes, k = 4: client 1 takes slots 4, 5 of the first class order and 6, 7 of the second.
    labels = np.repeat(np.arange(6), 20)
    for seed in range(10):
        m = count_matrix(labels, partition(labels, 3, "classes_per_client", {"k": 4}, seed=seed, min_samples=1), 6)
        assert np.all((m > 0).sum(axis=1) == 4) and m.sum() == 120


SEEN = []


def spy(labels, num_clients, rng):
    """A plug-in scheme that records the type of the labels it is handed."""
    SEEN.append(type(labels))
    return np.array_split(np.arange(len(labels)), num_clients)


def test_partition_hands_schemes_a_numpy_label_array():
    partition([0, 1] * 10, 2, f"{__name__}:spy", {}, seed=0, min_samples=1)
    assert SEEN == [np.ndarray]


def returns(labels, num_clients, rng, *, case: str):
    """A plug-in scheme returning what `case` names: a good split, or one breaking the contract."""
    n = len(labels)
    return {"good": [np.arange(0, n // 2), [n - 1, n // 2]],     # a list is fine, so is any order
            "three": [np.arange(4), np.arange(4, 8), np.arange(8, 12)],
            "overlap": [np.arange(0, 6), np.arange(5, 11)],
            "out_of_range": [np.arange(0, 5), np.arange(5, n + 1)],
            "negative": [np.arange(-1, 5), np.arange(5, 10)],
            "floats": [np.arange(0.0, 5.0), np.arange(5, 10)],
            "nested": [np.arange(6).reshape(2, 3), np.arange(6, 10)]}[case]


@pytest.mark.parametrize("case, problem", [("three", "3 index arrays for 2 clients"),
                                           ("overlap", "a sample on two clients"),
                                           ("out_of_range", "an index outside 0..19"),
                                           ("negative", "an index outside 0..19"),
                                           ("floats", "an index array that is not one-dimensional integers"),
                                           ("nested", "an index array that is not one-dimensional integers")])
def test_a_scheme_breaking_the_contract_is_stopped_naming_the_key(case, problem):
    with pytest.raises(DataError, match=rf"data\.partition = '{__name__}:returns' returned {problem}"):
        partition([0, 1] * 10, 2, f"{__name__}:returns", {"case": case}, seed=0, min_samples=1)
    assert [p.tolist() for p in partition([0, 1] * 10, 2, f"{__name__}:returns", {"case": "good"}, 0, 1)] == [
        list(range(10)), [10, 19]]


def takes_two(labels, num_clients):
    return [np.arange(len(labels))]


def takes_more(labels, num_clients, rng, extra):
    return [np.arange(len(labels))]


@pytest.mark.parametrize("name, message", [
    ("takes_two", r"takes_two\(labels, num_clients\) is not a partition scheme"),
    ("takes_more", r"takes_more\(labels, num_clients, rng, extra\) is not a partition scheme"),
    ("LABELS", r"array\(.*is not a partition scheme \(a function\)"),
])
def test_a_plug_in_that_is_not_a_scheme_is_refused_naming_the_key(name, message):
    with pytest.raises(ConfigError, match=rf"data\.partition = '{__name__}:{name}': {message}"):
        check_params(f"{__name__}:{name}", {})


def test_a_setting_annotated_str_takes_a_string_and_only_a_string():
    assert check_params(f"{__name__}:returns", {"case": "good"}) == {"case": "good"}
    with pytest.raises(ConfigError, match=r"data\.partition_params\.case = 1: must be a string"):
        check_params(f"{__name__}:returns", {"case": 1})


def test_evaluation_split_rules_both_sides_of_each_boundary():
    parts = [np.arange(10)]
    for bad in (1.0, -1e-9, "0.2", True):
        with pytest.raises(ConfigError, match=r"data\.validation_fraction"):
            validation_split(parts, bad, seed=0)
    assert len(validation_split(parts, 0.0, seed=0)[1][0]) == 0
    assert len(validation_split(parts, 1 - 1e-9, seed=0)[1][0]) == 9
    counts = np.array([[2, 1]])
    for bad in (0, -0.1, "0.3", True):
        with pytest.raises(ConfigError, match=r"data\.local_test_ratio"):
            local_test_sets(np.array([0, 1]), counts, bad, seed=0)
    assert [len(s) for s in local_test_sets(np.array([0, 1]), counts, 1e-9, seed=0)] == [0]
    for bad_labels in ([0, 1, 2], [-1, 0, 1]):
        with pytest.raises(DataError, match=r"test labels must lie in 0\.\.1"):
            local_test_sets(np.array(bad_labels), counts, 1.0, seed=0)


def test_local_test_sets_need_only_the_classes_a_client_trains_on():
    # No test sample of class 1, which no client trains on; array-likes are accepted.
    sets = local_test_sets([0, 2, 2, 0], [[2, 0, 1], [0, 0, 3]], 1.0, seed=0)
    assert [np.bincount(np.array([0, 2, 2, 0])[s], minlength=3).tolist() for s in sets] == [[2, 0, 1], [0, 0, 3]]


def test_count_matrix_checks_labels_and_takes_lists():
    assert np.array_equal(count_matrix([0, 2, 1, 2], [np.array([0, 1]), np.array([2, 3])], 3), [[1, 0, 1], [0, 1, 1]])
    assert count_matrix(np.array([0, 1]), [], 2).shape == (0, 2)
    for labels in ([0, 3], [-1, 0]):
        with pytest.raises(DataError, match=r"labels must lie in 0\.\.2"):
            count_matrix(labels, [np.array([0, 1])], 3)


def test_shared_set_takes_a_list_and_needs_every_class():
    labels = [2, 0, 1, 0, 2, 1, 0]
    picked = shared_set(labels, 3, seed=4)
    assert [labels[i] for i in picked] == [0, 1, 2] and picked.dtype == np.int64
    with pytest.raises(DataError, match="no sample of class 3"):
        shared_set(labels, 4, seed=4)
    held_out = [1, 3, 5]                           # class 1's 5 and class 0's 1, 3: validation rows
    picks = {tuple(shared_set(labels, 3, seed, np.array(held_out))) for seed in range(20)}
    assert picks == {(6, 2, 0), (6, 2, 4)}          # never a held-out row; class 2's still drawn
    with pytest.raises(DataError, match="no sample of class 1 outside the validation rows"):
        shared_set(labels, 3, seed=4, held_out=np.array([2, 5]))


def test_dirichlet_caps_clients_holding_a_fair_share():
    """NIID-Bench's balancing: once a client holds >= N / num_clients samples it gets none of later classes."""
    parts = partition(LABELS, 20, "dirichlet", {"beta": 0.1}, seed=0)
    m = count_matrix(LABELS, parts, 10)
    before = np.cumsum(m, axis=1) - m  # what each client held when each class was dealt
    capped = before >= len(LABELS) / 20
    assert capped.sum() > 20 and np.all(m[capped] == 0)


# ---- Pinned golden values. The numbers below come from the seeded random streams (hpcfl.seeding, NumPy's
# Generator). Changing them is a deliberate decision: it changes every partition and split of every past
# job, so results are no longer comparable with those recorded before. Update only on purpose. ----

SMALL = np.repeat(np.arange(4), [12, 9, 6, 3])  # indices 0-11: class 0, 12-20: 1, 21-26: 2, 27-29: 3


def test_golden_dirichlet_count_matrix_shows_the_cap():
    # 40 samples, 4 clients: the cap is 10. Client 0 takes exactly 10 of class 0 and client 1 reaches 15
    # after class 1, so neither gets anything later. min_samples=7 is the smallest client: the first draw stands.
    labels = np.repeat(np.arange(3), [20, 12, 8])
    parts = partition(labels, 4, "dirichlet", {"beta": 1.0}, seed=0, min_samples=7)
    assert count_matrix(labels, parts, 3).tolist() == [[10, 0, 0], [6, 9, 0], [1, 0, 6], [3, 3, 2]]


@pytest.mark.parametrize("scheme,params,expected", [
    ("iid", {}, [[4, 4, 2, 0], [4, 2, 3, 1], [4, 3, 1, 2]]),
    ("dirichlet", {"beta": 1.0}, [[6, 0, 0, 1], [4, 4, 5, 0], [2, 5, 1, 2]]),
    ("dirichlet_equal", {"beta": 0.5}, [[6, 1, 3, 0], [1, 6, 1, 2], [5, 2, 2, 1]]),          # (filled in turns)
    ("dirichlet_equal", {"beta": 0.5, "size": 5}, [[5, 0, 0, 0], [1, 3, 0, 1], [2, 1, 1, 1]]),
    ("classes_per_client", {"k": 2}, [[0, 0, 6, 2], [6, 9, 0, 0], [6, 0, 0, 1]]),
    ("missing", {"x": 1}, [[6, 3, 0, 2], [6, 3, 3, 0], [0, 3, 3, 1]]),
    ("quantity_skew", {"sigma": 1.0}, [[10, 8, 6, 2], [1, 0, 0, 0], [1, 1, 0, 1]]),
])
def test_golden_count_matrices_at_seed_0(scheme, params, expected):
    # Column sums are the class sizes 12, 9, 6, 3 wherever a scheme deals every sample.
    parts = partition(SMALL, 3, scheme, params, seed=0, min_samples=1)
    assert count_matrix(SMALL, parts, 4).tolist() == expected


def test_golden_classes_per_client_indices():
    # Client 0: all of class 2 and two of class 3; 1: six of class 0 and all of class 1;
    # 2: the other six of 0, one of 3.
    parts = partition(SMALL, 3, "classes_per_client", {"k": 2}, seed=0, min_samples=1)
    assert [p.tolist() for p in parts] == [[21, 22, 23, 24, 25, 26, 27, 29],
                                           [1, 2, 6, 8, 9, 10, 12, 13, 14, 15, 16, 17, 18, 19, 20],
                                           [0, 3, 4, 5, 7, 11, 28]]


def test_golden_validation_split():
    # 0.25 x 10 = 2.5 and 0.25 x 6 = 1.5 round half up: 3 and 2 held out.
    train, val = validation_split([np.arange(10), np.arange(10, 16)], 0.25, seed=0)
    assert [v.tolist() for v in val] == [[1, 3, 9], [11, 13]]
    assert [t.tolist() for t in train] == [[0, 2, 4, 5, 6, 7, 8], [10, 12, 14, 15]]


def test_a_share_rounds_half_up_as_the_decimal_it_was_written_as():
    """0.35 x 90 is 31.499999999999996 in floats: 32 samples, as the documented rule says."""
    from hpcfl.data.partition import round_half_up

    assert [round_half_up(0.35, 90), round_half_up(0.29, 50), round_half_up(0.25, 10), round_half_up(0.25, 6),
            round_half_up(0.2, 7), round_half_up(0.5, 0)] == [32, 15, 3, 2, 1, 0]
    assert [len(v) for v in validation_split([np.arange(90)], 0.35, seed=0)[1]] == [32]


def test_golden_local_test_sets():
    # Test indices 0-4: class 0, 5-8: class 1, 9-11: class 2. Client 0 trains 6:3:0 -> 0.5 x 9 = 4.5 -> 5
    # test samples, 3 + 2; client 1 trains 0:2:4 -> 3 test samples, 1 + 2.
    test_labels = np.repeat(np.arange(3), [5, 4, 3])
    sets = local_test_sets(test_labels, np.array([[6, 3, 0], [0, 2, 4]]), 0.5, seed=0)
    assert [s.tolist() for s in sets] == [[0, 1, 2, 5, 8], [5, 10, 11]]


def test_golden_shared_set():
    # One index per class: 0-3 are class 0, 4-6 class 1, 7-8 class 2.
    assert shared_set(np.repeat(np.arange(3), [4, 3, 2]), 3, seed=0).tolist() == [2, 4, 8]


def test_training_subset_keeps_the_class_mix_and_is_keyed_by_the_seed():
    labels = np.array([0] * 50 + [1] * 30 + [2] * 20)       # 10 of 100: 5 / 3 / 2 exactly
    subset = training_subset(labels, 10, seed=4)
    assert subset.dtype == np.int64 and np.all(np.diff(subset) > 0)
    assert np.bincount(labels[subset], minlength=3).tolist() == [5, 3, 2]
    # 7 of 100: exact shares 3.5 / 2.1 / 1.4, largest remainders give the odd sample to class 0
    assert np.bincount(labels[training_subset(labels, 7, seed=4)], minlength=3).tolist() == [4, 2, 1]
    assert np.array_equal(training_subset(labels, 10, seed=4), subset)
    assert not np.array_equal(training_subset(labels, 10, seed=5), subset)
    assert len(training_subset(labels, 100, seed=4)) == 100


@pytest.mark.parametrize("size", [0, 101, -1, 2.5, True])
def test_training_subset_size_names_the_key(size):
    with pytest.raises(ConfigError, match="data.train_samples"):
        training_subset(np.zeros(100, dtype=np.int64), size, seed=0)


def test_a_jobs_split_indexes_the_training_set_through_its_subset():
    """client_partition (set-up's split, and the one docs/how-to/write-a-partition.md exports): with
    data.train_samples the scheme splits the subset, and the indices come back as training-set ones."""
    from hpcfl.data.splits import client_partition
    from hpcfl.jobs import job_from_dict

    job = job_from_dict({"data": {"num_clients": 4, "train_samples": 400, "partition": "dirichlet",
                                  "partition_params": {"beta": 0.5}, "seed": 3}, "train": {"clients_per_round": 4}})
    parts = client_partition(job, LABELS)
    pool = training_subset(LABELS, 400, 3)
    assert np.isin(np.concatenate(parts), pool).all() and sum(map(len, parts)) == 400
    within = partition(LABELS[pool], 4, "dirichlet", {"beta": 0.5}, 3)
    np.testing.assert_array_equal(count_matrix(LABELS, parts, 10), count_matrix(LABELS[pool], within, 10))
    assert all((np.diff(p) > 0).all() for p in parts)


def test_an_empty_part_of_any_dtype_is_a_client_with_no_samples_and_nothing_is_dealt_from_no_labels():
    """np.array([]) is float64: an empty part is still a valid (empty) index array; and with no labels
    at all there is nothing to deal."""
    from hpcfl.data.partition import _check_parts, _deal, check_scheme

    _check_parts("plugin", [np.array([]), np.array([0, 1])], 2, 2)
    with pytest.raises(DataError, match="not one-dimensional integers"):
        _check_parts("plugin", [np.array([0.0]), np.array([1])], 2, 2)
    dealt = _deal(np.zeros(0, np.int64), np.zeros((0, 2), np.int64), np.random.default_rng(0))
    assert [p.size for p in dealt] == [0, 0]
    assert check_scheme(max) == "<built-in function max> is not a partition scheme (a function)"   # no signature


def test_class_categories_of_many_clients_take_each_clients_own_shares():
    from hpcfl.data.splits import class_categories

    dominant, non_dominant, missing = class_categories([[8, 2, 0], [1, 1, 18]], 0.5)
    assert dominant.tolist() == [[True, False, False], [False, False, True]]
    assert non_dominant.tolist() == [[False, True, False], [True, True, False]]
    assert missing.tolist() == [[False, False, True], [False, False, False]]


def test_a_training_subset_of_one_sample_from_a_list_of_labels():
    assert training_subset([0, 1, 1, 0], 1, seed=0).size == 1
    with pytest.raises(ConfigError, match="data.train_samples = 5: must be an integer in 1..4"):
        training_subset([0, 1, 1, 0], 5, seed=0)


def test_split_data_reads_the_data_root_and_draws_only_what_the_job_asks(tmp_path, monkeypatch):
    """No validation: no training images for a rank that does not train, empty held-out sets, no local
    test sets, no shared set; with them, each asked for."""
    from data.test_cache import _write_mnist

    from hpcfl.data.splits import split_data

    monkeypatch.setenv("HPCFL_CACHE", "off")
    _write_mnist(tmp_path / "data")                       # 20 training and 10 test images
    data = {"dataset": "mnist", "num_clients": 2, "min_samples": 1, "partition": "iid"}
    train = {"clients_per_round": 2}
    split = split_data(job_from_dict({"data": data, "train": train}), str(tmp_path / "data"), train_images=False)
    assert len(split.data.train_x) == 0 and split.shared is None and split.local_tests is None
    assert [v.size for v in split.val_parts] == [0, 0] and sorted(np.concatenate(split.parts)) == list(range(20))
    asked = job_from_dict({"data": {**data, "validation_fraction": 0.2}, "train": train})
    split = split_data(asked, str(tmp_path / "data"), train_images=False)
    assert len(split.data.train_x) == 20 and [v.size for v in split.val_parts] == [2, 2]     # the server validates
    local = job_from_dict({"data": {**data, "dataset": "digits", "local_test_ratio": 0.5}, "train": train})
    split = split_data(local, None, train_images=False)
    assert [t.size for t in split.local_tests] == [(p.size + 1) // 2 for p in split.parts]      # half, rounded up


def test_held_out_sets_that_would_be_empty_are_refused_naming_the_key(tmp_path, monkeypatch):
    """An empty set to evaluate on would divide by zero in the first round: refused at set-up."""
    from data.test_cache import _write_mnist

    from hpcfl.data.splits import split_data

    monkeypatch.setenv("HPCFL_CACHE", "off")
    _write_mnist(tmp_path / "data")                       # 20 training and 10 test images: 10 a client
    data = {"dataset": "mnist", "num_clients": 2, "min_samples": 1, "partition": "iid"}
    train = {"clients_per_round": 2}
    few = job_from_dict({"data": {**data, "validation_fraction": 0.04}, "train": train})      # 0.4 of a sample
    with pytest.raises(ConfigError, match=r"data.validation_fraction = 0.04 holds out no sample of any client "
                                          r"\(clients of 10-10 samples\): raise it"):
        split_data(few, str(tmp_path / "data"), train_images=False)
    tiny = job_from_dict({"data": {**data, "local_test_ratio": 0.04}, "train": train})
    with pytest.raises(ConfigError, match=r"data.local_test_ratio = 0.04 gives client\(s\) \[0, 1\] \(of 10 "
                                          r"training samples\) no test sample to evaluate on"):
        split_data(tiny, str(tmp_path / "data"), train_images=False)
