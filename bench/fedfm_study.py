"""The CPU-sized FedFM study (jobs/fedfm/fmnist-cpu.toml, real Fashion-MNIST, Dir(0.1)): final test
accuracy of FedAvg, FedFM-L2, FedFM-CG and FedFM-Lite (a = 2, 5) over seeds, and the bytes each
sent. Runs `--parallel` one-process jobs at a time (one CPU core each) and prints a Markdown table.

    python bench/fedfm_study.py [--seeds 0 1 2] [--parallel 2] [--root results]
"""
import argparse
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from hpcfl.metrics import read_run

JOB = Path(__file__).resolve().parent.parent / "jobs" / "fedfm" / "fmnist-cpu.toml"
METHODS = {                                   # label -> overrides of the job file
    "FedAvg": ['algorithm.name="fedavg"', "algorithm.params={}"],
    "FedFM-L2": ['algorithm.name="fedavg"', "algorithm.params={}",
                 "algorithm.regularizers={fm_l2 = {start_round = 5}}"],
    "FedFM-CG": [],
    "FedFM-Lite a=2": ['algorithm.name="fedfm_lite"', "algorithm.params.model_every=2"],
    "FedFM-Lite a=5": ['algorithm.name="fedfm_lite"', "algorithm.params.model_every=5"],
}


def run(root: Path, label: str, seed: int) -> dict:
    name = f"{label.replace(' ', '').replace('=', '')}-seed{seed}"
    cmd = [sys.executable, "-m", "hpcfl.launch", str(JOB), "--results-root", str(root), "--set", f"run.seed={seed}",
           "--set", f"run.name={name!r}", *(arg for o in METHODS[label] for arg in ("--set", o))]
    path = root / "fedfm-fmnist" / f"{name}.h5"
    if path.exists() and read_run(path).attrs.get("status") != "completed":
        path.unlink()                 # an interrupted earlier run: redo it
    if not path.exists():
        subprocess.run(cmd, check=True, capture_output=True)
    return read_run(path).arrays


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--root", type=Path, default=Path("results"))
    args = parser.parse_args()
    jobs = [(label, seed) for label in METHODS for seed in args.seeds]
    with ThreadPoolExecutor(args.parallel) as pool:
        results = dict(zip(jobs, pool.map(lambda job: run(args.root, *job), jobs)))
    print("| method | final test accuracy (mean ± std over seeds) | per seed | MB sent (down + up) | NMI |")
    print("|---|---|---|---|---|")
    for label in METHODS:
        runs = [results[(label, seed)] for seed in args.seeds]
        acc = np.array([r["round/test_acc"][-1] for r in runs])
        megabytes = np.mean([sum(np.nansum(v) for k, v in r.items() if k.startswith("round/bytes_")) for r in runs]) / 1e6
        nmi = np.mean([float(r["final/feature_nmi"]) for r in runs])
        print(f"| {label} | {acc.mean():.4f} ± {acc.std():.4f} | {', '.join(f'{a:.4f}' for a in acc)} | "
              f"{megabytes:.1f} | {nmi:.3f} |")


if __name__ == "__main__":
    main()
