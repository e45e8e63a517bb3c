"""FedClassAvg's memory and bytes (its accuracy study: this folder's README).

    python studies/fedclassavg/memory.py [--data-root DIR]
    python studies/fedclassavg/memory.py --smoke      # 4 clients, 25 images each, 2 architectures (CI)

It runs one round of Table 2's heterogeneous CIFAR-10 job (ResNet-18, ShuffleNetV2, GoogLeNet,
AlexNet; 20 clients, all trained) under `mpirun -np 3` and prints the classifier bytes per client and
each worker's client state and peak memory. Without --data-root it writes a small random-pixel
stand-in in CIFAR-10's real file format (memory does not depend on the pixels).
"""
import argparse
import pickle
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
from runs import launch  # noqa: E402  (bench/runs.py: what the bench scripts share)

JOBS = REPO / "jobs" / "fedclassavg"


def _cifar_stand_in(root: Path, train: int = 1200, test: int = 400) -> None:
    """Random pixels in CIFAR-10's file layout (pickled dicts of b'data' and b'labels')."""
    base = root / "cifar-10-batches-py"
    base.mkdir(parents=True)
    rng = np.random.default_rng(0)
    names = [f"data_batch_{i}" for i in range(1, 6)]
    for name, size in [*((n, train // 5) for n in names), ("test_batch", test)]:
        batch = {b"data": rng.integers(0, 256, (size, 3072), dtype=np.uint8),
                 b"labels": (np.arange(size) % 10).tolist()}
        (base / name).write_bytes(pickle.dumps(batch, protocol=2))


# --smoke: 4 clients of 25 stand-in images on two of the four architectures (one round of all four on the
# CPU takes tens of seconds); the same script path, for CI
SMOKE = ["data.num_clients=4", "train.clients_per_round=4", "model.architectures=['alexnet_cifar', 'shufflenetv2']",
         "model.params={preactivation=true}"]


def memory(args) -> None:
    clients, sizes, smoke = (4, (100, 20), SMOKE) if args.smoke else (20, (1200, 400), [])
    with tempfile.TemporaryDirectory() as tmp:
        data_root = args.data_root
        if data_root is None:
            data_root = Path(tmp) / "data"
            _cifar_stand_in(data_root, *sizes)
        arrays = launch(JOBS / "cifar10-dir.toml", Path(tmp), "memory", "run.rounds=1",
                        f"data.root={str(data_root)!r}", *smoke, ranks=0 if args.smoke else 3)
        print(f"classifier bytes per client per round: down {arrays['round/bytes_down/shared'][0] / clients:,.0f}, "
              f"up {arrays['round/bytes_up/shared'][0] / clients:,.0f}")
        state, rss = arrays["rank/client_state_bytes"][-1], arrays["rank/max_rss_bytes"][-1]
        for rank in range(len(state)):
            print(f"rank {rank}: client state {state[rank] / 2**20:7.1f} MiB, peak RSS {rss[rank] / 2**20:7.1f} MiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-root", type=Path, default=None)
    parser.add_argument("--smoke", action="store_true", help="4 clients of 25 stand-in images, two "
                        "architectures: checks that it runs")
    memory(parser.parse_args())


if __name__ == "__main__":
    main()
