"""MpiTransport collectives under a real launcher, at any world size (1 included):

    mpirun -np 3 python -m pytest --with-mpi -m mpi tests/transport/test_mpi_collectives.py -q

Every rank runs every test in the same order and makes all of a test's collective calls before it
asserts anything, so a failed check on one rank never leaves the others blocked in a collective.
Expected results are computed with plain NumPy from the same deterministic inputs on every rank.
Values are small dyadic rationals, so every float64 sum is exact whatever order MPI adds in.
"""
import socket

import numpy as np
import pytest

pytestmark = pytest.mark.mpi

N_CLIENTS = 7
LENGTHS = [5, 1, 12, 0, 7, 3, 20]          # per-client buffer lengths (one empty buffer)


def world():
    from mpi4py import MPI  # imported lazily: collecting this file does not start MPI
    return MPI.COMM_WORLD


def workers(size):
    return [0] if size == 1 else list(range(1, size))


def spread(size, n=N_CLIENTS):
    """Clients round-robin over the workers (rank 0 alone if size == 1)."""
    ws = workers(size)
    return {c: ws[c % len(ws)] for c in range(n)}


def last_worker_empty(size, n=N_CLIENTS):
    """Like `spread`, but the last worker hosts nobody when there are two workers or more."""
    ws = workers(size)
    ws = ws[:-1] if len(ws) > 1 else ws
    return {c: ws[c % len(ws)] for c in range(n)}


PLACEMENTS = {"spread": spread, "last_worker_empty": last_worker_empty}


def client_buf(c, length, salt=0):
    """A deterministic, client-specific float64 buffer (exactly representable values)."""
    return (np.arange(length, dtype=np.float64) - 3) * 0.25 + 1000.0 * c + 0.125 * salt


def hosted(client_rank, rank):
    return sorted(c for c, r in client_rank.items() if r == rank)


@pytest.fixture
def make_transport():
    from hpcfl.transport.mpi import MpiTransport
    made = []

    def make(client_rank):
        t = MpiTransport(client_rank, world())
        made.append(t)
        return t
    yield make
    for t in made:
        t.close()


def test_rank_and_size_follow_the_communicator(make_transport):
    comm = world()
    t = make_transport(spread(comm.size))
    assert (t.rank, t.size) == (comm.rank, comm.size)
    assert t.is_server == (comm.rank == 0)
    assert t.client_rank == spread(comm.size)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.uint8])
def test_broadcast(make_transport, dtype):
    comm = world()
    t = make_transport(spread(comm.size))
    expected = (np.arange(1001) % 200).astype(dtype)
    if dtype in (np.float32, np.float64):
        expected = expected * dtype(0.5) - dtype(7.25)
    out = t.broadcast("model", expected.copy() if t.is_server else None)
    small = t.broadcast("empty", np.zeros(0, dtype=dtype) if t.is_server else None)
    stats = t.take_stats()

    assert out.dtype == dtype
    assert np.array_equal(out, expected)
    assert small.dtype == dtype and small.size == 0
    if t.is_server:
        assert stats.sent["model"] == expected.nbytes * (comm.size - 1)
        assert stats.received["model"] == 0
    else:
        assert stats.received["model"] == expected.nbytes
        assert stats.sent["model"] == 0


def contribution(rank, n):
    """Rank-dependent, exactly summable values; odd ranks send float32 (summed as float64)."""
    values = ((np.arange(n) % 97) - 48) * 2.0 ** -(rank % 5) + rank
    return values.astype(np.float32) if rank % 2 else values


def test_reduce_sum(make_transport):
    comm = world()
    t = make_transport(spread(comm.size))
    n = 1003
    out = t.reduce_sum("model", contribution(comm.rank, n))
    stats = t.take_stats()
    again = t.reduce_sum("zeros", np.zeros(n))

    expected = sum(contribution(r, n).astype(np.float64) for r in range(comm.size))
    if t.is_server:
        assert out.dtype == np.float64 and out.shape == (n,)
        assert np.array_equal(out, expected)
        assert np.array_equal(again, np.zeros(n))
        assert stats.received["model"] == 8 * n * (comm.size - 1)
        assert stats.sent["model"] == 0
    else:
        assert out is None and again is None
        assert stats.sent["model"] == 8 * n            # float64 on the wire, even from float32 input
        assert stats.received["model"] == 0
    assert stats.wait_s >= 0.0


