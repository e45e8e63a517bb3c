"""Local training of a worker's sampled clients one after another vs together (train.batched_clients).

The job's clients (quickstart: FMNIST CNN, Fashion-MNIST Dir(0.5), 20 clients, 10 sampled per round)
all on one worker: each round's cohort trains from the same model, once with LocalTrainer client
by client and once with BatchedTrainer (groups of --group), each result loaded into the model as the
worker does. On the CPU with one torch thread, and on CUDA when there is a GPU (synchronised around
the timings). Prints seconds per round, samples per second, the speed-up and the largest absolute
difference between the two paths' trained models; on the CPU also that of the sequential path against
itself with torch's oneDNN convolutions off, the spread that fp32 rounding alone gives.

    flock /tmp/hpcfl-bench.lock python bench/batched.py [--job jobs/quickstart.toml] [--rounds 2] [--group 10]
"""
import argparse
import time

import numpy as np
import torch

from hpcfl.algorithms.base import Client
from hpcfl.data.base import resolve_data_root
from hpcfl.data.datasets import load_dataset
from hpcfl.data.partition import partition
from hpcfl.jobs import load_job
from hpcfl.models import build_model, lay_out, load_state
from hpcfl.runtime.placement import memory_format
from hpcfl.seeding import cohort_schedule, torch_seed
from hpcfl.training import LocalTrainer
from hpcfl.training.batched import BatchedTrainer


def timed(device, work):
    """`work()`'s result and wall seconds, the device synchronised on both sides."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    out = work()
    sync()
    return out, time.perf_counter() - start


def compare(cfg, data, parts, cohorts, device, group: int) -> None:
    torch.manual_seed(torch_seed(cfg.run.seed, "init"))
    model = build_model(cfg.model.name, data.input_shape, data.num_classes).to(device)
    lay_out(model, memory_format(cfg.run.memory_format, device))   # one after another as the runner trains them
    start = {k: v.detach().clone() for k, v in model.state_dict().items()}
    trainer = LocalTrainer(cfg.train, cfg.run.seed)
    batched = BatchedTrainer(trainer, model, group)
    clients = {c: Client(c, *(t.to(device) for t in data.train_rows(p)), np.zeros(0)) for c, p in enumerate(parts)}

    def one_by_one(cohort, round):
        out = {}
        for c in cohort:
            load_state(model, start)
            trainer.train(model, clients[c], round)
            out[c] = {k: v.clone() for k, v in model.state_dict().items()}
        return out

    def together(cohort, round):
        trained, out = batched.train([clients[c] for c in cohort], round, start), {}
        for c in cohort:
            trained.train(model, clients[c], round)
            out[c] = {k: v.clone() for k, v in model.state_dict().items()}
        return out

    small = sorted(cohorts[0], key=lambda c: len(parts[c]))[:2]
    one_by_one(small, 0), together(small, 0)                           # warm-up (CUDA context, kernels)
    seconds, diff, spread, samples = {"sequential": 0.0, "batched": 0.0}, 0.0, 0.0, 0
    for round, cohort in enumerate(cohorts):
        cohort = [int(c) for c in cohort]
        alone, s_seq = timed(device, lambda cohort=cohort, round=round: one_by_one(cohort, round))
        joint, s_bat = timed(device, lambda cohort=cohort, round=round: together(cohort, round))
        seconds["sequential"] += s_seq
        seconds["batched"] += s_bat
        samples += cfg.train.local_epochs * sum(len(parts[c]) for c in cohort)
        diff = max(diff, largest_difference(alone, joint))
        if device.type == "cpu":
            with torch.backends.mkldnn.flags(enabled=False):
                spread = max(spread, largest_difference(alone, one_by_one(cohort, round)))
    rounds = len(cohorts)
    name = f"{device.type}" + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ", 1 thread")
    print(f"{name}: {rounds} round(s) of {len(cohorts[0])} clients, {samples // rounds} samples per round, "
          f"groups of {group}")
    for path, s in seconds.items():
        print(f"  {path:10s} {s / rounds:7.2f} s/round  {samples / s:8.0f} samples/s")
    print(f"  speed-up   {seconds['sequential'] / seconds['batched']:.2f}x   "
          f"max |difference| of trained models {diff:.2e}")
    if device.type == "cpu":
        print(f"  reference: sequential with oneDNN convolutions off vs on, max |difference| {spread:.2e}")


def largest_difference(one: dict, other: dict) -> float:
    """The largest absolute difference between two sets of trained client models."""
    return max((one[c][k] - other[c][k]).abs().max().item() for c in one for k in one[c])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", default="jobs/quickstart.toml")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--group", type=int, default=10, help="clients trained together (train.batched_clients)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = load_job(args.job, [f"train.batched_clients={args.group}"])
    data = load_dataset(cfg.data.dataset, resolve_data_root(cfg.data.root or None))
    parts = partition(data.train_y.numpy(), cfg.data.num_clients, cfg.data.partition, cfg.data.partition_params,
                      cfg.run.seed, cfg.data.min_samples)
    cohorts = cohort_schedule(cfg.run.seed, args.rounds, cfg.data.num_clients, cfg.train.clients_per_round)
    for device in [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else []):
        compare(cfg, data, parts, cohorts, device, args.group)


if __name__ == "__main__":
    main()
