"""Buffer-based MPI collectives (mpi4py upper-case API: no pickled tensors, one call per payload).

Waiting without burning a core: MPICH's blocking calls busy-poll, and a rank blocked inside one never
runs Python signal handlers. So each collective first meets its peers through a non-blocking
`Ibarrier` polled with short sleeps, and only then runs the blocking data movement, which finds
every rank already there and moves at full speed.

Large payloads move in pieces of CHUNK elements, which bounds the MPI library's own temporaries
(MPICH allocates a buffer-sized one for a reduce) and keeps counts within an int for any MPI.

Naming a silent rank: entering a collective, each worker posts the server a two-integer note
(collectives entered so far, round). A meeting that takes longer than `timeout_s` (run.round_timeout_s)
raises PeerTimeout: on the server naming the ranks whose note for this collective never came and
the round they were last heard from in; on a worker, `grace` later, so the server speaks first when
it can. A dead rank usually ends the job sooner (mpiexec and srun stop a job whose process died);
the timeout catches what they cannot see: a rank alive but stuck.
"""
import socket
import time

import numpy as np
from mpi4py import MPI

from hpcfl.errors import PeerTimeout
from hpcfl.transport.base import Transport, deliver_in_memory

_DTYPES = [np.float64, np.float32, np.int64, np.uint8]
SLICED_FROM = 2 ** 14   # reduce_sum pieces of this many elements or more: reduce-scatter + gather (_reduce)
CHUNK = 2 ** 23         # elements per Bcast/Reduce call: MPICH's reduce temporaries stay at 64 MiB (not
                        # the buffer's size), and every count stays below 2**31 for MPI-3 libraries
_NOTE_TAG = 32000                   # the MPI standard guarantees tags up to 32767


