"""The CPU-sized FedKA study (jobs/fedka/fmnist-cpu.toml: real Fashion-MNIST, Dir(0.1), 10 clients):
FedAvg vs FedKA over seeds. Prints each method's final test accuracy and FedKA Table 2's speed-up
measure: the first round at which the global model reaches FedAvg's final accuracy on the same seed.

    python bench/fedka_study.py [--seeds 0 1 2] [--parallel 2] [--root results] [--beta 0.1]
"""
from pathlib import Path

import numpy as np
from runs import launch, run_all, study_parser

JOB = Path(__file__).resolve().parent.parent / "jobs" / "fedka" / "fmnist-cpu.toml"
METHODS = {"FedAvg": lambda beta: ['algorithm.name="fedavg"', "algorithm.params={}"],
           "FedKA": lambda beta: [f"algorithm.params.weight={beta}"]}


def rounds_to_reach(acc: np.ndarray, target: float) -> str:
    hit = np.flatnonzero(acc >= target)
    return str(hit[0] + 1) if hit.size else f"> {len(acc)}"


def main() -> None:
    parser = study_parser(__doc__)
    parser.add_argument("--beta", type=float, default=0.1, help="FedKA's beta (the paper tunes it in {0.5, 0.1, "
                        "0.01, 0.001})")
    args = parser.parse_args()
    jobs = [(label, seed) for label in METHODS for seed in args.seeds]
    def one(label, seed):
        name = f"{label}{'' if label == 'FedAvg' or args.beta == 0.1 else f'-beta{args.beta:g}'}-seed{seed}"
        return launch(JOB, args.root, name, f"run.seed={seed}", *METHODS[label](args.beta))

    results = run_all(jobs, one, args.parallel)
    print("| method | final test accuracy (mean ± std over seeds) | per seed | rounds to reach FedAvg's final "
          "accuracy, per seed |")
    print("|---|---|---|---|")
    for label in METHODS:
        curves = [results[(label, seed)]["round/test_acc"] for seed in args.seeds]
        targets = [results[("FedAvg", seed)]["round/test_acc"][-1] for seed in args.seeds]
        final = np.array([c[-1] for c in curves])
        print(f"| {label} | {final.mean():.4f} ± {final.std():.4f} | {', '.join(f'{a:.4f}' for a in final)} | "
              f"{', '.join(rounds_to_reach(c, t) for c, t in zip(curves, targets))} |")


if __name__ == "__main__":
    main()
