"""assign_clients: deterministic, counts balanced to +-1, data sizes balanced within that; deal_cohort
(per-round placement): longest first, within Graham's bound of the best split; idle_workers names the
ranks that would never train, and a launch with such ranks warns; pick_device; `place` decides them all
once, and its record hosts each round's cohort."""
from collections import Counter
from dataclasses import FrozenInstanceError

import numpy as np
import pytest
import torch

from hpcfl.errors import ConfigError
from hpcfl.jobs import job_from_dict
from hpcfl.logs import configure
from hpcfl.runtime.placement import assign_clients, deal_cohort, idle_workers, pick_device, place, worker_ranks


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

    def spread(a):
        return max(loads(a, sizes, workers).values()) - min(loads(a, sizes, workers).values())

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
def test_cuda_without_a_gpu_fails_naming_the_setting_and_auto_falls_back_with_a_warning(capsys):
    with pytest.raises(ConfigError, match="run.device = 'cuda'"):
        pick_device("cuda", 0)
    configure(0)
    assert pick_device("auto", 0) == torch.device("cpu")
    assert " WARNING run.device = 'auto' found no GPU" in capsys.readouterr().err


def test_the_node_local_rank_picks_its_gpu_round_robin(monkeypatch):
    """Ranks 0..5 of a node with 4 GPUs use cuda:0, 1, 2, 3, 0, 1 (CUDA_VISIBLE_DEVICES sets what torch counts)."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert [pick_device("auto", rank) for rank in range(6)] == [torch.device("cuda", k) for k in (0, 1, 2, 3, 0, 1)]
    assert pick_device("cuda", 5) == torch.device("cuda", 1) and pick_device("cpu", 5) == torch.device("cpu")


def makespan(deal, cost):
    load = Counter()
    for c, w in deal.items():
        load[w] += cost[c]
    return max(load.values())


@pytest.mark.parametrize("seed", range(30))
def test_dealing_a_cohort_is_within_grahams_bound_of_the_best(seed):
    # Longest processing time first is within 4/3 - 1/(3W) of the best split; checked by brute force.
    import itertools

    rng = np.random.default_rng(seed)
    cost = np.ceil(rng.dirichlet([0.3] * 12) * 3000)        # Dirichlet-skewed client sizes, in batches
    cohort = sorted(rng.choice(12, size=7, replace=False).tolist())
    workers = [1, 2, 3][:2 + seed % 2]
    deal = deal_cohort(cohort, cost, workers)
    assert sorted(deal) == cohort and set(deal.values()) <= set(workers)
    best = min(makespan(dict(zip(cohort, split, strict=True)), cost)
               for split in itertools.product(workers, repeat=len(cohort)))
    assert makespan(deal, cost) <= (4 / 3 - 1 / (3 * len(workers))) * best + 1e-9


def test_dealing_is_deterministic_and_puts_the_largest_first_on_the_lowest_rank():
    cost = np.array([5.0, 9.0, 9.0, 1.0, 4.0])
    deal = deal_cohort([4, 3, 2, 1, 0], cost, [1, 2])
    assert deal == deal_cohort([0, 1, 2, 3, 4], cost.copy(), [1, 2])
    assert deal[1] == 1 and deal[2] == 2                   # equal costs: the lower id to the lower rank
    assert makespan(deal, cost) == 14                      # 9 + 5 | 9 + 4 + 1


def test_dealing_spreads_equal_clients_evenly_and_leaves_extra_workers_idle():
    deal = deal_cohort(list(range(7)), np.ones(7), [1, 2, 3])
    assert sorted(Counter(deal.values()).values()) == [2, 2, 3]
    assert set(deal_cohort([3, 8], np.ones(10), [1, 2, 3, 4]).values()) == {1, 2}


def test_dealt_rounds_are_balanced_where_fixed_placement_is_not_on_dirichlet_clients():
    # What per-round placement is for: Dir(0.1) over 20 clients, 10 per round, 2 workers, 200 rounds.
    from hpcfl.data.partition import partition
    from hpcfl.seeding import cohort_schedule

    parts = partition(np.repeat(np.arange(10), 6000), 20, "dirichlet", {"beta": 0.1}, 0)
    cost = np.ceil(np.array([len(p) for p in parts]) / 32)
    home = assign_clients(cost, [1, 2])
    fixed, dealt = [], []
    for cohort in cohort_schedule(0, 200, 20, 10).tolist():
        mean = cost[cohort].sum() / 2
        fixed.append(makespan({c: home[c] for c in cohort}, cost) / mean - 1)     # busiest over the mean
        dealt.append(makespan(deal_cohort(cohort, cost, [1, 2]), cost) / mean - 1)
    assert np.mean(dealt) < 0.05 < 0.15 < np.mean(fixed), (np.mean(dealt), np.mean(fixed))


def test_every_rank_but_the_server_trains_unless_there_is_only_one():
    assert worker_ranks(1) == [0] and worker_ranks(2) == [1] and worker_ranks(5) == [1, 2, 3, 4]


def test_idle_workers_are_those_no_client_ever_reaches():
    sizes = np.array([50, 40])
    homes = assign_clients(sizes, [1, 2, 3])
    assert idle_workers([1, 2, 3], homes, 2, moving=False) == [3]
    assert idle_workers([1, 2, 3, 4], assign_clients(sizes, [1, 2, 3, 4]), 1, moving=True) == [2, 3, 4]
    dealt = set(deal_cohort([0, 1], np.array([2.0, 1.0]), [1, 2, 3, 4]).values())
    assert idle_workers([1, 2, 3, 4], {}, 2, moving=True) == sorted({1, 2, 3, 4} - dealt)
    assert idle_workers([1, 2], assign_clients(np.array([5, 4, 3]), [1, 2]), 1, moving=False) == []


def test_a_launch_with_more_workers_than_clients_names_the_idle_ranks(tiny_job, tmp_path):
    from helpers import launch

    result = launch(tiny_job(rounds=1), "--results-root", tmp_path, "--set", "data.num_clients=2",
                    "--set", "train.clients_per_round=2", ranks=4)
    assert result.returncode == 0, result.stderr
    assert "rank(s) 3 will host no client in any round" in result.stderr and "mpirun -np 3" in result.stderr


def test_a_placement_is_decided_once_and_hosts_each_round_as_it_says():
    config = job_from_dict({"run": {"device": "cpu", "memory_format": "contiguous"}, "data": {"num_clients": 4},
                            "train": {"clients_per_round": 2, "batch_size": 10}})
    sizes = np.array([40, 10, 25, 5])
    fixed = place(config, 3, 0, sizes, moving=False)
    assert fixed.device == torch.device("cpu") and fixed.memory_format == torch.contiguous_format
    # largest first to the least-loaded worker, two clients each: 0 (40) -> 1, 2 (25) -> 2, 1 (10) -> 2, 3 (5) -> 1
    assert fixed.workers == [1, 2] and fixed.homes == {0: 1, 2: 2, 1: 2, 3: 1}
    assert fixed.cost is None and fixed.idle == [] and fixed.hosts([3, 1]) == {3: 1, 1: 2}
    moving = place(config, 4, 0, sizes, moving=True)
    np.testing.assert_array_equal(moving.cost, [4, 1, 3, 1])           # batches of 10 per epoch
    # dealt afresh, the costliest first: 2 (3 batches) -> 1, 1 (1 batch) -> 2, where fixed homes are both rank 2
    assert moving.hosts([1, 2]) == {2: 1, 1: 2} and moving.idle == [3]     # 2 per round: rank 3 never trains
    assert place(config, 1, 0, sizes, moving=False).hosts([2]) == {2: 0}
    with pytest.raises(FrozenInstanceError):         # decided once: nobody moves a client behind the record
        fixed.homes = {}