def test_reduce_sum_large_buffer_is_not_truncated(make_transport):
    comm = world()
    t = make_transport(spread(comm.size))
    n = 5_000_000
    out = t.reduce_sum("big", np.arange(n, dtype=np.float64) * (comm.rank + 1))
    stats = t.take_stats()
    if t.is_server:
        factor = comm.size * (comm.size + 1) // 2          # sum of (r + 1) over ranks
        assert out.shape == (n,)
        assert out[-1] == (n - 1) * factor
        assert np.array_equal(out, np.arange(n, dtype=np.float64) * factor)
    else:
        assert out is None
        assert stats.sent["big"] == 8 * n


@pytest.mark.parametrize("sliced_from", [16, 10 ** 9])          # reduce-scatter + gather, or plain Reduce
def test_payloads_larger_than_a_chunk_move_in_pieces_and_arrive_whole(make_transport, monkeypatch, sliced_from):
    from hpcfl.transport import mpi

    monkeypatch.setattr(mpi, "CHUNK", 64)              # 1003 elements: 15 full pieces and a ragged one
    monkeypatch.setattr(mpi, "SLICED_FROM", sliced_from)
    comm = world()
    t = make_transport(spread(comm.size))
    n = 1003
    out = t.reduce_sum("model", contribution(comm.rank, n))
    sent = (np.arange(n) * 0.5).astype(np.float32)
    received = t.broadcast("model", sent.copy() if t.is_server else None)
    if t.is_server:
        assert np.array_equal(out, sum(contribution(r, n).astype(np.float64) for r in range(comm.size)))
    assert np.array_equal(received, sent)


@pytest.mark.parametrize("placement", list(PLACEMENTS))
def test_gather(make_transport, placement):
    comm = world()
    client_rank = PLACEMENTS[placement](comm.size)
    t = make_transport(client_rank)
    mine = {c: client_buf(c, LENGTHS[c]) for c in hosted(client_rank, comm.rank)}
    out = t.gather("layers", mine)
    stats = t.take_stats()

    sent = 8 * sum(LENGTHS[c] for c in mine)
    if t.is_server:
        assert out is not None
        assert list(out) == list(range(N_CLIENTS))              # client order, whatever the placement
        for c in range(N_CLIENTS):
            assert np.array_equal(out[c], client_buf(c, LENGTHS[c])), c
        assert stats.received["layers"] == 8 * sum(LENGTHS) - sent
    else:
        assert out is None
        assert stats.sent["layers"] == sent


def test_gather_from_nobody(make_transport):
    comm = world()
    t = make_transport(spread(comm.size))
    out = t.gather("nothing", {})
    assert out == ({} if t.is_server else None)


@pytest.mark.parametrize("subset", [False, True])
@pytest.mark.parametrize("placement", list(PLACEMENTS))
def test_scatter(make_transport, placement, subset):
    comm = world()
    client_rank = PLACEMENTS[placement](comm.size)
    t = make_transport(client_rank)
    targets = [0, 2, 3, 5] if subset else list(range(N_CLIENTS))
    items = {c: client_buf(c, LENGTHS[c], salt=1) for c in targets} if t.is_server else None
    receivers = [c for c in hosted(client_rank, comm.rank) if c in targets]
    out = t.scatter("assign", items, receivers[::-1])        # receiver order must not matter
    stats = t.take_stats()

    assert sorted(out) == receivers
    for c in receivers:
        assert np.array_equal(out[c], client_buf(c, LENGTHS[c], salt=1)), c
    mine = 8 * sum(LENGTHS[c] for c in receivers)
    if t.is_server:
        assert stats.sent["assign"] == 8 * sum(LENGTHS[c] for c in targets) - mine
    else:
        assert stats.received["assign"] == mine
    if not receivers:
        assert out == {}


