"""The CPU-sized FedCME study (jobs/fedcme/fmnist-cpu.toml: real Fashion-MNIST, Dir(0.1), K = 50,
M = 10): final test accuracy of FedAvg, FedProx, FedCME-OL (alignment only), FedCME-OE (exchange only)
and FedCME over seeds, and the wall time the classifier swap takes per round.

    python bench/fedcme_study.py [--seeds 0 1 2] [--parallel 2] [--root results]
"""
from pathlib import Path

import numpy as np
from runs import launch, run_all, study_parser

JOB = Path(__file__).resolve().parent.parent / "jobs" / "fedcme" / "fmnist-cpu.toml"
METHODS = {"FedAvg": ['algorithm.name="fedavg"', "algorithm.params={}"],
           "FedProx": ['algorithm.name="fedprox"', "algorithm.params={mu = 0.01}"],
           "FedCME-OL": ['algorithm.params.exchange="none"'],
           "FedCME-OE": ["algorithm.params.mu=0.0"],
           "FedCME": []}


def main() -> None:
    parser = study_parser(__doc__)
    args = parser.parse_args()
    jobs = [(label, seed) for label in METHODS for seed in args.seeds]
    results = run_all(jobs, lambda label, seed: launch(JOB, args.root, f"{label}-seed{seed}", f"run.seed={seed}",
                                                        *METHODS[label]), args.parallel)
    print("| method | final test accuracy (mean ± std over seeds) | per seed | swap s/round (median) | "
          "round s (median) |")
    print("|---|---|---|---|---|")
    for label in METHODS:
        runs = [results[(label, seed)] for seed in args.seeds]
        final = np.array([r["round/test_acc"][-1] for r in runs])
        swap = [np.median(r["round/phase_s/swap"]) for r in runs if "round/phase_s/swap" in r]
        swap_s = f"{np.mean(swap):.4f}" if swap else "–"
        round_s = np.mean([np.median(r["round/time_s"]) for r in runs])
        print(f"| {label} | {final.mean():.4f} ± {final.std():.4f} | {', '.join(f'{a:.4f}' for a in final)} | "
              f"{swap_s} | {round_s:.2f} |")


if __name__ == "__main__":
    main()
