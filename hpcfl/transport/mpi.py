"""Buffer-based MPI collectives (mpi4py upper-case API: no pickled tensors, one call per payload).

Waiting without burning a core: MPICH's blocking calls busy-poll, and a rank blocked inside one never
runs Python signal handlers. So each collective first meets its peers through a non-blocking call
(`Ibarrier`, or the `Ibcast` of a small header) polled with short sleeps, and only then runs the
blocking data movement, which finds every rank already there and moves at full speed.
"""
import socket
import time

import numpy as np
from mpi4py import MPI

from hpcfl.transport.base import Transport, deliver_in_memory

_DTYPES = [np.float64, np.float32, np.int64, np.uint8]


class MpiTransport(Transport):
    def __init__(self, client_rank: dict[int, int], comm=None, max_sleep_s: float = 0.002):
        super().__init__(client_rank)
        self.comm = (comm or MPI.COMM_WORLD).Dup()
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.max_sleep_s = max_sleep_s
        self.host = socket.gethostname()

    # -- waiting ---------------------------------------------------------------------------------
    def _wait(self, request) -> None:
        start, sleep = time.perf_counter(), 1e-5
        while not request.Test():
            time.sleep(sleep)
            sleep = min(2 * sleep, self.max_sleep_s)
        self.stats.wait_s += time.perf_counter() - start

    def _arrive(self) -> None:
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
        self._wait(self.comm.Ibcast(header, root=0))
        if not self.is_server:
            array = np.empty(int(header[0]), dtype=_DTYPES[int(header[1])])
        self._timed(self.comm.Bcast, array, 0)
        if self.is_server:
            self._count(name, sent=array.nbytes * (self.size - 1))
        else:
            self._count(name, received=array.nbytes)
        return array

    def reduce_sum(self, name, array):
        array = np.ascontiguousarray(array, dtype=np.float64)
        self._arrive()
        out = np.empty_like(array) if self.is_server else None
        self._timed(self.comm.Reduce, array, out, MPI.SUM, 0)
        if self.is_server:
            self._count(name, received=array.nbytes * (self.size - 1))
        else:
            self._count(name, sent=array.nbytes)
        return out

    def gather(self, name, items):
        ids = sorted(items)
        meta = np.array([len(ids), *ids, *(items[c].size for c in ids)], dtype=np.int64)
        data = np.concatenate([np.ravel(items[c]).astype(np.float64) for c in ids]) if ids else np.zeros(0)
        self._arrive()
        meta_sizes = self.comm.gather(meta.size, root=0)     # a few ints per rank
        all_meta = self._gatherv(meta, meta_sizes)
        data_sizes = self.comm.gather(data.size, root=0)
        all_data = self._gatherv(data, data_sizes)
        if not self.is_server:
            self._count(name, sent=data.nbytes)
            return None
        self._count(name, received=all_data.nbytes - data.nbytes)
        out, m, d = {}, 0, 0
        for _ in range(self.size):
            n = int(all_meta[m])
            cids, lens = all_meta[m + 1:m + 1 + n], all_meta[m + 1 + n:m + 1 + 2 * n]
            for cid, length in zip(cids, lens):
                out[int(cid)] = all_data[d:d + length]
                d += length
            m += 1 + 2 * n
        return out

    def _gatherv(self, array, sizes):
        recv = None
        if self.is_server:
            recv = np.empty(sum(sizes), dtype=array.dtype)
            recv = [recv, (sizes, None)]
        self._timed(self.comm.Gatherv, array, recv, 0)
        return recv[0] if self.is_server else None

    def scatter(self, name, items, clients):
        clients = sorted(clients)
        self._arrive()
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
        for cid, length in zip(clients, lengths):
            out[cid] = data[offset:offset + length]
            offset += length
        return out

    def exchange(self, name, sources, items):
        mine = lambda client: self.client_rank[client] == self.rank      # noqa: E731
        out = deliver_in_memory({r: s for r, s in sources.items() if mine(s)}, items, mine)
        requests, received, sending = [], {}, []
        for receiver, source in sorted(sources.items()):          # tag = receiver: one message per delivery
            if mine(receiver) and not mine(source):
                received[receiver] = np.empty(items[receiver].size, dtype=np.float64)
                requests.append(self.comm.Irecv(received[receiver], source=self.client_rank[source], tag=receiver))
                self._count(name, received=received[receiver].nbytes)
            elif mine(source) and not mine(receiver):
                buf = np.ascontiguousarray(items[source], dtype=np.float64)
                sending.append(buf)                              # alive until the sends complete
                requests.append(self.comm.Isend(buf, dest=self.client_rank[receiver], tag=receiver))
                self._count(name, sent=buf.nbytes)
        if requests:
            self._wait(_AllRequests(requests))
        return {**out, **received}

    def share(self, info):
        # Bookkeeping only (a few strings): the pickle-based lower-case call is the right tool.
        return self.comm.allgather(info)

    def close(self):
        self.comm.Free()


class _AllRequests:
    """A group of requests with the `Test()` of one."""

    def __init__(self, requests):
        self.requests = requests

    def Test(self):
        return MPI.Request.Testall(self.requests)
