"""assign_clients: deterministic, counts balanced to +-1, data sizes balanced within that; pick_device."""
from collections import Counter

import numpy as np
import pytest
import torch

from hpcfl.errors import ConfigError
from hpcfl.runtime.placement import assign_clients, pick_device


def check_counts(assignment, n_clients, workers):
    assert sorted(assignment) == list(range(n_clients))
    assert set(assignment.values()) <= set(workers)
    counts = Counter(assignment.values())
    per_worker = [counts.get(w, 0) for w in workers]
    assert sum(per_worker) == n_clients
    assert max(per_worker) - min(per_worker) <= 1, per_worker
    return per_worker


def loads(assignment, sizes, workers):
    load = {w: 0 for w in workers}
    for c, w in assignment.items():
        load[w] += int(sizes[c])
    return load


def test_deterministic():
    sizes = np.random.default_rng(0).integers(1, 1000, size=37)
    a = assign_clients(sizes, [1, 2, 3, 4])
    assert a == assign_clients(sizes.copy(), [1, 2, 3, 4])
    assert a == assign_clients(list(sizes), [1, 2, 3, 4])


@pytest.mark.parametrize("n_clients", [1, 2, 3, 4, 5, 7, 10, 23, 100])
@pytest.mark.parametrize("workers", [[0], [1, 2], [1, 2, 3], [1, 2, 3, 4, 5, 6, 7]])
@pytest.mark.parametrize("kind", ["random", "skewed", "equal", "zeros"])
def test_every_client_placed_and_counts_within_one(n_clients, workers, kind):
    rng = np.random.default_rng(n_clients * 31 + len(workers))
    sizes = {
        "random": rng.integers(1, 500, size=n_clients),
        "skewed": np.array([10_000] + [1] * (n_clients - 1)),      # one huge client
        "equal": np.full(n_clients, 50),
        "zeros": np.zeros(n_clients, dtype=int),                     # clients with no data
    }[kind]
    check_counts(assign_clients(sizes, workers), n_clients, workers)


def test_one_huge_client_does_not_unbalance_counts():
    # Regression: a count cap alone let the huge client's worker keep 1 client while others took 3.
    sizes = np.array([100, 1, 1, 1, 1, 1, 1])
    per_worker = check_counts(assign_clients(sizes, [1, 2, 3]), 7, [1, 2, 3])
    assert sorted(per_worker) == [2, 2, 3]


def test_data_sizes_better_balanced_than_round_robin():
    # Clients sorted by size, as a partition might number them: round-robin piles the big ones on worker 1.
    sizes = np.array([900, 800, 700, 600, 120, 110, 100, 90, 30, 20, 10, 5])
    workers = [1, 2, 3]
    greedy = assign_clients(sizes, workers)
    check_counts(greedy, len(sizes), workers)
    naive = {c: workers[c % len(workers)] for c in range(len(sizes))}
    spread = lambda a: max(loads(a, sizes, workers).values()) - min(loads(a, sizes, workers).values())
    assert spread(greedy) < spread(naive) / 2      # round-robin: 1620 / 1020 / 845
    assert max(loads(greedy, sizes, workers).values()) < max(loads(naive, sizes, workers).values())
    assert max(loads(greedy, sizes, workers).values()) < 1.2 * sizes.sum() / len(workers)


def test_largest_clients_go_to_different_workers():
    sizes = np.array([1, 1, 1000, 1, 1000, 1, 1000, 1, 1])
    a = assign_clients(sizes, [1, 2, 3])
    assert {a[2], a[4], a[6]} == {1, 2, 3}


def test_single_worker_gets_everything():
    sizes = np.array([5, 0, 300, 7, 7])
    assert assign_clients(sizes, [0]) == {c: 0 for c in range(5)}
    assert assign_clients(sizes, [4]) == {c: 4 for c in range(5)}


def test_more_workers_than_clients():
    a = assign_clients(np.array([3, 9]), [1, 2, 3, 4])
    check_counts(a, 2, [1, 2, 3, 4])
    assert len(set(a.values())) == 2               # never two clients on one worker while one sits idle


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour on a node without a GPU")
def test_cuda_without_a_gpu_fails_naming_the_setting_and_auto_falls_back_with_a_warning():
    with pytest.raises(ConfigError, match="run.device = 'cuda'"):
        pick_device("cuda", 0)
    said = []
    assert pick_device("auto", 0, said.append) == torch.device("cpu")
    assert "warning" in said[0] and "run.device = 'auto'" in said[0]
