"""Aggregation cost under `mpirun -np 3` (server + 2 workers): hpcfl's path against raw MPI calls
moving the same bytes.

1. Weighted averaging of a ResNet-18 (CIFAR stem, 11.2 M state_dict elements + the weight), the
   uplink of FedFM's train phase (FedAvg's), run as the round loop runs it: `Worker.run_phase` adds
   its clients' contributions into one float64 buffer (`Layout.add_into`, after the NaN/Inf check;
   the clients replay a fixed contribution instead of training), `MpiTransport.reduce_sum` sums the
   buffers on rank 0 (which sends zeros), and `Server.aggregate` unpacks and divides
   (`weighted_mean`). Timed: the transport alone, the whole aggregate and its two compute parts,
   against a raw `comm.Reduce` and `comm.Allreduce` of the same float64 buffer, and a raw float32
   `Allreduce` for reference.
2. FedFM's anchor aggregation: per-class feature sums and counts (10 classes x 512 features),
   summed the same way; the server's `update_anchors` divides.
3. FedMA's gather: `MpiTransport.gather` of every client's neurons of a VGG-9 layer, for each layer
   (16 clients, 8 per worker; a neuron is its input weights plus its bias, at the clients' own
   widths as in round 1), against one raw `comm.Gatherv` of the same float64 bytes, already
   contiguous, into a buffer allocated beforehand.

Each case: warm-up repetitions, then timed ones; every repetition starts after a Barrier and counts
the slowest rank. Printed: the median in ms and ratio = hpcfl / raw. The run is wrapped in
`flock /tmp/hpcfl-bench.lock`, so benchmarks on a shared machine do not overlap.

    python bench/aggregation.py [--reps 10] [--warmup 2] [--clients-per-worker 1]
    python bench/aggregation.py --smoke   # the same three parts on the small CNNs (fmnist_cnn averaged, LeNet's
                                          # layers gathered from 4 clients), once: checks that the bench runs (CI)
"""
import argparse
import subprocess
import sys
import time
import traceback
from pathlib import Path
from statistics import median

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
JOB = REPO / "jobs" / "quickstart.toml"
MPIRUN = str(Path(sys.executable).with_name("mpirun"))
LOCK = "/tmp/hpcfl-bench.lock"
RANKS = 3
FEDMA_CLIENTS = 16             # jobs/fedma/cifar10-vgg9.toml
AVERAGED, GATHERED = ("resnet18", (3, 32, 32)), ("vgg9", (3, 32, 32))      # (model, input shape) of parts 1-2 and 3
SMOKE = ("fmnist_cnn", (1, 28, 28)), ("lenet", (1, 28, 28)), 4              # --smoke: the same, small, 4 FedMA clients
MB = 1e6


class Bench:
    """Times collective calls on every rank; rank 0 prints."""

    def __init__(self, comm, reps: int, warmup: int):
        self.comm, self.reps, self.warmup = comm, reps, warmup

    def seconds(self, fn) -> float:
        """Median over repetitions of the slowest rank's time for fn()."""
        times = []
        for rep in range(self.warmup + self.reps):
            self.comm.Barrier()
            start = time.perf_counter()
            fn()
            slowest = self.slowest(time.perf_counter() - start)
            if rep >= self.warmup:
                times.append(slowest)
        return median(times)

    def slowest(self, seconds: float) -> float:
        """The largest `seconds` over the ranks. A rank done early sleeps while it waits: MPICH's blocking
        calls spin, which on an oversubscribed node would take the CPU from the ranks still timing."""
        from mpi4py import MPI

        mine, out = np.array([seconds]), np.empty(1)
        request = self.comm.Iallreduce(mine, out, op=MPI.MAX)
        while not request.Test():
            time.sleep(1e-4)
        return float(out[0])

    def print(self, text: str = "") -> None:
        if self.comm.Get_rank() == 0:
            print(text, flush=True)

    def table(self, title: str, rows: list[tuple[str, float, float]], baselines: list[str]) -> None:
        """rows: (what, MB per rank, seconds); one ratio column per baseline row name."""
        by_name = {name: seconds for name, _, seconds in rows}
        self.print(f"\n{title}")
        self.print(f"  {'what':<46} {'MB/rank':>8} {'median ms':>10}" + "".join(f" {'/ ' + b:>18}" for b in baselines))
        for name, mb, seconds in rows:
            ratios = "".join(f" {seconds / by_name[b]:>18.2f}" for b in baselines)
            self.print(f"  {name:<46} {mb:>8.2f} {1e3 * seconds:>10.2f}{ratios}")