class MpiTransport(Transport):
    def __init__(self, client_rank: dict[int, int], comm=None, max_sleep_s: float = 0.002, timeout_s: float = 0.0):
        super().__init__(client_rank)
        self.comm = (comm or MPI.COMM_WORLD).Dup()
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.max_sleep_s, self.timeout_s = max_sleep_s, timeout_s
        self.host = socket.gethostname()
        self.hosts = self.comm.allgather(self.host)
        self._entered, self._collective = 0, ""
        self._sending = []                                     # this worker's notes in flight
        self._heard = np.zeros((self.size, 2), dtype=np.int64)  # server: each rank's last note
        self._heard[:, 1] = -1
        self._inbox = {r: self._listen(r) for r in range(1, self.size)} if self.is_server else {}

    # -- waiting ---------------------------------------------------------------------------------
    def _listen(self, rank: int):
        note = np.empty(2, dtype=np.int64)
        return self.comm.Irecv(note, source=rank, tag=_NOTE_TAG), note

    def _read_notes(self) -> None:
        for rank, (request, note) in self._inbox.items():
            while request.Test():                  # notes from one rank arrive in order: keep the newest
                self._heard[rank] = note
                request, note = self._inbox[rank] = self._listen(rank)

    def _enter(self, name: str) -> None:
        self._entered, self._collective = self._entered + 1, name
        if self.is_server:
            self._read_notes()
            return
        note = np.array([self._entered, self.round], dtype=np.int64)
        self._sending = [(r, n) for r, n in self._sending if not r.Test()]
        self._sending.append((self.comm.Isend(note, dest=0, tag=_NOTE_TAG), note))

    @property
    def grace_s(self) -> float:
        return max(10.0, 0.1 * self.timeout_s)

    def _wait(self, request, peers: list[int] | None = None) -> None:
        """Poll `request` with growing sleeps; past the timeout raise PeerTimeout. `peers`: the ranks of
        a point-to-point wait's requests, in order (a collective's silent ranks come from the notes)."""
        start, sleep = time.perf_counter(), 1e-5
        limit = self.timeout_s + (0.0 if self.is_server or peers is not None else self.grace_s)
        while not request.Test():
            if self.is_server:
                self._read_notes()
            if self.timeout_s and time.perf_counter() - start > limit:
                raise PeerTimeout(self._silence(request, peers, limit))
            time.sleep(sleep)
            sleep = min(2 * sleep, self.max_sleep_s)
        self.stats.wait_s += time.perf_counter() - start

    def _silence(self, request, peers, waited: float) -> str:
        where = f"round {self.round + 1}" if self.round >= 0 else "set-up"
        if peers is not None:
            silent = sorted({p for r, p in zip(request.requests, peers, strict=True) if not r.Test()})
            what = f"{self._named(silent)} did not complete swap '{self._collective}' with this rank"
        elif self.is_server:
            silent = [r for r in range(1, self.size) if self._heard[r, 0] < self._entered]
            last = ", ".join(f"rank {r} in "
                             f"{'round ' + str(self._heard[r, 1] + 1) if self._heard[r, 1] >= 0 else 'set-up'}"
                             for r in silent)
            what = f"{self._named(silent)} never reached '{self._collective}' (last heard from: {last})"
        else:
            what = (f"'{self._collective}' did not complete: the server or another rank is stuck "
                    "(rank 0 names it if it can)")
        return (f"{where}: {what} after {waited:.0f} s (run.round_timeout_s = {self.timeout_s:g}); a rank is "
                "hung or dead, so the job stops (completed rounds are in the result file). If rounds are "
                "legitimately this slow, raise run.round_timeout_s")

    def _named(self, ranks: list[int]) -> str:
        return "rank" + ("s " if len(ranks) > 1 else " ") + ", ".join(f"{r} ({self.hosts[r]})" for r in ranks)

    def _arrive(self, name: str) -> None:
        self._enter(name)
        self._wait(self.comm.Ibarrier())

    def _timed(self, fn, *args):
        start = time.perf_counter()
        fn(*args)
        self.stats.wait_s += time.perf_counter() - start

    def _count(self, name: str, sent: int = 0, received: int = 0) -> None:
        self.stats.sent[name] += sent
        self.stats.received[name] += received

    # -- the collectives -------------------------------------------------------------------------
    def broadcast(self, name, array):
        header = np.zeros(2, dtype=np.int64)
        if self.is_server:
            array = np.ascontiguousarray(array)
            header[:] = array.size, _DTYPES.index(array.dtype.type)
        self._arrive(name)
        self._timed(self.comm.Bcast, header, 0)
        if not self.is_server:
            array = np.empty(int(header[0]), dtype=_DTYPES[int(header[1])])
        for start in range(0, array.size, CHUNK):
            self._timed(self.comm.Bcast, array[start:start + CHUNK], 0)
        if self.is_server:
            self._count(name, sent=array.nbytes * (self.size - 1))
        else:
            self._count(name, received=array.nbytes)
        return array

    def reduce_sum(self, name, array):
        array = np.ascontiguousarray(array, dtype=np.float64)
        self._arrive(name)
        out = np.empty_like(array) if self.is_server else None
        for start in range(0, array.size, CHUNK):
            self._reduce(array[start:start + CHUNK], out[start:start + CHUNK] if self.is_server else None)
        if self.is_server:
            self._count(name, received=array.nbytes * (self.size - 1))
        else:
            self._count(name, sent=array.nbytes)
        return out

    def _reduce(self, array: np.ndarray, out: np.ndarray | None) -> None:
        """Sum `array` over ranks into the server's `out`. From SLICED_FROM elements, as a reduce-scatter
        (each rank sums one slice) and a gather of the slices: MPICH's Reduce of an 89 MB buffer on 3
        ranks took 3x as long (326 vs 100 ms, bench/aggregation.py)."""
        if array.size < SLICED_FROM:
            self._timed(self.comm.Reduce, array, out, MPI.SUM, 0)
            return
        counts = [array.size // self.size + (r < array.size % self.size) for r in range(self.size)]
        part = np.empty(counts[self.rank])
        self._timed(self.comm.Reduce_scatter, array, part, counts, MPI.SUM)
        self._timed(self.comm.Gatherv, part, [out, (counts, None)] if self.is_server else None, 0)

    def gather(self, name, items):
        ids = sorted(items)
        meta = np.array([len(ids), *ids, *(items[c].size for c in ids)], dtype=np.int64)
        data = np.concatenate([np.ravel(items[c]) for c in ids], dtype=np.float64) if ids else np.zeros(0)
        self._arrive(name)
        meta_sizes = self.comm.gather(meta.size, root=0)     # a few ints per rank
        all_meta = self._gatherv(meta, meta_sizes)
        blocks = _meta_blocks(all_meta, self.size) if self.is_server else None
        all_data = self._gatherv(data, [int(lens.sum()) for _, lens in blocks] if blocks else None)
        if not self.is_server:
            self._count(name, sent=data.nbytes)
            return None
        self._count(name, received=all_data.nbytes - data.nbytes)
        out, d = {}, 0
        for cids, lens in blocks:
            for cid, length in zip(cids, lens, strict=True):
                out[int(cid)] = all_data[d:d + length]
                d += length
        return dict(sorted(out.items()))

    def _gatherv(self, array, sizes):
        recv = None
        if self.is_server:
            recv = np.empty(sum(sizes), dtype=array.dtype)
            recv = [recv, (sizes, None)]
        self._timed(self.comm.Gatherv, array, recv, 0)
        return recv[0] if self.is_server else None

    def scatter(self, name, items, clients):
        clients = sorted(clients)
        self._arrive(name)
        lengths = np.empty(len(clients), dtype=np.int64)
        send_lengths = send_data = None
        if self.is_server:
            per_rank = [sorted(c for c in items if self.client_rank[c] == r) for r in range(self.size)]
            lens = [[items[c].size for c in cs] for cs in per_rank]
            send_lengths = [np.array(sum(lens, []), dtype=np.int64), ([len(cs) for cs in per_rank], None)]
            flat = [np.ravel(items[c]).astype(np.float64) for cs in per_rank for c in cs]
            send_data = [np.concatenate(flat) if flat else np.zeros(0), ([sum(x) for x in lens], None)]
        self._timed(self.comm.Scatterv, send_lengths, lengths, 0)
        data = np.empty(int(lengths.sum()), dtype=np.float64)
        self._timed(self.comm.Scatterv, send_data, data, 0)
        if self.is_server:
            self._count(name, sent=send_data[0].nbytes - data.nbytes)
        else:
            self._count(name, received=data.nbytes)
        out, offset = {}, 0
        for cid, length in zip(clients, lengths, strict=True):
            out[cid] = data[offset:offset + length]
            offset += length
        return out

    def exchange(self, name, sources, items):
        mine = lambda client: self.client_rank[client] == self.rank      # noqa: E731
        out = deliver_in_memory({r: s for r, s in sources.items() if mine(s)}, items, mine)
        self._collective = name
        requests, peers, received, sending = [], [], {}, []
        # Both sides post in the receivers' order, and MPI matches messages of one tag between two ranks in
        # the order they were posted: so the tag may repeat, and stays below the 32767 every MPI allows.
        for receiver, source in sorted(sources.items()):
            tag = receiver % _NOTE_TAG
            if mine(receiver) and not mine(source):
                received[receiver] = np.empty(items[receiver].size, dtype=np.float64)
                requests.append(self.comm.Irecv(received[receiver], source=self.client_rank[source], tag=tag))
                peers.append(self.client_rank[source])
                self._count(name, received=received[receiver].nbytes)
            elif mine(source) and not mine(receiver):
                buf = np.ascontiguousarray(items[source], dtype=np.float64)
                sending.append(buf)                              # alive until the sends complete
                requests.append(self.comm.Isend(buf, dest=self.client_rank[receiver], tag=tag))
                peers.append(self.client_rank[receiver])
                self._count(name, sent=buf.nbytes)
        if requests:
            self._wait(_AllRequests(requests), peers)
        return {**out, **received}

    def share(self, info):
        # Bookkeeping only (a few strings): the pickle-based lower-case call is the right tool.
        self._arrive("share")
        return self.comm.allgather(info)

    def close(self):
        for request, _ in self._inbox.values():
            request.Cancel()
            request.Wait()
        self.comm.Free()


def _meta_blocks(all_meta: np.ndarray, size: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """The gathered [n, client ids..., lengths...] of every rank, as (client ids, lengths) per rank."""
    blocks, m = [], 0
    for _ in range(size):
        n = int(all_meta[m])
        blocks.append((all_meta[m + 1:m + 1 + n], all_meta[m + 1 + n:m + 1 + 2 * n]))
        m += 1 + 2 * n
    return blocks


class _AllRequests:
    """A group of requests with the `Test()` of one."""

    def __init__(self, requests):
        self.requests = requests

    def Test(self):
        return MPI.Request.Testall(self.requests)
