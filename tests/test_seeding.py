"""Generators keyed by (seed, purpose, *keys): reproducible, and distinct for distinct keys."""
import numpy as np
import torch

from hpcfl.seeding import cohort_schedule, numpy_rng, torch_generator, torch_seed

torch.set_num_threads(1)


def draws(seed, purpose, *keys):
    return numpy_rng(seed, purpose, *keys).integers(0, 2**62, size=8)


def test_numpy_rng_is_reproducible():
    assert np.array_equal(draws(7, "batches", 3, 11), draws(7, "batches", 3, 11))
    a = numpy_rng(7, "partition").random(100)
    b = numpy_rng(7, "partition").random(100)
    assert np.array_equal(a, b)


def test_numpy_rng_differs_by_seed_purpose_and_keys():
    base = draws(7, "batches", 3, 11)
    others = [
        draws(8, "batches", 3, 11),       # seed
        draws(7, "cohort", 3, 11),        # purpose
        draws(7, "batches", 4, 11),       # round
        draws(7, "batches", 3, 12),       # client
        draws(7, "batches", 11, 3),       # key order matters
        draws(7, "batches", 3),           # number of keys matters
        draws(7, "batches"),
    ]
    for other in others:
        assert not np.array_equal(base, other)
    assert len({tuple(o) for o in others}) == len(others)


def test_torch_seed_is_stable_and_distinct():
    s = torch_seed(0, "init")
    assert s == torch_seed(0, "init")
    assert 0 <= s < 2**63
    seeds = {torch_seed(0, "batches", r, c) for r in range(5) for c in range(5)}
    assert len(seeds) == 25
    assert torch_seed(0, "init") != torch_seed(1, "init") != torch_seed(1, "cohort")


def test_torch_generator_is_reproducible():
    a = torch.randn(50, generator=torch_generator(3, "batches", 2, 5))
    b = torch.randn(50, generator=torch_generator(3, "batches", 2, 5))
    assert torch.equal(a, b)
    p1 = torch.randperm(100, generator=torch_generator(3, "batches", 2, 5))
    p2 = torch.randperm(100, generator=torch_generator(3, "batches", 2, 5))
    assert torch.equal(p1, p2)


def test_torch_generator_differs_by_round_client_and_purpose():
    base = torch.randn(50, generator=torch_generator(3, "batches", 2, 5))
    for other in [torch_generator(3, "batches", 3, 5), torch_generator(3, "batches", 2, 6),
                  torch_generator(3, "dropout", 2, 5), torch_generator(4, "batches", 2, 5)]:
        assert not torch.equal(base, torch.randn(50, generator=other))


def test_draws_do_not_depend_on_global_state():
    torch.manual_seed(123)
    np.random.seed(123)
    a = (torch.randn(10, generator=torch_generator(1, "x", 0)), numpy_rng(1, "x", 0).random(10))
    torch.manual_seed(999)
    np.random.seed(999)
    torch.randn(1000)
    np.random.random(1000)
    b = (torch.randn(10, generator=torch_generator(1, "x", 0)), numpy_rng(1, "x", 0).random(10))
    assert torch.equal(a[0], b[0]) and np.array_equal(a[1], b[1])


# Pinned golden values. Every partition, cohort, initialisation and batch order derives from these streams;
# changing them is a deliberate decision (past runs stop being reproducible), so update them only on purpose.

def test_golden_cohort_schedule():
    # 3 rounds x 4 of 10 clients: sorted, distinct within a round.
    assert cohort_schedule(0, 3, 10, 4).tolist() == [[2, 4, 5, 6], [0, 3, 4, 8], [2, 3, 8, 9]]


def test_golden_generator_streams():
    assert numpy_rng(0, "partition").integers(0, 100, 5).tolist() == [10, 96, 14, 45, 76]
    assert numpy_rng(0, "batches", 2, 5).integers(0, 100, 5).tolist() == [85, 0, 69, 66, 11]
    assert torch_seed(0, "init") == 7518656201426917601
    assert torch.randint(0, 100, (5,), generator=torch_generator(0, "batches", 2, 5)).tolist() == [97, 84, 45, 78, 33]


def test_a_trailing_zero_key_names_the_stream_without_it_as_documented():
    """SeedSequence pads entropy with zeros (hpcfl.seeding's docstring): a change here would move every
    stream, so it is pinned rather than fixed."""
    from hpcfl.seeding import torch_seed

    assert torch_seed(5, "init") == torch_seed(5, "init", 0) != torch_seed(5, "init", 1)
