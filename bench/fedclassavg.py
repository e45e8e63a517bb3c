"""FedClassAvg's costs and its CPU-sized study.

    python bench/fedclassavg.py study [--seeds 0 1] [--parallel 2] [--root results]
    python bench/fedclassavg.py memory [--data-root DIR]

`study` runs jobs/fedclassavg/fmnist-cpu.toml (real Fashion-MNIST, 20 heterogeneous CNN clients,
Dir(0.5)) for local-only, FedProto and FedClassAvg, one-process jobs `--parallel` at a time, and
prints the final round's personalised accuracy: the mean over clients and the std across clients
(Table 2's two numbers), per seed, with the bytes each client sent and received per round.

`memory` runs one round of Table 2's heterogeneous CIFAR-10 job (ResNet-18, ShuffleNetV2, GoogLeNet,
AlexNet; 20 clients, all trained) under `mpirun -np 3` and prints the classifier bytes per client and
each worker's client state and peak memory. Without --data-root it writes a small random-pixel
stand-in in CIFAR-10's real file format (memory does not depend on the pixels).
"""
import argparse
import pickle
import tempfile
from pathlib import Path

import numpy as np
from runs import launch, run_all

JOBS = Path(__file__).resolve().parent.parent / "jobs" / "fedclassavg"
METHODS = ("local_only", "fedproto", "fedclassavg")


def study(args) -> None:
    def one(method, seed):
        reset = [] if method == "fedclassavg" else ["algorithm.params={}"]
        return launch(JOBS / "fmnist-cpu.toml", args.root, f"{method}-seed{seed}", f"algorithm.name={method!r}",
                      f"run.seed={seed}", *reset)

    jobs = [(m, s) for m in METHODS for s in args.seeds]
    results = run_all(jobs, one, args.parallel)
    print("| method | seed | personalised accuracy, last round (mean ± std across clients) | "
          "bytes per client per round (down / up) |")
    print("|---|---|---|---|")
    for method, seed in jobs:
        arrays = results[(method, seed)]
        clients = arrays["client/local_test_acc"][-1]
        clients = clients[np.isfinite(clients)]
        down = sum(float(v[-1]) for k, v in arrays.items() if k.startswith("round/bytes_down/")) / len(clients)
        up = sum(float(v[-1]) for k, v in arrays.items() if k.startswith("round/bytes_up/")) / len(clients)
        print(f"| {method} | {seed} | {clients.mean():.4f} ± {clients.std():.4f} | {down:,.0f} / {up:,.0f} |")


def _cifar_stand_in(root: Path, train: int = 1200, test: int = 400) -> None:
    """Random pixels in CIFAR-10's file layout (pickled dicts of b'data' and b'labels')."""
    base = root / "cifar-10-batches-py"
    base.mkdir(parents=True)
    rng = np.random.default_rng(0)
    names = [f"data_batch_{i}" for i in range(1, 6)]
    for name, size in [*((n, train // 5) for n in names), ("test_batch", test)]:
        batch = {b"data": rng.integers(0, 256, (size, 3072), dtype=np.uint8), b"labels": (np.arange(size) % 10).tolist()}
        (base / name).write_bytes(pickle.dumps(batch, protocol=2))


def memory(args) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        data_root = args.data_root
        if data_root is None:
            data_root = Path(tmp) / "data"
            _cifar_stand_in(data_root)
        arrays = launch(JOBS / "cifar10-dir.toml", Path(tmp), "memory", "run.rounds=1",
                        f"data.root={str(data_root)!r}", ranks=3)
        clients = 20
        print(f"classifier bytes per client per round: down {arrays['round/bytes_down/shared'][0] / clients:,.0f}, "
              f"up {arrays['round/bytes_up/shared'][0] / clients:,.0f}")
        state, rss = arrays["rank/client_state_bytes"][-1], arrays["rank/max_rss_bytes"][-1]
        for rank in range(len(state)):
            print(f"rank {rank}: client state {state[rank] / 2**20:7.1f} MiB, peak RSS {rss[rank] / 2**20:7.1f} MiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    s = sub.add_parser("study")
    s.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    s.add_argument("--parallel", type=int, default=2)
    s.add_argument("--root", type=Path, default=Path("results"))
    m = sub.add_parser("memory")
    m.add_argument("--data-root", type=Path, default=None)
    args = parser.parse_args()
    study(args) if args.what == "study" else memory(args)


if __name__ == "__main__":
    main()
