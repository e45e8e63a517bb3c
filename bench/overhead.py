"""Runner overhead: hpcfl's FedAvg against the floor, the same local training in a plain PyTorch loop.

The floor trains exactly the same clients, epochs and batches (same partition, cohort schedule,
batch order, model and optimizer, and each round's clients dealt to the trainers as the runner
deals them), sums the weighted models with one raw MPI `Allreduce` when it runs as several
processes, and evaluates once at the end, as the runner is told to (eval.every = rounds); its
convolution weights lie in memory as the runner's do (run.memory_format). Three
comparisons, each printed with its ratio:

1. training time (the rounds only), both in this process;
2. the whole process, start-up included: `python -m hpcfl.launch` against `python bench/overhead.py --floor`;
3. with --ranks N: `mpirun -np N python -m hpcfl.launch` (a server and N-1 workers) against the
   floor as N-1 concurrent processes, `mpirun -np N-1 python bench/overhead.py --floor`.

With --device cuda both sides keep the data, the model and the averaging on the GPU (every rank on
GPU local_rank % GPUs, as the runner places them) and synchronise before reading the clock.

    python bench/overhead.py [--job jobs/quickstart.toml] [--rounds 5] [--ranks 3] [--repeat 4] [--device cpu|cuda]
    python bench/overhead.py --training --repeat 12

Each figure is the best of --repeat runs (the machine's noise only ever adds time); every comparison
runs floor and hpcfl in pairs, one after the other, since the machine's speed drifts by several percent
over minutes, and alternates which goes first. Each comparison also prints the mean of its pairs'
ratios with a 95 % t-interval: a ratio target is met in a way that holds when the interval lies below
it, and the interval's half-width is the smallest difference the runs could resolve. --training runs the
first comparison alone (e.g. --repeat 12).
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from hpcfl.data.base import resolve_data_root
from hpcfl.data.datasets import load_dataset
from hpcfl.data.partition import partition
from hpcfl.jobs import load_job, resolve
from hpcfl.models import build_model, lay_out
from hpcfl.models.evaluation import evaluate
from hpcfl.runtime.placement import client_cost, deal_cohort, memory_format
from hpcfl.seeding import cohort_schedule, torch_seed
from hpcfl.training import LocalTrainer

MPIRUN = str(Path(sys.executable).with_name("mpirun"))


def floor(cfg, comm=None) -> float:
    """Seconds of the rounds of plain FedAvg; this process trains the clients the runner's placement
    deals trainer `rank` of `size` each round, and the weighted models are summed with one Allreduce."""
    rank, size = (comm.Get_rank(), comm.Get_size()) if comm else (0, 1)
    device = torch.device("cpu")
    if cfg.run.device == "cuda":
        device = torch.device("cuda", rank % torch.cuda.device_count())
    data = load_dataset(cfg.data.dataset, resolve_data_root(cfg.data.root or None))
    parts = partition(data.train_y.numpy(), cfg.data.num_clients, cfg.data.partition, cfg.data.partition_params,
                      cfg.run.seed, cfg.data.min_samples)
    cost = client_cost([len(p) for p in parts], cfg.train.batch_size)
    cohorts = cohort_schedule(cfg.run.seed, cfg.run.rounds, cfg.data.num_clients, cfg.train.clients_per_round)
    rows = {c: data.train_rows(p) for c, p in enumerate(parts)}     # float32 rows, no float copy of the whole set
    xs, ys = ({c: xy[i].to(device) for c, xy in rows.items()} for i in (0, 1))
    torch.manual_seed(torch_seed(cfg.run.seed, "init"))
    model = build_model(cfg.model.name, data.input_shape, data.num_classes).to(device)
    lay_out(model, memory_format(cfg.run.memory_format, device))     # as fast as the runner's layout
    batches = LocalTrainer(cfg.train, cfg.run.seed).batches          # the runner's batch order
    params = list(model.parameters())
    sync()
    start = time.perf_counter()
    flat_global = flatten(params)
    for round in range(cfg.run.rounds):
        total = torch.zeros(flat_global.numel() + 1, dtype=torch.float64, device=device)
        hosts = deal_cohort(cohorts[round].tolist(), cost, list(range(size)))
        for c in sorted(c for c, r in hosts.items() if r == rank):
            load(flat_global, params)
            opt = torch.optim.SGD(params, lr=cfg.train.lr, momentum=cfg.train.momentum)
            for idx in batches(len(ys[c]), round, c, device):
                opt.zero_grad()
                F.cross_entropy(model(xs[c].index_select(0, idx)), ys[c].index_select(0, idx)).backward()
                opt.step()
            total[:-1] += len(ys[c]) * flatten(params)
            total[-1] += len(ys[c])
        if comm:
            from mpi4py import MPI
            host = total.cpu().numpy()
            comm.Allreduce(MPI.IN_PLACE, host, op=MPI.SUM)
            total = torch.from_numpy(host).to(device)
        flat_global = total[:-1] / total[-1]
    load(flat_global, params)
    acc = evaluate(model, data.test_x.to(device), data.test_y.to(device), data.num_classes, 1000)["acc"]
    sync()
    seconds = time.perf_counter() - start
    if rank == 0:
        print(f"floor rounds_s={seconds:.3f} test_acc={acc:.4f}", flush=True)
    return seconds


def flatten(params) -> torch.Tensor:
    """The parameters as one float64 vector in their logical order (channels_last weights cannot be
    viewed flat, so torch's parameters_to_vector refuses them)."""
    return torch.cat([p.detach().reshape(-1) for p in params]).double()


def load(flat: torch.Tensor, params) -> None:
    """Copy a flat vector into the parameters, keeping their memory layout (vector_to_parameters
    would replace them with contiguous views)."""
    with torch.no_grad():
        for p, part in zip(params, flat.split([p.numel() for p in params]), strict=True):
            p.copy_(part.view(p.shape))


def sync() -> None:
    """Wait for the GPU's queued work, so the clock reads finished work."""
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()


def runner(cfg) -> float:
    """Seconds of hpcfl's rounds in this process."""
    from hpcfl.runtime.build import setup
    from hpcfl.runtime.loop import run  # imported here: the floor's process does without them
    from hpcfl.transport import LocalTransport

    job = setup(resolve(cfg), LocalTransport({}), None)
    sync()
    start = time.perf_counter()
    run(job)
    sync()
    seconds = time.perf_counter() - start
    job.recorder.close()
    return seconds


def profile(cfg) -> None:
    """hpcfl's rounds under torch's profiler: the operators by their own host time, and how often the
    host waited for the GPU (each wait stalls the queue of kernels)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    runner(cfg)                                                            # warm: kernels, allocator
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cfg.run.device == "cuda" else [])
    with torch_profile(activities=activities) as prof:
        runner(cfg)
    events = prof.key_averages()
    print(events.table(sort_by="self_cpu_time_total", row_limit=25))
    waits = sum(e.count for e in events if e.key in ("cudaStreamSynchronize", "cudaDeviceSynchronize", "aten::item",
                                                    "aten::_local_scalar_dense"))
    print(f"host waits for the device (synchronize, item): {waits}")


def device_name(device: str) -> str:
    return torch.cuda.get_device_name(0) if device == "cuda" else "cpu, 1 thread"


def timed(cmd: list[str], **env: str) -> tuple[float, str]:
    """Wall seconds of a command and its output."""
    start = time.perf_counter()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1", **env})
    return time.perf_counter() - start, out.stdout


def floor_rounds(out: str) -> float:
    """The rounds' seconds a floor process printed."""
    return float(out.split("rounds_s=")[1].split()[0])


def setup_comparison(launch: list[str], cfg, tmp: Path, repeat: int) -> None:
    """Set-up before round 1 in new processes (one-round runs), reading the data cache and decoding the
    files (HPCFL_CACHE=off), alternated."""
    def once(name: str, **env: str) -> float:
        timed(launch + ["--set", f"run.name='{name}'", "--set", "run.rounds=1", "--set", "eval.every=1"], **env)
        return setup_s(tmp / cfg(name).run.study / f"{name}.h5")

    pairs = paired(lambda i: once(f"cached{i}"), lambda i: once(f"decoded{i}", HPCFL_CACHE="off"), repeat)
    cached, decoded = min(c for c, _ in pairs), min(d for _, d in pairs)
    print(f"{'set-up before round 1, a new process':<44} cached {cached:7.3f} s   decoding {decoded:7.3f} s   "
          f"ratio {cached / decoded:.3f}   (target: cached <= 0.15 s; every run: "
          f"{', '.join(f'{c:.2f}/{d:.2f}' for c, d in pairs)})")


def setup_s(path: Path) -> float:
    """The seconds rank 0 spent in set-up (reading the data, the split, the models), from its result file."""
    from hpcfl.metrics import read_run

    return float(read_run(path).attrs["setup_s"][0])


def rounds_s(path: Path) -> float:
    from hpcfl.metrics import read_run

    return float(read_run(path).arrays["round/time_s"].sum())


def paired(first, second, repeat: int) -> list[tuple]:
    """`repeat` pairs (first(i), second(i)), the later pairs run in the other order: whichever runs
    second in a pair meets a machine the first has warmed, so neither side may always have that place."""
    return [(first(i), second(i)) if i % 2 == 0 else (second(i), first(i))[::-1] for i in range(repeat)]


def report(label: str, ours: list[float], floor_s: list[float]) -> None:
    """The best-of figures and their ratio, then the mean of the pairs' ratios with its 95 % t-interval
    (hpcfl.analysis.paired.interval) and every pair's ratio."""
    from hpcfl.analysis.paired import interval  # here: pandas and scipy would add 2 s to the floor's process

    ratios = [o / f for o, f in zip(ours, floor_s, strict=True)]
    mean, _, low, high = interval(np.array(ratios))
    print(f"{label:<44} hpcfl {min(ours):7.2f} s   floor {min(floor_s):7.2f} s   ratio {min(ours) / min(floor_s):.3f}"
          f"   paired: mean {mean:.3f}, 95 % interval {low:.3f}-{high:.3f} "
          f"(pairs: {', '.join(f'{r:.3f}' for r in ratios)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", default="jobs/quickstart.toml")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ranks", type=int, default=0, help="also compare mpirun -np RANKS (0: skip)")
    parser.add_argument("--repeat", type=int, default=4, help="pairs per comparison; even, so each side goes first "
                        "as often as the other")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--floor", action="store_true", help="run only the floor (used by the comparisons)")
    parser.add_argument("--profile", action="store_true", help="print where hpcfl's rounds spend their time, and stop")
    parser.add_argument("--setup", action="store_true", help="only compare set-up with and without the data cache")
    parser.add_argument("--training", action="store_true", help="only compare training in this process")
    args = parser.parse_args()
    if args.repeat % 2 and not args.floor:
        print(f"note: --repeat {args.repeat} is odd, so the floor goes first in one pair more than hpcfl")
    torch.set_num_threads(1)
    overrides = [f"run.rounds={args.rounds}", f"eval.every={args.rounds}", f"run.device='{args.device}'"]
    if args.floor:
        comm = None
        if "PMI_SIZE" in os.environ:
            from mpi4py import MPI
            comm = MPI.COMM_WORLD
        floor(load_job(args.job, overrides), comm)
        return
    with tempfile.TemporaryDirectory() as tmp:
        cfg = lambda name: load_job(args.job, overrides + [f"run.results_root='{tmp}'", f"run.name='{name}'"])  # noqa: E731
        torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)     # its first use imports torch._dynamo (1-2 s)
        print(f"device: {device_name(args.device)}, torch {torch.__version__}, job {args.job}, {args.rounds} rounds")
        if args.profile:
            return profile(cfg("profile"))
        sets = sum((["--set", o] for o in overrides + [f"run.results_root='{tmp}'"]), [])
        launch = [sys.executable, "-m", "hpcfl.launch", args.job, *sets]
        if args.setup:
            return setup_comparison(launch, cfg, Path(tmp), args.repeat)
        pairs = paired(lambda i: floor(cfg("floor")), lambda i: runner(cfg(f"inproc{i}")), args.repeat)
        report("training (rounds only, one process)", [r for _, r in pairs], [f for f, _ in pairs])
        if args.training:
            return
        plain = [sys.executable, __file__, "--floor", "--job", args.job, "--rounds", str(args.rounds),
                 "--device", args.device]
        wholes = paired(lambda i: timed(plain), lambda i: timed(launch + ["--set", f"run.name='cli{i}'"])[0],
                        args.repeat)
        report("whole process (start-up included)", [w for _, w in wholes], [f for (f, _), _ in wholes])
        outside = [(f - floor_rounds(out), w - rounds_s(Path(tmp) / cfg(f"cli{i}").run.study / f"cli{i}.h5"))
                   for i, ((f, out), w) in enumerate(wholes)]            # start-up, set-up and the end
        report("  of which outside the rounds", [o for _, o in outside], [f for f, _ in outside])
        setup_comparison(launch, cfg, Path(tmp), args.repeat)
        if args.ranks:
            trainers = args.ranks - 1
            pairs = paired(lambda i: timed([MPIRUN, "-np", str(trainers), *plain]),
                           lambda i: timed([MPIRUN, "-np", str(args.ranks), *launch, "--set", f"run.name='mpi{i}'"])[0],
                           args.repeat)
            floor_runs, mpi_runs = [f for f, _ in pairs], [m for _, m in pairs]
            ours_rounds = [rounds_s(Path(tmp) / cfg(f"mpi{i}").run.study / f"mpi{i}.h5") for i in range(args.repeat)]
            report(f"training, {args.ranks} ranks vs {trainers} plain processes", ours_rounds,
                   [floor_rounds(out) for _, out in floor_runs])
            report(f"whole, mpirun -np {args.ranks} vs -np {trainers} plain", mpi_runs, [t for t, _ in floor_runs])


if __name__ == "__main__":
    main()