def exchange_setup(size):
    """Pairs across two ranks (both directions, several between the same ranks), on one rank, and
    unpaired clients. With one worker every pair is on the same rank, which is still the contract."""
    ws = workers(size)
    first, mid, last = ws[0], ws[len(ws) // 2], ws[-1]
    client_rank = {0: first, 1: last, 2: last, 3: first, 4: first, 5: first, 6: mid, 7: last,
                   8: last, 9: first}
    pairs = [(0, 1), (4, 5), (2, 3), (7, 6)]
    lengths = {}
    for k, (a, b) in enumerate(pairs):
        lengths[a] = lengths[b] = 3 + 5 * k                    # partners hold equal-sized buffers
    lengths[8] = lengths[9] = 4
    return client_rank, pairs, lengths


def test_exchange(make_transport):
    comm = world()
    client_rank, pairs, lengths = exchange_setup(comm.size)
    t = make_transport(client_rank)
    mine = {c: client_buf(c, lengths[c], salt=2) for c in hosted(client_rank, comm.rank)}
    partner = {a: b for a, b in pairs} | {b: a for a, b in pairs}       # both directions of each pair
    out = t.exchange("classifier", partner, mine)
    stats = t.take_stats()
    # a second exchange right after must not pick up the first one's messages
    out2 = t.exchange("classifier", partner, {c: -b for c, b in mine.items()})

    expected = {c: client_buf(partner[c], lengths[c], salt=2) for c in mine if c in partner}
    assert sorted(out) == sorted(expected)
    for c, buf in expected.items():
        assert np.array_equal(out[c], buf), c
        assert np.array_equal(out2[c], -buf), c
    assert 8 not in out and 9 not in out                       # unpaired clients get nothing
    remote = [c for c in expected if client_rank[partner[c]] != comm.rank]
    assert stats.sent["classifier"] == 8 * sum(lengths[c] for c in remote)
    assert stats.received["classifier"] == 8 * sum(lengths[c] for c in remote)
    if comm.size >= 3:
        assert remote or not mine                              # the cross-rank path is exercised


def test_exchange_many_to_one(make_transport):
    """One source feeding receivers on its own rank and on others (FedCME's many-to-one ablation)."""
    comm = world()
    client_rank, _, _ = exchange_setup(comm.size)
    t = make_transport(client_rank)
    sources = {0: 1, 3: 1, 6: 1, 1: 0, 7: 6}               # client 1 feeds 0, 3 and 6
    mine = {c: client_buf(c, 5, salt=3) for c in hosted(client_rank, comm.rank)}
    out = t.exchange("classifier", sources, mine)
    expected = {r: client_buf(s, 5, salt=3) for r, s in sources.items() if client_rank[r] == comm.rank}
    assert sorted(out) == sorted(expected)
    for r, buf in expected.items():
        assert np.array_equal(out[r], buf), r


def test_exchange_between_clients_whose_ids_pass_the_tags_every_mpi_allows(make_transport):
    """Client ids 5 and 32005 give one tag: their messages between the same two ranks are matched by
    the order both sides post them, so each still gets its own partner's (of another length)."""
    comm = world()
    first, last = workers(comm.size)[0], workers(comm.size)[-1]
    client_rank = {5: first, 32005: first, 64005: last, 40000: last}
    sources = {5: 64005, 64005: 5, 32005: 40000, 40000: 32005}
    length = {5: 3, 64005: 3, 32005: 7, 40000: 7}
    t = make_transport(client_rank)
    mine = {c: client_buf(c, length[c], salt=4) for c in hosted(client_rank, comm.rank)}
    out = t.exchange("classifier", sources, mine)
    assert sorted(out) == sorted(mine)
    for c in mine:
        assert np.array_equal(out[c], client_buf(sources[c], length[c], salt=4)), c


def test_share(make_transport):
    comm = world()
    t = make_transport(spread(comm.size))
    info = {"rank": comm.rank, "host": socket.gethostname(), "items": list(range(comm.rank))}
    out = t.share(info)
    assert out == [{"rank": r, "host": out[r]["host"], "items": list(range(r))} for r in range(comm.size)]
    assert out[comm.rank] == info


def test_interleaved_rounds(make_transport):
    """Several rounds of the runtime's sequence; results checked only after every call is made."""
    comm = world()
    client_rank = spread(comm.size)
    t = make_transport(client_rank)
    n, results = 257, []
    for round in range(5):
        model = t.broadcast("model", np.full(n, float(round)) if t.is_server else None)
        mine = hosted(client_rank, comm.rank)
        total = sum((model + c for c in mine), np.zeros(n))
        results.append((model, t.reduce_sum("model", total)))
        t.gather("layers", {c: client_buf(c, LENGTHS[c], salt=round) for c in mine})
    for round, (model, reduced) in enumerate(results):
        assert np.array_equal(model, np.full(n, float(round)))
        if t.is_server:
            assert np.array_equal(reduced, np.full(n, N_CLIENTS * round + sum(range(N_CLIENTS)), dtype=float))
        else:
            assert reduced is None