# -- the payloads ---------------------------------------------------------------------------------
def fedfm_resnet18(clients_here: list[int], name: str = AVERAGED[0], shape: tuple = AVERAGED[1]):
    """(algorithm, worker or None, server or None, model) of FedFM on a ResNet-18 (or model `name`), its
    anchor phase from round 0; the worker hosts `clients_here`, whose contributions are set in
    worker.algorithm.contributions."""
    from hpcfl.algorithms import ALGORITHMS, algorithm_params
    from hpcfl.algorithms.anchored import wrap
    from hpcfl.algorithms.base import Client, Setup
    from hpcfl.jobs import load_job
    from hpcfl.models import build_model
    from hpcfl.runtime.server import Server
    from hpcfl.runtime.worker import Worker

    job = load_job(JOB, ['algorithm.name="fedfm"', "algorithm.params.start_round=0", f"model.name={name!r}",
                         'data.dataset="cifar10"'])
    model = build_model(name, shape, 10)
    setup = Setup.of(job, model, np.ones((job.data.num_clients, 10), dtype=np.int64))
    algorithm = wrap(ALGORITHMS["fedfm"](algorithm_params("fedfm", job.algorithm.params), setup))

    class Replay:
        """The algorithm, its clients returning a fixed contribution per payload instead of training."""
        contributions: dict = {}            # payload name -> (tensors, weight), set by the caller

        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def client_update(self, phase, round, client, received, model, trainer):
            return {name: self.contributions[name] for name in phase.uplink}, {}

    clients = {c: Client(c, torch.zeros(1, *shape), torch.zeros(1, dtype=torch.long), np.ones(10), name)
               for c in clients_here}
    worker = Worker(Replay(algorithm), clients, {name: model}, None, "cpu", 10, 1) if clients else None
    server = None if clients else Server(algorithm, model, torch.zeros(1, *shape), torch.zeros(1, dtype=torch.long),
                                         1, "cpu")
    return algorithm, worker, server, model


def aggregate_rows(bench, transport, worker, server, phase, cohort: list[int]) -> list[tuple[str, float, float]]:
    """Raw Reduce / Allreduce of the phase's one uplink buffer against hpcfl's reduce_sum and the whole
    aggregate, as the round loop runs it (hpcfl.runtime.loop.run)."""
    from mpi4py import MPI

    from hpcfl.runtime.report import CLIENT_METRICS

    (name, layout), = phase.uplink.items()
    comm, metric_rows = bench.comm, np.zeros((len(cohort), len(CLIENT_METRICS)))
    send64 = np.random.default_rng(comm.Get_rank()).random(layout.numel)
    recv64, send32 = np.empty_like(send64), send64.astype(np.float32)
    recv32 = np.empty_like(send32)

    def worker_sums():
        if not worker:                      # the server takes part with zeros, as in the round loop
            return np.zeros(layout.numel)
        return worker.run_phase(phase, 0, sorted(worker.clients), {}, metric_rows, CLIENT_METRICS)[name]

    def server_aggregate(reduced):
        if server:
            server.aggregate(phase, 0, {name: reduced})

    def whole():
        server_aggregate(transport.reduce_sum(name, worker_sums()))

    mb = send64.nbytes / MB
    return [("raw Reduce float64", mb, bench.seconds(lambda: comm.Reduce(send64, recv64, MPI.SUM, 0))),
            ("raw Allreduce float64", mb, bench.seconds(lambda: comm.Allreduce(send64, recv64, MPI.SUM))),
            ("raw Allreduce float32 (reference)", send32.nbytes / MB,
             bench.seconds(lambda: comm.Allreduce(send32, recv32, MPI.SUM))),
            ("hpcfl reduce_sum (transport)", mb, bench.seconds(lambda: transport.reduce_sum(name, send64))),
            ("hpcfl aggregate (sum clients, reduce, divide)", mb, bench.seconds(whole)),
            ("  of which Worker.run_phase: sum clients", mb, bench.seconds(worker_sums)),
            ("  of which Server.aggregate: unpack, divide", mb, bench.seconds(lambda: server_aggregate(send64)))]


def vgg9_layers(name: str = GATHERED[0], shape: tuple = GATHERED[1]) -> list[tuple[str, int, int]]:
    """(layer, neurons, elements per neuron: inputs + bias) of VGG-9 on CIFAR-10 (or model `name`)."""
    from hpcfl.models import build_model

    state = build_model(name, shape, 10).state_dict()
    return [(key.removesuffix(".weight"), w.shape[0], w[0].numel() + 1)
            for key, w in state.items() if key.endswith(".weight")]


