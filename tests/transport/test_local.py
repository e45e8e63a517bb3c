"""LocalTransport: one process is server and sole worker; every collective is the identity."""
import numpy as np
import pytest

from hpcfl.transport import LocalTransport


@pytest.fixture
def transport():
    return LocalTransport({c: 0 for c in range(6)})


def test_single_rank_server(transport):
    assert transport.rank == 0 and transport.size == 1 and transport.is_server
    assert transport.client_rank == {c: 0 for c in range(6)}


def test_broadcast_returns_the_servers_array(transport):
    for dtype in (np.float32, np.float64, np.int64, np.uint8):
        a = np.arange(10, dtype=dtype)
        out = transport.broadcast("model", a)
        assert out.dtype == dtype
        assert np.array_equal(out, a)


def test_reduce_sum_is_float64_of_the_single_input(transport):
    a = np.array([1.5, -2.0, 3.25], dtype=np.float32)
    out = transport.reduce_sum("model", a)
    assert out.dtype == np.float64
    assert np.array_equal(out, a.astype(np.float64))
    big = np.random.default_rng(0).random(1000)
    assert np.array_equal(transport.reduce_sum("x", big), big)


def test_gather_returns_every_client(transport):
    items = {3: np.arange(4.0), 0: np.arange(2.0), 5: np.zeros(0)}
    out = transport.gather("layers", items)
    assert list(out) == [0, 3, 5]                  # client order, as on N ranks
    for c in items:
        assert np.array_equal(out[c], items[c])
    assert out is not items                        # a new dict: the caller may mutate it
    assert transport.gather("layers", {}) == {}


def test_scatter_delivers_only_the_named_receivers(transport):
    items = {0: np.arange(3.0), 2: np.arange(5.0), 4: np.ones(1)}
    out = transport.scatter("assign", items, [2, 4])
    assert set(out) == {2, 4}
    assert np.array_equal(out[2], items[2]) and np.array_equal(out[4], items[4])
    assert transport.scatter("assign", items, []) == {}


def test_exchange_swaps_pairs_in_memory(transport):
    items = {c: np.full(3, float(c)) for c in (0, 1, 2, 5)}
    out = transport.exchange("classifier", {0: 5, 5: 0, 2: 1, 1: 2}, items)
    assert set(out) == {0, 1, 2, 5}
    assert np.array_equal(out[0], items[5]) and np.array_equal(out[5], items[0])
    assert np.array_equal(out[1], items[2]) and np.array_equal(out[2], items[1])


def test_exchange_leaves_unpaired_clients_out(transport):
    items = {c: np.full(2, float(c)) for c in (0, 1, 3)}
    out = transport.exchange("classifier", {0: 1, 1: 0}, items)
    assert set(out) == {0, 1}
    assert transport.exchange("classifier", {}, items) == {}


def test_exchange_lets_one_source_feed_several_receivers(transport):
    items = {c: np.full(2, float(c)) for c in (0, 1, 3)}
    out = transport.exchange("classifier", {0: 3, 1: 3, 3: 0}, items)       # many-to-one matching
    assert np.array_equal(out[0], items[3]) and np.array_equal(out[1], items[3]) and np.array_equal(out[3], items[0])


def test_share_is_a_list_of_this_ranks_info(transport):
    info = {"host": "h", "device": "cpu"}
    assert transport.share(info) == [info]


def test_nothing_travels_so_counters_stay_zero(transport):
    transport.broadcast("model", np.ones(10))
    transport.reduce_sum("model", np.ones(10))
    transport.gather("g", {0: np.ones(3)})
    stats = transport.take_stats()
    assert sum(stats.sent.values()) == 0 and sum(stats.received.values()) == 0
    fresh = transport.take_stats()
    assert fresh is not stats and dict(fresh.sent) == {} and fresh.wait_s == 0.0


def test_a_fresh_transport_is_in_set_up_and_waits_forever_and_the_contract_is_abstract():
    from hpcfl.transport.base import Transport

    transport = LocalTransport({})
    assert transport.round == -1 and transport.timeout_s == 0.0    # "failed in set-up"; 0: no round timeout
    with pytest.raises(TypeError, match="abstract"):
        Transport({})                                              # a transport must implement every collective


def test_in_memory_delivery_reaches_only_receivers_hosted_here_whose_source_sent():
    from hpcfl.transport.base import deliver_in_memory

    items = {1: np.array([1.0]), 2: np.array([2.0])}
    got = deliver_in_memory({1: 2, 2: 1, 3: 1, 4: 9}, items, hosted=lambda r: r in (1, 3, 4))
    assert sorted(got) == [1, 3] and got[1][0] == 2.0 and got[3][0] == 1.0   # 2 hosted elsewhere, 9 sent nothing
