"""Runner overhead: a FedAvg run of hpcfl vs the same local training in a plain PyTorch loop.

The floor trains exactly the same clients, epochs and batches (same partition, cohort schedule and
batch order, same model and optimizer) and averages the models, with no runner around it. Both
evaluate once, at the end. Prints each time and the ratio; with --ranks N also times
`mpirun -np N python -m hpcfl.launch` on the same job.

    python bench/overhead.py [--job jobs/quickstart.toml] [--rounds 5] [--ranks 3]
"""
import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from hpcfl.config import load_job
from hpcfl.data.base import resolve_data_root
from hpcfl.data.datasets import load_dataset
from hpcfl.data.partition import partition
from hpcfl.models import build_model
from hpcfl.runtime.job import run, setup
from hpcfl.seeding import cohort_schedule
from hpcfl.seeding import torch_seed
from hpcfl.training import LocalTrainer, evaluate
from hpcfl.transport import LocalTransport


def plain_fedavg(cfg) -> float:
    """Seconds of the floor: plain local SGD over the same batches, then a weighted average."""
    data = load_dataset(cfg.data.dataset, resolve_data_root(cfg.data.root or None))
    parts = partition(data.train_y.numpy(), cfg.data.num_clients, cfg.data.partition, cfg.data.partition_params,
                      cfg.run.seed, cfg.data.min_samples)
    cohorts = cohort_schedule(cfg.run.seed, cfg.run.rounds, cfg.data.num_clients, cfg.train.clients_per_round)
    xs = [data.train_x[torch.from_numpy(p)] for p in parts]
    ys = [data.train_y[torch.from_numpy(p)] for p in parts]
    torch.manual_seed(torch_seed(cfg.run.seed, "init"))
    model = build_model(cfg.model.name, data.input_shape, data.num_classes)
    batches = LocalTrainer(cfg.train, cfg.run.seed).batches       # the same batch order as the runner
    start = time.perf_counter()
    global_state = {k: v.clone() for k, v in model.state_dict().items()}
    for round in range(cfg.run.rounds):
        total = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in global_state.items()}
        weight = 0
        for c in cohorts[round]:
            model.load_state_dict(global_state)
            opt = torch.optim.SGD(model.parameters(), lr=cfg.train.lr, momentum=cfg.train.momentum)
            for idx in batches(len(ys[c]), round, int(c), "cpu"):
                opt.zero_grad()
                F.cross_entropy(model(xs[c][idx]), ys[c][idx]).backward()
                opt.step()
            for k, v in model.state_dict().items():
                total[k] += len(ys[c]) * v
            weight += len(ys[c])
        global_state = {k: (v / weight).float() for k, v in total.items()}
    model.load_state_dict(global_state)
    acc = evaluate(model, data.test_x, data.test_y, data.num_classes, 1000)["acc"]
    seconds = time.perf_counter() - start
    print(f"plain loop: {seconds:7.2f} s   final test_acc {acc:.4f}")
    return seconds


def runner_fedavg(cfg) -> float:
    job = setup(cfg, LocalTransport({}), None, log=lambda text: None)
    start = time.perf_counter()
    run(job, log=lambda text: None)
    seconds = time.perf_counter() - start
    job.recorder.close()
    print(f"hpcfl run:  {seconds:7.2f} s   (rounds only, one process)")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", default="jobs/quickstart.toml")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ranks", type=int, default=0, help="also time mpirun -np RANKS (0: skip)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        overrides = [f"run.rounds={args.rounds}", f"eval.every={args.rounds}", f"run.results_root='{tmp}'"]
        floor = plain_fedavg(load_job(args.job, overrides))
        ours = runner_fedavg(load_job(args.job, overrides + ['run.name="inproc"']))
        print(f"overhead ratio (rounds):        {ours / floor:.3f}")
        cmd = [sys.executable, "-m", "hpcfl.launch", args.job, *sum((["--set", o] for o in overrides), [])]
        start = time.perf_counter()
        subprocess.run(cmd + ["--set", 'run.name="cli"'], check=True, capture_output=True)
        whole = time.perf_counter() - start
        print(f"whole process (start-up incl.): {whole:7.2f} s   ratio {whole / floor:.3f}")
        if args.ranks:
            mpirun = str(Path(sys.executable).with_name("mpirun"))
            start = time.perf_counter()
            subprocess.run([mpirun, "-np", str(args.ranks), *cmd, "--set", 'run.name="mpi"'], check=True,
                           capture_output=True)
            print(f"mpirun -np {args.ranks} whole process: {time.perf_counter() - start:7.2f} s")


if __name__ == "__main__":
    main()