def gather_rows(bench, transport, clients_here: list[int], gathered: tuple = GATHERED
                ) -> list[tuple[str, float, float, float]]:
    """Per VGG-9 layer (or `gathered` model's): (layer, MB per worker, raw Gatherv s, hpcfl gather s)."""
    comm, rows = bench.comm, []
    for layer, neurons, width in vgg9_layers(*gathered):
        items = {c: np.random.default_rng(c).random(neurons * width) for c in clients_here}
        flat = np.concatenate(list(items.values())) if items else np.zeros(0)
        counts = comm.allgather(flat.size)
        recv = [np.empty(sum(counts)), (counts, None)] if transport.is_server else None
        raw = bench.seconds(lambda flat=flat, recv=recv: comm.Gatherv(flat, recv, 0))
        ours = bench.seconds(lambda layer=layer, items=items: transport.gather(layer, items))
        rows.append((layer, max(counts) * 8 / MB, raw, ours))
    return rows


# -- on every rank --------------------------------------------------------------------------------
def rank_main(reps: int, warmup: int, per_worker: int, smoke: bool = False) -> None:
    from mpi4py import MPI

    from hpcfl.algorithms.base import ONE, WEIGHT
    from hpcfl.transport.mpi import MpiTransport

    torch.set_num_threads(1)
    comm = MPI.COMM_WORLD
    rank, workers = comm.Get_rank(), comm.Get_size() - 1
    bench, transport = Bench(comm, reps, warmup), MpiTransport({}, comm)
    cohort = list(range(workers * per_worker))
    (averaged, gathered, fedma_clients) = SMOKE if smoke else (AVERAGED, GATHERED, FEDMA_CLIENTS)
    algorithm, worker, server, model = fedfm_resnet18([c for c in cohort if c % workers + 1 == rank], *averaged)
    anchor_phase, train_phase = algorithm.plan(0)
    classes, dim = algorithm.setup.num_classes, algorithm.setup.feature_dim
    contributions = {
        "model": ({**model.state_dict(), WEIGHT: ONE}, 500.0),
        "anchors": ({"sums": torch.rand(classes, dim, dtype=torch.float64),
                     "counts": torch.full((classes,), 50.0, dtype=torch.float64)}, 1.0)}
    if worker:
        worker.algorithm.contributions = contributions
    bench.print(f"mpirun -np {comm.Get_size()} (server + {workers} workers), {per_worker} client(s) per worker; "
                f"median of {reps} after {warmup} warm-up(s), each the slowest rank's time")

    baselines = ["raw Reduce float64", "raw Allreduce float64"]
    bench.table(f"1. weighted average, {averaged[0]}: {train_phase.uplink['model'].numel:,} float64 elements per rank",
                aggregate_rows(bench, transport, worker, server, train_phase, cohort), baselines)
    bench.table(f"2. FedFM anchors: {classes} classes x {dim} features + counts "
                f"({anchor_phase.uplink['anchors'].numel:,} float64 elements per rank)",
                aggregate_rows(bench, transport, worker, server, anchor_phase, cohort), baselines)

    here = [c for c in range(fedma_clients) if c % workers + 1 == rank]
    rows = gather_rows(bench, transport, here, gathered)
    bench.print(f"\n3. FedMA gather, {gathered[0]} layers, {fedma_clients} clients "
                f"({fedma_clients // workers} per worker), float64")
    bench.print(f"  {'layer':<12} {'MB/worker':>10} {'raw Gatherv ms':>15} {'hpcfl gather ms':>16} {'hpcfl / raw':>12}")
    for layer, mb, raw, ours in rows:
        bench.print(f"  {layer:<12} {mb:>10.2f} {1e3 * raw:>15.2f} {1e3 * ours:>16.2f} {ours / raw:>12.2f}")
    transport.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--clients-per-worker", type=int, default=1)
    parser.add_argument("--smoke", action="store_true", help="the small CNNs, once: checks that the bench runs")
    parser.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)     # set on the ranks by the driver
    args = parser.parse_args()
    if args.smoke:
        args.reps, args.warmup = 1, 0
    if args.rank:
        try:
            rank_main(args.reps, args.warmup, args.clients_per_worker, args.smoke)
        except BaseException:
            from mpi4py import MPI
            traceback.print_exc()
            MPI.COMM_WORLD.Abort(1)             # a failing rank must not leave the others waiting
        return
    subprocess.run(["flock", LOCK, MPIRUN, "-np", str(RANKS), sys.executable, __file__, "--rank",
                    "--reps", str(args.reps), "--warmup", str(args.warmup),
                    "--clients-per-worker", str(args.clients_per_worker), *(["--smoke"] if args.smoke else [])],
                   check=True, cwd=REPO)


if __name__ == "__main__":
    main()
