"""The baselines' cost: wall time per round relative to FedAvg on the same job, and the per-client
state each worker holds (SCAFFOLD's c_i, MOON's previous model, ...) with 100 clients.

Time: one process, real Fashion-MNIST, Dir(0.5) over 20 clients, 5 per round, 1 local epoch; the
median `round/time_s` of rounds 1.. (round 0 pays one-off warm-up). Memory: 100 clients, all of
them trained in one round under `mpirun -np 3` (server + 2 workers, 50 clients each); prints each
worker's `rank/client_state_bytes` and peak resident memory from the result file.

    python bench/baselines.py [--rounds 4] [--algorithms fedavg moon] [--skip-memory]
    python bench/baselines.py --smoke     # FedAvg, 2 rounds on `digits`, one process: checks that it runs (CI)
"""
import argparse
import tempfile
from pathlib import Path

import numpy as np
import runs

from hpcfl.algorithms import ALGORITHMS

JOB = Path(__file__).resolve().parent.parent / "jobs" / "quickstart.toml"
SMOKE = ["data.dataset='digits'"]    # --smoke: the small built-in set, every other setting the quickstart's


def launch(root: Path, name: str, algorithm: str, *overrides: str, ranks: int = 0) -> dict:
    personal = ["data.local_test_ratio=0.3"] if algorithm == "local_only" else []
    return runs.launch(JOB, root, name, f"algorithm.name={algorithm!r}", *personal, *overrides, ranks=ranks)


def per_round_times(root: Path, algorithms: list[str], rounds: int, *extra: str) -> None:
    print(f"wall time per round, one process, {rounds} rounds (median of rounds 1..), relative to fedavg")
    base = None
    for algorithm in algorithms:
        everyone = ["train.clients_per_round=20", "data.num_clients=20"] if algorithm == "ensemble" else []
        arrays = launch(root, f"time-{algorithm}", algorithm, f"run.rounds={rounds}", "train.clients_per_round=5",
                        *everyone, *extra)
        seconds = float(np.median(arrays["round/time_s"][1:]))
        per_client = seconds / (20 if everyone else 5)
        base = per_client if algorithm == "fedavg" else base
        ratio = f"{per_client / base:5.2f}x" if base else "   - "
        print(f"  {algorithm:<11} {seconds:7.2f} s/round  {per_client:6.3f} s/client  {ratio}", flush=True)


def state_memory(root: Path, algorithms: list[str]) -> None:
    print("per-worker memory, 100 clients all trained once, mpirun -np 3 (50 clients per worker)")
    for algorithm in algorithms:
        arrays = launch(root, f"mem-{algorithm}", algorithm, "run.rounds=1", "data.num_clients=100",
                        "train.clients_per_round=100", "eval.every=1", ranks=3)
        state, rss = arrays["rank/client_state_bytes"][-1], arrays["rank/max_rss_bytes"][-1]
        for rank in (1, 2):
            print(f"  {algorithm:<9} rank {rank}: client state {state[rank] / 2**20:7.1f} MiB, "
                  f"peak RSS {rss[rank] / 2**20:7.1f} MiB", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--algorithms", nargs="+", default=["fedavg", *sorted(set(ALGORITHMS) - {"fedavg"})])
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="FedAvg, 2 rounds on digits, one process: checks that "
                        "the bench runs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.smoke:
            return per_round_times(Path(tmp), ["fedavg"], 2, *SMOKE)
        per_round_times(Path(tmp), args.algorithms, args.rounds)
        if not args.skip_memory:
            state_memory(Path(tmp), ["fedavg", "scaffold", "moon"])


if __name__ == "__main__":
    main()
