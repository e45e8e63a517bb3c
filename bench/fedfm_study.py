"""The CPU-sized FedFM study (jobs/fedfm/fmnist-cpu.toml, real Fashion-MNIST, Dir(0.1)): final test
accuracy of FedAvg, FedFM-L2, FedFM-CG and FedFM-Lite (a = 2, 5) over seeds (and its mean over the
last 5 rounds, since one round's accuracy swings by several points under this skew), and the bytes
each sent. Runs `--parallel` one-process jobs at a time (one CPU core each) and prints a Markdown table.

    python bench/fedfm_study.py [--seeds 0 1 2] [--parallel 2] [--root results] [--weight 50]
"""
from pathlib import Path

import numpy as np
from runs import launch, run_all, study_parser

JOB = Path(__file__).resolve().parent.parent / "jobs" / "fedfm" / "fmnist-cpu.toml"
METHODS = {                                   # label -> overrides of the job file, given lambda
    "FedAvg": lambda weight: ['algorithm.name="fedavg"', "algorithm.params={}"],
    "FedFM-L2": lambda weight: ['algorithm.name="fedavg"', "algorithm.params={}",
                                f"algorithm.regularizers={{fm_l2 = {{start_round = 10, weight = {weight}}}}}"],
    "FedFM-CG": lambda weight: [f"algorithm.params.weight={weight}"],
    "FedFM-Lite a=2": lambda weight: ['algorithm.name="fedfm_lite"', "algorithm.params.model_every=2",
                                      f"algorithm.params.weight={weight}"],
    "FedFM-Lite a=5": lambda weight: ['algorithm.name="fedfm_lite"', "algorithm.params.model_every=5",
                                      f"algorithm.params.weight={weight}"],
}


def run(root: Path, label: str, seed: int, weight: float) -> dict:
    suffix = "" if label == "FedAvg" or weight == 50.0 else f"-lambda{weight:g}"
    name = f"{label.replace(' ', '').replace('=', '')}{suffix}-seed{seed}"
    return launch(JOB, root, name, f"run.seed={seed}", *METHODS[label](weight))


def main() -> None:
    parser = study_parser(__doc__)
    parser.add_argument("--weight", type=float, default=50.0, help="lambda of every FedFM variant (paper: 50)")
    args = parser.parse_args()
    jobs = [(label, seed) for label in METHODS for seed in args.seeds]
    results = run_all(jobs, lambda label, seed: run(args.root, label, seed, args.weight), args.parallel)
    print("| method | final test accuracy (mean ± std over seeds) | per seed | mean of the last 5 rounds | "
          "MB sent (down + up) | NMI |")
    print("|---|---|---|---|---|---|")
    for label in METHODS:
        runs = [results[(label, seed)] for seed in args.seeds]
        acc = np.array([r["round/test_acc"][-1] for r in runs])
        last5 = np.array([np.nanmean(r["round/test_acc"][-5:]) for r in runs])
        megabytes = np.mean([sum(np.nansum(v) for k, v in r.items() if k.startswith("round/bytes_")) for r in runs]) / 1e6
        nmi = np.mean([float(r["final/feature_nmi"]) for r in runs])
        print(f"| {label} | {acc.mean():.4f} ± {acc.std():.4f} | {', '.join(f'{a:.4f}' for a in acc)} | "
              f"{last5.mean():.4f} ± {last5.std():.4f} | {megabytes:.1f} | {nmi:.3f} |")


if __name__ == "__main__":
    main()
