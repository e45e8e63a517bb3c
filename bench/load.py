"""Load checks: many clients per worker, a large model, and long metric series.

1. `clients`: the real runner under `mpirun -np 3` (server + 2 workers) with 100 and 500 clients per
   worker (run.placement = "fixed"), every client trained every round, FedAvg and SCAFFOLD (one
   control variate per client), on real Fashion-MNIST with the FMNIST CNN. Every client holds 50
   samples (Dir(0.5) label skew, equal sizes), 1 local epoch, 4 rounds. From the result file: the
   round time without the server's test evaluation (median of rounds 1..; round 0 warms up), the
   time per client on a worker, and each worker's peak resident memory, client state and client
   data. Memory should grow with the clients' data and state, not with clients x model; time
   linearly with the clients.
2. `model`: (a) broadcast (float32, and uint8 for more than 2^31 elements) and reduce_sum (float64)
   through hpcfl's MpiTransport under `mpirun -np 3`, of 0.25, 1 and 2.125 GiB (over 2 GiB), fresh
   processes for each row: time, every element checked, and the peak memory each rank adds during
   the collective, in buffer sizes. The server sends zeros in the reduce, as in the runner. (b) The
   runner with a 512 MiB model (the FMNIST CNN plus a 512 MiB lookup table, so that compute stays the
   CNN's) and 2 or 8 clients per round, against the plain CNN: rank 0's peak memory must not grow
   with the cohort (one sum-reduce, no gather of the updates).
3. `metrics`: 10,000 rounds x 1,000 clients of the keys a run with validation and local test sets
   writes, appended with hpcfl.metrics.Recorder in a temporary folder: append + flush time per
   round, file size against the raw data, and the time to read one client metric whole with h5py and
   with hpcfl.metrics.read_run (in the page cache: median of 3 after one untimed read), checked equal.

Runner peaks are those of the rounds: each rank's peak RSS is reset (Linux /proc/self/clear_refs)
as round 0 starts, so `rank/max_rss_bytes` leaves out the set-up's (importing torch, ~0.5 GiB, and
reading the data set). Runs go to a temporary results root, removed afterwards. Torch uses one
thread per rank (run.threads=1). Timings are wall seconds on a 2-core machine shared with other
work, with 3 ranks that busy-poll inside MPI: expect noise. Every mpirun, and the metrics check,
holds `flock /tmp/hpcfl-bench.lock`, so benchmarks on a shared machine do not overlap.

    python bench/load.py [clients|model|metrics|all] [--rounds 4] [--table-mib 512] [--gib 0.25 1 2.125]
    python bench/load.py --smoke      # seconds, one process: 200 rounds x 20 clients of metrics, and the
                                      # table model built at 1 MiB (checks that the bench runs; CI)
"""
import argparse
import fcntl
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import h5py
import numpy as np

from hpcfl.metrics import Recorder, read_run

REPO = Path(__file__).resolve().parent.parent
JOB = REPO / "jobs" / "quickstart.toml"
MPIRUN = str(Path(sys.executable).with_name("mpirun"))
LOCK = "/tmp/hpcfl-bench.lock"      # held by every timed part, so benchmarks on a shared machine do not overlap
RANKS = 3
CLIENTS_PER_RANK = (100, 500)       # the clients check's two sizes
SAMPLES = 50                        # per client in the clients check
MIB, GIB = 2**20, 2**30
TABLE_MODEL = "load_table_cnn"
IMAGE_BYTES = 28 * 28 * 4 + 8       # one Fashion-MNIST sample on a worker: float32 pixels + int64 label
PATTERN = 251                       # element i of a test buffer holds (i % PATTERN) x scale: exact in uint8 too
REPEAT = 3                          # timed collectives per transport run
STEP = 2**20                        # elements filled or checked at a time (small temporaries)


# -- launching ranks -----------------------------------------------------------------------------
def mpirun(*args: str) -> str:
    """Run this script on RANKS ranks with `args`; its stdout."""
    done = subprocess.run(["flock", LOCK, MPIRUN, "-np", str(RANKS), sys.executable, __file__, *args],
                          capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(args[:3])} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout


def run_job(root: Path, name: str, sets: list[str], table_mib: int = 0) -> dict:
    """The arrays of a quickstart-based run on RANKS ranks (with a `table_mib` table model if > 0)."""
    sets = [f"run.name={name!r}", "run.threads=1", "run.checkpoint_every=0", *sets]
    mpirun("rank-runner", str(table_mib), str(JOB), "--results-root", str(root),
           *(arg for s in sets for arg in ("--set", s)))
    return read_run(root / "quickstart" / f"{name}.h5").arrays


# -- what each rank runs under mpirun ------------------------------------------------------------
def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024       # Linux reports KiB


def register_table_model(table_mib: int) -> None:
    """Add TABLE_MODEL to hpcfl's model registry in this process."""
    import torch
    from torch import nn

    from hpcfl.models import MODELS
    from hpcfl.models.cnn import FmnistCNN

    class TableCNN(FmnistCNN):
        """The FMNIST CNN plus a lookup table whose row, chosen by a hash of the image, adds to the
        features: the model is as large as the table, its compute stays the CNN's."""

        def __init__(self, in_shape, num_classes, **options):
            super().__init__(in_shape, num_classes, **options)     # options=: the CNN's head options
            width = self.classifier.in_features
            self.table = nn.Embedding(table_mib * MIB // (4 * width), width)
            nn.init.zeros_(self.table.weight)

        def features(self, x: torch.Tensor) -> torch.Tensor:
            row = (x.flatten(1).sum(1) * 1000).long().remainder(self.table.num_embeddings)
            return super().features(x) + self.table(row)

    MODELS.register(TABLE_MODEL, TableCNN)


def runner_rank(table_mib: str, *launch_args: str) -> None:
    """One rank of `python -m hpcfl.launch launch_args`, with the table model registered first. The
    rank's peak RSS is reset as the rounds start, so `rank/max_rss_bytes` is the rounds' peak and not
    the set-up's (loading the data set)."""
    import hpcfl.runtime.loop as loop
    from hpcfl.launch import main as launch

    if int(table_mib):
        register_table_model(int(table_mib))
    rounds = loop.run

    def run_from_reset_peak(*args, **kwargs):
        Path("/proc/self/clear_refs").write_text("5")       # Linux: resets the peak RSS (VmHWM, ru_maxrss)
        return rounds(*args, **kwargs)

    loop.run = run_from_reset_peak                          # hpcfl.launch imports loop.run as it starts
    sys.exit(launch(list(launch_args)))


def fill(buf: np.ndarray, scale: float) -> np.ndarray:
    for i in range(0, buf.size, STEP):
        buf[i:i + STEP] = np.arange(i, min(i + STEP, buf.size)) % PATTERN * scale
    return buf


def matches(buf: np.ndarray, scale: float) -> bool:
    return all(np.array_equal(buf[i:i + STEP], np.arange(i, min(i + STEP, buf.size)) % PATTERN * scale)
               for i in range(0, buf.size, STEP))


def transport_rank(op: str, dtype: str, gib: str) -> None:
    """One rank of REPEAT `op`s (broadcast or reduce_sum) of a `gib` GiB `dtype` buffer through
    MpiTransport; rank 0 prints every rank's figures as JSON."""
    from mpi4py import MPI

    from hpcfl.transport.mpi import MpiTransport

    transport = MpiTransport({}, MPI.COMM_WORLD)
    dtype = np.dtype(dtype)
    n = int(float(gib) * GIB) // dtype.itemsize
    if op == "broadcast":
        send, expected = (fill(np.empty(n, dtype), 1) if transport.is_server else None), 1
    else:       # each worker sends rank x pattern, the server zeros (it hosts no client), as in the runner
        send = np.zeros(n) if transport.is_server else fill(np.empty(n), transport.rank)
        expected = sum(range(transport.size))
    before, seconds, out = peak_rss(), [], None
    for _ in range(REPEAT):
        out = None                      # free the last result before the next arrives
        transport.comm.Barrier()        # time the collective, not a slower rank's filling
        start = time.perf_counter()
        out = getattr(transport, op)("load", send)
        seconds.append(time.perf_counter() - start)
    added = peak_rss() - before
    reports = transport.share({"seconds": seconds, "added": added, "peak": peak_rss(), "elements": n,
                               "ok": bool(out is None or matches(out, expected)), "bytes": n * dtype.itemsize})
    if transport.is_server:
        print(json.dumps(reports))
    transport.close()


# -- 1. many clients per worker ------------------------------------------------------------------
def per_rank_data(arrays: dict, rank: int) -> int:
    """Bytes of client data the worker `rank` holds (fixed placement, every client sampled)."""
    return int(arrays["partition"].sum(1)[arrays["client/rank"][0] == rank].sum()) * IMAGE_BYTES


def clients_check(root: Path, rounds: int) -> None:
    print(f"1. many clients per worker: mpirun -np {RANKS}, Fashion-MNIST, fmnist_cnn, {SAMPLES} samples per client, "
          f"every client every round, 1 local epoch, {rounds} rounds")
    print(f"{'clients/rank':>12} {'algorithm':>9} {'round s':>8} {'ms/client':>9} {'peak RSS/worker MiB':>19} "
          f"{'client state MiB':>16} {'client data MiB':>15} {'model MiB':>9}")
    rss = {}
    for algorithm in ("fedavg", "scaffold"):
        for per_rank in CLIENTS_PER_RANK:
            clients = per_rank * (RANKS - 1)
            arrays = run_job(root, f"clients-{algorithm}-{per_rank}", [
                f"algorithm.name={algorithm!r}", f"data.num_clients={clients}", f"train.clients_per_round={clients}",
                "data.partition='dirichlet_equal'", f"data.partition_params={{beta=0.5, size={SAMPLES}}}",
                f"run.rounds={rounds}", f"eval.every={rounds}", "run.placement='fixed'"])
            seconds = float(np.median((arrays["round/time_s"] - np.nan_to_num(arrays["round/eval_s"]))[1:]))
            workers = slice(1, RANKS)
            rss[algorithm, per_rank] = arrays["rank/max_rss_bytes"][-1, workers].max()
            state = arrays["rank/client_state_bytes"][-1, workers].max()
            data = max(per_rank_data(arrays, r) for r in range(1, RANKS))
            model = arrays["round/bytes_down/model"][0] / clients      # float32 bytes sent to each client
            print(f"{per_rank:>12} {algorithm:>9} {seconds:>8.2f} {1000 * seconds / per_rank:>9.1f} "
                  f"{rss[algorithm, per_rank] / MIB:>19.0f} {state / MIB:>16.1f} {data / MIB:>15.1f} "
                  f"{model / MIB:>9.2f}", flush=True)
    few, many = CLIENTS_PER_RANK
    for algorithm in ("fedavg", "scaffold"):
        growth = (rss[algorithm, many] - rss[algorithm, few]) / (many - few)
        print(f"   {algorithm}: peak RSS grows {growth / 1024:.0f} KiB per extra client on a worker "
              f"(its data: {SAMPLES * IMAGE_BYTES / 1024:.0f} KiB; one model copy: {model / 1024:.0f} KiB)")


# -- 2. a large model ----------------------------------------------------------------------------
def transport_check(sizes: list[float]) -> None:
    print(f"2a. MpiTransport on {RANKS} ranks, fresh processes per row; s: median of {REPEAT} (the slowest rank); "
          "added: peak RSS the collective added on rank 0/1/2, in buffer sizes")
    print(f"{'collective':>10} {'dtype':>7} {'GiB':>6} {'elements':>13} {'s':>6} {'GB/s':>5} {'correct':>7} "
          f"{'added (x buffer)':>18} {'peak RSS all ranks GiB':>22}")
    cases = [("broadcast", "float32", gib) for gib in sizes] + [("broadcast", "uint8", max(sizes))]
    for op, dtype, gib in cases + [("reduce_sum", "float64", gib) for gib in sizes]:
        reports = json.loads(mpirun("rank-transport", op, dtype, str(gib)).strip().splitlines()[-1])
        size = reports[0]["bytes"]
        seconds = float(np.median(np.max([r["seconds"] for r in reports], axis=0)))
        added = " / ".join(f"{r['added'] / size:.2f}" for r in reports)
        print(f"{op:>10} {dtype:>7} {size / GIB:>6.3f} {reports[0]['elements']:>13,} {seconds:>6.2f} "
              f"{size / seconds / 1e9:>5.2f} {str(all(r['ok'] for r in reports)):>7} {added:>18} "
              f"{sum(r['peak'] for r in reports) / GIB:>22.2f}", flush=True)


def large_model_check(root: Path, table_mib: int) -> None:
    print(f"2b. runner, mpirun -np {RANKS}, FedAvg, 8 clients of 32 samples, 2 rounds: the {table_mib} MiB "
          "table model against the plain CNN")
    print(f"{'model':>14} {'model MiB':>9} {'clients/round':>13} {'round s':>8} {'peak RSS MiB rank 0/1/2':>24} "
          f"{'rank 0 above CNN run (x model)':>30}")
    common = ["data.num_clients=8", "data.partition='dirichlet_equal'", "data.partition_params={beta=0.5, size=32}",
              "run.rounds=2"]
    base = None
    for model, cohort in (("fmnist_cnn", 8), (TABLE_MODEL, 2), (TABLE_MODEL, 8)):
        arrays = run_job(root, f"model-{model}-{cohort}", [*common, f"model.name={model!r}",
                                                          f"train.clients_per_round={cohort}"],
                         table_mib if model == TABLE_MODEL else 0)
        size = arrays["round/bytes_down/model"][0] / cohort
        peaks = arrays["rank/max_rss_bytes"][-1]
        base = peaks[0] if base is None else base
        above = "-" if model == "fmnist_cnn" else f"{(peaks[0] - base) / size:.1f}"
        seconds = np.median(arrays["round/time_s"] - arrays["round/eval_s"])
        print(f"{model:>14} {size / MIB:>9.1f} {cohort:>13} {seconds:>8.2f} "
              f"{' / '.join(f'{p / MIB:.0f}' for p in peaks):>24} {above:>30}", flush=True)


# -- 3. metrics ----------------------------------------------------------------------------------
def round_values(rng: np.random.Generator, clients: int) -> dict:
    """One round of what a run with validation and local test sets records, on RANKS ranks."""
    values = {f"client/{k}": rng.random(clients) for k in ("train_loss", "steps", "val_acc", "local_test_acc")}
    values.update({f"round/{k}": rng.random() for k in (
        "test_acc", "test_loss", "train_loss", "personal_acc_mean", "personal_acc_std", "bytes_down/model",
        "bytes_up/model", "phase_s/train", "eval_s", "time_s")})
    values.update({f"rank/{k}": rng.random(RANKS) for k in (
        "compute_s", "wait_s", "wire_sent_bytes", "wire_received_bytes", "client_state_bytes", "max_rss_bytes")})
    values["class/test_acc"] = rng.random(10)
    return values


def timed(fn, repeat: int = 3):
    """(result, median seconds) of `repeat` calls after an untimed one (the first read after the
    write is slower, for whichever reader comes first)."""
    fn()
    seconds = []
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        seconds.append(time.perf_counter() - start)
    return result, float(np.median(seconds))


def read_h5py(path: Path, key: str) -> np.ndarray:
    with h5py.File(path, "r", locking=False) as file:
        return file[key][:]


def metrics_check(rounds: int, clients: int, lock: bool = True) -> None:
    print(f"3. metrics: {rounds:,} rounds x {clients:,} clients through hpcfl.metrics.Recorder")
    rng = np.random.default_rng(0)
    key = "client/train_loss"
    with tempfile.TemporaryDirectory() as tmp, open(LOCK if lock else os.devnull, "a") as held:
        if lock:
            fcntl.flock(held, fcntl.LOCK_EX)
        path = Path(tmp) / "load.h5"
        written, append_s, raw = np.empty((rounds, clients)), np.empty(rounds), 0
        with Recorder.create(path, {"config": {}}) as recorder:
            for r in range(rounds):
                values = round_values(rng, clients)
                written[r], raw = values[key], raw + sum(np.asarray(v).nbytes for v in values.values())
                start = time.perf_counter()
                recorder.append_round(r, values)
                append_s[r] = time.perf_counter() - start
        size = path.stat().st_size
        by_h5py, h5py_s = timed(lambda: read_h5py(path, key))
        by_reader, reader_s = timed(lambda: read_run(path, keys=[key]).arrays[key])
        everything, all_s = timed(lambda: read_run(path).arrays)
        same = np.array_equal(by_h5py, written) and np.array_equal(by_reader, written)
        print(f"   {len(values)} keys per round, {raw / rounds / 1024:.1f} KiB raw per round")
        print(f"   file {size / MIB:.1f} MiB for {raw / MIB:.1f} MiB of raw data ({size / raw:.3f}x)")
        print(f"   append_round (write + flush + commit): median {1000 * np.median(append_s):.2f} ms, "
              f"p99 {1000 * np.percentile(append_s, 99):.2f} ms, max {1000 * append_s.max():.1f} ms, "
              f"total {append_s.sum():.1f} s")
        print(f"   read {key} ({rounds:,} x {clients:,}, {written.nbytes / MIB:.0f} MiB), median of 3: "
              f"h5py {h5py_s:.3f} s, read_run(keys=[...]) {reader_s:.3f} s; equal to what was written: {same}")
        print(f"   read_run(path), all {len(everything)} arrays: {all_s:.2f} s")


def smoke() -> None:
    """Seconds, in this process, no mpirun: the metrics check at 200 rounds x 20 clients, and the
    table model registered and built at 1 MiB (what `model` runs on every rank), one forward pass."""
    import torch

    from hpcfl.models import build_model

    metrics_check(200, 20, lock=False)
    register_table_model(1)
    model = build_model(TABLE_MODEL, (1, 28, 28), 10)
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    out = model(torch.rand(4, 1, 28, 28))
    print(f"   {TABLE_MODEL}: {size / MIB:.2f} MiB of parameters, output {tuple(out.shape)}")


def main() -> None:
    ranks = {"rank-runner": runner_rank, "rank-transport": transport_rank}
    if sys.argv[1:2] and sys.argv[1] in ranks:      # a rank this script started under mpirun
        ranks[sys.argv[1]](*sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("check", nargs="?", default="all", choices=["clients", "model", "metrics", "all"])
    parser.add_argument("--rounds", type=int, default=4, help="rounds of the clients check")
    parser.add_argument("--table-mib", type=int, default=512, help="size of the large model")
    parser.add_argument("--gib", type=float, nargs="+", default=[0.25, 1.0, 2.125], help="transport buffer sizes")
    parser.add_argument("--metric-rounds", type=int, default=10_000)
    parser.add_argument("--metric-clients", type=int, default=1_000)
    parser.add_argument("--smoke", action="store_true", help="seconds, one process: checks that the bench runs")
    args = parser.parse_args()
    if args.smoke:
        return smoke()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        checks = {"clients": partial(clients_check, Path(tmp), args.rounds),
                  "model": lambda: (transport_check(args.gib), large_model_check(Path(tmp), args.table_mib)),
                  "metrics": partial(metrics_check, args.metric_rounds, args.metric_clients)}
        for name, check in checks.items():
            if args.check in (name, "all"):
                check()
                print()
    print(f"total {time.perf_counter() - start:.0f} s (wall, waits for the bench lock included)")


if __name__ == "__main__":
    main()
